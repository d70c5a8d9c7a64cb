// Data-parallel training of an MLP classifier with DistributedDataParallel.
//
//   bazel build --config=opt //examples/ddp //tools/launcher:ferry_run
//   bazel-bin/tools/launcher/ferry_run --nproc 2 -- bazel-bin/examples/ddp/ddp
//
// Every rank generates the same seeded Gaussian clusters and trains on its
// own shard of each global batch (rank r takes rows [r*B, (r+1)*B) of the
// step's W*B rows). Ranks start from *different* initial weights:
// DistributedDataParallel broadcasts rank 0's at construction. Rank 0 prints
// progress (step, its shard's loss, global samples/s) and the held-out
// accuracy. At the end all ranks all-gather their parameters and check they
// are bit-identical; the exit status is 1 otherwise (or when accuracy stays
// below --target_accuracy).
//
// --device=cuda trains on the GPU: parameters, gradients and DDP's buckets
// on cuda:(LOCAL_RANK mod GPUs), the buckets all-reduced by NCCL (group
// "cpu:gloo,cuda:nccl"; metadata stays on Gloo). Ranks beyond the GPU count
// share devices: NCCL refuses two ranks of one host on one device, so each
// such rank takes its own NCCL_HOSTID and NCCL treats them as separate
// hosts. Built without CUDA, or run without a GPU, it exits 2 naming why.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/ddp.h"
#include "ferry/ferry.h"
#include "ferry/store.h"
#ifdef FERRY_DDP_EXAMPLE_CUDA
#include "ferry/tensor/cuda/local_rank.h"
#include "ferry/tensor/cuda/ops.h"
#endif

ABSL_FLAG(int64_t, steps, 300, "training steps");
ABSL_FLAG(int64_t, batch, 32, "rows per rank per step");
ABSL_FLAG(int64_t, hidden, 64, "hidden width");
ABSL_FLAG(int64_t, log_every, 50, "progress every N steps (rank 0)");
ABSL_FLAG(double, lr, 0.05, "SGD learning rate");
ABSL_FLAG(double, target_accuracy, 0.9, "held-out accuracy to reach");
ABSL_FLAG(bool, fp16, false, "compress gradients to float16 on the wire");
ABSL_FLAG(bool, bucket_view, true, "gradients as views into bucket buffers");
ABSL_FLAG(std::string, device, "cpu", "cpu, or cuda (see the top)");

namespace ferry {
namespace {

constexpr int64_t kDim = 8;
constexpr int64_t kClasses = 4;

struct Data {
  Tensor x;  // [n, kDim] float32
  Tensor y;  // [n] int64
};

// Points around kClasses centres (the centres are the same for every seed).
Data Clusters(int64_t n, uint64_t seed) {
  Tensor centres = randn({kClasses, kDim}, 7).mul(1.5);
  Tensor noise = randn({n, kDim}, seed);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = (i * 7 + static_cast<int64_t>(seed)) % kClasses;
    noise[i].add_(centres[labels[i]]);
  }
  return {noise, from_vector(labels)};
}

std::shared_ptr<nn::Sequential> Mlp(int64_t hidden, uint64_t seed) {
  auto m = std::make_shared<nn::Sequential>();
  m->Append(std::make_shared<nn::Linear>(kDim, hidden, seed));
  m->Append(std::make_shared<nn::ReLU>());
  m->Append(std::make_shared<nn::Linear>(hidden, hidden, seed + 2));
  m->Append(std::make_shared<nn::ReLU>());
  m->Append(std::make_shared<nn::Linear>(hidden, kClasses, seed + 4));
  return m;
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int out = fallback;
  if (v == nullptr || !absl::SimpleAtoi(v, &out)) return fallback;
  return out;
}

absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> InitGroup(
    const std::string& backend) {
  const int rank = EnvInt("RANK", 0);
  const int world = EnvInt("WORLD_SIZE", 1);
  const char* addr = std::getenv("MASTER_ADDR");
  // Under ferry_run the launcher serves the store; otherwise rank 0 does.
  const char* agent = std::getenv("FERRY_USE_AGENT_STORE");
  const bool serve = !(agent != nullptr && std::strcmp(agent, "1") == 0) &&
                     rank == 0;
  // The store's secret, when one is set, from FERRY_STORE_SECRET_FILE or
  // FERRY_STORE_SECRET (as ferry_run's store expects).
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                   MakeTcpStoreFactory()(
                       addr != nullptr ? addr : "127.0.0.1",
                       EnvInt("MASTER_PORT", 29500), serve,
                       /*world_size=*/0, absl::Seconds(60)));
  c10d::InitProcessGroupOptions o;
  o.store = std::shared_ptr<Store>(std::move(store));
  o.rank = rank;
  o.world_size = world;
  o.group.timeout = absl::Seconds(60);
  if (!backend.empty()) o.group.backend = backend;
  return c10d::InitProcessGroup(std::move(o));
}

// Where the model trains: the CPU, or a GPU with its compute context.
struct Place {
  Device device;
  cuda::DeviceOps* ops = nullptr;  // Null on the CPU.
#ifdef FERRY_DDP_EXAMPLE_CUDA
  std::unique_ptr<cuda::CudaContext> ctx;
#endif
  // `t` where the model is.
  absl::StatusOr<Tensor> Put(const Tensor& t) const {
    if (ops == nullptr) return t;
    return ops->To(t, device);
  }
  // `t` on the CPU.
  absl::StatusOr<Tensor> Get(const Tensor& t) const {
    if (ops == nullptr || t.device().is_cpu()) return t;
    return ops->To(t, Device::CPU());
  }
};

absl::StatusOr<Place> MakePlace(const std::string& device) {
  Place place;
  if (device == "cpu") return place;
  if (device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", device, " is not cpu or cuda"));
  }
#ifdef FERRY_DDP_EXAMPLE_CUDA
  ASSIGN_OR_RETURN(place.ctx, cuda::CreateComputeContext({}));
  const cuda::LocalRankDevice mine = cuda::DeviceForLocalRank(
      EnvInt("LOCAL_RANK", EnvInt("RANK", 0)), place.ctx->device_count());
  place.device = mine.device;
  place.ops = place.ctx->compute();
  if (!mine.nccl_hostid.empty()) {  // Shares a device (see the top).
    setenv("NCCL_HOSTID", mine.nccl_hostid.c_str(), 1);
  }
  return place;
#else
  return absl::FailedPreconditionError(
      "--device=cuda: this binary was built without CUDA");
#endif
}

double Accuracy(nn::Module& model, const Data& d, const Place& place) {
  autograd::NoGradGuard no_grad;
  absl::StatusOr<Tensor> x = place.Put(d.x);
  if (!x.ok()) return 0;
  absl::StatusOr<Tensor> out = place.Get(model.Forward(*x));
  if (!out.ok()) return 0;
  std::vector<float> logits = out->to_vector<float>();
  std::vector<int64_t> y = d.y.to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < kClasses; ++c) {
      if (logits[i * kClasses + c] > logits[i * kClasses + best]) best = c;
    }
    correct += best == y[i];
  }
  return static_cast<double>(correct) / static_cast<double>(y.size());
}

// Whether every rank holds exactly rank 0's parameter bits.
absl::StatusOr<bool> BitIdentical(c10d::ProcessGroup& pg, nn::Module& model,
                                  const Place& place) {
  std::vector<Tensor> flat;
  for (const Tensor& p : model.parameters()) {
    ASSIGN_OR_RETURN(Tensor host, place.Get(autograd::Detach(p)));
    flat.push_back(host.reshape({-1}));
  }
  Tensor mine = autograd::Detach(autograd::cat(flat, 0));
  std::vector<Tensor> all;
  for (int r = 0; r < pg.size(); ++r) all.push_back(empty_like(mine));
  RETURN_IF_ERROR(pg.Allgather(all, mine)->Wait(absl::Seconds(60)));
  for (const Tensor& t : all) {
    if (std::memcmp(t.data_ptr(), all[0].data_ptr(), t.nbytes()) != 0)
      return false;
  }
  return true;
}

int Run() {
  auto place = MakePlace(absl::GetFlag(FLAGS_device));
  if (!place.ok()) {
    std::cerr << "ddp example: " << place.status() << "\n";
    return 2;
  }
  auto pg = InitGroup(place->ops != nullptr ? "cpu:gloo,cuda:nccl" : "");
  if (!pg.ok()) {
    std::cerr << "ddp example: " << pg.status() << "\n";
    return 2;
  }
  const int rank = (*pg)->rank();
  const int world = (*pg)->size();
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  auto model = Mlp(absl::GetFlag(FLAGS_hidden), 11 + 100 * rank);
  if (place->ops != nullptr) {
    if (absl::Status s = model->to(place->device, place->ops); !s.ok()) {
      std::cerr << "ddp example: " << s << "\n";
      return 2;
    }
  }
  ddp::DdpOptions o;
  o.gradient_as_bucket_view = absl::GetFlag(FLAGS_bucket_view);
  if (absl::GetFlag(FLAGS_fp16)) o.comm_hook = ddp::Fp16CompressHook();
  o.first_bucket_bytes = 16 << 10;
  auto ddp = ddp::DistributedDataParallel::Create(model, *pg, o);
  if (!ddp.ok()) {
    std::cerr << "ddp example: " << ddp.status() << "\n";
    return 2;
  }
  optim::SgdOptions so;
  so.lr = absl::GetFlag(FLAGS_lr);
  so.momentum = 0.9;
  optim::SGD sgd(model->parameters(), so);
  nn::CrossEntropyLoss loss_fn;
  const int64_t n = steps * world * batch;
  Data train = Clusters(n, 1);
  Data test = Clusters(1024, 2);
  if (place->ops != nullptr) {  // The whole training set on the device.
    auto x = place->Put(train.x);
    auto y = place->Put(train.y);
    if (!x.ok() || !y.ok()) {
      std::cerr << "ddp example: " << (x.ok() ? y.status() : x.status())
                << "\n";
      return 2;
    }
    train = {*x, *y};
  }
  const int64_t log_every = absl::GetFlag(FLAGS_log_every);
  absl::Time window = absl::Now();
  for (int64_t step = 1; step <= steps; ++step) {
    const int64_t at = ((step - 1) * world + rank) * batch;
    Tensor x = train.x.slice(0, at, at + batch);
    Tensor y = train.y.slice(0, at, at + batch);
    for (const Tensor& p : model->parameters()) {
      Tensor g = autograd::GradOf(p);
      if (!g.defined()) continue;
      // In place: keeps bucket views.
      if (place->ops != nullptr) {
        if (absl::Status z = place->ops->Fill(g, 0); !z.ok()) {
          std::cerr << "ddp example: " << z << "\n";
          return 2;
        }
      } else {
        g.zero_();
      }
    }
    Tensor loss = loss_fn((*ddp)->Forward(x), y);
    absl::Status s = (*ddp)->Backward(loss);
    if (s.ok()) s = sgd.Step();
    if (!s.ok()) {
      std::cerr << "ddp example: step " << step << ": " << s << "\n";
      return 2;
    }
    if (rank == 0 && log_every > 0 && step % log_every == 0) {
      const double secs = absl::ToDoubleSeconds(absl::Now() - window);
      absl::StatusOr<Tensor> l = place->Get(loss);
      std::cout << "step " << step << " loss "
                << (l.ok() ? l->item() : -1.0)
                << " samples/s "
                << static_cast<int64_t>(log_every * world * batch / secs)
                << std::endl;
      window = absl::Now();
    }
  }
  auto same = BitIdentical(**pg, *model, *place);
  if (!same.ok()) {
    std::cerr << "ddp example: " << same.status() << "\n";
    return 2;
  }
  const double acc = Accuracy(*model, test, *place);
  if (rank == 0) {
    std::cout << "device " << place->device.ToString() << "\n"
              << "held-out accuracy " << acc << "\n"
              << "parameters " << (*same ? "bit-identical" : "DIFFER")
              << " across " << world << " ranks" << std::endl;
  }
  return *same && acc >= absl::GetFlag(FLAGS_target_accuracy) ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
