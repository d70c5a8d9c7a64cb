// Ferry side of bench/ddp (run it through run.sh, which runs PyTorch 1.13's
// DDP in the same job). One JSON line from rank 0 per run:
//   --mode=single  forward + cross-entropy + backward + SGD step of an MLP
//                  (float32, ReLU between layers) in one process;
//   --mode=ddp     the same per rank under DistributedDataParallel (Gloo),
//                  each rank with its own batch; launched by ferry_run.
// time_us is the best per-step time over --repeats timed loops after
// warm-up (ranks stay in lockstep through the all-reduces).
// allreduce_bytes is what the communication hook put on the wire per step
// and rank (half of the gradient bytes with --fp16).
// --device=cuda: model, batch, gradients and buckets on cuda:(LOCAL_RANK mod
// GPUs), buckets all-reduced by NCCL (group "cpu:gloo,cuda:nccl"), ranks
// sharing a GPU with their own NCCL_HOSTID (tensor/cuda/local_rank.h); each
// timed loop ends with a device synchronization. tools/gpu_check runs it at
// 2 processes on one GPU with --mlp=4096-4096-2048-10 (25.2M parameters)
// beside torch_ddp_bench.py --device=cuda (step ddp_bench). Without CUDA it
// exits 2 naming the reason.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/ops.h"
#include "ferry/c10d/init.h"
#include "ferry/ddp/distributed_data_parallel.h"
#include "ferry/ddp/optimizer_in_backward.h"
#include "ferry/optim/optim.h"
#include "ferry/store/tcp_store.h"
#include "ferry/tensor/cuda/device_ops.h"
#ifdef FERRY_DDP_BENCH_CUDA
#include "ferry/tensor/cuda/local_rank.h"
#include "ferry/tensor/cuda/ops.h"
#endif

ABSL_FLAG(std::string, mode, "single", "single or ddp");
ABSL_FLAG(std::string, mlp, "1024-1024-1024-10", "layer widths");
ABSL_FLAG(int64_t, batch, 64, "batch per rank");
ABSL_FLAG(int, iters, 20, "steps per timed loop");
ABSL_FLAG(int, repeats, 3, "timed loops (best is reported)");
ABSL_FLAG(bool, fp16, false, "fp16 compression hook");
ABSL_FLAG(bool, optimizer_in_backward, false, "SGD step per bucket");
ABSL_FLAG(bool, bucket_view, true, "gradient_as_bucket_view");
ABSL_FLAG(int, threads, 1, "threads (reported; set via the environment)");
ABSL_FLAG(std::string, device, "cpu", "cpu, or cuda (see the top)");

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "ddp_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int out = fallback;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

std::shared_ptr<c10d::ProcessGroup> InitGroup(const std::string& backend) {
  TcpStoreOptions so;
  const char* addr = std::getenv("MASTER_ADDR");
  so.host = addr != nullptr ? addr : "127.0.0.1";
  so.port = EnvInt("MASTER_PORT", 29500);
  const char* agent = std::getenv("FERRY_USE_AGENT_STORE");
  so.is_server = !(agent != nullptr && std::strcmp(agent, "1") == 0) &&
                 EnvInt("RANK", 0) == 0;
  auto store = TcpStore::Create(so);
  Check(store.status());
  c10d::InitProcessGroupOptions o;
  o.store = std::shared_ptr<Store>(*std::move(store));
  o.rank = EnvInt("RANK", 0);
  o.world_size = EnvInt("WORLD_SIZE", 1);
  o.group.timeout = absl::Seconds(120);
  if (!backend.empty()) o.group.backend = backend;
  auto pg = c10d::InitProcessGroup(std::move(o));
  Check(pg.status());
  return *pg;
}

// The device the bench runs on; `ops` is null on the CPU.
struct Place {
  Device device;
  cuda::DeviceOps* ops = nullptr;
#ifdef FERRY_DDP_BENCH_CUDA
  std::unique_ptr<cuda::CudaContext> ctx;
#endif
  Tensor Put(const Tensor& t) const {
    if (ops == nullptr) return t;
    absl::StatusOr<Tensor> out = ops->To(t, device);
    Check(out.status());
    return *out;
  }
  absl::Status Sync() const {
#ifdef FERRY_DDP_BENCH_CUDA
    if (ctx != nullptr) return ctx->Synchronize(device);
#endif
    return absl::OkStatus();
  }
};

Place MakePlace() {
  Place place;
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu") return place;
#ifdef FERRY_DDP_BENCH_CUDA
  if (device == "cuda") {
    auto ctx = cuda::CreateComputeContext({});
    if (!ctx.ok()) {
      std::fprintf(stderr, "ddp_bench: %s\n", ctx.status().ToString().c_str());
      std::exit(2);
    }
    place.ctx = *std::move(ctx);
    const cuda::LocalRankDevice mine = cuda::DeviceForLocalRank(
        EnvInt("LOCAL_RANK", EnvInt("RANK", 0)), place.ctx->device_count());
    place.device = mine.device;
    place.ops = place.ctx->compute();
    if (!mine.nccl_hostid.empty()) {
      setenv("NCCL_HOSTID", mine.nccl_hostid.c_str(), 1);
    }
    return place;
  }
#endif
  std::fprintf(stderr, "ddp_bench: --device=%s: not cpu%s\n", device.c_str(),
#ifdef FERRY_DDP_BENCH_CUDA
               " or cuda"
#else
               " (built without CUDA)"
#endif
  );
  std::exit(2);
}

int Run() {
  const Place place = MakePlace();
  std::vector<int64_t> widths;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_mlp), '-')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(w, &v)) return 2;
    widths.push_back(v);
  }
  auto model = std::make_shared<nn::Sequential>();
  int64_t params = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) model->Append(std::make_shared<nn::ReLU>());
    model->Append(
        std::make_shared<nn::Linear>(widths[i], widths[i + 1], 10 + i));
    params += widths[i] * widths[i + 1] + widths[i + 1];
  }
  if (place.ops != nullptr) Check(model->to(place.device, place.ops));
  const bool ddp_mode = absl::GetFlag(FLAGS_mode) == "ddp";
  std::shared_ptr<c10d::ProcessGroup> pg;
  std::unique_ptr<ddp::DistributedDataParallel> ddp;
  auto wire_bytes = std::make_shared<std::atomic<int64_t>>(0);
  optim::SgdOptions sgd_options{.lr = 0.01};
  const bool in_backward = absl::GetFlag(FLAGS_optimizer_in_backward);
  if (ddp_mode) {
    pg = InitGroup(place.ops != nullptr ? "cpu:gloo,cuda:nccl" : "");
    ddp::DdpOptions o;
    o.gradient_as_bucket_view = absl::GetFlag(FLAGS_bucket_view);
    ddp::CommHook inner = absl::GetFlag(FLAGS_fp16) ? ddp::Fp16CompressHook()
                                                    : ddp::AllreduceHook();
    // Counts the bytes each hook's result (what went on the wire) holds.
    o.comm_hook = [inner, wire_bytes](c10d::ProcessGroup& g,
                                      const ddp::GradBucket& b) {
      return inner(g, b).Then(
          [wire_bytes](const absl::StatusOr<Tensor>& r)
              -> absl::StatusOr<Tensor> {
            if (r.ok()) wire_bytes->fetch_add(r->nbytes());
            return r;
          });
    };
    if (in_backward) {
      o.optimizer_in_backward =
          ddp::SgdInBackward(sgd_options, model->parameters().size());
    }
    auto made = ddp::DistributedDataParallel::Create(model, pg, o);
    Check(made.status());
    ddp = *std::move(made);
  }
  const int rank = pg != nullptr ? pg->rank() : 0;
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  Tensor x = place.Put(randn({batch, widths.front()}, 1 + rank));
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i + rank) % widths.back();
  Tensor y = place.Put(from_vector<int64_t>(labels, {batch}));
  optim::SGD sgd(model->parameters(), sgd_options);
  auto step = [&] {
    for (const Tensor& p : model->parameters()) {
      Tensor g = autograd::GradOf(p);
      if (!g.defined()) continue;
      if (place.ops != nullptr) {
        Check(place.ops->Fill(g, 0));
      } else {
        g.zero_();
      }
    }
    Tensor loss = autograd::cross_entropy(model->Forward(x), y);
    if (ddp != nullptr) {
      Check(ddp->Backward(loss));
    } else {
      Check(autograd::Backward({loss}));
    }
    if (!(ddp != nullptr && in_backward)) Check(sgd.Step());
  };
  const int iters = absl::GetFlag(FLAGS_iters);
  for (int i = 0; i < std::max(2, iters / 5); ++i) step();
  Check(place.Sync());
  double best = 1e300;
  wire_bytes->store(0);
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) step();
    Check(place.Sync());
    best = std::min(
        best, std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  const int64_t steps =
      static_cast<int64_t>(iters) * absl::GetFlag(FLAGS_repeats);
  if (rank == 0) {
    std::printf(
        "{\"bench\": \"ddp\", \"impl\": \"ferry\", \"mode\": \"%s\", "
        "\"world\": %d, \"mlp\": \"%s\", \"params\": %lld, \"batch\": %lld, "
        "\"device\": \"%s\", \"fp16\": %s, \"optimizer_in_backward\": %s, "
        "\"buckets\": %zu, "
        "\"threads\": %d, \"time_us\": %.1f, \"allreduce_bytes\": %lld}\n",
        ddp_mode ? "ddp" : "single", pg != nullptr ? pg->size() : 1,
        absl::GetFlag(FLAGS_mlp).c_str(), static_cast<long long>(params),
        static_cast<long long>(batch), place.ops != nullptr ? "cuda" : "cpu",
        absl::GetFlag(FLAGS_fp16) ? "true" : "false",
        in_backward ? "true" : "false",
        ddp != nullptr ? ddp->reducer().buckets().size() : size_t{0},
        absl::GetFlag(FLAGS_threads), best * 1e6,
        static_cast<long long>(wire_bytes->load() / steps));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
