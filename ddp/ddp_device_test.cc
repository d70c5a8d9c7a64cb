// DDP with parameters and gradients on a CUDA device: buckets on the device,
// the bucket all-reduce through the group's device backend. Two backends:
// "host" (tensor/cuda/host_ops.h contexts, whose device memory is host
// memory, and c10d/testing's host-device backend reducing it through Gloo:
// runs everywhere) and "cuda" (CUDA contexts and NCCL: one device per rank,
// so it skips, naming the reason, with fewer GPUs than ranks; one GPU shared
// by processes is examples/ddp's shape in tools/gpu_check). Ranks are
// threads; float64 models make "same as one process" checks tight.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/autograd/engine.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/ops.h"
#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/process_group.h"
#include "ferry/c10d/testing/host_device_backend.h"
#include "ferry/ddp/distributed_data_parallel.h"
#include "ferry/ddp/optimizer_in_backward.h"
#include "ferry/ddp/test_model.h"
#include "ferry/optim/optim.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/cuda/context.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
#include "ferry/tensor/cuda/ops.h"
#include "ferry/tests/util/run_ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::ddp {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr double kRtol = 1e-10;
constexpr double kAtol = 1e-12;
constexpr int kSteps = 3;
constexpr double kLr = 0.1;

using testutil::Inputs;
using testutil::kBatch;
using testutil::MakeMlp;
using testutil::Shard;
using testutil::Targets;

absl::Status Step(nn::Module& m) {
  optim::SgdState state;
  optim::SgdOptions o;
  o.lr = kLr;
  std::vector<Tensor> params = m.parameters(), grads;
  for (const Tensor& p : params) grads.push_back(autograd::GradOf(p));
  return optim::SgdStep(params, grads, state, o);
}

// One rank's device context and group.
struct Rank {
  std::unique_ptr<cuda::CudaContext> ctx;
  std::shared_ptr<c10d::ProcessGroup> pg;
  Device device;
  // The "host" backend's device, whose streams run only when driven.
  std::shared_ptr<cuda::FakeDeviceApi> fake;

  // Before a host transfer: the fake device runs what the default stream
  // waits for (DDP's communication stream), as a GPU does by itself.
  void RunDevice() {
    if (fake != nullptr) {
      EXPECT_TRUE(fake->CompleteStreamAndWaits(0, ctx->stream(0)));
    }
  }
  Tensor Dev(const Tensor& t) {
    RunDevice();
    absl::StatusOr<Tensor> d = ctx->To(t, device);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : Tensor();
  }
  Tensor Host(const Tensor& t) {
    RunDevice();
    absl::StatusOr<Tensor> h = ctx->To(t, Device::CPU());
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : Tensor();
  }
};

// max |a - b| of two float64 CPU tensors of one shape.
double MaxDifference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.contiguous().to_vector<double>(),
                            y = b.contiguous().to_vector<double>();
  double most = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    most = std::max(most, std::abs(x[i] - y[i]));
  return most;
}

// The float64 values of a device tensor's bytes as they are now (host
// memory on the fake), without any stream synchronization.
std::vector<double> RawValues(const Tensor& t) {
  const double* p = static_cast<const double*>(t.data_ptr());
  return std::vector<double>(p, p + t.numel());
}

class DdpDeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Runs body on `world` ranks (threads), each with its context and group,
  // or skips naming why this backend cannot run that many.
  void RunRanks(int world, const std::function<void(int, Rank&)>& body) {
    std::shared_ptr<c10d::BackendRegistry> registry =
        c10d::MakeDefaultBackendRegistry();
    std::string spec;
    if (GetParam() == "host") {
      ASSERT_TRUE(registry
                      ->RegisterBackend("host-device",
                                        testutil::HostDeviceBackendFactory(),
                                        {DeviceType::kCUDA})
                      .ok());
      spec = "cpu:gloo,cuda:host-device";
    } else {
      auto probe = cuda::CreateComputeContext({});
      if (!probe.ok()) GTEST_SKIP() << "no CUDA device: " << probe.status();
      if ((*probe)->device_count() < world) {
        GTEST_SKIP() << "NCCL needs a device per rank of one process: "
                     << world << " ranks, " << (*probe)->device_count()
                     << " CUDA device(s)";
      }
      spec = "cpu:gloo,cuda:nccl";
    }
    auto store = std::make_shared<HashStore>();
    testutil::RunRanks(
        world,
        [&](int r) {
          c10d::ProcessGroupOptions o;
          o.backend = spec;
          o.timeout = kTimeout;
          return c10d::ProcessGroup::Create(store, r, world, registry, o);
        },
        [&](int r, auto& pg) {
          ASSERT_TRUE(pg.ok()) << pg.status();
          Rank rank;
          rank.pg = *pg;
          if (GetParam() == "host") {
            rank.fake =
                std::make_shared<cuda::FakeDeviceApi>(1, uint64_t{1} << 26);
            auto c = cuda::CreateHostComputeContext(rank.fake, {});
            ASSERT_TRUE(c.ok()) << c.status();
            rank.ctx = *std::move(c);
            rank.device = Device::CUDA(0);
          } else {
            auto c = cuda::CreateComputeContext({});
            ASSERT_TRUE(c.ok()) << c.status();
            rank.ctx = *std::move(c);
            rank.device = Device::CUDA(r);
          }
          body(r, rank);
        });
  }
};

struct Case {
  int world;
  int64_t cap;
  bool view;
  bool in_backward;  // The SGD step per bucket inside backward.
};


// Every rank ends with the same parameters, equal to one CPU process
// training on the concatenated batch.
TEST_P(DdpDeviceTest, MatchesOneCpuProcessOnConcatenatedBatch) {
  for (const Case c : {Case{2, int64_t{1} << 30, false, false},
                       Case{3, 8, true, false}, Case{2, 8, false, true}}) {
    SCOPED_TRACE(::testing::Message()
                 << c.world << " ranks, cap " << c.cap << ", view " << c.view
                 << ", step in backward " << c.in_backward);
    std::vector<std::vector<Tensor>> result(c.world), on_cpu(c.world);
    std::vector<std::string> grad_devices(c.world);
    RunRanks(c.world, [&](int r, Rank& rank) {
      auto model = MakeMlp(100 + 7 * r);  // Differs until broadcast.
      auto cpu_model = MakeMlp(100 + 7 * r);  // The same DDP on the CPU.
      ASSERT_TRUE(model->to(rank.device, rank.ctx->compute()).ok());
      DdpOptions o;
      o.first_bucket_bytes = c.cap;
      o.bucket_cap_bytes = c.cap;
      o.gradient_as_bucket_view = c.view;
      o.timeout = kTimeout;
      if (c.in_backward) {
        optim::SgdOptions so;
        so.lr = kLr;
        o.optimizer_in_backward =
            SgdInBackward(so, model->parameters().size());
      }
      DdpOptions cpu_o = o;
      if (c.in_backward) {
        optim::SgdOptions so;
        so.lr = kLr;
        cpu_o.optimizer_in_backward =
            SgdInBackward(so, cpu_model->parameters().size());
      }
      auto ddp = DistributedDataParallel::Create(model, rank.pg, o);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      auto cpu = DistributedDataParallel::Create(cpu_model, rank.pg, cpu_o);
      ASSERT_TRUE(cpu.ok()) << cpu.status();
      for (int step = 0; step < kSteps; ++step) {
        model->ZeroGrad();
        Tensor x = rank.Dev(
            Shard(Inputs(step, c.world), r));
        Tensor y = rank.Dev(
            Shard(Targets(step, c.world), r));
        Tensor loss = autograd::mse_loss((*ddp)->Forward(x), y);
        absl::Status s = (*ddp)->Backward(loss);
        ASSERT_TRUE(s.ok()) << s;
        if (!c.in_backward) {
          ASSERT_TRUE(Step(*model).ok());
        }
        cpu_model->ZeroGrad();
        s = (*cpu)->Backward(autograd::mse_loss(
            (*cpu)->Forward(Shard(Inputs(step, c.world), r)),
            Shard(Targets(step, c.world), r)));
        ASSERT_TRUE(s.ok()) << s;
        if (!c.in_backward) {
          ASSERT_TRUE(Step(*cpu_model).ok());
        }
      }
      grad_devices[r] =
          autograd::GradOf(model->parameters()[0]).device().ToString();
      for (const Tensor& p : model->parameters())
        result[r].push_back(rank.Host(p));
      on_cpu[r] = cpu_model->parameters();
    });
    if (HasFatalFailure() || IsSkipped()) return;
    const std::vector<Tensor> expected =
        testutil::TrainedReference(c.world, kSteps, kLr);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_EQ(grad_devices[r], r == 0 || GetParam() == "host"
                                     ? "cuda:0"
                                     : absl::StrCat("cuda:", r));
      ASSERT_EQ(result[r].size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_TRUE(result[r][i].allclose(expected[i], kRtol, kAtol))
            << "rank " << r << " param " << i << "\n"
            << result[r][i] << "\nvs\n"
            << expected[i];
        EXPECT_TRUE(result[r][i].equal(result[0][i])) << "rank " << r;
        if (GetParam() == "host") {
          // The host kernels' last bits differ from the CPU's (the MLP's
          // arithmetic, not DDP's: see ExactGradientsAverageLikeTheCpu).
          EXPECT_TRUE(result[r][i].allclose(on_cpu[r][i], kRtol, kAtol))
              << "rank " << r << " param " << i << ": max difference "
              << MaxDifference(result[r][i], on_cpu[r][i]);
        }
      }
    }
  }
}

// Through the communication stream, the averaged gradients equal the CPU
// DDP's bit for bit when the local gradients do: a loss linear in the
// parameters gives every rank exact, distinct gradients (world 3 makes the
// division round), over two passes, with bucket views and with the SGD
// step in backward.
TEST_P(DdpDeviceTest, ExactGradientsAverageLikeTheCpu) {
  if (GetParam() != "host") GTEST_SKIP() << "compares the host kernels' bits";
  constexpr int kWorld = 3;
  for (const bool view : {false, true}) {
    for (const bool in_backward : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "view " << view
                                        << ", step in backward "
                                        << in_backward);
      std::vector<std::vector<Tensor>> dev(kWorld), cpu(kWorld);
      RunRanks(kWorld, [&](int r, Rank& rank) {
        const Tensor ca = from_vector<double>({0.1 * (r + 1), 1.0 / 3, -1.0 * r});
        const Tensor cb = from_vector<double>({0.7 / (r + 2), 5});
        for (const bool on_device : {true, false}) {
          auto make = [&](std::vector<double> v) {
            Tensor t = from_vector<double>(v);
            if (on_device) t = rank.Dev(t);
            autograd::SetRequiresGrad(t);
            return t;
          };
          Tensor a = make({1, 2, 3}), b = make({4, 5});
          DdpOptions o;
          o.first_bucket_bytes = 8;  // Two buckets.
          o.gradient_as_bucket_view = view;
          o.timeout = kTimeout;
          if (in_backward) {
            optim::SgdOptions so;
            so.lr = kLr;
            o.optimizer_in_backward = SgdInBackward(so, 2);
          }
          auto ddp = DistributedDataParallel::Create(
              std::vector<std::pair<std::string, Tensor>>{{"a", a},
                                                          {"b", b}},
              rank.pg, o);
          ASSERT_TRUE(ddp.ok()) << ddp.status();
          const Tensor da = on_device ? rank.Dev(ca) : ca;
          const Tensor db = on_device ? rank.Dev(cb) : cb;
          for (int pass = 0; pass < 2; ++pass) {
            Tensor loss = autograd::add(autograd::sum(autograd::mul(a, da)),
                                        autograd::sum(autograd::mul(b, db)));
            absl::Status s = (*ddp)->Backward(loss);
            ASSERT_TRUE(s.ok()) << s;
          }
          for (const Tensor& p : {a, b}) {
            Tensor g = autograd::GradOf(p);
            (on_device ? dev : cpu)[r].push_back(on_device ? rank.Host(g)
                                                           : g.clone());
          }
        }
      });
      if (HasFatalFailure() || IsSkipped()) return;
      for (int r = 0; r < kWorld; ++r) {
        ASSERT_EQ(dev[r].size(), 2u);
        ASSERT_EQ(cpu[r].size(), 2u);
        for (size_t i = 0; i < 2; ++i) {
          EXPECT_TRUE(dev[r][i].equal(cpu[r][i]))
              << "rank " << r << " param " << i << ": " << dev[r][i]
              << " vs " << cpu[r][i];
          EXPECT_TRUE(dev[r][i].equal(dev[0][i])) << "rank " << r;
        }
      }
    }
  }
}

// The communication stream copies a gradient into its bucket only after
// the stream that produced it got there (a device-side wait): held on the
// fake device, the copy waits for the producer's queued work, then copies
// what that work wrote.
TEST_P(DdpDeviceTest, CommStreamCopiesAGradientOnlyAfterItsProducer) {
  if (GetParam() != "host") GTEST_SKIP() << "holds the fake device's streams";
  RunRanks(1, [&](int, Rank& rank) {
    Tensor a = rank.Dev(from_vector<double>({0, 0, 0}));
    Tensor b = rank.Dev(from_vector<double>({0, 0}));
    autograd::SetRequiresGrad(a);
    autograd::SetRequiresGrad(b);
    DdpOptions o;
    o.gradient_as_bucket_view = true;  // .grad becomes the bucket slot.
    o.timeout = kTimeout;
    auto ddp = DistributedDataParallel::Create(
        std::vector<std::pair<std::string, Tensor>>{{"a", a}, {"b", b}},
        rank.pg, o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    Reducer& reducer = (*ddp)->reducer();
    const uintptr_t comm = reducer.comm_stream();
    ASSERT_NE(comm, rank.ctx->stream(0));
    // a's gradient: -1s, overwritten by work queued on the default stream
    // (its producer) that has not run yet.
    Tensor ga = rank.Dev(from_vector<double>({-1, -1, -1}));
    const std::vector<double> produced = {1.5, 2.5, 3.5};
    ASSERT_TRUE(rank.fake
                    ->MemcpyAsync(0, ga.data_ptr(), produced.data(),
                                  produced.size() * sizeof(double), 0)
                    .ok());
    autograd::SetGrad(a, ga);
    ASSERT_TRUE((*ddp)->PrepareForBackward({}).ok());
    reducer.OnGradReady(0);  // a's hook, as backward fires it.
    Tensor slot = autograd::GradOf(a);
    ASSERT_FALSE(slot.is_same(ga));
    EXPECT_FALSE(rank.fake->CompleteStream(0, comm))
        << "the communication stream does not wait for the producer";
    EXPECT_EQ(RawValues(slot), std::vector<double>({0, 0, 0}));
    ASSERT_TRUE(rank.fake->CompleteStream(0, 0));  // The producer runs.
    EXPECT_TRUE(rank.fake->CompleteStream(0, comm));
    EXPECT_EQ(RawValues(slot), produced);
    // b's gradient fills the bucket, which is reduced (one rank: as is).
    autograd::SetGrad(b, rank.Dev(from_vector<double>({4, 5})));
    reducer.OnGradReady(1);
    absl::Status s = (*ddp)->FinishBackward();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(rank.Host(autograd::GradOf(a)).equal(
        from_vector<double>(produced)));
    EXPECT_TRUE(rank.Host(autograd::GradOf(b)).equal(
        from_vector<double>({4, 5})));
  });
}

// The bucket hooks run with the communication stream current, and the
// averaged gradients are copied out on it: after Backward they sit queued
// there, the caller's (default) stream waits for them, and the buckets'
// memory is not reused before that stream is done with it.
TEST_P(DdpDeviceTest, CallersStreamWaitsForTheCopiesOutOnTheCommStream) {
  if (GetParam() != "host") GTEST_SKIP() << "holds the fake device's streams";
  constexpr int kWorld = 2;
  std::vector<std::vector<Tensor>> before(kWorld), after(kWorld);
  RunRanks(kWorld, [&](int r, Rank& rank) {
    int hooks = 0;
    uintptr_t bucket_stream = 0, current_in_hook = 0;
    auto model = MakeMlp(100);
    ASSERT_TRUE(model->to(rank.device, rank.ctx->compute()).ok());
    DdpOptions o;
    o.timeout = kTimeout;
    o.comm_hook = [&, inner = AllreduceHook()](c10d::ProcessGroup& pg,
                                               const GradBucket& b) {
      ++hooks;
      bucket_stream = b.stream;
      current_in_hook = rank.ctx->stream(0);
      return inner(pg, b);
    };
    auto ddp = DistributedDataParallel::Create(model, rank.pg, o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    const uintptr_t comm = (*ddp)->reducer().comm_stream();
    Tensor x = rank.Dev(Shard(Inputs(0, kWorld), r));
    Tensor y = rank.Dev(Shard(Targets(0, kWorld), r));
    // The first pass rebuilds the buckets (which runs the device); the
    // second, on the same batch, is held.
    for (int pass = 0; pass < 2; ++pass) {
      rank.RunDevice();
      model->ZeroGrad();
      absl::Status s =
          (*ddp)->Backward(autograd::mse_loss((*ddp)->Forward(x), y));
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ(hooks, 2);
    EXPECT_NE(comm, 0u);
    EXPECT_EQ(bucket_stream, comm);
    EXPECT_EQ(current_in_hook, comm);
    EXPECT_EQ(rank.ctx->stream(0), 0u) << "the hook's stream stayed current";
    for (const Tensor& p : model->parameters()) {
      before[r].push_back(
          from_vector<double>(RawValues(autograd::GradOf(p)))
              .reshape(p.sizes()));
    }
    ddp->reset();  // Its buckets go, while the stream still reads them.
    EXPECT_GT(rank.ctx->allocator().Stats(0).pending_bytes, 0u);
    EXPECT_FALSE(rank.fake->CompleteStream(0, 0))
        << "the default stream does not wait for the communication stream";
    EXPECT_TRUE(rank.fake->CompleteStream(0, comm));
    EXPECT_TRUE(rank.fake->CompleteStream(0, 0));
    EXPECT_EQ(rank.ctx->allocator().Stats(0).pending_bytes, 0u);
    for (const Tensor& p : model->parameters())
      after[r].push_back(rank.Host(autograd::GradOf(p)));
  });
  if (HasFatalFailure() || IsSkipped()) return;
  const std::vector<Tensor> want = testutil::AccumulatedReference(kWorld, 1);
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(after[r][i].allclose(want[i], kRtol, kAtol))
          << "rank " << r << " param " << i;
      EXPECT_FALSE(before[r][i].allclose(want[i], kRtol, kAtol))
          << "rank " << r << " param " << i
          << " was averaged before the communication stream ran";
    }
  }
}

// A no_sync pass accumulates on the device; the next pass reduces the sum.
TEST_P(DdpDeviceTest, NoSyncAccumulatesOnTheDeviceThenReducesTheSum) {
  constexpr int kWorld = 2;
  std::vector<std::vector<Tensor>> synced(kWorld);
  std::vector<int64_t> bytes_after_local(kWorld);
  RunRanks(kWorld, [&](int r, Rank& rank) {
    auto model = MakeMlp(100);
    ASSERT_TRUE(model->to(rank.device, rank.ctx->compute()).ok());
    auto ddp = DistributedDataParallel::Create(model, rank.pg, {});
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    for (int step = 0; step < 2; ++step) {
      Tensor x =
          rank.Dev(Shard(Inputs(step, kWorld), r));
      Tensor y = rank.Dev(
          Shard(Targets(step, kWorld), r));
      Tensor loss = autograd::mse_loss((*ddp)->Forward(x), y);
      if (step == 0) {
        auto guard = (*ddp)->NoSync();
        ASSERT_TRUE((*ddp)->Backward(loss).ok());
        bytes_after_local[r] = (*ddp)->reducer().bytes_reduced();
      } else {
        ASSERT_TRUE((*ddp)->Backward(loss).ok());
      }
    }
    for (const Tensor& p : model->parameters())
      synced[r].push_back(rank.Host(autograd::GradOf(p)));
  });
  if (HasFatalFailure() || IsSkipped()) return;
  const std::vector<Tensor> want = testutil::AccumulatedReference(kWorld, 2);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(bytes_after_local[r], 0) << "the no_sync pass communicated";
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(synced[r][i].allclose(want[i], kRtol, kAtol))
          << "rank " << r << " param " << i;
    }
  }
}

// The fp16/bf16 compression hooks on a device: divide, convert and reduce
// the 16-bit copy, convert back into the bucket. On the host backend the
// conversion is the CPU's, so the gradients equal those of the same hook in
// a CPU DDP bit for bit; on CUDA, within the format's rounding. Either way
// they really went through 16 bits (they differ from the exact mean).
TEST_P(DdpDeviceTest, CompressionHooksMatchTheCpuHooks) {
  constexpr int kWorld = 2;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bfloat16" : "float16");
    std::vector<std::vector<Tensor>> on_device(kWorld), on_cpu(kWorld);
    RunRanks(kWorld, [&](int r, Rank& rank) {
      DdpOptions o;
      o.comm_hook = bf16 ? Bf16CompressHook() : Fp16CompressHook();
      auto cpu_model = MakeMlp(100);
      auto cpu = DistributedDataParallel::Create(cpu_model, rank.pg, o);
      ASSERT_TRUE(cpu.ok()) << cpu.status();
      Tensor x = Shard(Inputs(0, kWorld), r), y = Shard(Targets(0, kWorld), r);
      ASSERT_TRUE(
          (*cpu)->Backward(autograd::mse_loss((*cpu)->Forward(x), y)).ok());
      for (const Tensor& p : cpu_model->parameters())
        on_cpu[r].push_back(autograd::GradOf(p).clone());

      auto model = MakeMlp(100);
      ASSERT_TRUE(model->to(rank.device, rank.ctx->compute()).ok());
      auto ddp = DistributedDataParallel::Create(model, rank.pg, o);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      absl::Status s = (*ddp)->Backward(
          autograd::mse_loss((*ddp)->Forward(rank.Dev(x)), rank.Dev(y)));
      ASSERT_TRUE(s.ok()) << s;
      for (const Tensor& p : model->parameters())
        on_device[r].push_back(rank.Host(autograd::GradOf(p)));
    });
    if (HasFatalFailure() || IsSkipped()) return;
    const std::vector<Tensor> exact = testutil::AccumulatedReference(kWorld, 1);
    bool any_rounded = false;
    for (int r = 0; r < kWorld; ++r) {
      for (size_t i = 0; i < exact.size(); ++i) {
        if (GetParam() == "host") {
          EXPECT_TRUE(on_device[r][i].equal(on_cpu[r][i]))
              << "rank " << r << " param " << i;
        } else {
          EXPECT_TRUE(on_device[r][i].allclose(on_cpu[r][i], 1e-2, 1e-3))
              << "rank " << r << " param " << i;
        }
        EXPECT_TRUE(on_device[r][i].allclose(exact[i], 2e-2, 1e-3))
            << "rank " << r << " param " << i;
        any_rounded = any_rounded || !on_device[r][i].equal(exact[i]);
      }
    }
    EXPECT_TRUE(any_rounded) << "no gradient shows 16-bit rounding";
  }
}

// A replica's parameters share one device: a model split across the CPU
// and a device is refused at Create, naming both parameters and devices.
TEST_P(DdpDeviceTest, ParametersOnTwoDevicesAreRefused) {
  RunRanks(1, [&](int, Rank& rank) {
    Tensor a = from_vector<double>({1, 2});
    Tensor b = rank.Dev(from_vector<double>({3, 4}));
    autograd::SetRequiresGrad(a);
    autograd::SetRequiresGrad(b);
    auto ddp = DistributedDataParallel::Create(
        std::vector<std::pair<std::string, Tensor>>{{"a", a}, {"b", b}},
        rank.pg, {});
    ASSERT_FALSE(ddp.ok());
    EXPECT_EQ(ddp.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ddp.status().message()),
                HasSubstr("parameter 'b' is on " + rank.device.ToString() +
                          " but parameter 'a' is on cpu"));
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpDeviceTest,
                         ::testing::Values("host", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry::ddp
