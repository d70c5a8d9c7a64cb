// Distributed autograd, DistributedOptimizer and RRefs with CUDA tensors
// (issue #32) over the staged path, between workers of one process whose
// devices are FakeDeviceApi host memory computing through the host backend
// (tensor/cuda/host_ops.h): no GPU needed. Gradients and optimizer steps
// are compared, in float64, with the same computation in one process on the
// CPU. Design: docs/design/cuda_rpc.md ("Distributed autograd").
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/common/ids.h"
#include "ferry/optim/distributed_optimizer.h"
#include "ferry/optim/optim.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/rref/rref.h"
#include "ferry/tensor/cuda/context.h"
#include "ferry/tensor/cuda/device_ops.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
#include "ferry/tensor/tensor.h"
#include "ferry/worker/test_group.h"
#include "ferry/worker/worker.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

namespace ag = ::ferry::autograd;
using ::ferry::autograd::dist::ContextScope;
using ::ferry::autograd::dist::GradientMap;

constexpr absl::Duration kWait = absl::Seconds(30);
constexpr double kRtol = 1e-12;
constexpr double kAtol = 1e-13;

// A CPU copy of device tensor `t`, through the backend its storage records
// (so this also checks that a landed tensor has one).
Tensor Host(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  cuda::DeviceOps* d = cuda::DeviceOpsOf(t);
  if (d == nullptr) {
    ADD_FAILURE() << "device tensor without a compute backend: "
                  << t.device().ToString();
    return Tensor();
  }
  absl::StatusOr<Tensor> h = d->To(t, Device::CPU());
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *std::move(h) : Tensor();
}

bool Close(const Tensor& device, const Tensor& cpu) {
  const Tensor h = Host(device);
  return h.defined() && h.sizes() == cpu.sizes() &&
         h.allclose(cpu, kRtol, kAtol);
}

// A leaf requiring grad: a copy of CPU tensor `t`.
Tensor Leaf(const Tensor& t) {
  Tensor c = ag::Detach(t).clone();
  ag::SetRequiresGrad(c);
  return c;
}

// The model w1 serves: tanh(x W + b).
Tensor Forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  return ag::tanh(ag::add(ag::matmul(x, w), b));
}

// A remote object holding a device tensor: its methods compute with it.
class Shard {
 public:
  explicit Shard(Tensor w) : w_(ag::Detach(w)) { ag::SetRequiresGrad(w_); }
  Tensor Apply(Tensor x) { return ag::mul(x, w_); }
  std::string Where() { return w_.device().ToString(); }
  const Tensor& weight() const { return w_; }

 private:
  Tensor w_;
};

// Three workers, two fake devices each, each with its own compute context.
// w0 maps its cuda:0 to w1's cuda:1 (and stages unmapped tensors to CPU);
// w1 maps nothing, so any gradient it sends back must follow w0's map;
// w2 maps its cuda:1 to w1's cuda:1. w1 holds parameter sets on its cuda:1.
class DeviceAutogradTest : public ::testing::Test {
 protected:
  static constexpr int kSets = 4;  // Gradients, SGD, Adam, fused SGD.

  // Whether the three fakes pose as processes of one host, w0 and w2 use
  // the IPC path, and w0 stages nothing to the CPU (so replies and returning
  // gradients may come back by IPC too).
  virtual bool SameHostIpc() const { return false; }

  void SetUp() override {
    auto host = std::make_shared<cuda::FakeHost>("h1");
    for (int i = 0; i < 3; ++i) {
      apis_[i] = std::make_shared<cuda::FakeDeviceApi>(
          2, uint64_t{64} << 20, SameHostIpc() ? host : nullptr);
      auto c = cuda::CreateHostComputeContext(apis_[i], {});
      ASSERT_TRUE(c.ok()) << c.status();
      ctx_[i] = *std::move(c);
    }
    w_cpu_ = randn({3, 4}, 11, DType::kFloat64);
    b_cpu_ = randn({4}, 12, DType::kFloat64);
    for (int k = 0; k < kSets; ++k) {
      w_[k] = DeviceLeaf(1, w_cpu_, 1);
      b_[k] = DeviceLeaf(1, b_cpu_, 1);
    }
    cpu_param_ = Leaf(randn({4}, 13, DType::kFloat64));
    std::vector<WorkerOptions> o(3);
    for (int i = 0; i < 3; ++i) {
      o[i].devices = {"cuda:0", "cuda:1"};
      o[i].device_api = apis_[i];
      o[i].device_compute = ctx_[i]->shared_compute();
      o[i].cuda_transport = SameHostIpc() ? "ipc" : "staged";
      o[i].join_timeout = kWait;
      o[i].rpc_timeout = kWait;
      o[i].registry = std::make_shared<rpc::FunctionRegistry>();
    }
    o[0].device_maps = {{"w1", {{"cuda:0", "cuda:1"}}}};
    o[0].stage_unmapped_to_cpu = !SameHostIpc();
    o[2].device_maps = {{"w1", {{"cuda:1", "cuda:1"}}}};
    rpc::FunctionRegistry& r1 = *o[1].registry;
    ASSERT_TRUE(r1.Register("forward", [this](int64_t k, Tensor x) {
                    return Forward(x, w_[k], b_[k]);
                  }).ok());
    ASSERT_TRUE(r1.Register("where", [](Tensor x) {
                    return x.device().ToString();
                  }).ok());
    ASSERT_TRUE(r1.Register("echo", [](Tensor x) { return x; }).ok());
    // A tensor that arrives on w1's CPU, times a CPU parameter.
    ASSERT_TRUE(r1.Register("scale_cpu", [this](Tensor x) {
                    return ag::mul(x, cpu_param_);
                  }).ok());
    // On the owner: its own value, never moved.
    ASSERT_TRUE(r1.Register("owner_view", [](rref::RRef<Tensor> r) {
                    absl::StatusOr<Tensor> v = r.to_here(kWait);
                    if (!v.ok()) return v.status().ToString();
                    return absl::StrCat(r.is_owner() ? "owner " : "user ",
                                        v->device().ToString());
                  }).ok());
    // On a third worker: the value lands on its mapped device (the reverse
    // of its map to the owner); the answer is a CPU copy.
    ASSERT_TRUE(
        o[2].registry
            ->Register(
                "fetch",
                [](rref::RRef<Tensor> r) -> Future<Tensor> {
                  return r.to_here_async(kWait).Then(
                      [](const Result<Tensor>& v) -> absl::StatusOr<Tensor> {
                        if (!v.ok()) return v.status();
                        if (v->device() != Device::CUDA(1)) {
                          return absl::FailedPreconditionError(absl::StrCat(
                              "landed on ", v->device().ToString()));
                        }
                        return Host(*v);
                      });
                })
            .ok());
    o[1].before_serving = [this](Worker& w) {
      w.rrefs()
          .classes()
          .RegisterClass<Shard>("Shard")
          .Constructor<Tensor>()
          .Method("apply", &Shard::Apply)
          .Method("where", &Shard::Where);
      return w.registry().Register("params", [this, &w](int64_t k) {
        return std::vector<rref::RRef<Tensor>>{
            rref::MakeLocalRRef<Tensor>(w.rrefs(), w_[k]),
            rref::MakeLocalRRef<Tensor>(w.rrefs(), b_[k])};
      });
    };
    group_ = StartWorkerGroup("devgrad", o);
    for (auto& w : group_) ASSERT_TRUE(w.ok()) << w.status();
  }

  void TearDown() override { ShutdownWorkerGroup(group_); }

  // `cpu` on worker `i`'s `device`, made by its compute context.
  Tensor OnDevice(int i, const Tensor& cpu, int device) {
    absl::StatusOr<Tensor> t = ctx_[i]->To(cpu, Device::CUDA(device));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : Tensor();
  }
  // The same, as a leaf requiring grad.
  Tensor DeviceLeaf(int i, const Tensor& cpu, int device) {
    Tensor t = OnDevice(i, cpu, device);
    ag::SetRequiresGrad(t);
    return t;
  }
  Worker& w(int i) { return **group_[i]; }
  // The forward and distributed backward of GradientsReturn... (below).
  void ForwardAndBackwardAcrossDevices();
  // Worker `i`'s gradient of `leaf` in context `id`, checked to be on
  // `device` (undefined, with a failure, when missing).
  Tensor GradientOn(int i, GlobalId id, const Tensor& leaf, Device device) {
    absl::StatusOr<GradientMap> g = w(i).dist_autograd().GetGradients(id);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return Tensor();
    const Tensor grad = g->Get(leaf);
    EXPECT_TRUE(grad.defined()) << "no gradient on w" << i;
    if (grad.defined()) {
      EXPECT_EQ(grad.device(), device) << "on w" << i;
    }
    return grad;
  }

  std::shared_ptr<cuda::FakeDeviceApi> apis_[3];
  std::unique_ptr<cuda::CudaContext> ctx_[3];
  Tensor w_cpu_, b_cpu_, cpu_param_;
  Tensor w_[kSets], b_[kSets];
  WorkerGroup group_;
};

// The forward crosses from w0's cuda:0 to w1's cuda:1 and back; the
// gradients flow back the same way: w0's leaf gradient is on its cuda:0,
// w1's parameter gradients on its cuda:1, equal to one CPU process.
void DeviceAutogradTest::ForwardAndBackwardAcrossDevices() {
  const Tensor a_cpu = randn({5, 3}, 21, DType::kFloat64);
  // One process, on the CPU.
  Tensor ra = Leaf(a_cpu), rw = Leaf(w_cpu_), rb = Leaf(b_cpu_);
  Tensor ry = Forward(ag::mul(ra, ra), rw, rb);
  absl::StatusOr<std::vector<Tensor>> ref =
      ag::Grad({ag::sum(ag::mul(ry, ry))}, {ra, rw, rb});
  ASSERT_TRUE(ref.ok()) << ref.status();

  const Tensor a = DeviceLeaf(0, a_cpu, 0);
  {
    ContextScope scope(w(0).dist_autograd());
    const Tensor x = ag::mul(a, a);  // Computed on w0's cuda:0.
    Result<Tensor> y = w(0).rpc_sync<Tensor>("w1", "forward", int64_t{0}, x);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->device(), Device::CUDA(0));  // The reverse of w0's map.
    EXPECT_TRUE(Close(*y, ry));
    const Tensor loss = ag::sum(ag::mul(*y, *y));
    EXPECT_EQ(loss.device(), Device::CUDA(0));
    absl::Status s = w(0).dist_autograd().Backward(scope.id(), {loss});
    ASSERT_TRUE(s.ok()) << s;

    EXPECT_TRUE(
        Close(GradientOn(0, scope.id(), a, Device::CUDA(0)), (*ref)[0]));
    EXPECT_TRUE(
        Close(GradientOn(1, scope.id(), w_[0], Device::CUDA(1)), (*ref)[1]));
    EXPECT_TRUE(
        Close(GradientOn(1, scope.id(), b_[0], Device::CUDA(1)), (*ref)[2]));
    EXPECT_EQ(w(1).dist_autograd().GetGradients(scope.id())->size(), 2u);
  }
}

TEST_F(DeviceAutogradTest, GradientsReturnToTheDevicesTheTensorsCameFrom) {
  const uint64_t landed_before = w(0).staged_traffic("w1").tensors_in;
  ForwardAndBackwardAcrossDevices();
  // The result and the returning gradient both landed on w0 (staged).
  EXPECT_GE(w(0).staged_traffic("w1").tensors_in, landed_before + 2);
}

class DeviceAutogradIpcTest : public DeviceAutogradTest {
 protected:
  bool SameHostIpc() const override { return true; }
};

// The same, with w0 and w1 on one host: the forward's request and reply and
// the returning gradient all travel by CUDA IPC, none staged, and w1's
// exported gradient is released once the BACKWARD's reply acknowledged it.
TEST_F(DeviceAutogradIpcTest, GradientsReturnByIpcToTheDevicesTheyCameFrom) {
  ForwardAndBackwardAcrossDevices();
  const IpcTraffic in = w(0).ipc_traffic("w1");
  EXPECT_EQ(in.reply_tensors_in, 1u);                 // y.
  EXPECT_EQ(in.tensors_in - in.reply_tensors_in, 1u);  // The gradient of x.
  // x, and the gradient of y (w0's own BACKWARD request, as any request).
  EXPECT_EQ(w(1).ipc_traffic("w0").tensors_in, 2u);
  EXPECT_EQ(w(0).staged_traffic("w1").tensors_in, 0u);
  EXPECT_EQ(w(1).staged_traffic("w0").tensors_in, 0u);
  EXPECT_EQ(w(1).ipc_traffic("w0").held_calls, 0u);
}

// A proxy call on an RRef to a remote object holding a device tensor, in a
// distributed autograd context: the argument lands on w1's cuda:1, the
// result on w0's cuda:0, and the gradients reach w0's leaf (cuda:0) and the
// object's tensor (w1's cuda:1). rpc_async() proxies work the same way.
TEST_F(DeviceAutogradTest, ProxyCallsOnADeviceObjectAndTheirGradients) {
  const Tensor s_cpu = randn({6}, 31, DType::kFloat64);
  const Tensor x_cpu = randn({6}, 32, DType::kFloat64);
  rref::RRef<Shard> shard =
      w(0).remote<Shard>("w1", "Shard", OnDevice(0, s_cpu, 0));
  Result<std::string> where = shard.rpc_sync(kWait).call<std::string>("where");
  ASSERT_TRUE(where.ok()) << where.status();
  EXPECT_EQ(*where, "cuda:1");

  const Tensor x = DeviceLeaf(0, x_cpu, 0);
  Result<Tensor> async = shard.rpc_async(kWait).call<Tensor>("apply", x).Get();
  ASSERT_TRUE(async.ok()) << async.status();
  EXPECT_EQ(async->device(), Device::CUDA(0));
  EXPECT_TRUE(Close(*async, x_cpu.mul(s_cpu)));

  Tensor rx = Leaf(x_cpu), rs = Leaf(s_cpu);
  absl::StatusOr<std::vector<Tensor>> ref =
      ag::Grad({ag::sum(ag::tanh(ag::mul(rx, rs)))}, {rx, rs});
  ASSERT_TRUE(ref.ok()) << ref.status();
  ContextScope scope(w(0).dist_autograd());
  Result<Tensor> y = shard.rpc_sync(kWait).call<Tensor>("apply", x);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->device(), Device::CUDA(0));
  absl::Status s =
      w(0).dist_autograd().Backward(scope.id(), {ag::sum(ag::tanh(*y))});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(Close(GradientOn(0, scope.id(), x, Device::CUDA(0)), (*ref)[0]));
  absl::StatusOr<GradientMap> g1 =
      w(1).dist_autograd().GetGradients(scope.id());
  ASSERT_TRUE(g1.ok()) << g1.status();
  ASSERT_EQ(g1->size(), 1u);  // The object's tensor.
  const Tensor gs = g1->entries()[0].second;
  EXPECT_EQ(gs.device(), Device::CUDA(1));
  EXPECT_TRUE(Close(gs, (*ref)[1]));
}

// An RRef to a device value, forked: to a third worker, whose to_here()
// lands it on its own mapped device (the reverse of its map to the owner),
// and back to its owner, which reads its own value where it is.
TEST_F(DeviceAutogradTest, ForkedDeviceRRefsLandOnEachHoldersMappedDevice) {
  // Above the RRef layer's inline limit, so fetches carry it whatever the
  // creation reply's timing.
  const Tensor cpu = randn({1000}, 41, DType::kFloat64);
  rref::RRef<Tensor> value =
      w(0).remote<Tensor>("w1", "echo", OnDevice(0, cpu, 0));
  absl::StatusOr<Tensor> here = value.to_here(kWait);
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_EQ(here->device(), Device::CUDA(0));
  EXPECT_TRUE(Close(*here, cpu));

  Result<Tensor> on_w2 = w(0).rpc_sync<Tensor>("w2", "fetch", value);
  ASSERT_TRUE(on_w2.ok()) << on_w2.status();
  EXPECT_TRUE(on_w2->device().is_cpu());
  EXPECT_TRUE(on_w2->allclose(cpu, 0, 0));
  EXPECT_GE(w(2).staged_traffic("w1").tensors_in, 1u);

  Result<std::string> at_owner =
      w(0).agent().rpc_sync<std::string>("w1", "owner_view", value);
  ASSERT_TRUE(at_owner.ok()) << at_owner.status();
  EXPECT_EQ(*at_owner, "owner cuda:1");
}

// DistributedOptimizer steps w1's device parameters through RRefs: after
// each step they equal the same optimizer run in one process on the CPU
// (SGD with momentum, Adam, and SGD fused into the backward pass; three
// steps each).
TEST_F(DeviceAutogradTest, DistributedOptimizerStepsDeviceParametersAsOnCpu) {
  const optim::FunctionalOptions kinds[] = {
      optim::SgdOptions{.lr = 0.1, .momentum = 0.9},
      optim::AdamOptions{.lr = 0.05},
      optim::SgdOptions{.lr = 0.1, .momentum = 0.9}};
  const char* names[] = {"SGD", "Adam", "fused SGD"};
  for (int k = 1; k < kSets; ++k) {
    SCOPED_TRACE(names[k - 1]);
    const optim::FunctionalOptions& kind = kinds[k - 1];
    const bool fused = k == 3;
    Result<std::vector<rref::RRef<Tensor>>> params =
        w(0).rpc_sync<std::vector<rref::RRef<Tensor>>>("w1", "params",
                                                       int64_t{k});
    ASSERT_TRUE(params.ok()) << params.status();
    auto opt = optim::DistributedOptimizer::Create(w(0).agent(), kind, *params);
    ASSERT_TRUE(opt.ok()) << opt.status();
    std::vector<Tensor> ref = {w_cpu_.clone(), b_cpu_.clone()};
    optim::SgdState sgd;
    optim::AdamState adam;
    for (int it = 0; it < 3; ++it) {
      const Tensor x_cpu = randn({5, 3}, 50 + it, DType::kFloat64);
      // One process, on the CPU.
      Tensor rw = Leaf(ref[0]), rb = Leaf(ref[1]);
      Tensor ry = Forward(x_cpu, rw, rb);
      absl::StatusOr<std::vector<Tensor>> g =
          ag::Grad({ag::sum(ag::mul(ry, ry))}, {rw, rb});
      ASSERT_TRUE(g.ok()) << g.status();
      absl::Status local =
          k == 2
              ? optim::AdamStep(ref, *g, adam,
                                std::get<optim::AdamOptions>(kind))
              : optim::SgdStep(ref, *g, sgd, std::get<optim::SgdOptions>(kind));
      ASSERT_TRUE(local.ok()) << local;
      // Across workers, on the devices.
      ContextScope scope(w(0).dist_autograd());
      Result<Tensor> y = w(0).rpc_sync<Tensor>("w1", "forward", int64_t{k},
                                               OnDevice(0, x_cpu, 0));
      ASSERT_TRUE(y.ok()) << y.status();
      autograd::dist::BackwardOptions bo;
      if (fused) bo.fused_optimizer = opt->get();
      absl::Status s = w(0).dist_autograd().Backward(
          scope.id(), {ag::sum(ag::mul(*y, *y))}, bo);
      ASSERT_TRUE(s.ok()) << s;
      if (!fused) s = (*opt)->Step(scope.id());
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(w_[k].device(), Device::CUDA(1));
      EXPECT_TRUE(Close(w_[k], ref[0])) << "step " << it;
      EXPECT_TRUE(Close(b_[k], ref[1])) << "step " << it;
    }
    EXPECT_FALSE(Host(w_[k]).allclose(w_cpu_, 1e-6, 0)) << "never stepped";
  }
}

// A tensor staged to w1's CPU (w0's cuda:1 is unmapped and w0 allows it)
// gets a CPU gradient back, which w0's send node moves back onto the
// cuda:1 the tensor left from; equal to one CPU process.
TEST_F(DeviceAutogradTest, AGradientOfATensorStagedToCpuReturnsToItsDevice) {
  const Tensor x_cpu = randn({4}, 61, DType::kFloat64);
  Tensor rx = Leaf(x_cpu);
  absl::StatusOr<std::vector<Tensor>> ref = ag::Grad(
      {ag::sum(ag::tanh(ag::mul(ag::mul(rx, rx), Leaf(cpu_param_))))}, {rx});
  ASSERT_TRUE(ref.ok()) << ref.status();
  const Tensor x = DeviceLeaf(0, x_cpu, 1);
  ContextScope scope(w(0).dist_autograd());
  const Tensor sq = ag::mul(x, x);  // On w0's cuda:1 (unmapped).
  Result<Tensor> y = w(0).rpc_sync<Tensor>("w1", "scale_cpu", sq);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(y->device().is_cpu());
  absl::Status s =
      w(0).dist_autograd().Backward(scope.id(), {ag::sum(ag::tanh(*y))});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(Close(GradientOn(0, scope.id(), x, Device::CUDA(1)), (*ref)[0]));
  EXPECT_EQ(w(0).staged_traffic("w1").to_cpu_out, 1u);
}

}  // namespace
}  // namespace ferry
