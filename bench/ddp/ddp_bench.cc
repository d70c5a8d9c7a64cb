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

ABSL_FLAG(std::string, mode, "single", "single or ddp");
ABSL_FLAG(std::string, mlp, "1024-1024-1024-10", "layer widths");
ABSL_FLAG(int64_t, batch, 64, "batch per rank");
ABSL_FLAG(int, iters, 20, "steps per timed loop");
ABSL_FLAG(int, repeats, 3, "timed loops (best is reported)");
ABSL_FLAG(bool, fp16, false, "fp16 compression hook");
ABSL_FLAG(bool, optimizer_in_backward, false, "SGD step per bucket");
ABSL_FLAG(bool, bucket_view, true, "gradient_as_bucket_view");
ABSL_FLAG(int, threads, 1, "threads (reported; set via the environment)");

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

std::shared_ptr<c10d::ProcessGroup> InitGroup() {
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
  auto pg = c10d::InitProcessGroup(std::move(o));
  Check(pg.status());
  return *pg;
}

int Run() {
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
  const bool ddp_mode = absl::GetFlag(FLAGS_mode) == "ddp";
  std::shared_ptr<c10d::ProcessGroup> pg;
  std::unique_ptr<ddp::DistributedDataParallel> ddp;
  auto wire_bytes = std::make_shared<std::atomic<int64_t>>(0);
  optim::SgdOptions sgd_options{.lr = 0.01};
  const bool in_backward = absl::GetFlag(FLAGS_optimizer_in_backward);
  if (ddp_mode) {
    pg = InitGroup();
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
  Tensor x = randn({batch, widths.front()}, 1 + rank);
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i + rank) % widths.back();
  Tensor y = from_vector<int64_t>(labels, {batch});
  optim::SGD sgd(model->parameters(), sgd_options);
  auto step = [&] {
    for (const Tensor& p : model->parameters()) {
      Tensor g = autograd::GradOf(p);
      if (g.defined()) g.zero_();
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
  double best = 1e300;
  wire_bytes->store(0);
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) step();
    best = std::min(
        best, std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  const int64_t steps =
      static_cast<int64_t>(iters) * absl::GetFlag(FLAGS_repeats);
  if (rank == 0) {
    std::printf(
        "{\"bench\": \"ddp\", \"impl\": \"ferry\", \"mode\": \"%s\", "
        "\"world\": %d, \"mlp\": \"%s\", \"params\": %lld, \"batch\": %lld, "
        "\"fp16\": %s, \"optimizer_in_backward\": %s, \"buckets\": %zu, "
        "\"threads\": %d, \"time_us\": %.1f, \"allreduce_bytes\": %lld}\n",
        ddp_mode ? "ddp" : "single", pg != nullptr ? pg->size() : 1,
        absl::GetFlag(FLAGS_mlp).c_str(), static_cast<long long>(params),
        static_cast<long long>(batch),
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
