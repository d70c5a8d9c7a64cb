// CUDA tensors over Ferry's RPC on one GPU (issue #32), beside the physical
// floors; bench/rpc/torch_cuda_rpc_bench.py measures PyTorch's TensorPipe
// agent with device maps the same way, bench/rpc/cuda_report.py puts them
// side by side (tools/gpu_check step rpc_bench runs all three).
//
//   cuda_rpc_bench [--sizes=4096,...] [--budget_s=0.3] [--skip_autograd]
//                  [--batch=256] [--width=1024] [--fake]
//
// Two processes share cuda:0: this one (w0) and a copy of itself (w1,
// --role=peer), one group per path, forced with WorkerOptions::
// cuda_transport: "ipc" (requests and replies carry CUDA IPC handles:
// worker/device_ipc.h) and "staged" (device -> pinned host ->
// the peer's pinned host -> device: worker/device_stage.h), whose large
// payloads go through the same-host channel, and "streamed": staged with
// that channel off (WorkerOptions::same_host), so payloads of 1 MiB and
// more are streamed over gRPC as between hosts, pipelined both ways
// (chunked device-to-host copies while sending, worker/device_landing.h's
// host-to-device copies while receiving). Figures, each
// a median over calls timed until --budget_s passed (at least 3, at most
// 200), one JSON line each and a table:
//   tensor_send   a float32 CUDA tensor of N bytes to w1 (which answers
//                 its element count): one-way GB/s = N / round trip
//   tensor_echo   the same tensor sent and returned onto w0's cuda:0:
//                 GB/s = 2N / round trip
//   d2d_copy      floor: cudaMemcpyAsync device to device in this process
//   h2d_pinned / d2h_pinned  floor: pinned host <-> device copies
//   dist_autograd_step  w0: x (batch x width) -> w1's tanh(x W + b) (W
//                 width x width)
//                 -> sum(y*y), then distributed backward; with the tensors
//                 on cuda:0 (paths "ipc" and "staged") or on the CPU (path
//                 "cpu", a group without devices)
//   single_gpu_step  the same step in one process on the GPU (path "local",
//                 local autograd, no RPC)
// Without a GPU it exits 2 naming CUDA's reason. --fake checks the flow
// without one: FakeDeviceApi host memory computing through the host backend
// (tensor/cuda/host_ops.h), figures printed as impl "fake" (meaningless as
// numbers), floors left out, and "ipc" staged (a fake shares no memory
// across processes; the worker logs why).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/ops.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/cuda_device_api.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
#include "ferry/tensor/cuda/ops.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tests/util/subprocess.h"
#include "ferry/worker/worker.h"

ABSL_FLAG(std::string, sizes,
          "4096,65536,1048576,16777216,67108864,268435456",
          "tensor sizes in bytes (multiples of 4)");
ABSL_FLAG(double, budget_s, 0.3, "seconds of timed calls per figure");
ABSL_FLAG(bool, skip_autograd, false, "leave out the autograd figures");
ABSL_FLAG(int64_t, batch, 256, "rows of x in the autograd step");
ABSL_FLAG(int64_t, width, 1024, "x's columns and W's side in the autograd step");
ABSL_FLAG(bool, fake, false,
          "FakeDeviceApi devices with the host backend (checks the flow "
          "without a GPU; the figures mean nothing)");
ABSL_FLAG(std::string, role, "", "internal: \"peer\" for w1");
ABSL_FLAG(std::string, init, "", "internal: the group's init method");
ABSL_FLAG(std::string, transport, "", "internal: ipc, staged or cpu");

namespace {

namespace ag = ::ferry::autograd;
using ferry::Device;
using ferry::Tensor;
using ferry::Worker;
using Clock = std::chrono::steady_clock;


// Median seconds of `op`, called until the budget passed (>= 3, <= 200
// calls) after one warm-up call; the first error stops it.
absl::StatusOr<double> MedianSeconds(const std::function<absl::Status()>& op) {
  if (absl::Status s = op(); !s.ok()) return s;
  const double budget = absl::GetFlag(FLAGS_budget_s);
  std::vector<double> s;
  const auto start = Clock::now();
  while (s.size() < 200 &&
         (s.size() < 3 ||
          std::chrono::duration<double>(Clock::now() - start).count() <
              budget)) {
    const auto t0 = Clock::now();
    if (absl::Status e = op(); !e.ok()) return e;
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

void PrintFigure(const std::string& impl, const std::string& path,
                 const std::string& name, int64_t bytes, double seconds,
                 double moved) {
  const double gbps = moved > 0 ? moved / seconds / 1e9 : 0;
  std::printf("%-8s %-10s %-18s %11lld %12.1f us %9.2f GB/s\n", impl.c_str(),
              path.c_str(), name.c_str(), static_cast<long long>(bytes),
              seconds * 1e6, gbps);
  std::printf(
      "{\"bench\": \"cuda_rpc\", \"impl\": \"%s\", \"path\": \"%s\", "
      "\"name\": \"%s\", \"bytes\": %lld, \"us_p50\": %.2f, \"gbps\": %.4f}\n",
      impl.c_str(), path.c_str(), name.c_str(), static_cast<long long>(bytes),
      seconds * 1e6, gbps);
  std::fflush(stdout);
}

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cuda_rpc_bench: ", what, ": ", cudaGetErrorString(e)));
}

// d2d_copy, h2d_pinned and d2h_pinned at every size.
absl::Status Floors(const std::vector<int64_t>& sizes) {
  const int64_t most = *std::max_element(sizes.begin(), sizes.end());
  void *a = nullptr, *b = nullptr, *h = nullptr;
  absl::Status s = Cuda(cudaSetDevice(0), "cudaSetDevice");
  if (s.ok()) s = Cuda(cudaMalloc(&a, most), "cudaMalloc");
  if (s.ok()) s = Cuda(cudaMalloc(&b, most), "cudaMalloc");
  if (s.ok()) s = Cuda(cudaMallocHost(&h, most), "cudaMallocHost");
  cudaStream_t stream = nullptr;
  if (s.ok()) s = Cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  struct Floor {
    const char* name;
    void* dst;
    const void* src;
    cudaMemcpyKind kind;
  };
  const Floor floors[] = {{"d2d_copy", b, a, cudaMemcpyDeviceToDevice},
                          {"h2d_pinned", a, h, cudaMemcpyHostToDevice},
                          {"d2h_pinned", h, a, cudaMemcpyDeviceToHost}};
  for (const Floor& f : floors) {
    for (int64_t n : sizes) {
      if (!s.ok()) break;
      absl::StatusOr<double> t = MedianSeconds([&] {
        absl::Status e =
            Cuda(cudaMemcpyAsync(f.dst, f.src, n, f.kind, stream), f.name);
        return e.ok() ? Cuda(cudaStreamSynchronize(stream), f.name) : e;
      });
      if (!t.ok()) {
        s = t.status();
        break;
      }
      PrintFigure("cuda", "floor", f.name, n, *t, static_cast<double>(n));
    }
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (h != nullptr) cudaFreeHost(h);
  if (b != nullptr) cudaFree(b);
  if (a != nullptr) cudaFree(a);
  return s;
}

// A process's cuda:0: the device calls its worker uses and the context its
// tensors are made and computed with (the same fake with --fake).
struct Devices {
  std::shared_ptr<ferry::cuda::DeviceMemoryApi> api;
  std::unique_ptr<ferry::cuda::CudaContext> ctx;
};

absl::StatusOr<Devices> OpenDevices() {
  Devices d;
  if (absl::GetFlag(FLAGS_fake)) {
    auto fake =
        std::make_shared<ferry::cuda::FakeDeviceApi>(1, uint64_t{4} << 30);
    d.api = fake;
    absl::StatusOr<std::unique_ptr<ferry::cuda::CudaContext>> ctx =
        ferry::cuda::CreateHostComputeContext(fake, {});
    if (!ctx.ok()) return ctx.status();
    d.ctx = *std::move(ctx);
    return d;
  }
  absl::StatusOr<std::unique_ptr<ferry::cuda::CudaContext>> ctx =
      ferry::cuda::CreateComputeContext({});
  if (!ctx.ok()) return ctx.status();
  d.ctx = *std::move(ctx);
  absl::StatusOr<std::shared_ptr<ferry::cuda::CudaDeviceApi>> api =
      ferry::cuda::CudaDeviceApi::Create();
  if (!api.ok()) return api.status();
  d.api = *std::move(api);
  return d;
}

const char* Impl() { return absl::GetFlag(FLAGS_fake) ? "fake" : "ferry"; }

// The model w1 serves: tanh(x W + b), its parameters on `device`.
struct Model {
  Tensor w, b;
};

absl::StatusOr<Model> MakeModel(ferry::cuda::CudaContext* ctx) {
  const int64_t width = absl::GetFlag(FLAGS_width);
  Tensor w = ferry::randn({width, width}, 7).mul(1.0 / std::sqrt(width));
  Tensor b = ferry::randn({width}, 8);
  if (ctx != nullptr) {
    absl::StatusOr<Tensor> dw = ctx->To(w, Device::CUDA(0));
    if (!dw.ok()) return dw.status();
    absl::StatusOr<Tensor> db = ctx->To(b, Device::CUDA(0));
    if (!db.ok()) return db.status();
    w = *dw;
    b = *db;
  }
  ag::SetRequiresGrad(w);
  ag::SetRequiresGrad(b);
  return Model{w, b};
}

Tensor Forward(const Tensor& x, const Model& m) {
  return ag::tanh(ag::add(ag::matmul(x, m.w), m.b));
}

// Worker options of w0 or w1 of the group for `transport` ("cpu": none).
absl::StatusOr<ferry::WorkerOptions> GroupOptions(
    const std::string& name, const std::string& init,
    const std::string& transport, const Devices& d) {
  ferry::WorkerOptions o;
  o.name = name;
  o.rank = name == "w0" ? 0 : 1;
  o.world_size = 2;
  o.init_method = init;
  o.join_timeout = absl::Seconds(60);
  o.rpc_timeout = absl::Seconds(60);
  if (transport != "cpu") {
    o.devices = {"cuda:0"};
    o.device_api = d.api;
    o.device_compute = d.ctx->shared_compute();
    // "streamed": the staged path over gRPC streams (see the top).
    o.cuda_transport = transport == "streamed" ? "staged" : transport;
    o.same_host = transport != "streamed";
    o.device_maps = {{name == "w0" ? "w1" : "w0", {{"cuda:0", "cuda:0"}}}};
  }
  return o;
}

// w1: serves echo, sink and forward until w0 ends the group.
int RunPeer() {
  const std::string transport = absl::GetFlag(FLAGS_transport);
  Devices d;
  if (transport != "cpu") {
    absl::StatusOr<Devices> opened = OpenDevices();
    if (!opened.ok()) {
      std::fprintf(stderr, "w1: %s\n", opened.status().ToString().c_str());
      return 2;
    }
    d = *std::move(opened);
  }
  absl::StatusOr<Model> model = MakeModel(d.ctx.get());
  absl::StatusOr<ferry::WorkerOptions> o =
      GroupOptions("w1", absl::GetFlag(FLAGS_init), transport, d);
  if (!model.ok() || !o.ok()) {
    std::fprintf(stderr, "w1: %s\n",
                 (model.ok() ? o.status() : model.status()).ToString().c_str());
    return 1;
  }
  auto registry = std::make_shared<ferry::rpc::FunctionRegistry>();
  const Model m = *model;
  if (!registry->Register("echo", [](Tensor t) { return t; }).ok() ||
      !registry->Register("sink", [](Tensor t) { return t.numel(); }).ok() ||
      !registry->Register("forward", [m](Tensor x) { return Forward(x, m); })
           .ok()) {
    return 1;
  }
  o->registry = registry;
  absl::StatusOr<std::unique_ptr<Worker>> w = ferry::InitWorker(*o);
  if (!w.ok()) {
    std::fprintf(stderr, "w1: %s\n", w.status().ToString().c_str());
    return 1;
  }
  absl::Status down = (*w)->Shutdown(absl::Seconds(120));
  if (!down.ok()) {
    std::fprintf(stderr, "w1: %s\n", down.ToString().c_str());
    return 1;
  }
  return 0;
}

// One distributed step from w0: forward through w1, backward from the loss.
// `ctx`: w0's, when x is on its cuda:0 (null on the CPU).
absl::Status DistStep(Worker& w0, const Tensor& x,
                      ferry::cuda::CudaContext* ctx) {
  ag::dist::ContextScope scope(w0.dist_autograd());
  ferry::Result<Tensor> y = w0.rpc_sync<Tensor>("w1", "forward", x);
  if (!y.ok()) return y.status();
  const Tensor loss = ag::sum(ag::mul(*y, *y));
  if (absl::Status s = w0.dist_autograd().Backward(scope.id(), {loss});
      !s.ok() || ctx == nullptr) {
    return s;
  }
  return ctx->Synchronize(Device::CUDA(0));  // x's gradient is computed.
}

// The group for `transport` with a copy of this binary as w1; its figures.
absl::Status RunGroup(const std::string& transport,
                      const std::vector<int64_t>& sizes, const Devices& d) {
  ferry::cuda::CudaContext& ctx = *d.ctx;
  const char* tmp = std::getenv("TMPDIR");
  const std::string init =
      absl::StrCat("file://", tmp ? tmp : "/tmp", "/cuda_rpc_bench_", getpid(),
                   "_", transport);
  ferry::testutil::SpawnOptions so;
  absl::StatusOr<std::unique_ptr<ferry::testutil::Subprocess>> peer =
      ferry::testutil::Subprocess::Spawn(
          {"/proc/self/exe", "--role=peer", "--init=" + init,
           "--transport=" + transport,
           absl::StrCat("--fake=", absl::GetFlag(FLAGS_fake)),
           absl::StrCat("--width=", absl::GetFlag(FLAGS_width))},
          so);
  if (!peer.ok()) return peer.status();
  absl::StatusOr<ferry::WorkerOptions> o =
      GroupOptions("w0", init, transport, d);
  if (!o.ok()) return o.status();
  absl::StatusOr<std::unique_ptr<Worker>> started = ferry::InitWorker(*o);
  if (!started.ok()) return started.status();
  Worker& w0 = **started;
  absl::Status s;
  const std::string path = transport == "cpu" ? "cpu" : transport;
  if (transport != "cpu") {
    for (const char* name : {"tensor_send", "tensor_echo"}) {
      const bool echo = std::string(name) == "tensor_echo";
      for (int64_t n : sizes) {
        if (!s.ok()) break;
        absl::StatusOr<Tensor> x =
            ctx.To(ferry::arange(n / 4, ferry::DType::kFloat32),
                   Device::CUDA(0));
        if (!x.ok()) {
          s = x.status();
          break;
        }
        absl::StatusOr<double> t = MedianSeconds([&]() -> absl::Status {
          if (echo) {
            ferry::Result<Tensor> r = w0.rpc_sync<Tensor>("w1", "echo", *x);
            if (!r.ok()) return r.status();
            if (r->device() != Device::CUDA(0) || r->numel() != n / 4) {
              return absl::InternalError("echo: the tensor came back wrong");
            }
            return absl::OkStatus();
          }
          ferry::Result<int64_t> r = w0.rpc_sync<int64_t>("w1", "sink", *x);
          if (!r.ok()) return r.status();
          return *r == n / 4 ? absl::OkStatus()
                             : absl::InternalError("sink: wrong count");
        });
        if (!t.ok()) {
          s = t.status();
          break;
        }
        PrintFigure(Impl(), path, name, n, *t,
                    echo ? 2.0 * static_cast<double>(n)
                         : static_cast<double>(n));
      }
    }
  }
  if (s.ok() && !absl::GetFlag(FLAGS_skip_autograd)) {
    Tensor x = ferry::randn(
        {absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_width)}, 9);
    if (transport != "cpu") {
      absl::StatusOr<Tensor> dx = ctx.To(x, Device::CUDA(0));
      if (dx.ok()) x = *dx;
      s = dx.status();
    }
    ag::SetRequiresGrad(x);
    if (s.ok()) {
      absl::StatusOr<double> t = MedianSeconds([&] {
        return DistStep(w0, x, transport == "cpu" ? nullptr : &ctx);
      });
      s = t.status();
      if (t.ok()) {
        PrintFigure(Impl(), path, "dist_autograd_step",
                    4 * absl::GetFlag(FLAGS_batch) * absl::GetFlag(FLAGS_width), *t, 0);
      }
    }
  }
  absl::Status down = w0.Shutdown(absl::Seconds(120));
  absl::StatusOr<int> code = (*peer)->Wait(absl::Now() + absl::Seconds(60));
  std::remove(init.substr(std::string("file://").size()).c_str());
  if (s.ok()) s = down;
  if (s.ok() && (!code.ok() || *code != 0)) {
    s = absl::InternalError(
        absl::StrCat("w1 (", transport, ") ended with ",
                     code.ok() ? absl::StrCat("exit ", *code)
                               : code.status().ToString()));
  }
  return s;
}

// The same step in one process on the GPU (local autograd, no RPC).
absl::Status SingleGpuStep(ferry::cuda::CudaContext& ctx) {
  absl::StatusOr<Model> m = MakeModel(&ctx);
  if (!m.ok()) return m.status();
  absl::StatusOr<Tensor> x =
      ctx.To(ferry::randn(
        {absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_width)}, 9), Device::CUDA(0));
  if (!x.ok()) return x.status();
  ag::SetRequiresGrad(*x);
  absl::StatusOr<double> t = MedianSeconds([&]() -> absl::Status {
    const Tensor y = Forward(*x, *m);
    if (absl::Status s = ag::Backward({ag::sum(ag::mul(y, y))}); !s.ok()) {
      return s;
    }
    return ctx.Synchronize(Device::CUDA(0));
  });
  if (!t.ok()) return t.status();
  PrintFigure(Impl(), "local", "single_gpu_step", 4 * absl::GetFlag(FLAGS_batch) * absl::GetFlag(FLAGS_width), *t, 0);
  return absl::OkStatus();
}

int Run() {
  std::vector<int64_t> sizes;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 4 || n % 4 != 0) {
      std::fprintf(stderr,
                   "cuda_rpc_bench: --sizes: '%s' is not a positive multiple "
                   "of 4\n",
                   std::string(part).c_str());
      return 2;
    }
    sizes.push_back(n);
  }
  if (sizes.empty() || absl::GetFlag(FLAGS_budget_s) <= 0 ||
      absl::GetFlag(FLAGS_batch) <= 0 || absl::GetFlag(FLAGS_width) <= 0) {
    std::fprintf(stderr,
                 "cuda_rpc_bench: --sizes, and --budget_s, --batch and "
                 "--width > 0, are needed\n");
    return 2;
  }
  absl::StatusOr<Devices> d = OpenDevices();
  if (!d.ok()) {
    std::fprintf(stderr, "cuda_rpc_bench: %s\n",
                 d.status().ToString().c_str());
    return 2;
  }
  std::printf("%-8s %-10s %-18s %11s %15s %14s\n", "impl", "path", "figure",
              "bytes", "median", "rate");
  absl::Status s =
      absl::GetFlag(FLAGS_fake) ? absl::OkStatus() : Floors(sizes);
  for (const char* transport : {"ipc", "staged", "streamed", "cpu"}) {
    if (!s.ok()) break;
    if (std::string(transport) == "cpu" && absl::GetFlag(FLAGS_skip_autograd)) {
      break;
    }
    s = RunGroup(transport, sizes, *d);
  }
  if (s.ok() && !absl::GetFlag(FLAGS_skip_autograd)) {
    s = SingleGpuStep(*d->ctx);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "cuda_rpc_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_role) == "peer") return RunPeer();
  return Run();
}
