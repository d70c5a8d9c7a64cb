// DDP over real Gloo with ranks as threads of this process meeting through
// one HashStore. Float64 models make "same as one process" checks tight.
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/autograd/engine.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/gloo/gloo_backend.h"
#include "ferry/c10d/process_group.h"
#include "ferry/common/sync.h"
#include "ferry/ddp/distributed_data_parallel.h"
#include "ferry/ddp/optimizer_in_backward.h"
#include "ferry/ddp/test_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/optim/optim.h"
#include "ferry/store/hash_store.h"
#include "ferry/tests/util/run_ranks.h"

namespace ferry::ddp {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);
// Tolerance for float64 DDP vs one process: only summation order differs.
constexpr double kRtol = 1e-10;
constexpr double kAtol = 1e-12;

using Body = std::function<void(int rank, std::shared_ptr<c10d::ProcessGroup>)>;

// Runs body(rank, group) on `n` threads; `spec` names the backend.
void RunRanks(int n, const Body& body, absl::Duration timeout = kTimeout,
              std::shared_ptr<const c10d::BackendRegistry> registry = nullptr,
              const std::string& spec = "auto") {
  if (registry == nullptr) registry = c10d::MakeDefaultBackendRegistry();
  auto store = std::make_shared<HashStore>();
  testutil::RunRanks(
      n,
      [&](int r) {
        c10d::ProcessGroupOptions o;
        o.backend = spec;
        o.timeout = timeout;
        return c10d::ProcessGroup::Create(store, r, n, registry, o);
      },
      [&](int r, auto& pg) {
        ASSERT_TRUE(pg.ok()) << pg.status();
        body(r, *pg);
      });
}

using testutil::Inputs;
using testutil::kBatch;
using testutil::MakeMlp;
using testutil::Snapshot;
using testutil::SgdStep;
using testutil::Targets;

// Zeroes gradients in place (keeps bucket views attached).
void ZeroInPlace(nn::Module& m) {
  for (const Tensor& p : m.parameters()) {
    Tensor g = autograd::GradOf(p);
    if (g.defined()) g.zero_();
  }
}

constexpr int kSteps = 3;
constexpr double kLr = 0.1;

std::vector<Tensor> Reference(int world) {
  return testutil::TrainedReference(world, kSteps, kLr);
}

struct EquivalenceCase {
  int world;
  int64_t cap;  // Bucket cap in bytes (first bucket too).
  bool view;
};

class DdpEquivalenceTest : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(DdpEquivalenceTest, MatchesOneProcessOnConcatenatedBatch) {
  const EquivalenceCase c = GetParam();
  std::vector<std::vector<Tensor>> result(c.world);
  std::vector<size_t> buckets(c.world);
  RunRanks(c.world, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
    auto model = MakeMlp(100 + rank * 7);  // Differs until broadcast.
    DdpOptions o;
    o.first_bucket_bytes = c.cap;
    o.bucket_cap_bytes = c.cap;
    o.gradient_as_bucket_view = c.view;
    o.timeout = kTimeout;
    auto ddp = DistributedDataParallel::Create(model, pg, o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    buckets[rank] = (*ddp)->reducer().buckets().size();
    for (int step = 0; step < kSteps; ++step) {
      // Bucket views must survive both ways of clearing gradients.
      if (step % 2 == 0) {
        model->ZeroGrad();
      } else {
        ZeroInPlace(*model);
      }
      Tensor x =
          Inputs(step, c.world).slice(0, rank * kBatch, (rank + 1) * kBatch);
      Tensor y =
          Targets(step, c.world).slice(0, rank * kBatch, (rank + 1) * kBatch);
      Tensor loss = autograd::mse_loss((*ddp)->Forward(x), y);
      ASSERT_TRUE((*ddp)->Backward(loss).ok());
      if (c.view && c.cap >= 64) {
        // Every .grad is a view into the one bucket buffer.
        std::vector<Tensor> ps = model->parameters();
        for (const Tensor& p : ps) {
          EXPECT_TRUE(autograd::GradOf(p).storage().is_same(
              autograd::GradOf(ps[0]).storage()));
        }
      }
      SgdStep(*model, kLr);
    }
    EXPECT_EQ((*ddp)->reducer().passes(), kSteps);
    result[rank] = Snapshot(*model);
  });
  if (c.cap < 64) {
    EXPECT_EQ(buckets[0], 6u);  // One bucket per parameter.
  } else {
    EXPECT_EQ(buckets[0], 1u);
  }
  std::vector<Tensor> expected = Reference(c.world);
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(result[r].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(result[r][i].allclose(expected[i], kRtol, kAtol))
          << "rank " << r << " param " << i << "\n"
          << result[r][i] << "\nvs\n"
          << expected[i];
      // Every rank applies the same averaged gradient: identical bits.
      EXPECT_TRUE(result[r][i].equal(result[0][i])) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, DdpEquivalenceTest,
    ::testing::Values(EquivalenceCase{2, 1 << 30, false},
                      EquivalenceCase{2, 8, false},
                      EquivalenceCase{3, 1 << 30, true},
                      EquivalenceCase{3, 8, false}, EquivalenceCase{4, 8, true},
                      EquivalenceCase{4, 1 << 30, false}),
    [](const ::testing::TestParamInfo<EquivalenceCase>& info) {
      return "World" + std::to_string(info.param.world) +
             (info.param.cap < 64 ? "_ManyBuckets" : "_OneBucket") +
             (info.param.view ? "_View" : "_Copy");
    });

TEST(AssignBucketsTest, ReverseOrderSmallFirstBucketThenCap) {
  // Four float32 parameters of 40, 40, 40, 8 bytes.
  std::vector<Tensor> params = {zeros({10}), zeros({10}), zeros({10}),
                                zeros({2})};
  auto groups = AssignBuckets(params, {3, 2, 1, 0}, /*first_cap=*/48,
                              /*cap=*/80);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<int>{3, 2}));  // 48 bytes.
  EXPECT_EQ(groups[1], (std::vector<int>{1, 0}));  // 80 bytes.
  // A parameter above the cap sits alone; a dtype change closes a bucket.
  params.push_back(zeros({100}));
  params.push_back(zeros({1}, DType::kFloat64));
  groups = AssignBuckets(params, {5, 4, 3, 2}, 1 << 20, 1 << 20);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<int>{5}));
  EXPECT_EQ(groups[1], (std::vector<int>{4, 3, 2}));
}

// A backend wrapping Gloo that logs each Allreduce as it is issued.
class RecordingBackend : public c10d::Backend {
 public:
  RecordingBackend(std::unique_ptr<c10d::Backend> inner,
                   std::function<void()> on_allreduce)
      : Backend("recording", inner->rank(), inner->size(), inner->timeout()),
        inner_(std::move(inner)),
        on_allreduce_(std::move(on_allreduce)) {}
  std::shared_ptr<c10d::Work> Allreduce(
      Tensor t, const c10d::AllreduceOptions& o) override {
    on_allreduce_();
    return inner_->Allreduce(std::move(t), o);
  }
  std::shared_ptr<c10d::Work> Broadcast(
      Tensor t, const c10d::BroadcastOptions& o) override {
    return inner_->Broadcast(std::move(t), o);
  }
  std::shared_ptr<c10d::Work> Allgather(
      std::vector<Tensor> outs, Tensor in,
      const c10d::AllgatherOptions& o) override {
    return inner_->Allgather(std::move(outs), std::move(in), o);
  }

 private:
  std::unique_ptr<c10d::Backend> inner_;
  std::function<void()> on_allreduce_;
};

// Per-rank event log, appended from the backward thread.
struct EventLog {
  Mutex mu;
  std::vector<std::string> events ABSL_GUARDED_BY(mu);
  void Add(std::string e) {
    MutexLock l(&mu);
    events.push_back(std::move(e));
  }
  std::vector<std::string> Get() {
    MutexLock l(&mu);
    return events;
  }
};

TEST(DdpOverlapTest, FirstBucketAllreduceStartsBeforeBackwardEnds) {
  constexpr int kWorld = 2;
  EventLog logs[kWorld];
  auto registry = c10d::MakeDefaultBackendRegistry();
  ASSERT_TRUE(registry
                  ->RegisterBackend(
                      "recording",
                      [&logs](const c10d::BackendConfig& c)
                          -> absl::StatusOr<std::unique_ptr<c10d::Backend>> {
                        auto gloo = c10d::GlooBackend::Create(
                            c.store, c.rank, c.size, c.timeout);
                        if (!gloo.ok()) return gloo.status();
                        EventLog* log = &logs[c.rank];
                        return std::make_unique<RecordingBackend>(
                            *std::move(gloo), [log] { log->Add("allreduce"); });
                      })
                  .ok());
  std::vector<size_t> num_buckets(kWorld);
  RunRanks(
      kWorld,
      [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
        auto model = MakeMlp(100);
        DdpOptions o;
        o.first_bucket_bytes = 8;  // One bucket per parameter.
        o.bucket_cap_bytes = 8;
        auto ddp = DistributedDataParallel::Create(model, pg, o);
        ASSERT_TRUE(ddp.ok()) << ddp.status();
        num_buckets[rank] = (*ddp)->reducer().buckets().size();
        // The first layer's weight gets its gradient last in backward.
        EventLog* log = &logs[rank];
        autograd::RegisterHook(model->parameters()[0], [log](const Tensor&) {
          log->Add("first layer grad");
          return Tensor();
        });
        Tensor x =
            Inputs(0, kWorld).slice(0, rank * kBatch, (rank + 1) * kBatch);
        Tensor loss = autograd::mse_loss(
            (*ddp)->Forward(x),
            Targets(0, kWorld).slice(0, rank * kBatch, (rank + 1) * kBatch));
        ASSERT_TRUE((*ddp)->PrepareForBackward({loss}).ok());
        ASSERT_TRUE(autograd::Backward({loss}).ok());
        log->Add("backward returned");
        ASSERT_TRUE((*ddp)->FinishBackward().ok());
      },
      kTimeout, registry, "recording");
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> ev = logs[r].Get();
    auto first_grad = std::find(ev.begin(), ev.end(), "first layer grad");
    auto returned = std::find(ev.begin(), ev.end(), "backward returned");
    ASSERT_NE(first_grad, ev.end());
    ASSERT_NE(returned, ev.end());
    // Construction issues no all-reduce (verification all-gathers), so the
    // first all-reduce is bucket 0's; it precedes the last gradient.
    auto first_allreduce = std::find(ev.begin(), ev.end(), "allreduce");
    EXPECT_LT(first_allreduce - ev.begin(), first_grad - ev.begin());
    // Every bucket was launched during backward, none by Finish.
    EXPECT_EQ(std::count(ev.begin(), returned, std::string("allreduce")),
              static_cast<long>(num_buckets[r]));
    EXPECT_EQ(num_buckets[r], 6u);
  }
}

TEST(DdpTest, NoSyncAccumulatesLocallyThenReducesTheSum) {
  constexpr int kWorld = 2;
  for (bool view : {false, true}) {
    std::vector<std::vector<Tensor>> local(kWorld), synced(kWorld);
    std::vector<int64_t> bytes_after_local(kWorld);
    RunRanks(kWorld, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
      auto model = MakeMlp(100);
      DdpOptions o;
      o.gradient_as_bucket_view = view;
      auto ddp = DistributedDataParallel::Create(model, pg, o);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      for (int step = 0; step < 2; ++step) {
        Tensor x =
            Inputs(step, kWorld).slice(0, rank * kBatch, (rank + 1) * kBatch);
        Tensor y =
            Targets(step, kWorld).slice(0, rank * kBatch, (rank + 1) * kBatch);
        Tensor loss = autograd::mse_loss((*ddp)->Forward(x), y);
        if (step == 0) {
          auto guard = (*ddp)->NoSync();
          EXPECT_FALSE((*ddp)->require_grad_sync());
          ASSERT_TRUE((*ddp)->Backward(loss).ok());
          bytes_after_local[rank] = (*ddp)->reducer().bytes_reduced();
          for (const Tensor& p : model->parameters())
            local[rank].push_back(autograd::GradOf(p).clone());
        } else {
          EXPECT_TRUE((*ddp)->require_grad_sync());
          ASSERT_TRUE((*ddp)->Backward(loss).ok());
        }
      }
      for (const Tensor& p : model->parameters())
        synced[rank].push_back(autograd::GradOf(p).clone());
    });
    // Reference: both micro-batches of every rank, accumulated.
    const std::vector<Tensor> want = testutil::AccumulatedReference(kWorld, 2);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(bytes_after_local[r], 0) << "no_sync pass communicated";
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(synced[r][i].allclose(want[i], kRtol, kAtol))
            << "view " << view << " rank " << r << " param " << i;
      }
    }
    // The no_sync pass left each rank with its own, different gradient.
    EXPECT_FALSE(local[0][0].allclose(local[1][0]));
  }
}

// Three float64 parameters of 3 elements and per-rank inputs.
std::vector<std::pair<std::string, Tensor>> ThreeParams() {
  std::vector<std::pair<std::string, Tensor>> named;
  const char* names[] = {"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    Tensor t = from_vector<double>({1.0 + i, 2.0 - i, 0.5 * i});
    autograd::SetRequiresGrad(t);
    named.emplace_back(names[i], t);
  }
  return named;
}

TEST(DdpTest, FindUnusedParametersMarksUnreachedReady) {
  constexpr int kWorld = 2;
  std::vector<std::vector<Tensor>> grads(kWorld);
  std::vector<std::vector<Tensor>> values(kWorld);
  RunRanks(kWorld, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
    auto named = ThreeParams();
    DdpOptions o;
    o.find_unused_parameters = true;
    o.first_bucket_bytes = 8;
    o.bucket_cap_bytes = 8;
    auto ddp = DistributedDataParallel::Create(named, pg, o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    const Tensor& a = named[0].second;
    const Tensor& other = named[rank == 0 ? 1 : 2].second;  // b or c.
    for (int pass = 0; pass < 2; ++pass) {                  // Repeats cleanly.
      for (auto& [n, p] : named) autograd::SetGrad(p, Tensor());
      Tensor loss = autograd::sum(autograd::mul(a, other));
      ASSERT_TRUE((*ddp)->Backward(loss).ok());
    }
    for (auto& [n, p] : named) {
      grads[rank].push_back(autograd::GradOf(p));
      values[rank].push_back(p);
    }
  });
  // d(sum(a*b))/da = b; rank 0 uses (a, b), rank 1 (a, c).
  const std::vector<Tensor>& v = values[0];
  Tensor want_a = v[1].add(v[2]).div(2);
  Tensor want_b = v[0].div(2);
  Tensor want_c = v[0].div(2);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(grads[r][0].allclose(want_a, kRtol, kAtol)) << grads[r][0];
    EXPECT_TRUE(grads[r][1].allclose(want_b, kRtol, kAtol)) << grads[r][1];
    EXPECT_TRUE(grads[r][2].allclose(want_c, kRtol, kAtol)) << grads[r][2];
  }
}

TEST(DdpTest, SkippedParameterIsAnErrorAndOthersFailWithinTimeout) {
  constexpr int kWorld = 2;
  const absl::Duration timeout = absl::Seconds(3);
  absl::Status status[kWorld];
  absl::Status again[kWorld];
  absl::Duration elapsed[kWorld];
  RunRanks(
      kWorld,
      [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
        auto named = ThreeParams();
        DdpOptions o;
        o.first_bucket_bytes = 8;
        o.bucket_cap_bytes = 8;
        o.timeout = timeout;
        auto ddp = DistributedDataParallel::Create(named, pg, o);
        ASSERT_TRUE(ddp.ok()) << ddp.status();
        Tensor loss =
            autograd::sum(autograd::mul(named[0].second, named[1].second));
        if (rank == 0)  // Rank 1 leaves out c.
          loss = autograd::add(loss, autograd::sum(named[2].second));
        absl::Time start = absl::Now();
        status[rank] = (*ddp)->Backward(loss);
        elapsed[rank] = absl::Now() - start;
        again[rank] = (*ddp)->Backward(loss);
      },
      timeout);
  EXPECT_EQ(status[1].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status[1].message(), HasSubstr("'c' (2)"));
  EXPECT_THAT(status[1].message(), HasSubstr("rank 1"));
  EXPECT_THAT(status[1].message(), HasSubstr("find_unused_parameters"));
  EXPECT_FALSE(status[0].ok());
  EXPECT_LT(elapsed[0], timeout + absl::Seconds(10));
  for (int r = 0; r < kWorld; ++r)
    EXPECT_EQ(again[r].code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DdpTest, RankDeathFailsTheOthersWithinTimeout) {
  constexpr int kWorld = 3;
  const absl::Duration timeout = absl::Seconds(3);
  absl::Status status[kWorld];
  absl::Duration elapsed[kWorld];
  RunRanks(
      kWorld,
      [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
        auto model = MakeMlp(100);
        DdpOptions o;
        o.timeout = timeout;
        auto ddp = DistributedDataParallel::Create(model, pg, o);
        ASSERT_TRUE(ddp.ok()) << ddp.status();
        Tensor x =
            Inputs(0, kWorld).slice(0, rank * kBatch, (rank + 1) * kBatch);
        Tensor loss = autograd::mse_loss(
            model->Forward(x),
            Targets(0, kWorld).slice(0, rank * kBatch, (rank + 1) * kBatch));
        if (rank == 2) {  // Dies before backward: its group goes away.
          ddp->reset();
          pg.reset();
          return;
        }
        absl::Time start = absl::Now();
        status[rank] = (*ddp)->Backward(loss);
        elapsed[rank] = absl::Now() - start;
      },
      timeout);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(status[r].ok()) << "rank " << r;
    EXPECT_LT(elapsed[r], timeout + absl::Seconds(10)) << "rank " << r;
  }
}

// Fault tolerance (docs/design/ddp_quorum.md): after a rank dies, the
// survivors move their DDP onto a new group of two and train on; the new
// group's rank 0 parameters win.
TEST(DdpTest, ReconfigureOntoSurvivorsGroupContinues) {
  constexpr int kWorld = 3;
  const absl::Duration timeout = absl::Seconds(3);
  auto registry = c10d::MakeDefaultBackendRegistry();
  auto second_store = std::make_shared<HashStore>();
  absl::Status failed[kWorld], reconfigured[kWorld], again[kWorld];
  std::vector<std::vector<double>> params(kWorld), grads(kWorld);
  RunRanks(
      kWorld,
      [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
        auto model = MakeMlp(100 + rank);
        DdpOptions o;
        o.timeout = timeout;
        auto ddp = DistributedDataParallel::Create(model, pg, o);
        ASSERT_TRUE(ddp.ok()) << ddp.status();
        auto loss_of = [&](int step, int r, int world) {
          return autograd::mse_loss(
              model->Forward(
                  Inputs(step, world).slice(0, r * kBatch, (r + 1) * kBatch)),
              Targets(step, world).slice(0, r * kBatch, (r + 1) * kBatch));
        };
        if (rank == 2) {  // Dies: its group goes away.
          ddp->reset();
          pg.reset();
          return;
        }
        failed[rank] = (*ddp)->Backward(loss_of(0, rank, kWorld));
        // Rank 1's replica drifts: Reconfigure must restore rank 0's.
        if (rank == 1) {
          autograd::NoGradGuard no_grad;
          for (Tensor p : model->parameters()) p.add_(ones_like(p));
        }
        c10d::ProcessGroupOptions po;
        po.timeout = timeout;
        po.name = "gen2";
        auto pg2 = c10d::ProcessGroup::Create(second_store, rank, 2, registry,
                                              po);
        ASSERT_TRUE(pg2.ok()) << pg2.status();
        reconfigured[rank] = (*ddp)->Reconfigure(*pg2);
        for (const Tensor& p : model->parameters()) {
          Tensor g = autograd::GradOf(p);
          if (g.defined()) g.zero_();
        }
        again[rank] = (*ddp)->Backward(loss_of(1, rank, 2));
        for (const Tensor& p : model->parameters()) {
          for (double v : autograd::Detach(p).to_vector<double>())
            params[rank].push_back(v);
          for (double v : autograd::GradOf(p).to_vector<double>())
            grads[rank].push_back(v);
        }
        EXPECT_EQ(&(*ddp)->process_group(), pg2->get());
      },
      timeout);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(failed[r].ok()) << "rank " << r;
    EXPECT_TRUE(reconfigured[r].ok()) << "rank " << r << ": " << reconfigured[r];
    EXPECT_TRUE(again[r].ok()) << "rank " << r << ": " << again[r];
  }
  ASSERT_FALSE(params[0].empty());
  EXPECT_EQ(params[0], params[1]);  // Bit for bit: rank 0's broadcast.
  EXPECT_EQ(grads[0], grads[1]);    // Averaged over the two survivors.
}

TEST(DdpTest, BroadcastTensorsFromRoot) {
  RunRanks(2, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
    std::vector<Tensor> ts = {from_vector<double>({1.0 + rank, 2.0}),
                              from_vector<int64_t>({10 * (rank + 1)})};
    ASSERT_TRUE(BroadcastTensors(*pg, ts, 1, kTimeout).ok());
    EXPECT_EQ(ts[0].to_vector<double>(), (std::vector<double>{2.0, 2.0}));
    EXPECT_EQ(ts[1].to_vector<int64_t>(), (std::vector<int64_t>{20}));
  });
}

TEST(DdpTest, ShapeMismatchIsAnErrorOnEveryRank) {
  constexpr int kWorld = 3;
  absl::Status status[kWorld];
  absl::Status count_status[kWorld];
  RunRanks(kWorld, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
    std::vector<std::pair<std::string, Tensor>> named = {
        {"w0", zeros({4, 3}, DType::kFloat64)},
        {"w1", zeros(rank == 2 ? std::vector<int64_t>{3, 4}
                               : std::vector<int64_t>{4, 3},
                     DType::kFloat64)}};
    for (auto& [n, p] : named) autograd::SetRequiresGrad(p);
    status[rank] = DistributedDataParallel::Create(named, pg).status();
    if (rank == 1) named.pop_back();
    count_status[rank] = DistributedDataParallel::Create(named, pg).status();
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status[r].message(), HasSubstr("parameter 1 ('w1' here)"));
    EXPECT_THAT(status[r].message(),
                HasSubstr("rank 0 has float64 [4, 3], rank 2 has float64 "
                          "[3, 4]"));
    EXPECT_EQ(count_status[r].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(count_status[r].message(), HasSubstr("rank 1 has 1"));
  }
}

// Float32 parameter p of 1000 elements; loss sum(p * x_rank), so rank r's
// gradient is x_r exactly. Returns every rank's averaged gradient.
std::vector<Tensor> HookedGrads(int world, CommHook hook,
                                std::vector<int64_t>* bytes = nullptr) {
  std::vector<Tensor> grads(world);
  if (bytes != nullptr) bytes->assign(world, 0);
  RunRanks(world, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
    Tensor p = zeros({1000});
    autograd::SetRequiresGrad(p);
    DdpOptions o;
    o.comm_hook = hook;
    auto ddp = DistributedDataParallel::Create({{"p", p}}, pg, o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    Tensor x = randn({1000}, 50 + rank);
    ASSERT_TRUE((*ddp)->Backward(autograd::sum(autograd::mul(p, x))).ok());
    grads[rank] = autograd::GradOf(p);
    if (bytes != nullptr) (*bytes)[rank] = (*ddp)->reducer().bytes_reduced();
  });
  return grads;
}

Tensor MeanOfInputs(int world) {
  Tensor sum = zeros({1000});
  for (int r = 0; r < world; ++r) sum.add_(randn({1000}, 50 + r));
  return sum.div(world);
}

TEST(DdpCommHookTest, DefaultHookAverages) {
  for (const Tensor& g : HookedGrads(2, nullptr))
    EXPECT_TRUE(g.allclose(MeanOfInputs(2), 1e-6, 1e-7));
}

// Whether every element of `g` is within the rounding of a compressed
// all-reduce of two ranks: each x_r / 2 rounded, then their sum rounded,
// so |g - mean| <= eps * (|x_0| / 2 + |x_1| / 2 + |mean|) (plus slack for
// the float32 arithmetic), with eps the format's unit roundoff.
bool WithinRounding(const Tensor& g, double eps) {
  std::vector<float> got = g.to_vector<float>();
  std::vector<float> x0 = randn({1000}, 50).to_vector<float>();
  std::vector<float> x1 = randn({1000}, 51).to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) {
    const double mean = (double{x0[i]} + x1[i]) / 2;
    const double bound =
        eps * (std::abs(x0[i]) / 2.0 + std::abs(x1[i]) / 2.0 + std::abs(mean)) +
        1e-6;
    if (std::abs(got[i] - mean) > bound) return false;
  }
  return true;
}

TEST(DdpCommHookTest, Fp16AndBf16CompressionAreCloseButLossy) {
  const double fp16_eps = std::ldexp(1.0, -11);
  const double bf16_eps = std::ldexp(1.0, -8);
  const Tensor want = MeanOfInputs(2);
  std::vector<int64_t> bytes;
  for (const Tensor& g : HookedGrads(2, Fp16CompressHook(), &bytes)) {
    EXPECT_TRUE(WithinRounding(g, fp16_eps));
    EXPECT_FALSE(g.equal(want));  // It really went through float16.
  }
  EXPECT_EQ(bytes[0], 4000);  // Bucket bytes handed to the hook.
  for (const Tensor& g : HookedGrads(2, Bf16CompressHook())) {
    EXPECT_TRUE(WithinRounding(g, bf16_eps));
    EXPECT_FALSE(WithinRounding(g, fp16_eps));  // Coarser than float16.
  }
}

TEST(DdpCommHookTest, UserHookFutureDecidesTheGradient) {
  constexpr int kWorld = 3;
  std::atomic<int> calls{0};
  // Elementwise maximum over ranks instead of the mean.
  CommHook max_hook = [&calls](c10d::ProcessGroup& pg, const GradBucket& b) {
    calls.fetch_add(1);
    c10d::AllreduceOptions o;
    o.op = c10d::ReduceOp::kMax;
    Tensor buf = b.buffer;
    return pg.Allreduce(buf, o)->GetFuture().Then(
        [buf](const absl::Status& s) -> absl::StatusOr<Tensor> {
          if (!s.ok()) return s;
          return buf.clone();  // Not the buffer: the reducer copies it in.
        });
  };
  std::vector<Tensor> grads = HookedGrads(kWorld, max_hook);
  std::vector<float> want(1000, -1e30f);
  for (int r = 0; r < kWorld; ++r) {
    std::vector<float> x = randn({1000}, 50 + r).to_vector<float>();
    for (size_t i = 0; i < want.size(); ++i) want[i] = std::max(want[i], x[i]);
  }
  for (const Tensor& g : grads) EXPECT_TRUE(g.equal(from_vector(want)));
  EXPECT_EQ(calls.load(), kWorld);  // One bucket per rank.
}

TEST(DdpTest, BucketsRebuiltInReadyOrderAfterFirstPass) {
  constexpr int kWorld = 2;
  std::vector<std::vector<std::vector<int>>> before(kWorld), after(kWorld);
  RunRanks(kWorld, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
    auto named = ThreeParams();
    DdpOptions o;
    o.first_bucket_bytes = 8;
    o.bucket_cap_bytes = 8;
    auto ddp = DistributedDataParallel::Create(named, pg, o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    before[rank] = (*ddp)->reducer().buckets();
    // c is used first in forward, so its gradient is ready last; a first.
    const Tensor& a = named[0].second;
    const Tensor& b = named[1].second;
    const Tensor& c = named[2].second;
    for (int pass = 0; pass < 2; ++pass) {
      Tensor loss = autograd::sum(autograd::mul(
          a, autograd::tanh(autograd::mul(b, autograd::tanh(c)))));
      ASSERT_TRUE((*ddp)->Backward(loss).ok());
      if (pass == 0) after[rank] = (*ddp)->reducer().buckets();
    }
  });
  using Buckets = std::vector<std::vector<int>>;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(before[r], (Buckets{{2}, {1}, {0}}));  // Reverse registration.
    EXPECT_EQ(after[r], (Buckets{{0}, {1}, {2}}));   // Ready order.
  }
}

struct OptimCase {
  bool adam;
  bool view;
};

class DdpOptimizerInBackwardTest : public ::testing::TestWithParam<OptimCase> {
};

// Same parameters, bit for bit, as DDP followed by a separate step.
TEST_P(DdpOptimizerInBackwardTest, MatchesSeparateStep) {
  constexpr int kWorld = 2;
  const OptimCase c = GetParam();
  optim::SgdOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  optim::AdamOptions adam;
  adam.lr = 0.01;
  std::vector<Tensor> fused[kWorld], separate[kWorld];
  for (bool in_backward : {true, false}) {
    RunRanks(kWorld, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
      auto model = MakeMlp(100);
      const size_t n = model->parameters().size();
      DdpOptions o;
      o.first_bucket_bytes = 8;  // One bucket per parameter.
      o.bucket_cap_bytes = 8;
      o.gradient_as_bucket_view = c.view;
      if (in_backward) {
        o.optimizer_in_backward =
            c.adam ? AdamInBackward(adam, n) : SgdInBackward(sgd, n);
      }
      auto ddp = DistributedDataParallel::Create(model, pg, o);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      std::unique_ptr<optim::Optimizer> opt;
      if (c.adam) {
        opt = std::make_unique<optim::Adam>(model->parameters(), adam);
      } else {
        opt = std::make_unique<optim::SGD>(model->parameters(), sgd);
      }
      for (int step = 0; step < kSteps; ++step) {
        ZeroInPlace(*model);
        Tensor x =
            Inputs(step, kWorld).slice(0, rank * kBatch, (rank + 1) * kBatch);
        Tensor y =
            Targets(step, kWorld).slice(0, rank * kBatch, (rank + 1) * kBatch);
        Tensor loss = autograd::mse_loss((*ddp)->Forward(x), y);
        std::vector<Tensor> before = Snapshot(*model);
        ASSERT_TRUE((*ddp)->Backward(loss).ok());
        if (in_backward) {
          // The step already happened; .grad still holds the average.
          EXPECT_FALSE(model->parameters()[0].equal(before[0]));
          EXPECT_TRUE(autograd::GradOf(model->parameters()[0]).defined());
        } else {
          ASSERT_TRUE(opt->Step().ok());
        }
      }
      (in_backward ? fused : separate)[rank] = Snapshot(*model);
    });
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(fused[r].size(), separate[r].size());
    for (size_t i = 0; i < fused[r].size(); ++i)
      EXPECT_TRUE(fused[r][i].equal(separate[r][i]))
          << "rank " << r << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, DdpOptimizerInBackwardTest,
                         ::testing::Values(OptimCase{false, false},
                                           OptimCase{true, true}),
                         [](const ::testing::TestParamInfo<OptimCase>& info) {
                           return std::string(info.param.adam ? "Adam"
                                                              : "Sgd") +
                                  (info.param.view ? "_View" : "_Copy");
                         });

TEST(DdpTest, StaticGraphWithUnusedParametersRebuildsAndStaysCorrect) {
  constexpr int kWorld = 2;
  std::vector<std::vector<Tensor>> grads(kWorld), values(kWorld);
  std::vector<std::vector<std::vector<int>>> after(kWorld);
  RunRanks(kWorld, [&](int rank, std::shared_ptr<c10d::ProcessGroup> pg) {
    auto named = ThreeParams();
    DdpOptions o;
    o.find_unused_parameters = true;
    o.static_graph = true;
    o.first_bucket_bytes = 8;
    o.bucket_cap_bytes = 8;
    auto ddp = DistributedDataParallel::Create(named, pg, o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    // Rank 0 leaves out a, rank 1 leaves out c.
    const Tensor& x = named[rank == 0 ? 1 : 0].second;
    const Tensor& y = named[rank == 0 ? 2 : 1].second;
    for (int pass = 0; pass < 3; ++pass) {
      for (auto& [n, p] : named) autograd::SetGrad(p, Tensor());
      Tensor loss = autograd::sum(autograd::mul(x, y));
      ASSERT_TRUE((*ddp)->Backward(loss).ok());
      if (pass == 0) after[rank] = (*ddp)->reducer().buckets();
    }
    for (auto& [n, p] : named) {
      grads[rank].push_back(autograd::GradOf(p));
      values[rank].push_back(p);
    }
  });
  const std::vector<Tensor>& v = values[0];
  for (int r = 0; r < kWorld; ++r) {
    // Rebuilt from rank 0's ready order, which starts with its unused a
    // (marked at Prepare); reverse registration order started with c.
    EXPECT_EQ(after[r], after[0]);
    ASSERT_EQ(after[r].size(), 3u);
    EXPECT_EQ(after[r][0], std::vector<int>{0});
    // Rank 0: sum(b*c); rank 1: sum(a*b).
    EXPECT_TRUE(grads[r][0].allclose(v[1].div(2), kRtol, kAtol));
    EXPECT_TRUE(grads[r][1].allclose(v[0].add(v[2]).div(2), kRtol, kAtol));
    EXPECT_TRUE(grads[r][2].allclose(v[1].div(2), kRtol, kAtol));
  }
}

}  // namespace
}  // namespace ferry::ddp
