// DDP with parameters and gradients on a CUDA device: buckets on the device,
// the bucket all-reduce through the group's device backend. Two backends:
// "host" (tensor/cuda/host_ops.h contexts, whose device memory is host
// memory, and c10d/testing's host-device backend reducing it through Gloo:
// runs everywhere) and "cuda" (CUDA contexts and NCCL: one device per rank,
// so it skips, naming the reason, with fewer GPUs than ranks; one GPU shared
// by processes is examples/ddp's shape in tools/gpu_check). Ranks are
// threads; float64 models make "same as one process" checks tight.
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

  Tensor Dev(const Tensor& t) {
    absl::StatusOr<Tensor> d = ctx->To(t, device);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : Tensor();
  }
  Tensor Host(const Tensor& t) {
    absl::StatusOr<Tensor> h = ctx->To(t, Device::CPU());
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : Tensor();
  }
};

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
            auto c = cuda::CreateHostComputeContext(
                std::make_shared<cuda::FakeDeviceApi>(1, uint64_t{1} << 26),
                {});
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
    std::vector<std::vector<Tensor>> result(c.world);
    std::vector<std::string> grad_devices(c.world);
    RunRanks(c.world, [&](int r, Rank& rank) {
      auto model = MakeMlp(100 + 7 * r);  // Differs until broadcast.
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
      auto ddp = DistributedDataParallel::Create(model, rank.pg, o);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
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
      }
      grad_devices[r] =
          autograd::GradOf(model->parameters()[0]).device().ToString();
      for (const Tensor& p : model->parameters())
        result[r].push_back(rank.Host(p));
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
      }
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
