#include "ferry/c10d/testing/backend_conformance.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/common/status.h"
#include "gmock/gmock.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/prefix_store.h"
#include "ferry/tests/util/run_ranks.h"

namespace ferry {
namespace c10d {

std::string BackendUnderTestName(
    const ::testing::TestParamInfo<BackendUnderTest>& info) {
  return info.param.name;
}

void BackendConformanceTest::SetUp() {
  std::string reason = GetParam().skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
}

bool BackendConformanceTest::Supports(OpType op) const {
  const auto& ops = GetParam().ops;
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(20);
constexpr int64_t kNumel = 7;  // Odd, so ring segments are uneven.

std::vector<int> GroupSizes(const BackendUnderTest& p) {
  std::vector<int> sizes;
  for (int n : {2, 3, 4}) {
    if (n <= p.max_ranks()) sizes.push_back(n);
  }
  if (sizes.empty()) sizes.push_back(1);
  return sizes;
}

// Process mode: the store for the next group (every process counts every
// group, member or not, so all agree on its prefix).
std::shared_ptr<Store> NextGroupStore(const BackendUnderTest& p) {
  static std::atomic<int> groups{0};
  return std::make_shared<PrefixStore>(absl::StrCat("group", groups++),
                                       p.shared_store);
}

// Process mode: all processes meet at the end of a group (bounded).
void MeetAllProcesses(const BackendUnderTest& p, Store& group) {
  absl::StatusOr<int64_t> arrived = group.Add("processes_done", 1);
  ASSERT_TRUE(arrived.ok()) << arrived.status();
  if (*arrived == p.process_count) {
    ASSERT_TRUE(group.Set("all_done", "1").ok());
  }
  absl::Status all = group.Wait({"all_done"}, absl::Minutes(5));
  ASSERT_TRUE(all.ok()) << "process " << p.process_rank << ": " << all;
}

// Whether rank `r`'s results are observable here (its thread or process).
bool Local(const BackendUnderTest& p, int r) {
  return p.process_rank < 0 || p.process_rank == r;
}

// Ranks 0..count-1 meet at rank 0 point to point (tag 12): each returns
// once rank 0 has heard from all of them.
absl::Status MeetAtRankZero(Backend& b, int r, int count) {
  constexpr int kTag = 12;
  if (r != 0) {
    RETURN_IF_ERROR(b.Send(zeros({1}), 0, {.tag = kTag})->Wait(kTimeout));
    return b.Recv(zeros({1}), 0, {.tag = kTag})->Wait(kTimeout);
  }
  for (int s = 1; s < count; ++s) {
    RETURN_IF_ERROR(b.Recv(zeros({1}), s, {.tag = kTag})->Wait(kTimeout));
  }
  for (int s = 1; s < count; ++s) {
    RETURN_IF_ERROR(b.Send(zeros({1}), s, {.tag = kTag})->Wait(kTimeout));
  }
  return absl::OkStatus();
}

// Process mode of RunGroup: this process's rank only.
void RunGroupInProcess(const BackendUnderTest& p, int n, absl::Duration timeout,
                       const std::function<void(int, Backend&)>& body,
                       int absent) {
  std::shared_ptr<Store> group = NextGroupStore(p);
  const int r = p.process_rank;
  if (r < n && r != absent) {
    absl::StatusOr<std::unique_ptr<Backend>> b = p.create(
        std::make_shared<PrefixStore>("conformance", group), r, n, timeout);
    EXPECT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
    if (b.ok()) body(r, **b);
  }
  MeetAllProcesses(p, *group);
}

// Brings up `n` ranks as threads through a fresh HashStore and runs
// body(rank, backend) on each; the ranks meet again before their backends
// are destroyed. `absent` ranks (if any) never create a backend.
void RunGroup(const BackendUnderTest& p, int n, absl::Duration timeout,
              const std::function<void(int, Backend&)>& body, int absent = -1) {
  if (p.process_rank >= 0) {
    RunGroupInProcess(p, n, timeout, body, absent);
    return;
  }
  auto store = std::make_shared<HashStore>();
  store->SetTimeout(timeout);
  testutil::RunRanks(
      n,
      [&](int r) -> absl::StatusOr<std::unique_ptr<Backend>> {
        if (r == absent) return nullptr;
        return p.create(std::make_shared<PrefixStore>("conformance", store), r,
                        n, timeout);
      },
      [&](int r, absl::StatusOr<std::unique_ptr<Backend>>& b) {
        if (r == absent) return;
        ASSERT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
        body(r, **b);
      });
}

// Small values whose reductions are exact in every dtype (int8 included).
double Value(ReduceOp op, DType dtype, int r, int64_t i) {
  if (dtype == DType::kBool) return (r + i) % 2 == 0 ? 1 : 0;
  switch (op) {
    case ReduceOp::kSum:
      return (r + 1) + (i % 3);
    case ReduceOp::kAvg:
      return r + (i % 8);
    case ReduceOp::kProduct:
      return 1 + ((r + i) % 2);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return (r * 7 + i * 3) % 5 + (dtype == DType::kUInt8 ? 0 : -2);
    default:
      return ((r + 1) * (i + 3)) % 64;
  }
}

double Expected(ReduceOp op, DType dtype, int n, int64_t i) {
  if (dtype == DType::kBool) {
    int ones = 0;
    for (int r = 0; r < n; ++r) ones += Value(op, dtype, r, i) != 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        return ones > 0;
      case ReduceOp::kBxor:
        return ones % 2;
      default:
        return ones == n;
    }
  }
  double acc = Value(op, dtype, 0, i);
  int64_t bits = static_cast<int64_t>(acc);
  for (int r = 1; r < n; ++r) {
    double v = Value(op, dtype, r, i);
    int64_t vb = static_cast<int64_t>(v);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kBand:
        bits &= vb;
        break;
      case ReduceOp::kBor:
        bits |= vb;
        break;
      case ReduceOp::kBxor:
        bits ^= vb;
        break;
    }
  }
  if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) {
    return static_cast<double>(bits);
  }
  if (op == ReduceOp::kAvg) acc /= n;
  return acc;
}

// How far a reduction's result over `n` ranks may be from the exact `want`:
// nothing, but about n units in the last place for AVG where the backend is
// not exact (each of n pre-multiplied terms may round).
double Tolerance(const BackendUnderTest& p, ReduceOp op, DType dtype, int n,
                 double want) {
  if (op != ReduceOp::kAvg || p.exact_avg) return 0;
  double eps = 0;
  switch (dtype) {
    case DType::kFloat64:
      eps = 0x1p-52;
      break;
    case DType::kFloat32:
      eps = 0x1p-23;
      break;
    case DType::kFloat16:
      eps = 0x1p-10;
      break;
    case DType::kBFloat16:
      eps = 0x1p-7;
      break;
    default:
      break;
  }
  return (n + 2) * eps * std::max(1.0, std::abs(want));
}

Tensor Filled(DType dtype, int64_t numel,
              const std::function<double(int64_t)>& f) {
  std::vector<double> v(numel);
  for (int64_t i = 0; i < numel; ++i) v[i] = f(i);
  return from_vector<double>(v, {numel}).to(dtype);
}

std::vector<double> AsDoubles(const BackendUnderTest& p, const Tensor& t) {
  return p.to_cpu(t).to(DType::kFloat64).to_vector<double>();
}

std::string Where(int n, int r, DType dtype) {
  return absl::StrCat("group of ", n, ", rank ", r, ", ", DTypeName(dtype));
}

}  // namespace

TEST_P(BackendConformanceTest, AllreduceEveryDtypeAndOp) {
  if (!Supports(OpType::kAllreduce)) {
    GTEST_SKIP() << "the backend does not implement "
                 << OpTypeName(OpType::kAllreduce);
  }
  const BackendUnderTest& p = GetParam();
  for (int n : GroupSizes(p)) {
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      // 7 elements take backends' small-message paths, 9001 their
      // segmented ones.
      for (int64_t numel : {kNumel, int64_t{9001}}) {
        for (DType dtype : p.dtypes) {
          for (ReduceOp op : p.reduce_ops) {
            std::string where =
                absl::StrCat(Where(n, r, dtype), ", ", ReduceOpName(op), ", ",
                             numel, " elements");
            Tensor t = p.to_device(
                Filled(dtype, numel,
                       [&](int64_t i) { return Value(op, dtype, r, i); }),
                r);
            absl::Status s = b.Allreduce(t, {.op = op})->Wait(kTimeout);
            if (!CheckReduceOp(OpType::kAllreduce, op, dtype).ok()) {
              EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
                  << where << ": " << s;
              continue;
            }
            ASSERT_TRUE(s.ok()) << where << ": " << s;
            std::vector<double> got = AsDoubles(p, t);
            for (int64_t i = 0; i < numel; ++i) {
              double want = Expected(op, dtype, n, i);
              ASSERT_NEAR(got[i], want, Tolerance(p, op, dtype, n, want))
                  << where << ", element " << i;
            }
          }
        }
      }
    });
  }
}

TEST_P(BackendConformanceTest, LargeAllreduceSpansManySegments) {
  if (!Supports(OpType::kAllreduce)) {
    GTEST_SKIP() << "the backend does not implement "
                 << OpTypeName(OpType::kAllreduce);
  }
  const BackendUnderTest& p = GetParam();
  int n = std::min(3, p.max_ranks());
  constexpr int64_t kBig = (1 << 20) + 3;  // 4 MiB of float32, plus change.
  RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
    Tensor t = p.to_device(Filled(DType::kFloat32, kBig,
                                  [&](int64_t i) { return (i % 1000) + r; }),
                           r);
    ASSERT_TRUE(b.Allreduce(t)->Wait(kTimeout).ok());
    std::vector<double> got = AsDoubles(p, t);
    for (int64_t i = 0; i < kBig; i += 997) {
      ASSERT_EQ(got[i], n * (i % 1000) + n * (n - 1) / 2) << "element " << i;
    }
    ASSERT_EQ(got[kBig - 1], n * ((kBig - 1) % 1000) + n * (n - 1) / 2);
  });
}

TEST_P(BackendConformanceTest, BroadcastFromEveryRoot) {
  if (!Supports(OpType::kBroadcast)) {
    GTEST_SKIP() << "the backend does not implement "
                 << OpTypeName(OpType::kBroadcast);
  }
  const BackendUnderTest& p = GetParam();
  for (int n : GroupSizes(p)) {
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      for (DType dtype : p.dtypes) {
        for (int root = 0; root < n; ++root) {
          Tensor t = p.to_device(Filled(dtype, kNumel,
                                        [&](int64_t i) {
                                          return dtype == DType::kBool
                                                     ? (r == root ? 1 : 0)
                                                     : (r * 10 + i);
                                        }),
                                 r);
          absl::Status s = b.Broadcast(t, {.root = root})->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << Where(n, r, dtype) << ": " << s;
          std::vector<double> got = AsDoubles(p, t);
          for (int64_t i = 0; i < kNumel; ++i) {
            ASSERT_EQ(got[i], dtype == DType::kBool ? 1 : root * 10 + i)
                << Where(n, r, dtype) << ", root " << root;
          }
        }
      }
    });
  }
}

TEST_P(BackendConformanceTest, ReduceToRootLeavesOthersUnchanged) {
  if (!Supports(OpType::kReduce)) {
    GTEST_SKIP() << "the backend does not implement Reduce";
  }
  const BackendUnderTest& p = GetParam();
  for (int n : GroupSizes(p)) {
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      for (DType dtype : p.dtypes) {
        for (ReduceOp op :
             {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kBor, ReduceOp::kAvg}) {
          if (std::find(p.reduce_ops.begin(), p.reduce_ops.end(), op) ==
                  p.reduce_ops.end() ||
              !CheckReduceOp(OpType::kReduce, op, dtype).ok()) {
            continue;
          }
          int root = n - 1;
          auto value = [&](int64_t i) { return Value(op, dtype, r, i); };
          Tensor t = p.to_device(Filled(dtype, kNumel, value), r);
          absl::Status s =
              b.Reduce(t, {.root = root, .op = op})->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << Where(n, r, dtype) << ": " << s;
          std::vector<double> got = AsDoubles(p, t);
          for (int64_t i = 0; i < kNumel; ++i) {
            double want =
                r == root ? Expected(op, dtype, n, i)
                          : Filled(dtype, 1, [&](int64_t) { return value(i); })
                                .to(DType::kFloat64)
                                .item();
            // Other ranks' buffers are untouched: exactly.
            double tolerance =
                r == root ? Tolerance(p, op, dtype, n, want) : 0.0;
            ASSERT_NEAR(got[i], want, tolerance)
                << Where(n, r, dtype) << ", " << ReduceOpName(op)
                << ", element " << i;
          }
        }
      }
    });
  }
}

TEST_P(BackendConformanceTest, AllgatherGatherScatter) {
  const BackendUnderTest& p = GetParam();
  for (int n : GroupSizes(p)) {
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      for (DType dtype : p.dtypes) {
        auto val = [&](int src, int64_t i) -> double {
          return dtype == DType::kBool ? (src + i) % 2 : src * 10 + i;
        };
        Tensor in = p.to_device(
            Filled(dtype, kNumel, [&](int64_t i) { return val(r, i); }), r);
        if (Supports(OpType::kAllgather)) {
          std::vector<Tensor> outs;
          for (int k = 0; k < n; ++k) {
            outs.push_back(p.to_device(zeros({kNumel}, dtype), r));
          }
          absl::Status s = b.Allgather(outs, in)->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << Where(n, r, dtype) << ": " << s;
          for (int k = 0; k < n; ++k) {
            std::vector<double> got = AsDoubles(p, outs[k]);
            for (int64_t i = 0; i < kNumel; ++i) {
              ASSERT_EQ(got[i], val(k, i))
                  << Where(n, r, dtype) << " from " << k;
            }
          }
        }
        if (Supports(OpType::kGather)) {
          int root = n > 1 ? 1 : 0;
          std::vector<Tensor> outs;
          if (r == root) {
            for (int k = 0; k < n; ++k) {
              outs.push_back(p.to_device(zeros({kNumel}, dtype), r));
            }
          }
          absl::Status s = b.Gather(outs, in, {.root = root})->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << Where(n, r, dtype) << ": " << s;
          for (int k = 0; k < static_cast<int>(outs.size()); ++k) {
            std::vector<double> got = AsDoubles(p, outs[k]);
            for (int64_t i = 0; i < kNumel; ++i) {
              ASSERT_EQ(got[i], val(k, i)) << Where(n, r, dtype);
            }
          }
        }
        if (Supports(OpType::kScatter)) {
          int root = 0;
          std::vector<Tensor> ins;
          if (r == root) {
            for (int k = 0; k < n; ++k) {
              ins.push_back(p.to_device(
                  Filled(dtype, kNumel, [&](int64_t i) { return val(k, i); }),
                  r));
            }
          }
          Tensor out = p.to_device(zeros({kNumel}, dtype), r);
          absl::Status s = b.Scatter(out, ins, {.root = root})->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << Where(n, r, dtype) << ": " << s;
          std::vector<double> got = AsDoubles(p, out);
          for (int64_t i = 0; i < kNumel; ++i) {
            ASSERT_EQ(got[i], val(r, i)) << Where(n, r, dtype);
          }
        }
      }
    });
  }
}

TEST_P(BackendConformanceTest, ReduceScatterAndAlltoall) {
  const BackendUnderTest& p = GetParam();
  for (int n : GroupSizes(p)) {
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      for (DType dtype : p.dtypes) {
        if (Supports(OpType::kReduceScatter)) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kAvg}) {
            if (std::find(p.reduce_ops.begin(), p.reduce_ops.end(), op) ==
                    p.reduce_ops.end() ||
                !CheckReduceOp(OpType::kReduceScatter, op, dtype).ok()) {
              continue;
            }
            // Chunk k of rank r holds Value(op, r, k * kNumel + i).
            std::vector<Tensor> ins;
            for (int k = 0; k < n; ++k) {
              ins.push_back(p.to_device(Filled(dtype, kNumel,
                                               [&](int64_t i) {
                                                 return Value(op, dtype, r,
                                                              k * kNumel + i);
                                               }),
                                        r));
            }
            Tensor out = p.to_device(zeros({kNumel}, dtype), r);
            absl::Status s =
                b.ReduceScatter(out, ins, {.op = op})->Wait(kTimeout);
            ASSERT_TRUE(s.ok()) << Where(n, r, dtype) << ": " << s;
            std::vector<double> got = AsDoubles(p, out);
            for (int64_t i = 0; i < kNumel; ++i) {
              double want = Expected(op, dtype, n, r * kNumel + i);
              ASSERT_NEAR(got[i], want, Tolerance(p, op, dtype, n, want))
                  << Where(n, r, dtype) << ", " << ReduceOpName(op);
            }
          }
        }
        if (Supports(OpType::kAlltoall)) {
          // Rank r sends chunk k = (r, k) to rank k.
          auto val = [&](int src, int dst, int64_t i) -> double {
            return dtype == DType::kBool ? (src + dst + i) % 2
                                         : src * 16 + dst * 4 + i % 4;
          };
          std::vector<Tensor> ins, outs;
          for (int k = 0; k < n; ++k) {
            ins.push_back(p.to_device(
                Filled(dtype, kNumel, [&](int64_t i) { return val(r, k, i); }),
                r));
            outs.push_back(p.to_device(zeros({kNumel}, dtype), r));
          }
          absl::Status s = b.Alltoall(outs, ins)->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << Where(n, r, dtype) << ": " << s;
          for (int k = 0; k < n; ++k) {
            std::vector<double> got = AsDoubles(p, outs[k]);
            for (int64_t i = 0; i < kNumel; ++i) {
              ASSERT_EQ(got[i], val(k, r, i)) << Where(n, r, dtype);
            }
          }
        }
      }
    });
  }
}

TEST_P(BackendConformanceTest, BarrierWaitsForEveryRank) {
  if (!Supports(OpType::kBarrier)) {
    GTEST_SKIP() << "the backend does not implement "
                 << OpTypeName(OpType::kBarrier);
  }
  const BackendUnderTest& p = GetParam();
  for (int n : GroupSizes(p)) {
    // Arrivals counted in this process, or across processes in the store.
    std::atomic<int64_t> arrived{0};
    const std::string key = absl::StrCat("barrier_arrivals_", n);
    auto arrive = [&](int64_t delta) -> int64_t {
      if (p.process_rank < 0) return arrived.fetch_add(delta) + delta;
      absl::StatusOr<int64_t> v = p.shared_store->Add(key, delta);
      EXPECT_TRUE(v.ok()) << v.status();
      return v.value_or(-1);
    };
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      for (int round = 1; round <= 3; ++round) {
        arrive(1);
        ASSERT_TRUE(b.Barrier()->Wait(kTimeout).ok());
        // Everyone of this round arrived before anyone left the barrier.
        EXPECT_GE(arrive(0), round * n) << "rank " << r;
        ASSERT_TRUE(b.Barrier()->Wait(kTimeout).ok());
      }
    });
  }
}

TEST_P(BackendConformanceTest, SendRecvRingAndTags) {
  if (!Supports(OpType::kSend) || !Supports(OpType::kRecv)) {
    GTEST_SKIP() << "the backend does not implement Send/Recv";
  }
  const BackendUnderTest& p = GetParam();
  for (int n : GroupSizes(p)) {
    if (n < 2) continue;
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      for (DType dtype : p.dtypes) {
        int next = (r + 1) % n, prev = (r + n - 1) % n;
        auto val = [&](int src, int tag, int64_t i) -> double {
          return dtype == DType::kBool ? (src + tag + i) % 2
                                       : src * 10 + tag * 3 + i;
        };
        // Post the receives first, in reverse tag order, then the sends.
        Tensor got1 = p.to_device(zeros({kNumel}, dtype), r);
        Tensor got0 = p.to_device(zeros({kNumel}, dtype), r);
        auto rw1 = b.Recv(got1, prev, {.tag = 1});
        auto rw0 = b.Recv(got0, prev, {.tag = 0});
        auto sw0 = b.Send(
            p.to_device(
                Filled(dtype, kNumel, [&](int64_t i) { return val(r, 0, i); }),
                r),
            next, {.tag = 0});
        auto sw1 = b.Send(
            p.to_device(
                Filled(dtype, kNumel, [&](int64_t i) { return val(r, 1, i); }),
                r),
            next, {.tag = 1});
        for (auto* w : {&rw0, &rw1, &sw0, &sw1}) {
          absl::Status s = (*w)->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << Where(n, r, dtype) << ": " << s;
        }
        std::vector<double> g0 = AsDoubles(p, got0), g1 = AsDoubles(p, got1);
        for (int64_t i = 0; i < kNumel; ++i) {
          ASSERT_EQ(g0[i], val(prev, 0, i)) << Where(n, r, dtype);
          ASSERT_EQ(g1[i], val(prev, 1, i)) << Where(n, r, dtype);
        }
      }
    });
  }
}

TEST_P(BackendConformanceTest, MismatchedShapesFailOnEveryRankThenRecover) {
  const BackendUnderTest& p = GetParam();
  if (!p.detects_mismatch || !Supports(OpType::kAllreduce)) {
    GTEST_SKIP() << "the backend (as configured) does not detect mismatched "
                    "calls, or has no Allreduce";
  }
  int n = std::min(3, p.max_ranks());
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
    Tensor t = p.to_device(ones({r == 0 ? 4 : 5}), r);
    absl::Status s = b.Allreduce(t)->Wait(kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("Allreduce")) << s;
    // A different op on one rank is caught the same way.
    Tensor u = p.to_device(ones({3}), r);
    absl::Status s2 =
        (r == 1 ? b.Broadcast(u) : b.Allreduce(u))->Wait(kTimeout);
    EXPECT_EQ(s2.code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << s2;
    // The group still works afterwards.
    Tensor v = p.to_device(ones({6}), r);
    ASSERT_TRUE(b.Allreduce(v)->Wait(kTimeout).ok());
    EXPECT_EQ(AsDoubles(p, v), std::vector<double>(6, n));
  });
}

TEST_P(BackendConformanceTest, WrongRootFailsOnEveryRank) {
  const BackendUnderTest& p = GetParam();
  if (!Supports(OpType::kBroadcast)) {
    GTEST_SKIP() << "the backend does not implement "
                 << OpTypeName(OpType::kBroadcast);
  }
  int n = std::min(3, p.max_ranks());
  RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
    Tensor t = p.to_device(ones({4}), r);
    // Out of range everywhere: a local error on every rank.
    absl::Status s = b.Broadcast(t, {.root = n})->Wait(kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("root"));
    absl::Status neg = b.Broadcast(t, {.root = -1})->Wait(kTimeout);
    EXPECT_EQ(neg.code(), absl::StatusCode::kInvalidArgument) << neg;
    if (p.detects_mismatch && n >= 2) {
      // Out of range on one rank only: the others fail too, not hang.
      absl::Status one =
          b.Broadcast(t, {.root = r == 0 ? 7 : 0})->Wait(kTimeout);
      EXPECT_EQ(one.code(), absl::StatusCode::kInvalidArgument)
          << "rank " << r << one;
      // Different (valid) roots on different ranks.
      absl::Status differ =
          b.Broadcast(t, {.root = r == 0 ? 1 : 0})->Wait(kTimeout);
      EXPECT_EQ(differ.code(), absl::StatusCode::kInvalidArgument)
          << "rank " << r << differ;
      EXPECT_THAT(std::string(differ.message()), HasSubstr("root"));
    }
    // Invalid local arguments: non-contiguous tensor, bad ReduceOp.
    if (Supports(OpType::kAllreduce)) {
      absl::Status avg = b.Allreduce(p.to_device(ones({2}, DType::kInt32), r),
                                     {.op = ReduceOp::kAvg})
                             ->Wait(kTimeout);
      EXPECT_EQ(avg.code(), absl::StatusCode::kInvalidArgument) << avg;
      EXPECT_THAT(std::string(avg.message()), HasSubstr("AVG"));
    }
    ASSERT_TRUE(b.Broadcast(t, {.root = 0})->Wait(kTimeout).ok());
  });
}

TEST_P(BackendConformanceTest, RankThatNeverCallsGivesDeadlineExceeded) {
  const BackendUnderTest& p = GetParam();
  if (!Supports(OpType::kAllreduce)) {
    GTEST_SKIP() << "the backend does not implement "
                 << OpTypeName(OpType::kAllreduce);
  }
  int n = std::min(3, p.max_ranks());
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  constexpr absl::Duration kShort = absl::Milliseconds(400);
  RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
    if (r == n - 1) return;  // Joined, but never calls the collective.
    Tensor t = p.to_device(ones({16}), r);
    absl::Time start = absl::Now();
    absl::Status s = b.Allreduce(t, {.timeout = kShort})->Wait(kTimeout);
    absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("Allreduce"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("rank ", r)));
    EXPECT_LT(took, kShort + absl::Seconds(10)) << "rank " << r;
    EXPECT_GE(took, kShort - absl::Milliseconds(50)) << "rank " << r;
  });
}

TEST_P(BackendConformanceTest, RankThatNeverJoinsGivesDeadlineExceeded) {
  const BackendUnderTest& p = GetParam();
  if (!p.rendezvous_at_create) GTEST_SKIP() << "connects lazily";
  int n = std::min(3, p.max_ranks());
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  constexpr absl::Duration kShort = absl::Milliseconds(400);
  const bool processes = p.process_rank >= 0;
  std::shared_ptr<Store> store =
      processes ? NextGroupStore(p) : std::make_shared<HashStore>();
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(n);
  std::vector<absl::Duration> took(n);
  for (int r = 0; r < n - 1; ++r) {
    if (!Local(p, r)) continue;
    threads.emplace_back([&, r] {
      absl::Time start = absl::Now();
      auto b =
          p.create(std::make_shared<PrefixStore>("nj", store), r, n, kShort);
      took[r] = absl::Now() - start;
      results[r] = b.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n - 1; ++r) {
    if (!Local(p, r)) continue;
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded)
        << "rank " << r << ": " << results[r];
    EXPECT_LT(took[r], kShort + absl::Seconds(10));
  }
  if (processes) MeetAllProcesses(p, *store);
}

TEST_P(BackendConformanceTest, UnimplementedOpsAreNamed) {
  const BackendUnderTest& p = GetParam();
  RunGroup(p, 1, kTimeout, [&](int r, Backend& b) {
    Tensor t = p.to_device(ones({2}), r);
    struct Case {
      OpType op;
      std::function<std::shared_ptr<Work>()> call;
    };
    std::vector<Case> cases = {
        {OpType::kAllreduce, [&] { return b.Allreduce(t); }},
        {OpType::kBroadcast, [&] { return b.Broadcast(t); }},
        {OpType::kReduce, [&] { return b.Reduce(t); }},
        {OpType::kAllgather, [&] { return b.Allgather({t}, t); }},
        {OpType::kGather, [&] { return b.Gather({t}, t); }},
        {OpType::kScatter, [&] { return b.Scatter(t, {t}); }},
        {OpType::kReduceScatter, [&] { return b.ReduceScatter(t, {t}); }},
        {OpType::kAlltoall, [&] { return b.Alltoall({t}, {t}); }},
        {OpType::kBarrier, [&] { return b.Barrier(); }},
    };
    for (const Case& c : cases) {
      absl::Status s = c.call()->Wait(kTimeout);
      if (Supports(c.op)) {
        EXPECT_TRUE(s.ok()) << OpTypeName(c.op) << " on a group of 1: " << s;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr(OpTypeName(c.op)));
        EXPECT_THAT(std::string(s.message()), HasSubstr(b.name()));
      }
    }
  });
}

TEST_P(BackendConformanceTest, FlatCollectivesAndUnevenAlltoall) {
  const BackendUnderTest& p = GetParam();
  if (!Supports(OpType::kReduceScatterTensor) ||
      !Supports(OpType::kAllgatherIntoTensor) ||
      !Supports(OpType::kAlltoallSingle)) {
    GTEST_SKIP() << "the backend does not implement the flat collectives";
  }
  for (int n : GroupSizes(p)) {
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      // ReduceScatterTensor: chunk k of rank r is r + k*10 + i.
      Tensor in = Filled(DType::kFloat32, n * kNumel, [&](int64_t j) {
        return r + (j / kNumel) * 10 + j % kNumel;
      });
      Tensor out = zeros({kNumel});
      ASSERT_TRUE(b.ReduceScatterTensor(out, in)->Wait(kTimeout).ok());
      std::vector<float> got = out.to_vector<float>();
      for (int64_t i = 0; i < kNumel; ++i) {
        ASSERT_EQ(got[i], n * (n - 1) / 2 + n * (r * 10 + i))
            << Where(n, r, DType::kFloat32);
      }
      // AllgatherIntoTensor.
      Tensor all = zeros({n * kNumel}, DType::kInt32);
      Tensor mine =
          Filled(DType::kInt32, kNumel, [&](int64_t i) { return r * 100 + i; });
      ASSERT_TRUE(b.AllgatherIntoTensor(all, mine)->Wait(kTimeout).ok());
      std::vector<int32_t> g = all.to_vector<int32_t>();
      for (int64_t j = 0; j < n * kNumel; ++j) {
        ASSERT_EQ(g[j], (j / kNumel) * 100 + j % kNumel);
      }
      // AlltoallSingle, uneven: rank s sends s + d + 1 rows (of 2) to d.
      auto rows = [](int s, int d) { return int64_t{s + d + 1}; };
      AlltoallSingleOptions o;
      int64_t in_total = 0, out_total = 0;
      for (int d = 0; d < n; ++d) {
        o.input_split_sizes.push_back(rows(r, d));
        o.output_split_sizes.push_back(rows(d, r));
        in_total += rows(r, d);
        out_total += rows(d, r);
      }
      std::vector<double> src;
      for (int d = 0; d < n; ++d) {
        for (int64_t k = 0; k < rows(r, d) * 2; ++k) {
          src.push_back(r * 1000 + d * 100 + k);
        }
      }
      Tensor a_in = from_vector<double>(src, {in_total, 2});
      Tensor a_out = zeros({out_total, 2}, DType::kFloat64);
      absl::Status s = b.AlltoallSingle(a_out, a_in, o)->Wait(kTimeout);
      ASSERT_TRUE(s.ok()) << s;
      std::vector<double> ag = a_out.to_vector<double>();
      size_t at = 0;
      for (int sr = 0; sr < n; ++sr) {
        for (int64_t k = 0; k < rows(sr, r) * 2; ++k) {
          ASSERT_EQ(ag[at++], sr * 1000 + r * 100 + k)
              << Where(n, r, DType::kFloat64);
        }
      }
      // Splits that disagree between ranks fail every rank.
      if (p.detects_mismatch && n >= 2) {
        AlltoallSingleOptions bad = o;
        if (r == 0) {
          bad.input_split_sizes[1] += 1;
          bad.input_split_sizes[0] -= 1;
        }
        absl::Status m = b.AlltoallSingle(a_out, a_in, bad)->Wait(kTimeout);
        EXPECT_EQ(m.code(), absl::StatusCode::kInvalidArgument) << m;
        EXPECT_THAT(std::string(m.message()), HasSubstr("split sizes differ"));
      }
    });
  }
}

TEST_P(BackendConformanceTest, AnySourceBatchedP2PAndMonitoredBarrier) {
  const BackendUnderTest& p = GetParam();
  if (!Supports(OpType::kRecvAnysource) ||
      !Supports(OpType::kMonitoredBarrier)) {
    GTEST_SKIP() << "the backend does not implement RecvAnysource";
  }
  for (int n : GroupSizes(p)) {
    if (n < 2) continue;
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      // Any source: rank 0 receives one message from each other rank.
      if (r == 0) {
        std::vector<int> seen;
        for (int k = 1; k < n; ++k) {
          Tensor t = zeros({3}, DType::kInt64);
          auto w = b.RecvAnysource(t, {.tag = 9});
          ASSERT_TRUE(w->Wait(kTimeout).ok());
          ASSERT_EQ(t.to_vector<int64_t>()[2], w->source_rank() * 7);
          seen.push_back(w->source_rank());
        }
        std::sort(seen.begin(), seen.end());
        for (int k = 1; k < n; ++k) EXPECT_EQ(seen[k - 1], k);
      } else {
        ASSERT_TRUE(b.Send(full({3}, r * 7, DType::kInt64), 0, {.tag = 9})
                        ->Wait(kTimeout)
                        .ok());
      }
      // Batched ring exchange.
      int next = (r + 1) % n, prev = (r + n - 1) % n;
      Tensor got = zeros({4});
      std::vector<P2POp> ops = {
          {P2POp::Kind::kRecv, got, prev, 3},
          {P2POp::Kind::kSend, full({4}, r + 0.5), next, 3}};
      for (auto& w : b.BatchIsendIrecv(ops)) {
        ASSERT_TRUE(w->Wait(kTimeout).ok());
      }
      EXPECT_EQ(got.to_vector<float>()[3], prev + 0.5);
      EXPECT_TRUE(b.MonitoredBarrier({.timeout = kTimeout}).ok());
    });
    // A rank that never arrives is named by every rank that did. The others
    // first meet at rank 0 (point to point), so a rank that is merely slow
    // to start on a loaded machine is not what the short timeout catches.
    const absl::Duration kShort = absl::Seconds(2);
    std::vector<absl::Status> results(n);
    RunGroup(p, n, kTimeout, [&](int r, Backend& b) {
      if (r == n - 1) return;
      ASSERT_TRUE(MeetAtRankZero(b, r, n - 1).ok());
      results[r] = b.MonitoredBarrier({.timeout = kShort});
    });
    for (int r = 0; r < n - 1; ++r) {
      if (!Local(p, r)) continue;
      EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded)
          << "rank " << r << ": " << results[r];
      EXPECT_THAT(std::string(results[r].message()),
                  HasSubstr(absl::StrCat("rank(s) ", n - 1)));
    }
  }
}

}  // namespace c10d
}  // namespace ferry
