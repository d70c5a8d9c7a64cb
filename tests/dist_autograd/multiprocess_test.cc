// Distributed autograd across real processes over gRPC: the test is worker0
// of a 3-process group (model.h) meeting through a TCPStore it serves.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/autograd/engine.h"
#include "ferry/common/status.h"
#include "gtest/gtest.h"
#include "ferry/optim/distributed_optimizer.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rref/rref.h"
#include "ferry/tests/dist_autograd/model.h"
#include "ferry/tests/util/worker_processes.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry::dist_autograd_test {
namespace {

using autograd::dist::ContextScope;
using autograd::dist::DistAutogradContainer;

// Worker processes of tests/dist_autograd/worker_main beside this one
// (worker0).
class Group {
 public:
  absl::Status Start(int world) {
    rpc::GrpcAgentOptions options;
    options.before_serving = [this](rpc::Agent& agent) -> absl::Status {
      ASSIGN_OR_RETURN(dist_, DistAutogradContainer::Install(agent));
      ASSIGN_OR_RETURN(rrefs_, rref::RRefContext::Install(agent));
      return absl::OkStatus();
    };
    return procs_.Start(world, "tests/dist_autograd/worker_main",
                        std::move(options));
  }
  absl::StatusOr<int> Wait(size_t i, absl::Duration timeout) {
    return procs_.Wait(i, timeout);
  }

  rpc::Agent& agent() { return procs_.agent(); }
  DistAutogradContainer& dist() { return *dist_; }
  rref::RRefContext& rrefs() { return *rrefs_; }
  size_t workers() const { return procs_.workers(); }
  testutil::Subprocess& worker(size_t i) { return procs_.worker(i); }

 private:
  std::shared_ptr<DistAutogradContainer> dist_;
  std::shared_ptr<rref::RRefContext> rrefs_;
  testutil::WorkerProcesses procs_;  // Shuts the agent down first.
};

void ExpectClose(const Tensor& got, const Tensor& want,
                 const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  EXPECT_TRUE(got.allclose(want, 1e-9, 1e-12))
      << what << "\n got " << got.ToString() << "\n want " << want.ToString();
}

TEST(MultiProcessDistAutograd, ChainGradientsEqualSingleProcessAndCleanup) {
  Group g;
  absl::Status started = g.Start(3);
  ASSERT_TRUE(started.ok()) << started;

  Tensor x = Leaf(-1), w0 = Leaf(0);
  std::vector<Tensor> ref = {Leaf(-1), Leaf(0), Leaf(1), Leaf(2)};
  Tensor ref_loss = LocalLoss(ref[0], ref[1], ref[2], ref[3]);
  ASSERT_TRUE(autograd::Backward({ref_loss}).ok());

  for (int round = 0; round < 2; ++round) {
    ContextScope ctx(g.dist());
    Tensor h = Layer0(x, w0);
    auto y = g.agent().rpc_sync<Tensor>("worker1", "layer1", h);
    ASSERT_TRUE(y.ok()) << y.status();
    Tensor loss = Loss(h, *y);
    EXPECT_TRUE(loss.allclose(ref_loss, 1e-12));
    absl::Status s = g.dist().Backward(ctx.id(), {loss});
    ASSERT_TRUE(s.ok()) << s;
    auto here = g.dist().GetGradients(ctx.id());
    ASSERT_TRUE(here.ok()) << here.status();
    ExpectClose(here->Get(x), autograd::GradOf(ref[0]), "x on worker0");
    ExpectClose(here->Get(w0), autograd::GradOf(ref[1]), "w0 on worker0");
    const int64_t id = static_cast<int64_t>(ctx.id().value());
    for (int r = 1; r <= 2; ++r) {
      auto grad = g.agent().rpc_sync<Tensor>(r, "grad", id);
      ASSERT_TRUE(grad.ok()) << grad.status();
      ExpectClose(*grad, autograd::GradOf(ref[r + 1]),
                  absl::StrCat("w", r, " on worker", r));
      auto n = g.agent().rpc_sync<int64_t>(r, "num_contexts");
      ASSERT_TRUE(n.ok()) << n.status();
      EXPECT_EQ(*n, 1) << "worker" << r;
    }
    ASSERT_TRUE(ctx.Release(absl::Seconds(60)).ok());
    for (int r = 1; r <= 2; ++r) {
      auto n = g.agent().rpc_sync<int64_t>(r, "num_contexts");
      ASSERT_TRUE(n.ok()) << n.status();
      EXPECT_EQ(*n, 0) << "worker" << r << " kept a released context";
    }
    EXPECT_EQ(g.dist().NumContexts(), 0u);
  }

  ASSERT_TRUE(g.rrefs().Shutdown(absl::Seconds(60)).ok());
  for (size_t i = 0; i < g.workers(); ++i) {
    absl::StatusOr<int> code = g.Wait(i, absl::Seconds(60));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
  }
}

// A DistributedOptimizer on worker0 steps the weights where they live (SGD
// with momentum, two iterations): each owner's weight equals the local
// functional step applied to that owner's gradients.
TEST(MultiProcessDistAutograd, DistributedOptimizerStepsOwnersWeights) {
  Group g;
  absl::Status started = g.Start(3);
  ASSERT_TRUE(started.ok()) << started;
  std::vector<rref::RRef<Tensor>> params;
  for (int r = 1; r <= 2; ++r) {
    auto p = g.agent().rpc_sync<rref::RRef<Tensor>>(r, "param_rref");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->owner().id, r);
    params.push_back(*p);
  }
  const optim::SgdOptions sgd{.lr = 0.1, .momentum = 0.9};
  auto opt = optim::DistributedOptimizer::Create(g.agent(), sgd, params);
  ASSERT_TRUE(opt.ok()) << opt.status();

  std::vector<Tensor> expected;  // The local replay of each owner's steps.
  for (int r = 1; r <= 2; ++r) {
    auto w = g.agent().rpc_sync<Tensor>(r, "weight");
    ASSERT_TRUE(w.ok()) << w.status();
    expected.push_back(*w);
  }
  std::vector<optim::SgdState> states(2);
  Tensor x = Leaf(-1), w0 = Leaf(0);
  for (int it = 0; it < 2; ++it) {
    ContextScope ctx(g.dist());
    Tensor h = Layer0(x, w0);
    auto y = g.agent().rpc_sync<Tensor>("worker1", "layer1", h);
    ASSERT_TRUE(y.ok()) << y.status();
    absl::Status s = g.dist().Backward(ctx.id(), {Loss(h, *y)});
    ASSERT_TRUE(s.ok()) << s;
    const int64_t id = static_cast<int64_t>(ctx.id().value());
    for (int r = 1; r <= 2; ++r) {
      auto grad = g.agent().rpc_sync<Tensor>(r, "grad", id);
      ASSERT_TRUE(grad.ok()) << grad.status();
      std::vector<Tensor> p = {expected[r - 1]};
      ASSERT_TRUE(optim::SgdStep(p, {*grad}, states[r - 1], sgd).ok());
    }
    s = (*opt)->Step(ctx.id());
    ASSERT_TRUE(s.ok()) << s;
  }
  for (int r = 1; r <= 2; ++r) {
    auto w = g.agent().rpc_sync<Tensor>(r, "weight");
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(w->allclose(expected[r - 1], 1e-12, 1e-14)) << "worker" << r;
    EXPECT_FALSE(w->allclose(Leaf(r), 1e-6)) << "worker" << r << " unchanged";
  }
  opt->reset();
  params.clear();
  ASSERT_TRUE(g.rrefs().Shutdown(absl::Seconds(60)).ok());
  for (size_t i = 0; i < g.workers(); ++i) {
    absl::StatusOr<int> code = g.Wait(i, absl::Seconds(60));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
  }
}

}  // namespace
}  // namespace ferry::dist_autograd_test
