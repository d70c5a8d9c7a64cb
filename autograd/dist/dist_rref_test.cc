// Distributed autograd through the RRef layer: remote() arguments, to_here()
// fetches and a remote object's method are recorded like calls, because
// they are Messages through the same interceptors.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/ops.h"
#include "ferry/common/status.h"
#include "gtest/gtest.h"
#include "ferry/rpc/testing/in_process.h"
#include "ferry/rref/rref.h"

namespace ferry::autograd::dist {
namespace {

using rref::RRef;
using rref::RRefContext;

constexpr absl::Duration kWait = absl::Seconds(20);

Tensor Param(const std::vector<int64_t>& sizes, uint64_t seed) {
  Tensor t = randn(sizes, seed, DType::kFloat64);
  SetRequiresGrad(t);
  return t;
}

Tensor Copy(const Tensor& t) {
  Tensor c = Detach(t).clone();
  SetRequiresGrad(c);
  return c;
}

// A remote object holding its own parameter.
class Net {
 public:
  explicit Net(int64_t seed) : w_(Param({3, 2}, seed)) {}
  Tensor Forward(Tensor x) { return tanh(matmul(x, w_)); }
  // Fetches its input from wherever `input` lives, then runs Forward.
  absl::StatusOr<Tensor> ForwardFetched(RRef<Tensor> input) {
    absl::StatusOr<Tensor> x = input.to_here(kWait);
    if (!x.ok()) return x.status();
    return Forward(*x);
  }
  const Tensor& weight() const { return w_; }

 private:
  Tensor w_;
};

// In-process workers with distributed autograd, RRefs and class Net.
struct Workers {
  explicit Workers(std::vector<std::string> names) : net(std::move(names)) {}
  absl::Status Install() {
    for (int i = 0; i < net.size(); ++i) {
      ASSIGN_OR_RETURN(auto d, DistAutogradContainer::Install(net.agent(i)));
      dist.push_back(d);
      ASSIGN_OR_RETURN(auto r, RRefContext::Install(net.agent(i)));
      rrefs.push_back(r);
      r->classes()
          .RegisterClass<Net>("Net")
          .Constructor<int64_t>()
          .Method("forward", &Net::Forward)
          .Method("forward_fetched", &Net::ForwardFetched);
    }
    return absl::OkStatus();
  }
  rpc::testing::InProcessNetwork net;
  std::vector<std::shared_ptr<DistAutogradContainer>> dist;
  std::vector<std::shared_ptr<RRefContext>> rrefs;
};

TEST(DistAutogradRRef, ToHereAndRemoteMethodGradientsEqualSingleProcess) {
  Workers w({"a", "b"});
  ASSERT_TRUE(w.Install().ok());
  rpc::testing::InProcessNetwork& net = w.net;
  auto& dist = w.dist;
  auto& rrefs = w.rrefs;
  Tensor wv = Param({2, 3}, 61);
  ASSERT_TRUE(
      net.agent(1).Register("make", [&](Tensor x) { return mul(x, wv); }).ok());
  Tensor x = Param({2, 3}, 62);

  // The same model in one process.
  Tensor rx = Copy(x), rwv = Copy(wv), rw = Copy(Net(63).weight());
  ASSERT_TRUE(Backward({sum(tanh(matmul(mul(rx, rwv), rw)))}).ok());

  {
    ContextScope ctx(*dist[0]);
    RRef<Tensor> made = rref::remote<Tensor>(*rrefs[0], "b", "make", x);
    absl::StatusOr<Tensor> t = made.to_here(kWait);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(RequiresGrad(*t));
    RRef<Net> model = rref::remote<Net>(*rrefs[0], "b", "Net", int64_t{63});
    absl::StatusOr<Tensor> y =
        model.rpc_sync(kWait).call<Tensor>("forward", *t);
    ASSERT_TRUE(y.ok()) << y.status();
    absl::Status s = dist[0]->Backward(ctx.id(), {sum(*y)});
    ASSERT_TRUE(s.ok()) << s;

    GradientMap ga = *dist[0]->GetGradients(ctx.id());
    Tensor gx = ga.Get(x);
    ASSERT_TRUE(gx.defined());
    EXPECT_TRUE(gx.allclose(GradOf(rx), 1e-9, 1e-12));
    GradientMap gb = *dist[1]->GetGradients(ctx.id());
    Tensor gwv = gb.Get(wv);
    ASSERT_TRUE(gwv.defined());
    EXPECT_TRUE(gwv.allclose(GradOf(rwv), 1e-9, 1e-12));
    // b's other leaf is the Net's weight.
    ASSERT_EQ(gb.size(), 2u);
    bool found = false;
    for (const auto& [leaf, grad] : gb.entries()) {
      if (leaf.sizes() == std::vector<int64_t>{3, 2}) {
        found = true;
        EXPECT_TRUE(grad.allclose(GradOf(rw), 1e-9, 1e-12));
      }
    }
    EXPECT_TRUE(found) << "no gradient for the remote Net's weight";
  }
  for (int i = 0; i < 2; ++i) EXPECT_EQ(dist[i]->NumContexts(), 0u) << i;
}

// Three workers: a has b compute t = x * wv (remote(), b keeps t), creates a
// Net on c and passes it the RRef to t; c's method fetches t from b
// (to_here inside the context, served on c's behalf) and applies the Net.
// Gradients reach x on a, wv on b and the Net's weight on c, equal to the
// single-process ones; the release leaves no context on any worker.
TEST(DistAutogradRRef, ThreeWorkersRRefForwardedToARemoteObject) {
  Workers w({"a", "b", "c"});
  ASSERT_TRUE(w.Install().ok());
  rpc::testing::InProcessNetwork& net = w.net;
  auto& dist = w.dist;
  auto& rrefs = w.rrefs;
  Tensor wv = Param({2, 3}, 71);
  ASSERT_TRUE(
      net.agent(1).Register("make", [&](Tensor x) { return mul(x, wv); }).ok());
  Tensor x = Param({2, 3}, 72);

  Tensor rx = Copy(x), rwv = Copy(wv), rw = Copy(Net(73).weight());
  ASSERT_TRUE(Backward({sum(mul(tanh(matmul(mul(rx, rwv), rw)), 2.0))}).ok());

  {
    ContextScope ctx(*dist[0]);
    RRef<Tensor> made = rref::remote<Tensor>(*rrefs[0], "b", "make", x);
    RRef<Net> model = rref::remote<Net>(*rrefs[0], "c", "Net", int64_t{73});
    absl::StatusOr<Tensor> y =
        model.rpc_sync(kWait).call<Tensor>("forward_fetched", made);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(RequiresGrad(*y));
    absl::Status s = dist[0]->Backward(ctx.id(), {sum(mul(*y, 2.0))});
    ASSERT_TRUE(s.ok()) << s;

    Tensor gx = dist[0]->GetGradients(ctx.id())->Get(x);
    ASSERT_TRUE(gx.defined());
    EXPECT_TRUE(gx.allclose(GradOf(rx), 1e-9, 1e-12));
    Tensor gwv = dist[1]->GetGradients(ctx.id())->Get(wv);
    ASSERT_TRUE(gwv.defined());
    EXPECT_TRUE(gwv.allclose(GradOf(rwv), 1e-9, 1e-12));
    GradientMap gc = *dist[2]->GetGradients(ctx.id());
    ASSERT_EQ(gc.size(), 1u);  // The Net's weight, c's only leaf.
    EXPECT_TRUE(gc.entries()[0].second.allclose(GradOf(rw), 1e-9, 1e-12));
    ASSERT_TRUE(ctx.Release(kWait).ok());
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(dist[i]->NumContexts(), 0u) << i;
}

}  // namespace
}  // namespace ferry::autograd::dist
