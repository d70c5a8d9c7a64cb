#include "ferry/worker/worker.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "ferry/common/poll.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/tensor/tensor.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

const rpc::RemoteFunction<int64_t(int64_t, int64_t)> kAdd("add");
const rpc::RemoteFunction<Tensor(Tensor)> kScale("scale");
const rpc::RemoteFunction<std::vector<double>(int64_t)> kGradOfParam(
    "grad_of_param");

std::string FreshFile(const std::string& tag) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path =
      absl::StrCat(dir ? dir : "/tmp", "/worker_test_", tag, "_", getpid());
  std::remove(path.c_str());
  return "file://" + path;
}

// The ids of this process's threads.
std::set<std::string> ThreadIds() {
  std::set<std::string> ids;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return ids;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ids.insert(e->d_name);
  }
  closedir(d);
  return ids;
}

// Threads that exist now and did not exist in `before`. A thread left
// over from an earlier test may exit meanwhile (that is not this test's
// concern), and a joined thread can stay listed in /proc for a moment
// after its join returns, so callers wait (bounded) for this to empty.
std::set<std::string> NewThreads(const std::set<std::string>& before) {
  std::set<std::string> added;
  for (const std::string& id : ThreadIds()) {
    if (!before.contains(id)) added.insert(id);
  }
  return added;
}

// True once every thread started since `before` has gone, within 10 s.
testing::AssertionResult NoThreadLeftSince(
    const std::set<std::string>& before) {
  if (PollUntil([&] { return NewThreads(before).empty(); },
                absl::Seconds(10))) {
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure()
         << NewThreads(before).size() << " thread(s) started by the call "
         << "still run 10 s later: " << absl::StrJoin(NewThreads(before), ",");
}

TEST(InitWorker, OneWorkerCallsItselfThroughATypedHandle) {
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  ASSERT_TRUE(
      registry->Register(kAdd, [](int64_t a, int64_t b) { return a + b; })
          .ok());
  WorkerOptions o;
  o.name = "solo";
  o.init_method = FreshFile("solo");
  o.rank = 0;
  o.world_size = 1;
  o.registry = registry;
  absl::StatusOr<std::unique_ptr<Worker>> w = InitWorker(o);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->name(), "solo");
  EXPECT_EQ((*w)->rank(), 0);
  EXPECT_EQ((*w)->world_size(), 1);
  Result<int64_t> sum = (*w)->rpc_sync("solo", kAdd, 2, 3);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 5);
  const WorkerStats stats = (*w)->stats();
  EXPECT_GE(stats.calls_out, 1u);
  EXPECT_GE(stats.calls_in, 1u);
  EXPECT_TRUE((*w)->Shutdown().ok());
  EXPECT_EQ((*w)->Shutdown().code(), absl::StatusCode::kFailedPrecondition);
}

// Two workers of one group (threads of this process): a typed call, an RRef
// made with remote() and fetched, and a distributed backward pass whose
// gradient lands on the worker that owns the parameter.
TEST(InitWorker, TwoWorkersCallRemoteAndRunADistributedBackward) {
  const std::string init = FreshFile("pair");
  // The parameter lives on w1 (w0 serves the same functions, unused).
  Tensor param = full({2}, 3.0);
  autograd::SetRequiresGrad(param);
  std::vector<std::unique_ptr<Worker>> workers(2);
  std::vector<absl::Status> started(2);
  // Each worker its own registry, as in separate processes (the optimizer
  // service registers its functions into it). The gradient lookup runs on
  // w1 only after InitWorker returned there.
  auto make_registry = [&](int r) {
    auto registry = std::make_shared<rpc::FunctionRegistry>();
    EXPECT_TRUE(
        registry->Register(kAdd, [](int64_t a, int64_t b) { return a + b; })
            .ok());
    EXPECT_TRUE(
        registry
            ->Register(kScale,
                       [param](Tensor x) { return autograd::mul(x, param); })
            .ok());
    EXPECT_TRUE(
        registry
            ->Register(
                kGradOfParam,
                [&workers, r, param](
                    int64_t context) -> absl::StatusOr<std::vector<double>> {
                  ASSIGN_OR_RETURN(
                      autograd::dist::GradientMap g,
                      workers[r]->dist_autograd().GetGradients(
                          GlobalId::FromValue(static_cast<uint64_t>(context))));
                  Tensor grad = g.Get(param);
                  if (!grad.defined()) {
                    return absl::NotFoundError("no gradient");
                  }
                  return std::vector<double>{grad.data<float>()[0],
                                             grad.data<float>()[1]};
                })
            .ok());
    return registry;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      WorkerOptions o;
      o.name = absl::StrCat("w", r);
      o.init_method = init;
      o.rank = r;
      o.world_size = 2;
      o.registry = make_registry(r);
      o.join_timeout = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<Worker>> w = InitWorker(std::move(o));
      started[r] = w.status();
      if (w.ok()) workers[r] = *std::move(w);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(started[0].ok()) << started[0];
  ASSERT_TRUE(started[1].ok()) << started[1];
  Worker& w0 = *workers[0];

  Result<int64_t> sum = w0.rpc_sync("w1", kAdd, 40, 2);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 42);

  {
    rref::RRef<int64_t> r = w0.remote("w1", kAdd, 7, 8);
    Result<int64_t> fetched = r.to_here();
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(*fetched, 15);
  }

  {
    autograd::dist::ContextScope ctx(w0.dist_autograd());
    Tensor x = full({2}, 1.0);
    x.data<float>()[1] = 2.0f;
    Result<Tensor> y = w0.rpc_sync("w1", kScale, x);
    ASSERT_TRUE(y.ok()) << y.status();
    ASSERT_TRUE(
        w0.dist_autograd().Backward(ctx.id(), {autograd::sum(*y)}).ok());
    // d(sum(x * p))/dp = x, accumulated in the context on w1.
    Result<std::vector<double>> g =
        w0.rpc_sync("w1", kGradOfParam, static_cast<int64_t>(ctx.id().value()));
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(*g, (std::vector<double>{1.0, 2.0}));
  }

  std::vector<absl::Status> ended(2);
  threads.clear();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { ended[r] = workers[r]->Shutdown(); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(ended[0].ok()) << ended[0];
  EXPECT_TRUE(ended[1].ok()) << ended[1];
}

TEST(InitWorker, BadOptionsAreNamedAndNothingStarts) {
  const std::set<std::string> threads_before = ThreadIds();
  struct Case {
    std::string what;
    std::function<void(WorkerOptions&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"empty name", [](WorkerOptions& o) { o.name = ""; },
       "WorkerOptions::name is empty"},
      {"init method", [](WorkerOptions& o) { o.init_method = "udp://x"; },
       "WorkerOptions::init_method 'udp://x'"},
      {"rank outside",
       [](WorkerOptions& o) {
         o.rank = 2;
         o.world_size = 2;
       },
       "WorkerOptions::rank 2 is outside world_size 2"},
      {"negative rank", [](WorkerOptions& o) { o.rank = -5; },
       "WorkerOptions::rank -5"},
      {"zero world", [](WorkerOptions& o) { o.world_size = 0; },
       "WorkerOptions::world_size 0"},
      {"join with rank",
       [](WorkerOptions& o) {
         o.join = true;
         o.rank = 1;
       },
       "WorkerOptions::join with rank 1"},
      {"threads", [](WorkerOptions& o) { o.num_worker_threads = 0; },
       "WorkerOptions::num_worker_threads 0"},
  };
  for (const Case& c : cases) {
    WorkerOptions o;
    o.name = "bad";
    o.init_method = FreshFile("bad");
    o.rank = 0;
    o.world_size = 1;
    c.edit(o);
    absl::StatusOr<std::unique_ptr<Worker>> w = InitWorker(o);
    ASSERT_FALSE(w.ok()) << c.what;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(w.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << w.status();
  }
  EXPECT_TRUE(NoThreadLeftSince(threads_before));
}

TEST(InitWorker, AGroupThatNeverFormsFailsAndLeavesNoThreadBehind) {
  const std::set<std::string> threads_before = ThreadIds();
  WorkerOptions o;
  o.name = "lonely";
  o.init_method = FreshFile("lonely");
  o.rank = 0;
  o.world_size = 2;  // Rank 1 never comes.
  o.join_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<Worker>> w = InitWorker(o);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded)
      << w.status();
  EXPECT_TRUE(NoThreadLeftSince(threads_before));
}

}  // namespace
}  // namespace ferry
