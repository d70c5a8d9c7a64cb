#include "ferry/c10d/backend.h"

#include <atomic>
#include <memory>
#include <thread>

#include "ferry/c10d/reduce.h"
#include "ferry/c10d/registry.h"
#include "ferry/c10d/work.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"

namespace ferry {
namespace c10d {
namespace {

using ::testing::HasSubstr;

TEST(WorkTest, CompletesOnceAndReportsStatus) {
  Work w("test op");
  EXPECT_FALSE(w.IsCompleted());
  EXPECT_FALSE(w.IsSuccess());
  EXPECT_TRUE(w.status().ok());
  absl::Status waited = w.Wait(absl::Milliseconds(10));
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited)) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("test op"));
  EXPECT_TRUE(w.Complete(absl::InternalError("boom")));
  EXPECT_FALSE(w.Complete(absl::OkStatus()));
  EXPECT_TRUE(w.IsCompleted());
  EXPECT_FALSE(w.IsSuccess());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(w.Wait().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(w.GetFuture().status().code(), absl::StatusCode::kInternal);
}

TEST(WorkTest, FutureCallbackRunsOnCompletion) {
  auto w = std::make_shared<Work>("op");
  std::atomic<bool> ran{false};
  w->GetFuture().OnComplete([&](const absl::Status& s) {
    EXPECT_TRUE(s.ok());
    ran = true;
  });
  std::thread t([w] { w->Complete(absl::OkStatus()); });
  EXPECT_TRUE(w->Wait(absl::Seconds(10)).ok());
  t.join();
  EXPECT_TRUE(ran);
  EXPECT_TRUE(w->IsSuccess());
}

// A Work whose backend finishes it from Wait's poll (as the nccl backend does
// once the operation's CUDA event has completed), after `polls_needed`
// polls, or never (-1).
class PolledWork : public Work {
 public:
  explicit PolledWork(int polls_needed)
      : Work("polled op"), polls_needed_(polls_needed) {}
  int polls() const { return polls_; }
  absl::Duration last_budget() const { return last_budget_; }

 protected:
  void PollBeforeBlocking(absl::Duration budget) override {
    ++polls_;
    last_budget_ = budget;
    if (polls_ == polls_needed_) Complete(absl::OkStatus());
  }

 private:
  const int polls_needed_;
  int polls_ = 0;
  absl::Duration last_budget_;
};

TEST(WorkTest, WaitLetsTheBackendFinishTheWorkOnTheWaitingThread) {
  auto w = std::make_shared<PolledWork>(1);
  std::atomic<bool> ran_here{false};
  const std::thread::id me = std::this_thread::get_id();
  w->GetFuture().OnComplete([&](const absl::Status&) {
    ran_here = std::this_thread::get_id() == me;
  });
  // No other thread completes it: only the poll can.
  EXPECT_TRUE(w->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(w->polls(), 1);
  EXPECT_EQ(w->last_budget(), absl::Seconds(10));
  EXPECT_TRUE(ran_here);
  // Complete already: Wait neither polls nor blocks again.
  EXPECT_TRUE(w->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(w->polls(), 1);
}

TEST(WorkTest, WaitThatThePollDoesNotFinishStillTimesOut) {
  PolledWork w(-1);
  absl::Status s = w.Wait(absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("polled op"));
  EXPECT_EQ(w.polls(), 1);
}

class NothingBackend : public Backend {
 public:
  NothingBackend(int rank, int size)
      : Backend("nothing", rank, size, absl::Seconds(1)) {}
};

TEST(BackendTest, DefaultsAreUnimplementedNamingBackendAndOp) {
  NothingBackend b(0, 2);
  struct Case {
    std::shared_ptr<Work> work;
    const char* op;
  };
  Tensor t = zeros({2});
  std::vector<Case> cases = {
      {b.Allreduce(t), "Allreduce"},
      {b.Broadcast(t), "Broadcast"},
      {b.Reduce(t), "Reduce"},
      {b.Allgather({t, t}, t), "Allgather"},
      {b.Gather({t, t}, t), "Gather"},
      {b.Scatter(t, {t, t}), "Scatter"},
      {b.ReduceScatter(t, {t, t}), "ReduceScatter"},
      {b.Alltoall({t, t}, {t, t}), "Alltoall"},
      {b.Barrier(), "Barrier"},
      {b.Send(t, 1), "Send"},
      {b.Recv(t, 1), "Recv"},
  };
  for (const Case& c : cases) {
    ASSERT_NE(c.work, nullptr);
    EXPECT_TRUE(c.work->IsCompleted());
    absl::Status s = c.work->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << c.op;
    EXPECT_THAT(std::string(s.message()), HasSubstr("'nothing'"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.op));
  }
}

TEST(BackendTest, ArgumentChecks) {
  EXPECT_TRUE(CheckTensor(OpType::kAllreduce, zeros({2, 2}), "t").ok());
  EXPECT_EQ(CheckTensor(OpType::kAllreduce, Tensor(), "t").code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status nc = CheckTensor(OpType::kAllreduce, zeros({2, 3}).t(), "t");
  EXPECT_EQ(nc.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nc.message()), HasSubstr("contiguous"));
  EXPECT_THAT(
      std::string(CheckRank(OpType::kBroadcast, 3, 2, "root").message()),
      HasSubstr("root 3 is not in [0, 2)"));
  EXPECT_TRUE(CheckRank(OpType::kBroadcast, 1, 2, "root").ok());
  Tensor like = zeros({3});
  EXPECT_TRUE(CheckTensorList(OpType::kAllgather, {zeros({3}), zeros({3})}, 2,
                              like, "outputs")
                  .ok());
  EXPECT_THAT(std::string(CheckTensorList(OpType::kAllgather, {zeros({3})}, 2,
                                          like, "outputs")
                              .message()),
              HasSubstr("has 1 tensors, expected 2"));
  EXPECT_THAT(
      std::string(CheckTensorList(OpType::kAllgather, {zeros({3}), zeros({4})},
                                  2, like, "outputs")
                      .message()),
      HasSubstr("outputs[1]"));
  EXPECT_EQ(
      CheckReduceOp(OpType::kAllreduce, ReduceOp::kAvg, DType::kInt32).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckReduceOp(OpType::kAllreduce, ReduceOp::kBxor, DType::kFloat32)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      CheckReduceOp(OpType::kAllreduce, ReduceOp::kBxor, DType::kBool).ok());
}

// The per-operation checks every backend shares: rank 1 of 2, CUDA-only
// (so a CPU tensor shows the device check without needing a GPU).
TEST(BackendTest, SharedArgChecksPerOperation) {
  const ArgChecks cuda("nccl", DeviceType::kCUDA, /*rank=*/1, /*size=*/2);
  absl::Status device = cuda.One(OpType::kAllreduce, zeros({2}), "tensor");
  EXPECT_EQ(device.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(device.message()),
              HasSubstr("the nccl backend takes CUDA tensors, tensor is on"));

  const ArgChecks cpu("gloo", DeviceType::kCPU, /*rank=*/1, /*size=*/2);
  EXPECT_TRUE(cpu.One(OpType::kAllreduce, zeros({2}), "tensor").ok());
  EXPECT_THAT(
      std::string(
          cpu.Rooted(OpType::kBroadcast, zeros({2}), "tensor", 2).message()),
      HasSubstr("root 2 is not in [0, 2)"));
  const std::vector<Tensor> two = {zeros({2}), zeros({2})};
  EXPECT_TRUE(
      cpu.WithList(OpType::kAllgather, zeros({2}), "input", two, "outputs")
          .ok());
  // Gather: the root passes `size` outputs, everyone else none.
  EXPECT_TRUE(cpu.RootedWithList(OpType::kGather, zeros({2}), "input", 1, two,
                                 "outputs")
                  .ok());
  EXPECT_THAT(std::string(cpu.RootedWithList(OpType::kGather, zeros({2}),
                                             "input", 0, two, "outputs")
                              .message()),
              HasSubstr("outputs (non-root)"));
  EXPECT_THAT(std::string(cpu.Alltoall(two, {}).message()),
              HasSubstr("inputs has 0 tensors, expected 2"));
  EXPECT_TRUE(cpu.Alltoall(two, two).ok());
  EXPECT_THAT(
      std::string(cpu.PointToPoint(OpType::kSend, zeros({2}), 1, 0).message()),
      HasSubstr("destination is this rank"));
  EXPECT_THAT(
      std::string(cpu.PointToPoint(OpType::kRecv, zeros({2}), 0, -1).message()),
      HasSubstr("tag -1 is negative"));
  EXPECT_TRUE(cpu.PointToPoint(OpType::kRecv, zeros({2}), 0, 3).ok());
}

TEST(ReduceTest, KernelsPerDtypeAndOp) {
  Tensor a = from_vector<int32_t>({1, 6, -3});
  Tensor b = from_vector<int32_t>({4, 2, 5});
  struct Case {
    ReduceOp op;
    std::vector<int32_t> want;
  };
  for (const Case& c : std::vector<Case>{
           {ReduceOp::kSum, {5, 8, 2}},
           {ReduceOp::kProduct, {4, 12, -15}},
           {ReduceOp::kMin, {1, 2, -3}},
           {ReduceOp::kMax, {4, 6, 5}},
           {ReduceOp::kBand, {0, 2, 5}},
           {ReduceOp::kBor, {5, 6, -3}},
           {ReduceOp::kBxor, {5, 4, -8}},
       }) {
    Tensor acc = a.clone();
    ASSERT_TRUE(ReduceInto(acc, b, c.op).ok()) << ReduceOpName(c.op);
    EXPECT_EQ(acc.to_vector<int32_t>(), c.want) << ReduceOpName(c.op);
  }
  Tensor wrap = from_vector<int8_t>({127});
  ASSERT_TRUE(ReduceInto(wrap, from_vector<int8_t>({1}), ReduceOp::kSum).ok());
  EXPECT_EQ(wrap.to_vector<int8_t>()[0], -128);

  Tensor h = ones({3}, DType::kFloat16);
  ASSERT_TRUE(
      ReduceInto(h, full({3}, 2.0, DType::kFloat16), ReduceOp::kSum).ok());
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{3, 3, 3}));
  FinishAverage(h, 3);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{1, 1, 1}));

  Tensor t = from_vector<bool>({true, false, true});
  ASSERT_TRUE(
      ReduceInto(t, from_vector<bool>({true, false, false}), ReduceOp::kProduct)
          .ok());
  EXPECT_EQ(t.to_vector<bool>(), (std::vector<bool>{true, false, false}));

  EXPECT_FALSE(GetReduceFn(DType::kFloat64, ReduceOp::kBand).ok());
  EXPECT_FALSE(GetReduceFn(DType::kInt64, ReduceOp::kAvg).ok());
  EXPECT_FALSE(ReduceInto(t, zeros({3}), ReduceOp::kSum).ok());
}

TEST(RegistryTest, RegisterCreateAndErrors) {
  BackendRegistry registry;
  EXPECT_TRUE(registry.Names().empty());
  auto factory =
      [](const BackendConfig& c) -> absl::StatusOr<std::unique_ptr<Backend>> {
    return std::make_unique<NothingBackend>(c.rank, c.size);
  };
  ASSERT_TRUE(registry.RegisterBackend("nothing", factory).ok());
  EXPECT_EQ(registry.RegisterBackend("nothing", factory).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.RegisterBackend("", factory).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterBackend("a:b", factory).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterBackend("x", nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterBackend("y", factory, {}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      registry
          .RegisterBackend("broken",
                           [](const BackendConfig&)
                               -> absl::StatusOr<std::unique_ptr<Backend>> {
                             return absl::UnavailableError("no network");
                           },
                           {DeviceType::kCPU, DeviceType::kCUDA})
          .ok());
  EXPECT_TRUE(registry.IsRegistered("nothing"));
  EXPECT_FALSE(registry.IsRegistered("gloo"));
  EXPECT_EQ(registry.Names(), (std::vector<std::string>{"broken", "nothing"}));
  EXPECT_EQ(registry.Devices("broken").value().size(), 2u);

  BackendConfig config;
  config.store = std::make_shared<HashStore>();
  config.rank = 1;
  config.size = 3;
  auto made = registry.Create("nothing", config);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ((*made)->rank(), 1);
  EXPECT_EQ((*made)->size(), 3);

  auto unknown = registry.Create("mpi", config);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown backend 'mpi'; registered backends: broken, "
                        "nothing"));
  auto broken = registry.Create("broken", config);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr("'broken'"));
}

}  // namespace
}  // namespace c10d
}  // namespace ferry
