// A parameter-server job: M parameter servers own the shards of a model, N
// trainers train it asynchronously with distributed autograd and the
// DistributedOptimizer.
//
//   ferry_run --nproc 4 -- parameter_server --servers=2 --trainers=2
//
// Ranks 0..M-1 are parameter servers "ps0".."ps<M-1>", ranks M..M+N-1 are
// trainers "trainer0".."trainer<N-1>" (WORLD_SIZE must be M + N).
//
// The task (seeded, synthetic): a sample is a bag of --tokens token ids out
// of --vocab; its class is the argmax over --classes of the sum of the
// tokens' rows in a hidden random score table. The model:
//   h      = mean of the tokens' embedding rows        (embedding [V, D])
//   logits = relu(h W1 + b1) W2 + b2                   (the dense head)
// The embedding table is split by rows: ps<m> owns rows
// [V m / M, V (m + 1) / M) and serves "lookup" (the sum of the batch's rows
// it owns, per sample); ps0 also owns the dense head and serves "head".
//
// Each trainer, independently of the others, per iteration: opens a
// distributed autograd context, asks every server for its partial sums (in
// parallel), calls the head on ps0, computes the cross-entropy loss locally,
// runs the distributed backward pass and steps its own DistributedOptimizer
// (one optimizer per trainer on each server, as in PyTorch's example). The
// servers apply steps under a per-server lock that their forward functions
// also take, so no step overlaps a read of the same parameters.
//
// Trainers print progress (iteration, mean loss, training accuracy and
// samples/s over the last --log_every iterations) and, at their end, the
// accuracy on a held-out set; they exit 1 when it is below
// --target_accuracy, which fails the job under ferry_run.
//
// Elastic trainers (--elastic_trainers=K; WORLD_SIZE must then be M + N + K,
// ranks M+N.. are "elastic0".."elastic<K-1>"): not part of the static group,
// each waits until ps0 has served --join_after forward passes (a key ps0
// sets in the job's store), joins the running job (JoinRpc), trains
// --elastic_iterations iterations through the same loop as the trainers
// (its own DistributedOptimizer on every server), reports its held-out
// accuracy (not checked against the target) and leaves (RRefContext::Leave)
// while the job goes on. The servers log each worker that joins or leaves
// with their worker table and, for a leaver, the optimizer steps it made
// there and what of it they still hold (RRef forks, autograd contexts,
// optimizers: none once it left); they end the job only after every elastic
// trainer has left.
//
// Fault-tolerant mode (--fault_tolerant; tools/run_job --fault_tolerant runs
// it under ferry_run --elastic_ranks=<the trainers' ranks>; design:
// docs/design/fault_tolerance.md): the servers alone form the static group;
// every trainer joins it (JoinRpc), checks its accuracy and leaves, so a
// dead trainer is never waited for in a collective shutdown. Each server
// calls "ps_alive" on every joined trainer each --heartbeat_ms; a trainer
// whose call fails and whose health probe fails too is reported dead by the
// agent, and the servers then drop its RRef forks (the RRef context),
// optimizers (the optimizer service) and autograd contexts (here), logging
// one line: the trainer, its last step here, how long after its last request
// the death was detected, what was released. The servers end once every
// trainer left or died; the job succeeds when the trainers that finished
// reached the target. --kill_trainer=T --kill_at_step=K: trainer T SIGKILLs
// itself in iteration K, between its forward pass and its backward pass, or
// --kill_after_us=U after the iteration began (fault injection for tests
// and bench/fault).
//
// Server death (--checkpoint_dir=DIR, --checkpoint_every=K steps and/or
// --checkpoint_secs=T; tools/run_job --fault_tolerant runs it under
// ferry_run --restart_ranks=<the servers' ranks>): each server counts its
// applied steps (updates of its embedding shard, under its step lock, from
// the optimizer service's after-update hook) and snapshots its parameters
// and that counter there with an optim::Checkpointer (a copy under the
// lock; its own thread writes DIR/ps<m>.ckpt). A server restarted by
// ferry_run (FERRY_RUN_RESTART >= 1) restores the newest valid checkpoint,
// joins the running group under its name (the agent evicts its dead
// instance), logs what it restored and serves; a trainer whose step fails
// while a server is reported failed (or replaced) waits for it
// (Agent::WaitForWorker, --server_wait_s), drops the failed step, fetches
// that server's parameter RRefs and creates its optimizer there again (its
// optimizers on the other servers keep their state) and goes on.
// --kill_server=M --kill_server_at_step=S: ps<M> SIGKILLs itself right
// after applying its step S (first start only; fault injection).
//
// Devices (--device=cuda; the parameter_server_cuda binary, or the testonly
// parameter_server_fake over FakeDeviceApi; design: docs/design/cuda_rpc.md,
// "The parameter-server job on devices"): trainers compute on --device
// (cuda = cuda:0), each server keeps its shard where --server_devices says
// (one entry per server, cpu or cuda[:N]; empty: all on --device). Every
// device process has its own compute context (ps_devices.h); a trainer maps
// its device to each GPU server's shard device (two processes may share one
// GPU), moves a CPU server's partial sums onto its device with the
// differentiable autograd::to and h to the CPU before calling a CPU ps0.
// Servers build lookup indices and masks on the host and move them to the
// shard's device; losses, accuracy counts, fingerprints and checkpoints read
// host copies, and a restore is copied onto the device.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/common/status.h"
#include "ferry/common/sync.h"
#include "ferry/examples/parameter_server/ps_devices.h"
#include "ferry/ferry.h"
#include "ferry/optim/checkpoint.h"
#include "ferry/store.h"
#include "ferry/tensor/cuda/device_ops.h"

ABSL_FLAG(int, servers, 2, "M: parameter servers (ranks 0..M-1)");
ABSL_FLAG(int, trainers, 2, "N: trainers (ranks M..M+N-1)");
ABSL_FLAG(int, iterations, 4000, "iterations per trainer");
ABSL_FLAG(int, batch, 64, "samples per iteration per trainer");
ABSL_FLAG(int, vocab, 5000, "V: token ids (embedding rows)");
ABSL_FLAG(int, tokens, 8, "tokens per sample");
ABSL_FLAG(int, dim, 16, "D: embedding width");
ABSL_FLAG(int, hidden, 32, "hidden width of the dense head");
ABSL_FLAG(int, classes, 4, "classes");
ABSL_FLAG(std::string, optimizer, "adagrad", "sgd, adam, adamw or adagrad");
ABSL_FLAG(double, lr, 0.1, "learning rate");
ABSL_FLAG(int, log_every, 250, "progress line every N iterations");
ABSL_FLAG(int, test_samples, 2000, "held-out samples");
ABSL_FLAG(double, target_accuracy, 0.9, "held-out accuracy to reach");
ABSL_FLAG(uint64_t, seed, 1, "seed of the task and the model");
ABSL_FLAG(int, timeout_s, 600, "limit of the job's collective shutdown (s)");
ABSL_FLAG(int, elastic_trainers, 0,
          "K: trainers that join the running job and leave before its end "
          "(ranks M+N..M+N+K-1)");
ABSL_FLAG(int, join_after, 100,
          "elastic trainers join once ps0 served this many forward passes");
ABSL_FLAG(int, elastic_iterations, 200,
          "iterations of each elastic trainer before it leaves");
ABSL_FLAG(bool, fault_tolerant, false,
          "servers form the static group, trainers join and leave; a dead "
          "trainer's state is released and the job goes on");
ABSL_FLAG(int, heartbeat_ms, 100,
          "--fault_tolerant: servers call every trainer this often");
ABSL_FLAG(int, kill_trainer, -1,
          "fault injection: this trainer SIGKILLs itself (--kill_at_step)");
ABSL_FLAG(int, kill_at_step, 0,
          "fault injection: the iteration in which --kill_trainer dies");
ABSL_FLAG(int, kill_after_us, 0,
          "fault injection: --kill_trainer dies this long after iteration "
          "--kill_at_step began (0: between its forward and backward pass)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "each server checkpoints its shard (parameters and applied-step "
          "counter) into DIR/ps<m>.ckpt; a server restarted by ferry_run "
          "(FERRY_RUN_RESTART >= 1) restores it and rejoins under its name");
ABSL_FLAG(int, checkpoint_every, 100,
          "--checkpoint_dir: a snapshot every K applied steps (0: by time only)");
ABSL_FLAG(double, checkpoint_secs, 0,
          "--checkpoint_dir: a snapshot every T seconds (0: by steps only)");
ABSL_FLAG(int, kill_server, -1,
          "fault injection: server ps<m> SIGKILLs itself at applied step "
          "--kill_server_at_step (first start only)");
ABSL_FLAG(int, kill_server_at_step, 0,
          "fault injection: the applied-step counter at which --kill_server "
          "dies (right after applying that step, before answering)");
ABSL_FLAG(int, server_wait_s, 60,
          "--fault_tolerant: how long a trainer waits for a dead server to "
          "come back");
ABSL_FLAG(std::string, device, "cpu",
          "where trainers compute: cpu, or cuda[:N] (parameter_server_cuda)");
ABSL_FLAG(std::string, server_devices, "",
          "where each server keeps its shard: one of cpu, cuda[:N] per "
          "server, comma-separated (empty: every server on --device)");
ABSL_FLAG(std::string, cuda_transport, "",
          "device tensors between processes: auto, ipc or staged (empty: the "
          "binary's choice, auto on CUDA, staged over the fake)");
ABSL_FLAG(bool, print_step_times, false,
          "trainers end with a line of each step's end (unix us; bench/fault)");

namespace ferry::ps_example {
namespace {

using autograd::dist::ContextScope;
using rref::RRef;

struct Config {
  int servers, trainers, iterations, batch, vocab, tokens, dim, hidden, classes,
      log_every, test_samples;
  uint64_t seed;
  int elastic = 0, join_after = 0, elastic_iterations = 0;
  bool fault_tolerant = false;
  int heartbeat_ms = 100, kill_trainer = -1, kill_at_step = 0,
      kill_after_us = 0;
  std::string checkpoint_dir = "";
  int checkpoint_every = 0;
  double checkpoint_secs = 0;
  int kill_server = -1, kill_server_at_step = 0, server_wait_s = 60;
  // ferry_run's FERRY_RUN_RESTART: 0 at first start, k >= 1 on restarts.
  int restart = 0;
  // --device and --server_devices (one per server once validated).
  std::string device_flag = "cpu", server_devices_flag = "";
  Device device = Device::CPU();
  std::vector<Device> server_device = {};
  // A trainer's compute backend on `device` (null on the CPU); Run sets it.
  cuda::DeviceOps* ops = nullptr;
  // Whether any process of the job uses a device.
  bool on_devices() const { return device.is_cuda(); }
};

// "cpu", "cuda" (cuda:0) or "cuda:N"; InvalidArgument naming `flag`.
absl::StatusOr<Device> ParseDeviceFlag(const std::string& flag,
                                       const std::string& text) {
  if (text == "cpu") return Device::CPU();
  if (text == "cuda") return Device::CUDA(0);
  int index = -1;
  if (absl::StartsWith(text, "cuda:") &&
      absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
    return Device::CUDA(index);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": '", text, "' is not cpu, cuda or cuda:N"));
}

Config FromFlags() {
  Config c = {absl::GetFlag(FLAGS_servers),      absl::GetFlag(FLAGS_trainers),
              absl::GetFlag(FLAGS_iterations),   absl::GetFlag(FLAGS_batch),
              absl::GetFlag(FLAGS_vocab),        absl::GetFlag(FLAGS_tokens),
              absl::GetFlag(FLAGS_dim),          absl::GetFlag(FLAGS_hidden),
              absl::GetFlag(FLAGS_classes),      absl::GetFlag(FLAGS_log_every),
              absl::GetFlag(FLAGS_test_samples), absl::GetFlag(FLAGS_seed)};
  c.elastic = absl::GetFlag(FLAGS_elastic_trainers);
  c.join_after = absl::GetFlag(FLAGS_join_after);
  c.elastic_iterations = absl::GetFlag(FLAGS_elastic_iterations);
  c.fault_tolerant = absl::GetFlag(FLAGS_fault_tolerant);
  c.heartbeat_ms = absl::GetFlag(FLAGS_heartbeat_ms);
  c.kill_trainer = absl::GetFlag(FLAGS_kill_trainer);
  c.kill_at_step = absl::GetFlag(FLAGS_kill_at_step);
  c.kill_after_us = absl::GetFlag(FLAGS_kill_after_us);
  c.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  c.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  c.checkpoint_secs = absl::GetFlag(FLAGS_checkpoint_secs);
  c.kill_server = absl::GetFlag(FLAGS_kill_server);
  c.kill_server_at_step = absl::GetFlag(FLAGS_kill_server_at_step);
  c.server_wait_s = absl::GetFlag(FLAGS_server_wait_s);
  c.device_flag = absl::GetFlag(FLAGS_device);
  c.server_devices_flag = absl::GetFlag(FLAGS_server_devices);
  const char* restart = std::getenv("FERRY_RUN_RESTART");
  if (restart == nullptr || !absl::SimpleAtoi(restart, &c.restart)) {
    c.restart = 0;
  }
  return c;
}

std::string ServerName(int m) { return absl::StrCat("ps", m); }
// Servers are "ps<m>"; every other worker is a trainer. A restarted server
// is a joined worker (its id is past the static group's), so roles go by
// name, not by id.
bool IsServerName(const std::string& name) {
  return absl::StartsWith(name, "ps");
}

absl::Duration Timeout() {
  return absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
}

// Set by ps0 in the job's store once elastic trainers may join.
constexpr char kJoinsOpenKey[] = "ps_example/joins_open";

// `t` itself on the CPU, else a host copy through its storage's backend
// (FailedPrecondition naming the device when it has none).
absl::StatusOr<Tensor> OnHost(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  cuda::DeviceOps* ops = cuda::DeviceOpsOf(t);
  if (ops == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a tensor on ", t.device().ToString(), " has no compute backend"));
  }
  return ops->To(t, Device::CPU());
}

// A tensor that needs no gradient (indices, masks, labels) on `device`.
absl::StatusOr<Tensor> ToDevice(const Tensor& t, Device device,
                                cuda::DeviceOps* ops) {
  if (device.is_cpu()) return t;
  return ops->To(t, device);
}

Tensor Parameter(std::vector<int64_t> sizes, uint64_t seed, double scale) {
  Tensor t = randn(sizes, seed).mul(scale);
  autograd::SetRequiresGrad(t);
  return t;
}

// --- Parameter server --------------------------------------------------------

// What one server owns. The tensors are written before serving; their
// contents change only under *mu (optimizer steps).
struct Shard {
  int64_t begin = 0, end = 0;  // Embedding rows [begin, end).
  Tensor embedding;            // [end - begin, D]
  std::vector<Tensor> head;    // W1 [D, H], b1 [H], W2 [H, C], b2 [C]; ps0.
  std::shared_ptr<Mutex> mu = std::make_shared<Mutex>();
  // Applied steps: updates of `embedding` (every trainer step updates it
  // once), under *mu; restored from a checkpoint on a restart.
  int64_t applied = 0;
  // Where the parameters live (--server_devices) and, on a device, the
  // backend they compute with.
  Device device = Device::CPU();
  cuda::DeviceOps* ops = nullptr;

  std::vector<Tensor> Params() const {
    std::vector<Tensor> p = {embedding};
    p.insert(p.end(), head.begin(), head.end());
    return p;
  }
  // Host copies of Params() (the parameters themselves on the CPU).
  absl::StatusOr<std::vector<Tensor>> HostParams() const {
    std::vector<Tensor> p = Params();
    if (device.is_cpu()) return p;
    for (Tensor& t : p) {
      ASSIGN_OR_RETURN(t, OnHost(autograd::Detach(t)));
    }
    return p;
  }
  // Moves the parameters (seeded or restored on the CPU) onto `to`, before
  // the server serves: each becomes a leaf requiring grad there.
  absl::Status MoveTo(Device to, cuda::DeviceOps* backend) {
    if (to.is_cpu()) return absl::OkStatus();
    device = to;
    ops = backend;
    std::vector<Tensor*> all = {&embedding};
    for (Tensor& t : head) all.push_back(&t);
    for (Tensor* t : all) {
      ASSIGN_OR_RETURN(Tensor moved, ops->To(autograd::Detach(*t), to));
      autograd::SetRequiresGrad(moved);
      *t = moved;
    }
    return absl::OkStatus();
  }
  static std::vector<std::string> Names(size_t n) {
    std::vector<std::string> names = {"embedding"};
    for (size_t i = 1; i < n; ++i) names.push_back(absl::StrCat("head", i - 1));
    return names;
  }
};

// The sum of every element of `params` (a fingerprint logged at each
// checkpoint and restore: a restored shard must show one written).
// Reads host copies (Shard::HostParams).
double Fingerprint(const std::vector<Tensor>& params) {
  double sum = 0;
  for (const Tensor& t : params) {
    for (float v : t.to_vector<float>()) sum += v;
  }
  return sum;
}

Shard MakeShard(const Config& c, int m) {
  Shard s;
  s.begin = int64_t{c.vocab} * m / c.servers;
  s.end = int64_t{c.vocab} * (m + 1) / c.servers;
  s.embedding = Parameter({s.end - s.begin, c.dim}, c.seed * 100 + m, 0.1);
  if (m == 0) {
    s.head = {
        Parameter({c.dim, c.hidden}, c.seed * 100 + 50, 1.0 / std::sqrt(c.dim)),
        Parameter({c.hidden}, c.seed * 100 + 51, 0.0),
        Parameter({c.hidden, c.classes}, c.seed * 100 + 52,
                  1.0 / std::sqrt(c.hidden)),
        Parameter({c.classes}, c.seed * 100 + 53, 0.0)};
  }
  return s;
}

// "lookup": for ids [B, K] (int64, global rows), the sum over each sample's
// tokens of the rows this server owns: [B, D] (tokens owned elsewhere count
// zero).
absl::StatusOr<Tensor> Lookup(const Shard& s, const std::string& me,
                              const Tensor& ids) {
  if (ids.dtype() != DType::kInt64 || ids.dim() != 2 ||
      !ids.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        me, " lookup: expected int64 ids [batch, tokens] on the cpu, got ",
        autograd::ShapeString(ids), " on ", ids.device().ToString()));
  }
  const int64_t b = ids.size(0), k = ids.size(1), n = b * k;
  std::vector<int64_t> local = ids.to_vector<int64_t>();
  std::vector<float> mask(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    const bool mine = local[i] >= s.begin && local[i] < s.end;
    mask[i] = mine ? 1.0f : 0.0f;
    local[i] = mine ? local[i] - s.begin : 0;
  }
  // Built on the host, then moved to the shard's device.
  ASSIGN_OR_RETURN(Tensor indices,
                   ToDevice(from_vector(local), s.device, s.ops));
  ASSIGN_OR_RETURN(Tensor weights,
                   ToDevice(from_vector(mask, {n, 1}), s.device, s.ops));
  Tensor rows;
  {
    // The rows are copied out under the lock; the embedding's backward
    // needs only their indices, never the table's contents.
    MutexLock l(s.mu.get());
    rows = autograd::embedding(s.embedding, indices);
  }
  Tensor masked = autograd::mul(rows, weights);
  return autograd::sum(autograd::reshape(masked, {b, k, s.embedding.size(1)}),
                       {1});
}

// "head": logits [B, C] for h [B, D].
absl::StatusOr<Tensor> Head(const Shard& s, const std::string& me,
                            const Tensor& h) {
  if (s.head.empty()) {
    return absl::FailedPreconditionError(me + " does not own the head");
  }
  if (h.dtype() != DType::kFloat32 || h.dim() != 2 ||
      h.size(1) != s.head[0].size(0) || h.device() != s.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        me, " head: expected float32 [batch, ", s.head[0].size(0), "] on ",
        s.device.ToString(), ", got ", autograd::ShapeString(h), " on ",
        h.device().ToString()));
  }
  std::vector<Tensor> p;
  {
    // Differentiable copies: the backward pass reads these, not the live
    // parameters another trainer's step may be updating.
    MutexLock l(s.mu.get());
    for (const Tensor& t : s.head) p.push_back(autograd::mul(t, 1.0));
  }
  Tensor hidden =
      autograd::relu(autograd::add(autograd::matmul(h, p[0]), p[1]));
  return autograd::add(autograd::matmul(hidden, p[2]), p[3]);
}

// A server's view of the job's membership: logs each worker that joins or
// leaves with the worker table, counts what each worker did here (optimizer
// steps, optimizers created and destroyed, through the
// DistOptimizerService's OPTIM_* requests it receives) and the forward
// passes served, and lets the server wait on those counts.
// Thread safety: every method is safe from any thread.
class ServerView {
 public:
  explicit ServerView(std::string me, int static_size)
      : me_(std::move(me)), static_size_(static_size) {}

  // Subscribes to `agent` (before it serves); `w`'s layers are installed.
  void Install(Worker& w) {
    rpc::Agent& agent = w.agent();
    std::weak_ptr<rref::RRefContext> rrefs = w.rrefs().weak_from_this();
    std::weak_ptr<autograd::dist::DistAutogradContainer> dist =
        w.dist_autograd_ptr();
    // Weak: a failure report can run on a transport thread while the
    // worker is destroyed, after the service is gone.
    std::weak_ptr<optim::DistOptimizerService> optimizers =
        w.optimizer_service_ptr();
    agent.AddInterceptor([this, dist](rpc::InterceptPoint point,
                                      const rpc::WorkerInfo& peer,
                                      rpc::Message& message) {
      if (point != rpc::InterceptPoint::kReceiveRequest) {
        return absl::OkStatus();
      }
      // Only the elastic trainers' steps are checked for gradients (they
      // are reported when they leave): the others cost only the counting.
      const bool check = absl::StartsWith(peer.name, "elastic");
      if (message.type == optim::kOptimCreate ||
          message.type == optim::kOptimStep ||
          message.type == optim::kOptimDestroy) {
        Count(peer.id, check, message, dist.lock());
      } else if (message.type == autograd::dist::kBackward) {
        absl::StatusOr<autograd::dist::AutogradHeader> h =
            autograd::dist::AutogradHeaderOf(message);
        if (h.ok() && h->fields.has_value() && !h->fused_steps.empty()) {
          CountFused(peer.id, check, h->fields->context_id.value(), message);
        }
      }
      MutexLock l(&mu_);
      last_seen_[peer.id] = absl::Now();
      return absl::OkStatus();
    });
    rpc::Agent* ap = &agent;
    // A trainer found dead (the heartbeat's call failed and so did the
    // agent's health probe): the RRef context dropped its forks and the
    // optimizer service its optimizers (their listeners came first); its
    // autograd contexts go here. Runs on a transport thread: nothing here
    // blocks (releases are sent, not awaited).
    agent.AddPeerFailureListener([this, ap, rrefs, dist, optimizers](
                                     const rpc::WorkerInfo& who,
                                     const absl::Status& why) {
      if (who.id < static_size_ || IsServerName(who.name)) {
        std::printf("%s: server %s (id %d) failed: %s\n", me_.c_str(),
                    who.name.c_str(), who.id, why.ToString().c_str());
        return;
      }
      std::shared_ptr<optim::DistOptimizerService> opt = optimizers.lock();
      if (opt == nullptr) return;  // The worker is shutting down.
      const absl::Time now = absl::Now();
      int64_t contexts = 0;
      if (std::shared_ptr<autograd::dist::DistAutogradContainer> d =
              dist.lock()) {
        for (GlobalId ctx : d->ContextIds()) {
          if (ctx.worker_id() != who.id) continue;
          // Its release to the dead trainer fails at once; nothing waits.
          d->Release(ctx).OnComplete([](const absl::Status&) {});
          ++contexts;
        }
      }
      std::string detected = "no request from it here";
      Did did;
      {
        MutexLock l(&mu_);
        auto seen = last_seen_.find(who.id);
        if (seen != last_seen_.end()) {
          detected = absl::StrFormat(
              "%.0f ms after its last request here",
              absl::ToDoubleMilliseconds(now - seen->second));
        }
        did = did_[who.id];
        ++joiners_dead_;
        gone_.insert(who.id);
        dead_at_[who.id] = now;
      }
      std::printf(
          "%s: %s (id %d) died at its step %ld here, detected %s; released "
          "%ld autograd contexts, %zu optimizers and its RRef forks at "
          "unix_us %ld; %s; workers: %s\n",
          me_.c_str(), who.name.c_str(), who.id, static_cast<long>(did.steps),
          detected.c_str(), static_cast<long>(contexts),
          opt->released_of(who.id),
          static_cast<long>(absl::ToUnixMicros(absl::Now())),
          Holds(who.id, rrefs.lock(), dist.lock(), opt.get()).c_str(),
          Table(*ap).c_str());
    });
    agent.AddMembershipListener(
        [this, ap, rrefs, dist](const rpc::WorkerInfo& who,
                                rpc::MembershipChange change) {
          if (change == rpc::MembershipChange::kJoined) {
            std::printf("%s: %s joined (id %d); workers: %s\n", me_.c_str(),
                        who.name.c_str(), who.id, Table(*ap).c_str());
            return;
          }
          // The RRef context heard of the leave first (its listener was
          // added before this one) and dropped the forks the leaver held.
          std::printf("%s: %s (id %d) left after %s; workers: %s\n",
                      me_.c_str(), who.name.c_str(), who.id,
                      Left(who.id, !IsServerName(who.name),
                           absl::StartsWith(who.name, "elastic"),
                           rrefs.lock(), dist.lock())
                          .c_str(),
                      Table(*ap).c_str());
        });
  }

  void CountForward() {
    MutexLock l(&mu_);
    ++forwards_;
  }
  // Whether `n` forward passes were served by `deadline`.
  bool AwaitForwards(int64_t n, absl::Time deadline) {
    MutexLock l(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return forwards_ >= n;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  }
  // Whether `n` workers that joined the running group left it by `deadline`.
  bool AwaitLeft(int n, absl::Time deadline) {
    MutexLock l(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return joiners_left_ >= n;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  }
  int joiners_left() {
    MutexLock l(&mu_);
    return joiners_left_;
  }
  // Whether `n` joined workers left or died by `deadline`.
  bool AwaitGone(int n, absl::Time deadline) {
    MutexLock l(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      // Distinct workers: one reported dead may still leave later.
      return static_cast<int>(gone_.size()) >= n;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  }
  // (left, dead) joined workers so far.
  std::pair<int, int> gone() {
    MutexLock l(&mu_);
    return {joiners_left_, joiners_dead_};
  }
  // When worker `id` was found dead here (nullopt: it was not).
  std::optional<absl::Time> dead_at(int id) {
    MutexLock l(&mu_);
    auto it = dead_at_.find(id);
    if (it == dead_at_.end()) return std::nullopt;
    return it->second;
  }

 private:
  struct Did {
    // Steps asked for; those whose context holds a non-zero gradient of
    // this server's parameters (so the step changes them); optimizers
    // created minus destroyed.
    int64_t steps = 0, changing_steps = 0, optimizers = 0;
    // Fused steps: the last context counted (a pass may send several
    // BACKWARDs here), and the last counted as changing.
    uint64_t fused_context = 0, changed_context = 0;
  };

  // A BACKWARD whose pass steps this server's parameters (fused): one step
  // per context; changing when a gradient it carries is non-zero (checked
  // for joiners only, as in Count).
  void CountFused(int id, bool check, uint64_t ctx, const rpc::Message& m) {
    bool changes = false;
    if (check) {
      Value payload = m.payload;  // Shared tensor handles, not copies.
      rpc::ForEachTensor(payload, [&](Tensor& t) {
        changes = changes || NonZero(t);
      });
    }
    MutexLock l(&mu_);
    Did& d = did_[id];
    if (d.fused_context != ctx) {
      d.fused_context = ctx;
      ++d.steps;
    }
    if (changes && d.changed_context != ctx) {
      d.changed_context = ctx;
      ++d.changing_steps;
    }
  }

  // For a call of the optimizer service (its arguments: optimizer id,
  // context id), what the worker `id` asked of it. Only a joiner's steps
  // are checked for gradients (they are reported when it leaves), so the
  // static trainers' steps cost no more than the counting.
  void Count(int id, bool check, const rpc::Message& call,
             std::shared_ptr<autograd::dist::DistAutogradContainer> dist) {
    const bool step = call.type == optim::kOptimStep;
    const bool changes = step && check && dist != nullptr &&
                         HasGradient(*dist, call.payload);
    MutexLock l(&mu_);
    if (step) ++did_[id].steps;
    did_[id].changing_steps += changes;
    if (call.type == optim::kOptimCreate) ++did_[id].optimizers;
    if (call.type == optim::kOptimDestroy) --did_[id].optimizers;
  }

  // Whether the context that step arguments `args` name holds a non-zero
  // gradient here.
  static bool HasGradient(const autograd::dist::DistAutogradContainer& dist,
                          const Value& args) {
    const Value::List* list = args.if_list();
    if (list == nullptr || list->size() != 2 || !(*list)[1].if_int()) {
      return false;
    }
    absl::StatusOr<autograd::dist::GradientMap> grads = dist.GetGradients(
        GlobalId::FromValue(static_cast<uint64_t>(*(*list)[1].if_int())));
    if (!grads.ok()) return false;
    for (const auto& [leaf, grad] : grads->entries()) {
      if (NonZero(grad)) return true;
    }
    return false;
  }

  // Whether float tensor `t` (on any device: read through a host copy) has
  // a non-zero element; false when it cannot be read.
  static bool NonZero(const Tensor& t) {
    absl::StatusOr<Tensor> host = OnHost(t);
    if (!host.ok()) return false;
    for (float g : host->to_vector<float>()) {
      if (g != 0) return true;
    }
    return false;
  }

  // The present workers' names, by id.
  static std::string Table(const rpc::Agent& agent) {
    std::vector<std::string> names;
    for (const rpc::WorkerInfo& w : agent.GetWorkerInfos()) {
      names.push_back(w.name);
    }
    return absl::StrJoin(names, " ");
  }

  // "N optimizer steps here (G with gradients); it still holds here: F RRef
  // forks, ..." for worker `id`, which just left (G for a `checked` one).
  std::string Left(
      int id, bool trainer, bool checked, std::shared_ptr<rref::RRefContext> rrefs,
      std::shared_ptr<autograd::dist::DistAutogradContainer> dist) {
    const auto [forks, contexts] = HeldBy(id, rrefs, dist);
    MutexLock l(&mu_);
    if (id >= static_size_ && trainer) {
      ++joiners_left_;
      gone_.insert(id);
    }
    const Did did = did_[id];
    return absl::StrCat(
        did.steps, " optimizer steps here",
        checked ? absl::StrCat(" (", did.changing_steps, " with gradients)")
                : "",
        "; it still holds here: ", forks, " RRef forks, ",
        contexts, " autograd contexts, ", did.optimizers, " optimizers");
  }

  // The RRef forks and autograd contexts worker `id` holds here.
  static std::pair<int64_t, int64_t> HeldBy(
      int id, const std::shared_ptr<rref::RRefContext>& rrefs,
      const std::shared_ptr<autograd::dist::DistAutogradContainer>& dist) {
    int64_t forks = 0, contexts = 0;
    for (const rref::RRefContext::OwnedInfo& o :
         rrefs ? rrefs->Owned() : std::vector<rref::RRefContext::OwnedInfo>{}) {
      for (const auto& [fork, holder] : o.forks) forks += holder == id;
    }
    for (GlobalId ctx : dist ? dist->ContextIds() : std::vector<GlobalId>{}) {
      contexts += ctx.worker_id() == id;
    }
    return {forks, contexts};
  }

  // "it still holds here: F RRef forks, C autograd contexts, O optimizers".
  static std::string Holds(
      int id, std::shared_ptr<rref::RRefContext> rrefs,
      std::shared_ptr<autograd::dist::DistAutogradContainer> dist,
      const optim::DistOptimizerService* optimizers) {
    const auto [forks, contexts] = HeldBy(id, rrefs, dist);
    return absl::StrCat("it still holds here: ", forks, " RRef forks, ",
                        contexts, " autograd contexts, ",
                        optimizers->num_optimizers_of(id), " optimizers");
  }

  const std::string me_;
  const int static_size_;
  Mutex mu_;
  int64_t forwards_ ABSL_GUARDED_BY(mu_) = 0;
  int joiners_left_ ABSL_GUARDED_BY(mu_) = 0;
  int joiners_dead_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int> gone_ ABSL_GUARDED_BY(mu_);  // Joined trainers left or dead.
  std::map<int, Did> did_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Time> dead_at_ ABSL_GUARDED_BY(mu_);
};

// With elastic trainers: ps0 opens the job to them once it served
// --join_after forward passes; every server waits until they all left, so
// the static group's shutdown never meets a joined worker.
absl::Status HostElasticTrainers(const Config& c, int m, ServerView& view) {
  if (c.elastic == 0) return absl::OkStatus();
  const std::string me = ServerName(m);
  const absl::Time deadline = absl::Now() + Timeout();
  if (m == 0) {
    if (!view.AwaitForwards(c.join_after, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat(me, ": fewer than ", c.join_after,
                       " forward passes served within --timeout_s"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                     OpenGroupStore("env://", Timeout()));
    // Said before the key is set: a joiner's lines come after this one.
    std::printf("%s: elastic trainers may join (%d forward passes served)\n",
                me.c_str(), c.join_after);
    RETURN_IF_ERROR(store->Set(kJoinsOpenKey, "1"));
  }
  // --fault_tolerant: AwaitTrainers waits for every trainer, elastic ones
  // included, to leave or die.
  if (c.fault_tolerant) return absl::OkStatus();
  if (!view.AwaitLeft(c.elastic, deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat(me, ": ", view.joiners_left(), " of ", c.elastic,
                     " elastic trainers left within --timeout_s"));
  }
  return absl::OkStatus();
}

// --fault_tolerant: calls "ps_alive" on every joined trainer every
// --heartbeat_ms (at most one call outstanding per trainer), so that a dead
// one is found by the agent (a failed call, then a failed health probe)
// even when it sent nothing. Stops when destroyed.
class Heartbeat {
 public:
  Heartbeat(rpc::Agent& agent, int servers, absl::Duration every)
      : agent_(agent), servers_(servers), every_(every) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Heartbeat() {
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

 private:
  void Run() {
    std::map<int, Future<int64_t>> outstanding;
    // Bounded by the server's life: stop_ is set before Shutdown.
    while (true) {
      for (const rpc::WorkerInfo& w : agent_.GetWorkerInfos()) {
        if (w.id < servers_ || IsServerName(w.name) ||
            agent_.IsPeerFailed(w.id)) {
          continue;
        }
        auto it = outstanding.find(w.id);
        if (it != outstanding.end() && !it->second.IsReady()) continue;
        outstanding.insert_or_assign(
            w.id, agent_.rpc_async_for<int64_t>(absl::Seconds(10), w.id,
                                                "ps_alive"));
      }
      MutexLock l(&mu_);
      auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_;
      };
      // A timed wait for the stop flag: the heartbeat's period.
      if (mu_.AwaitWithTimeout(absl::Condition(&stopped), every_)) return;
    }
  }

  rpc::Agent& agent_;
  const int servers_;
  const absl::Duration every_;
  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// --fault_tolerant: every trainer (fixed and elastic) joins; the servers
// serve until each of them left or died.
absl::Status AwaitTrainers(const Config& c, int m, ServerView& view) {
  const int all = c.trainers + c.elastic;
  if (!view.AwaitGone(all, absl::Now() + Timeout())) {
    auto [left, dead] = view.gone();
    return absl::DeadlineExceededError(
        absl::StrCat(ServerName(m), ": of ", all, " trainers ", left,
                     " left and ", dead, " died within --timeout_s"));
  }
  auto [left, dead] = view.gone();
  std::printf("%s: all %d trainers are gone (%d left, %d died)\n",
              ServerName(m).c_str(), all, left, dead);
  return absl::OkStatus();
}

// The agent's member table as something to wait on: the agent tells it of
// every join, leave and peer failure (listeners), and Await re-checks a
// condition on the table after each change, bounded by a limit.
// Thread safety: every method is safe from any thread.
class TableWatch {
 public:
  // Subscribes to `agent` for its life (the listeners hold the watch
  // weakly, so the watch may go first).
  static std::shared_ptr<TableWatch> Attach(rpc::Agent& agent) {
    auto watch = std::make_shared<TableWatch>();
    std::weak_ptr<TableWatch> weak = watch;
    agent.AddMembershipListener(
        [weak](const rpc::WorkerInfo&, rpc::MembershipChange) {
          if (std::shared_ptr<TableWatch> w = weak.lock()) w->Changed();
        });
    agent.AddPeerFailureListener(
        [weak](const rpc::WorkerInfo&, const absl::Status&) {
          if (std::shared_ptr<TableWatch> w = weak.lock()) w->Changed();
        });
    return watch;
  }

  // Whether `cond` (read from the table, called without this watch's lock)
  // held within `limit`: checked now and after each change.
  bool Await(const std::function<bool()>& cond, absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    // Each pass needs a change of the table or ends at the deadline.
    while (true) {
      uint64_t seen;
      {
        MutexLock l(&mu_);
        seen = changes_;
      }
      if (cond()) return true;
      bool changed_in_time;
      {
        MutexLock l(&mu_);
        auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return changes_ != seen;
        };
        changed_in_time =
            mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
      }
      if (!changed_in_time) return cond();  // Once more at the deadline.
    }
  }

 private:
  void Changed() {
    MutexLock l(&mu_);
    ++changes_;
  }

  Mutex mu_;
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Prints inspector `name`'s rows as the Admin service's Inspect returns
// them, one line each: "<me>: inspect <name>: <kind> k=v ...".
void PrintInspection(const rpc::Agent& agent, const std::string& me,
                     const std::string& name) {
  absl::StatusOr<std::vector<rpc::Inspection>> got =
      agent.inspectors().Inspect(name);
  if (!got.ok()) {
    std::printf("%s: inspect %s: %s\n", me.c_str(), name.c_str(),
                got.status().ToString().c_str());
    return;
  }
  for (const rpc::Inspection& in : *got) {
    for (const rpc::InspectionRow& row : in.rows) {
      std::string line = absl::StrCat(me, ": inspect ", in.name, ": ", row.kind);
      for (const auto& [k, v] : row.fields) absl::StrAppend(&line, " ", k, "=", v);
      std::printf("%s\n", line.c_str());
    }
  }
}

// --fault_tolerant, a restarted server: it joined after the trainers, so it
// cannot count them leaving; it serves until no trainer is present and
// alive in its table (waits on the table's changes, bounded).
absl::Status AwaitTrainersGoneFromTable(rpc::Agent& agent, TableWatch& table,
                                        const std::string& me) {
  const bool gone = table.Await(
      [&] {
        for (const rpc::WorkerInfo& w : agent.GetWorkerInfos()) {
          if (!IsServerName(w.name) && !agent.IsPeerFailed(w.id)) return false;
        }
        return true;
      },
      Timeout());
  if (!gone) {
    return absl::DeadlineExceededError(
        absl::StrCat(me, ": trainers still present after --timeout_s"));
  }
  std::printf("%s: every trainer is gone\n", me.c_str());
  return absl::OkStatus();
}

// --fault_tolerant, a static server: a restarted server is a joined member
// and must leave before the static group's shutdown barrier completes, so
// the static servers wait for it (on the table's changes, bounded).
absl::Status AwaitRestartedServersLeft(rpc::Agent& agent, TableWatch& table,
                                       const Config& c, const std::string& me) {
  const bool left = table.Await(
      [&] {
        for (const rpc::WorkerInfo& w : agent.GetWorkerInfos()) {
          if (IsServerName(w.name) && w.id >= c.servers &&
              !agent.IsPeerFailed(w.id)) {
            return false;
          }
        }
        return true;
      },
      Timeout());
  return left ? absl::OkStatus()
              : absl::DeadlineExceededError(absl::StrCat(
                    me, ": a restarted server did not leave in --timeout_s"));
}

// --checkpoint_dir on a restart: the newest valid checkpoint of `me` into
// `shard` (NotFound: the server starts from its seeded initial values).
absl::Status Restore(const Config& c, const std::string& me, Shard& shard) {
  absl::StatusOr<optim::LoadedCheckpoint> loaded =
      optim::LoadLatest(c.checkpoint_dir, me);
  if (absl::IsNotFound(loaded.status())) {
    std::printf("%s: restarted (FERRY_RUN_RESTART=%d): no checkpoint in %s, "
                "starting from the initial values (applied step 0)\n",
                me.c_str(), c.restart, c.checkpoint_dir.c_str());
    return absl::OkStatus();
  }
  if (!loaded.ok()) {
    return Annotate(loaded.status(),
                    absl::StrCat(me, ": restoring after a restart"));
  }
  for (const std::string& r : loaded->refused) {
    std::printf("%s: refused checkpoint %s\n", me.c_str(), r.c_str());
  }
  std::vector<Tensor> params = shard.Params();
  const std::vector<std::string> names = Shard::Names(params.size());
  const auto& tensors = loaded->checkpoint.tensors;
  if (tensors.size() != params.size()) {
    return absl::DataLossError(absl::StrCat(
        me, ": checkpoint ", loaded->path, " holds ", tensors.size(),
        " tensors, the shard has ", params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (tensors[i].first != names[i] ||
        tensors[i].second.sizes() != params[i].sizes() ||
        tensors[i].second.dtype() != params[i].dtype()) {
      return absl::DataLossError(
          absl::StrCat(me, ": checkpoint ", loaded->path, " tensor ", i, " '",
                       tensors[i].first, "' does not match the shard's '",
                       names[i], "' (", autograd::ShapeString(params[i]), ")"));
    }
  }
  MutexLock l(shard.mu.get());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].copy_(tensors[i].second);  // Same storage: RRefs see it.
  }
  shard.applied = loaded->checkpoint.step;
  std::printf(
      "%s: restarted (FERRY_RUN_RESTART=%d): restored applied step %ld from "
      "%s (fingerprint %.9g)\n",
      me.c_str(), c.restart, static_cast<long>(shard.applied),
      loaded->path.c_str(), Fingerprint(params));
  return absl::OkStatus();
}

// Fills `o`'s device fields for a process on `devices` that uses `device`
// (nothing for the CPU).
void SetDevices(WorkerOptions& o, Device device, const PsDevices* devices) {
  if (device.is_cpu() || devices == nullptr) return;
  o.devices = {device.ToString()};
  o.device_api = devices->api;
  o.device_compute = devices->compute;
  const std::string transport = absl::GetFlag(FLAGS_cuda_transport);
  o.cuda_transport = transport.empty() ? devices->transport : transport;
}

// Server m; `devices` is this process's (null when its shard is on the CPU).
absl::Status Serve(const Config& c, int m, const PsDevices* devices) {
  const std::string me = ServerName(m);
  const Device shard_device = c.server_device[m];
  Shard shard = MakeShard(c, m);
  // A server restarted by ferry_run (--restart_ranks) in fault-tolerant
  // mode joins the running group under its name (the static group formed
  // without it, and its dead instance is evicted by the join).
  const bool rejoin = c.fault_tolerant && c.restart > 0;
  if (c.restart > 0 && !c.checkpoint_dir.empty()) {
    RETURN_IF_ERROR(Restore(c, me, shard));
  } else if (c.restart > 0) {
    std::printf("%s: restarted (FERRY_RUN_RESTART=%d) without "
                "--checkpoint_dir: starting from the initial values\n",
                me.c_str(), c.restart);
  }
  const int64_t restored = shard.applied;
  // Seeded or restored on the host; onto the shard's device before serving.
  if (shard_device.is_cuda()) {
    absl::Status moved = shard.MoveTo(shard_device, devices->compute.get());
    if (!moved.ok()) {
      return Annotate(moved, absl::StrCat(me, ": moving its shard to ",
                                          shard_device.ToString()));
    }
  }
  std::unique_ptr<optim::Checkpointer> ck;
  if (!c.checkpoint_dir.empty()) {
    ASSIGN_OR_RETURN(
        ck, optim::Checkpointer::Create(
                {.dir = c.checkpoint_dir,
                 .name = me,
                 .every_steps = c.checkpoint_every,
                 .every = absl::Seconds(c.checkpoint_secs)}));
    MutexLock l(shard.mu.get());
    ck->Due(shard.applied);  // The step clock starts at the restored step.
  }
  const bool kill_here =
      c.kill_server == m && c.restart == 0 && c.kill_server_at_step > 0;
  int64_t logged_written = -1;  // Under *shard.mu.
  Shard* shp = &shard;
  optim::Checkpointer* ckp = ck.get();
  // Runs under *shard.mu after each parameter update (the optimizer
  // service's hook): counts the applied steps, snapshots the shard when a
  // checkpoint is due (the copy is the only pause; the Checkpointer's
  // thread writes), and injects the server's death.
  auto after_update = [shp, ckp, me, kill_here, &c,
                       &logged_written](const Tensor& param) {
    if (!param.is_same(shp->embedding)) return;
    const int64_t step = ++shp->applied;
    if (ckp != nullptr) {
      const int64_t written = ckp->stats().last_written_step;
      if (written != logged_written) {
        logged_written = written;
        std::printf("%s: checkpoint of applied step %ld written to %s\n",
                    me.c_str(), static_cast<long>(written),
                    optim::LatestCheckpointPath(c.checkpoint_dir, me).c_str());
      }
      const std::vector<std::string> names =
          Shard::Names(shp->Params().size());
      double fingerprint = 0;
      bool took = false;
      if (ckp->Due(step)) {
        // Host copies of device parameters (the parameters on the CPU),
        // made only when a snapshot is due.
        absl::StatusOr<std::vector<Tensor>> params = shp->HostParams();
        if (!params.ok()) {
          std::printf("%s: checkpoint of applied step %ld skipped: %s\n",
                      me.c_str(), static_cast<long>(step),
                      params.status().ToString().c_str());
        } else {
          took = ckp->MaybeCheckpoint(step, [&](optim::ShardCheckpoint& out) {
            optim::SnapshotShardInto(out, step, *params, nullptr, names);
            fingerprint = Fingerprint(*params);
          });
        }
      }
      if (took) {
        std::printf("%s: checkpoint of applied step %ld taken (fingerprint "
                    "%.9g)\n",
                    me.c_str(), static_cast<long>(step), fingerprint);
      }
    }
    if (kill_here && step == c.kill_server_at_step) {
      std::printf(
          "%s: killing itself (SIGKILL) at applied step %ld (newest "
          "checkpoint written: step %ld) at unix_us %ld\n",
          me.c_str(), static_cast<long>(step),
          static_cast<long>(ckp ? ckp->stats().last_written_step : -1),
          static_cast<long>(absl::ToUnixMicros(absl::Now())));
      std::fflush(stdout);
      kill(getpid(), SIGKILL);
    }
  };
  // Outlives the agent. With --fault_tolerant the servers alone are static.
  ServerView view(me, c.fault_tolerant ? c.servers : c.servers + c.trainers);
  ServerView* vp = &view;
  // Set before the worker serves (the functions below run only then).
  Worker* wp = nullptr;
  Worker** wpp = &wp;
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  const Shard* sp = &shard;
  RETURN_IF_ERROR(registry->Register(
      "lookup", [sp, me](Tensor ids) { return Lookup(*sp, me, ids); },
      "per-sample sums of this server's embedding rows"));
  RETURN_IF_ERROR(registry->Register(
      "head",
      [sp, vp, me](Tensor h) {
        vp->CountForward();
        return Head(*sp, me, h);
      },
      "the dense head (ps0)"));
  RETURN_IF_ERROR(registry->Register(
      "ps_applied",
      [sp]() -> int64_t {
        MutexLock l(sp->mu.get());
        return sp->applied;
      },
      "this server's applied-step counter"));
  RETURN_IF_ERROR(registry->Register(
      "param_rrefs",
      [sp, wpp] {
        rref::RRefContext& rrefs = (*wpp)->rrefs();
        std::vector<RRef<Tensor>> out = {
            rref::MakeLocalRRef<Tensor>(rrefs, sp->embedding)};
        for (const Tensor& t : sp->head) {
          out.push_back(rref::MakeLocalRRef<Tensor>(rrefs, t));
        }
        return out;
      },
      "RRefs to this server's parameters"));
  WorkerOptions options;
  options.name = me;
  options.registry = registry;
  options.optimizer_param_mutex = shard.mu;
  options.optimizer_after_update = after_update;
  SetDevices(options, shard_device, devices);
  // The static group: elastic trainers (all trainers with
  // --fault_tolerant) join it later; a restarted server joins too.
  if (rejoin) {
    options.join = true;
  } else {
    options.world_size = c.fault_tolerant ? c.servers : c.servers + c.trainers;
  }
  options.join_timeout = absl::Seconds(120);
  options.before_serving = [vp, wpp](Worker& w) {
    *wpp = &w;
    vp->Install(w);
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, InitWorker(std::move(options)));
  if (rejoin) {
    std::printf("%s: rejoined the group under its name as worker %d at "
                "unix_us %ld, serving from applied step %ld\n",
                me.c_str(), w->rank(),
                static_cast<long>(absl::ToUnixMicros(absl::Now())),
                static_cast<long>(restored));
  }
  std::printf("%s: owns embedding rows [%ld, %ld)%s%s\n", me.c_str(),
              static_cast<long>(shard.begin), static_cast<long>(shard.end),
              shard.head.empty() ? "" : " and the dense head",
              c.on_devices()
                  ? absl::StrCat(" on ", shard.embedding.device().ToString())
                        .c_str()
                  : "");
  // What an operator sees through the Admin service's Inspect (grpcurl):
  // this server's generation, steps and what it survived. Everything it
  // reads outlives the worker.
  RETURN_IF_ERROR(w->agent().inspectors().Register(
      "parameter_server", [sp, vp, ckp, me, restart = c.restart, restored,
                           on_devices = c.on_devices()] {
        rpc::InspectionRow row;
        row.kind = "server";
        int64_t applied;
        {
          MutexLock l(sp->mu.get());
          applied = sp->applied;
        }
        auto [left, dead] = vp->gone();
        row.fields = {{"name", me},
                      {"restart", absl::StrCat(restart)},
                      {"applied_step", absl::StrCat(applied)},
                      {"restored_step", absl::StrCat(restored)},
                      {"trainers_left", absl::StrCat(left)},
                      {"trainers_died", absl::StrCat(dead)}};
        if (on_devices) {
          // Where the parameters really are (read from the tensors).
          row.fields.push_back(
              {"shard_device", sp->embedding.device().ToString()});
        }
        if (ckp != nullptr) {
          const optim::Checkpointer::Stats st = ckp->stats();
          row.fields.push_back({"checkpoints_written", absl::StrCat(st.written)});
          row.fields.push_back(
              {"last_checkpoint_step", absl::StrCat(st.last_written_step)});
        }
        return std::vector<rpc::InspectionRow>{row};
      }));
  std::unique_ptr<Heartbeat> heartbeat;
  std::shared_ptr<TableWatch> table;
  if (c.fault_tolerant) {
    table = TableWatch::Attach(w->agent());
    heartbeat = std::make_unique<Heartbeat>(
        w->agent(), c.servers, absl::Milliseconds(c.heartbeat_ms));
  }
  absl::Status hosted =
      rejoin ? absl::OkStatus() : HostElasticTrainers(c, m, view);
  if (c.fault_tolerant) {
    absl::Status gone =
        rejoin ? AwaitTrainersGoneFromTable(w->agent(), *table, me)
               : AwaitTrainers(c, m, view);
    if (hosted.ok()) hosted = gone;
    if (!rejoin && hosted.ok()) {
      hosted = AwaitRestartedServersLeft(w->agent(), *table, c, me);
    }
    heartbeat.reset();  // Stopped before the shutdown.
  }
  if (ck != nullptr) {
    absl::Status flushed = ck->Flush(absl::Seconds(60));
    if (!flushed.ok()) {
      std::printf("%s: last checkpoint: %s\n", me.c_str(),
                  flushed.ToString().c_str());
    }
  }
  {
    MutexLock l(shard.mu.get());
    std::printf("%s: applied-step counter %ld at the end (%s%ld applied by "
                "this process)\n",
                me.c_str(), static_cast<long>(shard.applied),
                c.restart > 0 ? absl::StrCat("restored ", restored, ", ").c_str()
                              : "",
                static_cast<long>(shard.applied - restored));
  }
  PrintInspection(w->agent(), me, "parameter_server");
  // A restarted server is a joined member: it leaves (the static group's
  // barrier counted its dead instance in).
  absl::Status left;
  if (rejoin) {
    left = w->Leave(Timeout());
  } else {
    // Serves until every trainer has finished and joined the shutdown (with
    // --fault_tolerant: every other server; the trainers are gone).
    left = w->Shutdown(Timeout());
  }
  // On devices: the device plan and what was staged with each trainer over
  // the whole job.
  if (c.on_devices()) PrintInspection(w->agent(), me, "devices");
  RETURN_IF_ERROR(hosted);
  return left;
}

// --- Trainer -----------------------------------------------------------------

struct Batch {
  Tensor ids;     // [B, K] int64
  Tensor labels;  // [B] int64
};

// The seeded task: a sample's class is the argmax of its tokens' summed
// rows of a hidden score table.
class Task {
 public:
  Task(const Config& c, uint64_t stream)
      : c_(c),
        scores_(randn({c.vocab, c.classes}, c.seed * 7919).to_vector<float>()),
        rng_(c.seed * 1000003 + stream) {}

  Batch Next(int b) {
    std::uniform_int_distribution<int64_t> token(0, c_.vocab - 1);
    std::vector<int64_t> ids(static_cast<size_t>(b) * c_.tokens), labels(b);
    for (int i = 0; i < b; ++i) {
      std::vector<float> sum(c_.classes, 0.0f);
      for (int k = 0; k < c_.tokens; ++k) {
        const int64_t t = token(rng_);
        ids[i * c_.tokens + k] = t;
        for (int j = 0; j < c_.classes; ++j)
          sum[j] += scores_[t * c_.classes + j];
      }
      labels[i] = ArgMax(sum.data(), c_.classes);
    }
    return {from_vector(ids, {b, c_.tokens}), from_vector(labels)};
  }

  static int64_t ArgMax(const float* v, int n) {
    int64_t best = 0;
    for (int j = 1; j < n; ++j) best = v[j] > v[best] ? j : best;
    return best;
  }

 private:
  const Config c_;
  const std::vector<float> scores_;
  std::mt19937_64 rng_;
};

// The model's forward pass from a trainer: partial sums from every server
// in parallel, then the head on ps0.
// On devices (--device=cuda): a CPU server's partial sums are moved onto
// the trainer's device and, for a CPU ps0, h onto the CPU, both with the
// differentiable autograd::to (its gradient goes back the same way); a GPU
// server's tensors land on the trainer's device by its device map.
absl::StatusOr<Tensor> Forward(rpc::Agent& agent, const Config& c,
                               const Tensor& ids) {
  std::vector<Future<Tensor>> parts;
  for (int m = 0; m < c.servers; ++m) {
    parts.push_back(agent.rpc_async<Tensor>(ServerName(m), "lookup", ids));
  }
  Tensor h;
  for (int m = 0; m < c.servers; ++m) {
    ASSIGN_OR_RETURN(Tensor p, parts[m].Get());
    if (p.device() != c.device) {
      if (c.server_device[m].is_cuda()) {
        return absl::InternalError(absl::StrCat(
            ServerName(m), "'s partial sums landed on ",
            p.device().ToString(), ", not on ", c.device.ToString()));
      }
      p = autograd::to(p, c.device, c.ops);
    }
    h = h.defined() ? autograd::add(h, p) : p;
  }
  Tensor in = autograd::mul(h, 1.0 / c.tokens);
  if (in.device() != c.server_device[0]) {
    in = autograd::to(in, c.server_device[0]);
  }
  ASSIGN_OR_RETURN(Tensor logits,
                   agent.rpc_sync<Tensor>(ServerName(0), "head", in));
  if (logits.device() != c.device) {
    logits = autograd::to(logits, c.device, c.ops);
  }
  return logits;
}

absl::StatusOr<int64_t> Correct(const Tensor& logits, const Tensor& labels) {
  ASSIGN_OR_RETURN(Tensor host, OnHost(autograd::Detach(logits)));
  std::vector<float> l = host.to_vector<float>();
  std::vector<int64_t> y = labels.to_vector<int64_t>();
  const int n = static_cast<int>(logits.size(1));
  int64_t correct = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    correct += Task::ArgMax(&l[i * n], n) == y[i];
  }
  return correct;
}

absl::StatusOr<double> HeldOutAccuracy(rpc::Agent& agent, const Config& c) {
  Task test(c, /*stream=*/999999);
  int64_t correct = 0, seen = 0;
  while (seen < c.test_samples) {
    const int b = std::min(500, c.test_samples - static_cast<int>(seen));
    Batch batch = test.Next(b);
    ASSIGN_OR_RETURN(Tensor logits, Forward(agent, c, batch.ids));
    ASSIGN_OR_RETURN(int64_t right, Correct(logits, batch.labels));
    correct += right;
    seen += b;
  }
  return static_cast<double>(correct) / static_cast<double>(seen);
}

absl::StatusOr<optim::FunctionalOptions> OptimizerFromFlags() {
  const std::string kind = absl::GetFlag(FLAGS_optimizer);
  const double lr = absl::GetFlag(FLAGS_lr);
  if (kind == "sgd") return optim::SgdOptions{.lr = lr, .momentum = 0.9};
  if (kind == "adam") return optim::AdamOptions{.lr = lr};
  if (kind == "adamw") return optim::AdamWOptions{{.lr = lr}};
  if (kind == "adagrad") return optim::AdagradOptions{.lr = lr};
  return absl::InvalidArgumentError(
      absl::StrCat("--optimizer: unknown '", kind, "'"));
}

// What one trainer runs.
struct TrainerRun {
  std::string me;
  int iterations;
  uint64_t stream;      // Of the task's samples.
  bool check_accuracy;  // Against --target_accuracy.
  int kill_at_step = 0;  // Fault injection (--kill_at_step); 0: none.
  int kill_after_us = 0;  // ... that long after the step began (0: after
                          // its forward pass).
};

// A trainer's DistributedOptimizers, one per server, stepped as one fused
// optimizer: a restarted server's is re-created alone, the others keep
// their state (Adagrad sums, momentum) on their servers.
class ServerOptimizers : public autograd::dist::FusedOptimizer {
 public:
  explicit ServerOptimizers(int servers)
      : params_(servers), optimizers_(servers), ids_(servers, -1) {}

  const std::vector<std::pair<int, int64_t>>& FusedSteps() const override {
    return steps_;
  }
  int id(int m) const { return ids_[m]; }

  // Fetches server m's parameter RRefs and creates this trainer's optimizer
  // there (dropping the previous one, if any).
  absl::Status Resolve(rpc::Agent& agent, int m) {
    optimizers_[m].reset();  // Its destroy fails at once on a dead server.
    const std::string name = ServerName(m);
    ASSIGN_OR_RETURN(rpc::WorkerInfo info, agent.GetWorkerInfo(name));
    ASSIGN_OR_RETURN(params_[m], agent.rpc_sync<std::vector<RRef<Tensor>>>(
                                     name, "param_rrefs"));
    ASSIGN_OR_RETURN(optim::FunctionalOptions options, OptimizerFromFlags());
    ASSIGN_OR_RETURN(optimizers_[m], optim::DistributedOptimizer::Create(
                                         agent, options, params_[m]));
    ids_[m] = info.id;
    steps_.clear();
    for (const auto& o : optimizers_) {
      if (o == nullptr) continue;
      steps_.insert(steps_.end(), o->FusedSteps().begin(),
                    o->FusedSteps().end());
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::vector<RRef<Tensor>>> params_;
  std::vector<std::unique_ptr<optim::DistributedOptimizer>> optimizers_;
  std::vector<int> ids_;  // Each server's worker id when resolved.
  std::vector<std::pair<int, int64_t>> steps_;
};

// --fault_tolerant: what a trainer saw of server restarts.
struct Recoveries {
  int count = 0;
  // Per server: the iteration it was recovered in (0: never) and the steps
  // this trainer completed since (all on the restarted instance).
  std::vector<int> at;
  std::vector<int64_t> steps_since;
};

// --fault_tolerant: server m died (or was replaced) under this trainer:
// waits for it to come back under its name (bounded by --server_wait_s),
// re-creates what this trainer holds there (parameter RRefs, its optimizer)
// and logs what the restarted server restored.
absl::Status RecoverServer(rpc::Agent& agent, const Config& c,
                           const std::string& me, int it, int m,
                           const absl::Status& why, ServerOptimizers& opt,
                           Recoveries& rec) {
  const std::string name = ServerName(m);
  const int stale = opt.id(m);
  const absl::Time start = absl::Now();
  std::printf("%s: iteration %d: %s (id %d) is gone (%s); waiting up to %d s "
              "for it to come back\n",
              me.c_str(), it, name.c_str(), stale,
              why.ok() ? "replaced in the member table" : why.ToString().c_str(),
              c.server_wait_s);
  ASSIGN_OR_RETURN(rpc::WorkerInfo back,
                   agent.WaitForWorker(name, absl::Seconds(c.server_wait_s),
                                       stale));
  absl::Status resolved = opt.Resolve(agent, m);
  if (!resolved.ok()) {
    return Annotate(resolved, absl::StrCat(me, ": re-creating its optimizer on ",
                                           name, " (id ", back.id, ")"));
  }
  ASSIGN_OR_RETURN(int64_t applied,
                   agent.rpc_sync<int64_t>(name, "ps_applied"));
  rec.count++;
  rec.at[m] = it;
  rec.steps_since[m] = 0;
  std::printf(
      "%s: iteration %d: %s is back as worker %d after %.3f s, applied-step "
      "counter %ld there; re-created this trainer's parameter RRefs and "
      "optimizer on it (the failed step's context dropped) at unix_us %ld\n",
      me.c_str(), it, name.c_str(), back.id,
      absl::ToDoubleSeconds(absl::Now() - start), static_cast<long>(applied),
      static_cast<long>(absl::ToUnixMicros(absl::Now())));
  return absl::OkStatus();
}

// A server reported failed to this trainer's agent or replaced under its
// name in the member table since `opt` resolved it; -1: none.
int GoneServer(rpc::Agent& agent, const Config& c,
               const ServerOptimizers& opt) {
  for (int m = 0; m < c.servers; ++m) {
    if (agent.IsPeerFailed(opt.id(m))) return m;
    absl::StatusOr<rpc::WorkerInfo> now = agent.GetWorkerInfo(ServerName(m));
    if (now.ok() && now->id != opt.id(m)) return m;
  }
  return -1;
}

// The server whose death failed a step (`why`): the error alone does not
// say which (it may name the server that relayed the failure), so this
// waits, bounded by --server_wait_s, until one is reported failed (the
// agent probes a peer whose call failed with Unavailable) or replaced.
// -1: none within the bound (the error was not a server's death).
int DeadServer(rpc::Agent& agent, TableWatch& table, const Config& c,
               const ServerOptimizers& opt, const absl::Status& why) {
  if (!absl::IsUnavailable(why) && !absl::IsDeadlineExceeded(why) &&
      !absl::IsAborted(why) && !absl::IsCancelled(why)) {
    return -1;
  }
  int m = -1;
  table.Await(
      [&] {
        m = GoneServer(agent, c, opt);
        return m >= 0;
      },
      absl::Seconds(c.server_wait_s));
  return m;
}

// One trainer's whole run, from the optimizer's creation to the held-out
// check; its optimizer and RRefs are gone when it returns.
absl::Status TrainerLoop(Worker& w, const Config& c, const TrainerRun& run) {
  rpc::Agent& agent = w.agent();
  const std::string& me = run.me;
  ServerOptimizers opt(c.servers);
  // Before resolving: a server replaced after its resolve is a change.
  std::shared_ptr<TableWatch> table = TableWatch::Attach(agent);
  for (int m = 0; m < c.servers; ++m) RETURN_IF_ERROR(opt.Resolve(agent, m));
  Recoveries rec{0, std::vector<int>(c.servers, 0),
                 std::vector<int64_t>(c.servers, 0)};
  Task task(c, run.stream);
  const absl::Time start = absl::Now();
  absl::Time window = start;
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  const bool print_steps = absl::GetFlag(FLAGS_print_step_times);
  std::vector<int64_t> step_ends;
  if (print_steps) step_ends.reserve(run.iterations);
  bool kill_armed = false;
  // `it` counts completed steps: a step failed by a server's death is
  // dropped (its context released, its batch not retried) and the
  // iteration is run again with the next batch.
  for (int it = 1; it <= run.iterations;) {
    Batch batch = task.Next(c.batch);
    if (c.fault_tolerant) {
      // A server restarted since the last step (seen in the member table):
      // re-resolve before sending to its new instance.
      const int m = GoneServer(agent, c, opt);
      if (m >= 0) {
        RETURN_IF_ERROR(
            RecoverServer(agent, c, me, it, m, absl::OkStatus(), opt, rec));
      }
    }
    Tensor logits, loss;
    absl::Status failed;
    {
      // Two requests per server and step: the forward (which also carries
      // the previous context's release) and the backward, whose owners step
      // the optimizer as each parameter's gradient is final. A failed
      // step's context is released here too.
      ContextScope ctx(w.dist_autograd(),
                       ContextScope::OnExit::kReleaseInBackground);
      if (run.kill_at_step == it && run.kill_after_us > 0 && !kill_armed) {
        kill_armed = true;
        // Fault injection at a time rather than a point: the SIGKILL lands
        // wherever the trainer is U us after this step began (its forward,
        // its backward while the servers step, or a later step). The delay
        // is the fault's timing, not a synchronization.
        std::thread([me, it, us = run.kill_after_us] {
          absl::SleepFor(absl::Microseconds(us));
          std::printf(
              "%s: killing itself (SIGKILL) %d us into iteration %d at "
              "unix_us %ld\n",
              me.c_str(), us, it,
              static_cast<long>(absl::ToUnixMicros(absl::Now())));
          std::fflush(stdout);
          kill(getpid(), SIGKILL);
        }).detach();
      }
      absl::StatusOr<Tensor> forward = Forward(agent, c, batch.ids);
      if (forward.ok()) {
        logits = *forward;
        if (run.kill_at_step == it && run.kill_after_us == 0) {
          // Fault injection: a real SIGKILL, with this step's context alive
          // on the servers (forward done, backward not sent).
          std::printf(
              "%s: killing itself (SIGKILL) in iteration %d at unix_us %ld\n",
              me.c_str(), it,
              static_cast<long>(absl::ToUnixMicros(absl::Now())));
          std::fflush(stdout);
          kill(getpid(), SIGKILL);
        }
        absl::StatusOr<Tensor> labels =
            ToDevice(batch.labels, c.device, c.ops);
        if (!labels.ok()) return labels.status();
        loss = autograd::cross_entropy(logits, *labels);
        failed = w.dist_autograd().Backward(ctx.id(), {loss},
                                            {.fused_optimizer = &opt});
      } else {
        failed = forward.status();
      }
    }
    if (!failed.ok()) {
      const int m =
          c.fault_tolerant ? DeadServer(agent, *table, c, opt, failed) : -1;
      if (m < 0 || rec.count >= 4 * c.servers) {
        return Annotate(failed, absl::StrCat(me, ": iteration ", it));
      }
      RETURN_IF_ERROR(RecoverServer(agent, c, me, it, m, failed, opt, rec));
      continue;
    }
    for (int m = 0; m < c.servers; ++m) rec.steps_since[m] += rec.at[m] > 0;
    if (print_steps) step_ends.push_back(absl::ToUnixMicros(absl::Now()));
    ASSIGN_OR_RETURN(Tensor host_loss, OnHost(loss));
    loss_sum += host_loss.item();
    ASSIGN_OR_RETURN(int64_t right, Correct(logits, batch.labels));
    correct += right;
    seen += c.batch;
    if (it % c.log_every == 0 || it == run.iterations) {
      const absl::Time now = absl::Now();
      const int n = static_cast<int>(seen / c.batch);
      std::printf("%s iteration %d loss %.4f accuracy %.3f samples/s %.0f\n",
                  me.c_str(), it, loss_sum / n,
                  static_cast<double>(correct) / seen,
                  seen / absl::ToDoubleSeconds(now - window));
      window = now;
      loss_sum = 0;
      correct = seen = 0;
    }
    ++it;
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  if (print_steps) {
    std::printf("%s step_end_unix_us: %s\n", me.c_str(),
                absl::StrJoin(step_ends, ",").c_str());
  }
  for (int m = 0; m < c.servers; ++m) {
    if (rec.at[m] == 0) continue;
    std::printf("%s: %s restarted: recovered in iteration %d, %ld steps "
                "completed on its new instance\n",
                me.c_str(), ServerName(m).c_str(), rec.at[m],
                static_cast<long>(rec.steps_since[m]));
  }
  ASSIGN_OR_RETURN(double accuracy, HeldOutAccuracy(agent, c));
  const double target = absl::GetFlag(FLAGS_target_accuracy);
  const std::string verdict =
      run.check_accuracy
          ? absl::StrFormat(", target %.2f %s", target,
                            accuracy >= target ? "reached" : "NOT reached")
          : "";
  std::printf(
      "%s done: %d iterations in %.1f s (%.0f samples/s), held-out accuracy "
      "%.4f%s\n",
      me.c_str(), run.iterations, secs, run.iterations * c.batch / secs,
      accuracy, verdict.c_str());
  if (run.check_accuracy && accuracy < target) {
    return absl::FailedPreconditionError(absl::StrCat(
        me, ": held-out accuracy ", accuracy, " below the target ", target));
  }
  return absl::OkStatus();
}

// A trainer's devices: its --device, mapped to each GPU server's shard
// device (the same index on a shared GPU); CPU servers get no map (their
// tensors are moved with autograd::to in Forward).
void SetTrainerDevices(const Config& c, WorkerOptions& o,
                       const PsDevices* devices) {
  SetDevices(o, c.device, devices);
  if (o.devices.empty()) return;
  for (int m = 0; m < c.servers; ++m) {
    if (c.server_device[m].is_cpu()) continue;
    o.device_maps[ServerName(m)] = {
        {c.device.ToString(), c.server_device[m].ToString()}};
  }
}

// --fault_tolerant: trainers serve "ps_alive" (the servers' heartbeat).
std::shared_ptr<rpc::FunctionRegistry> TrainerRegistry() {
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  registry
      ->Register(
          "ps_alive", []() -> int64_t { return 1; },
          "answers the servers' heartbeat (--fault_tolerant)")
      .IgnoreError();  // A fresh registry: the name is free.
  return registry;
}

// --fault_tolerant trainer `t`: joins the servers' group, trains, leaves.
absl::Status TrainJoined(const Config& c, int t, const PsDevices* devices) {
  const TrainerRun run{absl::StrCat("trainer", t), c.iterations,
                       static_cast<uint64_t>(t), /*check_accuracy=*/true,
                       c.kill_trainer == t ? c.kill_at_step : 0,
                       c.kill_after_us};
  WorkerOptions options;
  options.name = run.me;
  SetTrainerDevices(c, options, devices);
  options.join = true;
  options.join_timeout = absl::Seconds(120);
  options.registry = TrainerRegistry();
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, InitWorker(std::move(options)));
  std::printf("%s: joined the servers' group as worker %d\n", run.me.c_str(),
              w->rank());
  absl::Status trained = TrainerLoop(*w, c, run);
  // Leaves even after an error, so the servers are not left waiting.
  absl::Status left = w->Leave(Timeout());
  RETURN_IF_ERROR(trained);
  return left;
}

absl::Status Train(const Config& c, int t, const PsDevices* devices) {
  if (c.fault_tolerant) return TrainJoined(c, t, devices);
  const TrainerRun run{absl::StrCat("trainer", t), c.iterations,
                       static_cast<uint64_t>(t), /*check_accuracy=*/true,
                       c.kill_trainer == t ? c.kill_at_step : 0,
                       c.kill_after_us};
  WorkerOptions options;
  options.name = run.me;
  SetTrainerDevices(c, options, devices);
  options.world_size = c.servers + c.trainers;
  options.join_timeout = absl::Seconds(120);
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, InitWorker(std::move(options)));
  absl::Status trained = TrainerLoop(*w, c, run);
  // Joins the shutdown even after an error, so the others are not left
  // waiting for this trainer.
  absl::Status left = w->Shutdown(Timeout());
  RETURN_IF_ERROR(trained);
  return left;
}

// Elastic trainer `k`: joins once ps0 opened the job, trains, leaves.
absl::Status TrainElastic(const Config& c, int k, const PsDevices* devices) {
  const TrainerRun run{absl::StrCat("elastic", k), c.elastic_iterations,
                       static_cast<uint64_t>(c.trainers + k),
                       /*check_accuracy=*/false};
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                   OpenGroupStore("env://", Timeout()));
  absl::Status open = store->Wait({kJoinsOpenKey}, Timeout());
  if (!open.ok()) {
    return Annotate(open, absl::StrCat(run.me,
                                       ": waiting for ps0 to open "
                                       "the job to elastic trainers"));
  }
  WorkerOptions options;
  options.name = run.me;
  SetTrainerDevices(c, options, devices);
  options.join = true;
  options.join_timeout = absl::Seconds(120);
  if (c.fault_tolerant) options.registry = TrainerRegistry();
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, InitWorker(std::move(options)));
  std::printf("%s: joined the running job as worker %d (world size %d)\n",
              run.me.c_str(), w->rank(), w->world_size());
  absl::Status trained = TrainerLoop(*w, c, run);
  // Leaves even after an error, so the servers are not left waiting.
  absl::Status left = w->Leave(Timeout());
  if (left.ok()) std::printf("%s: left the job\n", run.me.c_str());
  RETURN_IF_ERROR(trained);
  return left;
}

absl::Status Validate(const Config& c, const InitMethod& launch) {
  const int world = launch.world_size.value_or(-1);
  const int need = c.servers + c.trainers + c.elastic;
  if (world != need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the launcher's world size is ",
        world < 0 ? "unset" : absl::StrCat(world), ", --servers=", c.servers,
        " --trainers=", c.trainers,
        c.elastic > 0 ? absl::StrCat(" --elastic_trainers=", c.elastic) : "",
        " need ", need, " (ferry_run --nproc ", need, ")"));
  }
  if (c.elastic < 0 ||
      (c.elastic > 0 && (c.elastic_iterations < 1 || c.join_after < 1 ||
                         c.join_after > int64_t{c.trainers} * c.iterations))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need --elastic_trainers >= 0, --elastic_iterations >= 1 and "
        "--join_after in [1, trainers * iterations = ",
        int64_t{c.trainers} * c.iterations, "]"));
  }
  if (c.heartbeat_ms < 1 || c.kill_after_us < 0 ||
      (c.kill_trainer >= 0 &&
       (c.kill_trainer >= c.trainers || c.kill_at_step < 1 ||
        c.kill_at_step > c.iterations))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need --heartbeat_ms >= 1, --kill_after_us >= 0, and with "
        "--kill_trainer=T: T < --trainers "
        "and --kill_at_step in [1, --iterations = ",
        c.iterations, "]"));
  }
  if (c.checkpoint_every < 0 || c.checkpoint_secs < 0 || c.server_wait_s < 1 ||
      (c.kill_server >= 0 &&
       (c.kill_server >= c.servers || c.kill_server_at_step < 1))) {
    return absl::InvalidArgumentError(
        "need --checkpoint_every >= 0, --checkpoint_secs >= 0, "
        "--server_wait_s >= 1, and with --kill_server=M: M < --servers and "
        "--kill_server_at_step >= 1");
  }
  if (c.servers < 1 || c.trainers < 1 || c.vocab < c.servers ||
      c.iterations < 1 || c.batch < 1 || c.tokens < 1 || c.dim < 1 ||
      c.hidden < 1 || c.classes < 2 || c.log_every < 1 || c.test_samples < 1) {
    return absl::InvalidArgumentError(
        "need servers, trainers, iterations, batch, tokens, dim, hidden, "
        "log_every, test_samples >= 1, classes >= 2 and vocab >= servers");
  }
  return absl::OkStatus();
}

// --device and --server_devices into c.device and c.server_device (one
// per server); InvalidArgument naming the flag and the server.
absl::Status ParseDevices(Config& c) {
  ASSIGN_OR_RETURN(c.device, ParseDeviceFlag("--device", c.device_flag));
  c.server_device.assign(c.servers, c.device);
  if (!c.server_devices_flag.empty()) {
    const std::vector<std::string> each =
        absl::StrSplit(c.server_devices_flag, ',');
    if (static_cast<int>(each.size()) != c.servers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--server_devices=", c.server_devices_flag, " names ", each.size(),
          " devices, --servers=", c.servers, " needs one per server"));
    }
    for (int m = 0; m < c.servers; ++m) {
      ASSIGN_OR_RETURN(c.server_device[m],
                       ParseDeviceFlag(absl::StrCat("--server_devices (",
                                                    ServerName(m), ")"),
                                       each[m]));
    }
  }
  for (int m = 0; m < c.servers; ++m) {
    if (c.server_device[m].is_cuda() && c.device.is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--server_devices puts ", ServerName(m), "'s shard on ",
          c.server_device[m].ToString(),
          ", which needs trainers on a device too (--device=cuda)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Run() {
  Config c = FromFlags();
  // Rank and world size as env:// reads them (RANK/WORLD_SIZE, Open MPI's
  // or Slurm's variables): the same binary runs under ferry_run and mpirun.
  ASSIGN_OR_RETURN(InitMethod launch, ParseInitMethod("env://"));
  RETURN_IF_ERROR(Validate(c, launch));
  RETURN_IF_ERROR(ParseDevices(c));
  const int rank = launch.rank.value_or(-1);
  if (rank < 0) return absl::InvalidArgumentError("the launcher set no rank");
  const bool server = rank < c.servers;
  const bool trainer = !server && rank < c.servers + c.trainers;
  const std::string me =
      server ? ServerName(rank)
             : trainer ? absl::StrCat("trainer", rank - c.servers)
                       : absl::StrCat("elastic", rank - c.servers - c.trainers);
  // This process's compute context, when it uses a device: it outlives the
  // worker and every tensor below.
  std::optional<PsDevices> devices;
  if ((server ? c.server_device[rank] : c.device).is_cuda()) {
    ASSIGN_OR_RETURN(devices, OpenPsDevices(me));
    if (!server) c.ops = devices->compute.get();
  }
  const PsDevices* d = devices.has_value() ? &*devices : nullptr;
  if (server) return Serve(c, rank, d);
  if (trainer) return Train(c, rank - c.servers, d);
  return TrainElastic(c, rank - c.servers - c.trainers, d);
}

}  // namespace
}  // namespace ferry::ps_example

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ferry::ps_example::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "parameter_server: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
