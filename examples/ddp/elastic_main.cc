// Elastic data-parallel training: DDP that survives a dead rank. Each process
// is one member of a Quorum (ddp/quorum.h) over the job's TCPStore; each step
// is applied only when the quorum's verdict says every member succeeded; on
// a failed step or a waiting joiner the members form the next generation,
// build a Gloo group over PrefixStore "<prefix>pg/<generation>/", move the DDP
// onto it (Reconfigure) and take the optimizer state and step from rank 0, a
// live member (a replacement gets everything from it, nothing from disk).
//
//   bazel build //examples/ddp:ddp_elastic //tools/launcher:ferry_run
//   bazel-bin/tools/launcher/ferry_run --nproc 3 --restart_ranks 0-2
//       --rank_restarts 1 -- bazel-bin/examples/ddp/ddp_elastic --probe
//       --die_rank=2 --die_at_step=10 --hold_at_step=20 --hold_until_size=3
//                                                   (one command line)
// (without the hold, a replacement that starts after the survivors finished
// prints JOB_DONE and exits 0).
//
// Under ferry_run the store is MASTER_ADDR:MASTER_PORT, the member id
// "rank<RANK>.<FERRY_RUN_RESTART>" and the first generation waits for
// WORLD_SIZE members; --port, --id and --min_size override them.
// Fault injection (real signals), for tests and bench/fault: --die_at_step=S
// raises SIGKILL inside the communication hook of bucket 1 during step S's
// backward (bucket 0's all-reduce is already issued; with --die_rank only
// that RANK, and never a restarted one); --stop_at_step=S raises SIGSTOP
// before step S's backward. Prints one line per event (see Say); exit 0 done,
// 3 refused as a stale member, 2 any other error. Design:
// docs/design/ddp_quorum.md.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ferry/ddp.h"
#include "ferry/ferry.h"
#include "ferry/store.h"

ABSL_FLAG(int, port, 0,
          "TCPStore port on MASTER_ADDR (default 127.0.0.1); 0: MASTER_PORT");
ABSL_FLAG(std::string, id, "",
          "member id (unique per process); empty: rank<RANK>.<restart>");
ABSL_FLAG(int, min_size, 0,
          "members the first generation waits for; 0: WORLD_SIZE (1 on a "
          "restart, or without WORLD_SIZE)");
ABSL_FLAG(int, die_rank, -1,
          "with --die_at_step: only this RANK dies (-1: every member)");
ABSL_FLAG(int64_t, steps, 30, "training steps (the epoch)");
ABSL_FLAG(int64_t, die_at_step, -1, "SIGKILL self mid-backward at this step");
ABSL_FLAG(int64_t, stop_at_step, -1, "SIGSTOP self before this step");
ABSL_FLAG(int64_t, hold_at_step, -1,
          "before this step, wait (bounded) for a joiner unless the group "
          "already has --hold_until_size members");
ABSL_FLAG(int, hold_until_size, 0, "see --hold_at_step");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, 5000, "quorum heartbeat timeout");
ABSL_FLAG(int64_t, collective_timeout_ms, 5000, "Gloo operation timeout");
ABSL_FLAG(int64_t, hidden, 32, "hidden width of the MLP");
ABSL_FLAG(bool, probe, false,
          "quorum liveness probe on 127.0.0.1 (QuorumOptions::probe_host): "
          "an exited peer is dead at once, not after the heartbeat timeout");
ABSL_FLAG(bool, shm, false,
          "let the \"auto\" backend put shared memory in front of Gloo "
          "(same host); off: Gloo's TCP pairs alone");

namespace ferry {
namespace {

constexpr int64_t kDim = 8;
constexpr int64_t kClasses = 4;
constexpr int64_t kBatch = 16;
constexpr int64_t kSamples = 4096;

std::string g_id;  // This member's id, for Say.

// The quorum's and the groups' keys: "ftddp/", and under ferry_run one
// prefix per attempt ("ftddp/g<FERRY_RUN_GENERATION>/"), so that a
// whole-job restart (--max_restarts) never meets the last attempt's members.
std::string KeyPrefix() {
  const char* gen = std::getenv("FERRY_RUN_GENERATION");
  return gen != nullptr ? absl::StrCat("ftddp/g", gen, "/") : "ftddp/";
}

// An integer from the environment (ferry_run's RANK, WORLD_SIZE...), or
// `fallback` when unset or not a number.
int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  int64_t out;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

// Whether this process is the one --die_at_step kills: --die_rank's RANK (or
// any), and not a worker ferry_run restarted.
bool Doomed() {
  const int die_rank = absl::GetFlag(FLAGS_die_rank);
  return EnvInt("FERRY_RUN_RESTART", 0) == 0 &&
         (die_rank < 0 || EnvInt("RANK", -1) == die_rank);
}

// The first generation's size: --min_size, else WORLD_SIZE at first start.
int MinSize() {
  if (absl::GetFlag(FLAGS_min_size) > 0) return absl::GetFlag(FLAGS_min_size);
  if (EnvInt("FERRY_RUN_RESTART", 0) > 0) return 1;
  return static_cast<int>(EnvInt("WORLD_SIZE", 1));
}

// One event line, flushed: "<EVENT> id=<id> t_ms=<unix ms> <fields>".
void Say(absl::string_view event, absl::string_view fields) {
  std::cout << event << " id=" << g_id
            << " t_ms=" << absl::ToUnixMillis(absl::Now()) << " " << fields
            << std::endl;
}

// Three linear layers with ReLU between (several DDP buckets).
std::shared_ptr<nn::Sequential> Mlp(int64_t hidden, uint64_t seed) {
  auto m = std::make_shared<nn::Sequential>();
  const int64_t widths[] = {kDim, hidden, hidden, kClasses};
  for (int i = 0; i < 3; ++i) {
    if (i > 0) m->Append(std::make_shared<nn::ReLU>());
    m->Append(
        std::make_shared<nn::Linear>(widths[i], widths[i + 1], seed + 2 * i));
  }
  return m;
}

// FNV-1a over the bytes of `tensors` (a fingerprint printed for the test,
// which compares it across processes).
uint64_t Fingerprint(const std::vector<Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& t : tensors) {
    Tensor c = autograd::Detach(t).contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  }
  return h;
}

// Whether every rank holds exactly rank 0's bytes of `tensors`.
absl::StatusOr<bool> BitIdentical(c10d::ProcessGroup& pg,
                                  const std::vector<Tensor>& tensors,
                                  absl::Duration timeout) {
  std::vector<Tensor> flat;
  for (const Tensor& p : tensors)
    flat.push_back(autograd::Detach(p).reshape({-1}));
  Tensor mine = autograd::cat(flat, 0);
  std::vector<Tensor> all;
  for (int r = 0; r < pg.size(); ++r) all.push_back(empty_like(mine));
  c10d::AllgatherOptions o;
  o.timeout = timeout;
  RETURN_IF_ERROR(pg.Allgather(all, mine, o)->Wait(timeout));
  for (const Tensor& t : all) {
    if (std::memcmp(t.data_ptr(), all[0].data_ptr(), t.nbytes()) != 0)
      return false;
  }
  return true;
}

class Trainer {
 public:
  absl::Status Init() {
    const char* addr = std::getenv("MASTER_ADDR");
    const int port = absl::GetFlag(FLAGS_port) > 0
                         ? absl::GetFlag(FLAGS_port)
                         : static_cast<int>(EnvInt("MASTER_PORT", 0));
    if (port <= 0) {
      return absl::InvalidArgumentError(
          "no store: pass --port or run under ferry_run (MASTER_PORT)");
    }
    // A client of the launcher's store, with its secret
    // (FERRY_STORE_SECRET_FILE / FERRY_STORE_SECRET) when one is set.
    ASSIGN_OR_RETURN(
        std::unique_ptr<Store> store,
        MakeTcpStoreFactory()(addr != nullptr ? addr : "127.0.0.1", port,
                              /*is_server=*/false, /*world_size=*/0,
                              absl::Seconds(60)));
    store_ = std::shared_ptr<Store>(std::move(store));
    prefix_ = KeyPrefix();
    registry_ = c10d::MakeDefaultBackendRegistry();
    ddp::QuorumOptions qo;
    qo.heartbeat_timeout =
        absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
    if (absl::GetFlag(FLAGS_probe)) qo.probe_host = "127.0.0.1";
    qo.prefix = prefix_;
    ASSIGN_OR_RETURN(quorum_, ddp::Quorum::Create(store_, g_id, qo));
    coll_timeout_ =
        absl::Milliseconds(absl::GetFlag(FLAGS_collective_timeout_ms));
    return absl::OkStatus();
  }

  // Returns the process exit code.
  int Run() {
    absl::StatusOr<ddp::QuorumView> view =
        quorum_->Form(MinSize());
    if (!view.ok()) return Refused(view.status());
    if (EnvInt("FERRY_RUN_RESTART", 0) > 0 && view->generation > 1 &&
        view->joined.size() == view->members.size()) {
      // Replacements among themselves, after the first generation: no live
      // member holds the state. Either the job just finished, or every
      // member is gone (and with it the state: nothing to train from).
      if (store_->Wait({DoneKey()}, absl::Seconds(10)).ok()) {
        Say("JOB_DONE", "reason=finished_before_this_member_joined");
        return 0;
      }
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "member '", g_id, "' restarted into generation ", view->generation,
          " with only replacements (", absl::StrJoin(view->members, ", "),
          "): no live member to take the parameters and optimizer state "
          "from")));
    }
    auto pg = MakeGroup(*view);
    if (!pg.ok()) return Fail(pg.status());
    // A seed of this process's own: only the broadcast makes replicas equal.
    uint64_t seed = 11;
    for (char c : g_id) seed = seed * 131 + static_cast<unsigned char>(c);
    model_ = Mlp(absl::GetFlag(FLAGS_hidden), seed);
    params_ = model_->parameters();
    Say("INIT", absl::StrCat("hash=", Fingerprint(params_)));
    for (const Tensor& p : params_)
      sgd_state_.momentum_buffer.push_back(zeros_like(autograd::Detach(p)));
    ddp::DdpOptions o;
    o.first_bucket_bytes = 512;
    o.bucket_cap_bytes = 2048;
    o.timeout = coll_timeout_;
    o.comm_hook = KillingHook();
    auto ddp = ddp::DistributedDataParallel::Create(model_, *pg, o);
    if (!ddp.ok()) return Fail(ddp.status());
    ddp_ = std::move(*ddp);
    if (absl::Status s = SyncState(**pg); !s.ok()) return Fail(s);
    pg_ = *pg;
    Announce("READY");
    return Train();
  }

 private:
  absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> MakeGroup(
      const ddp::QuorumView& view) {
    auto prefix = std::make_shared<PrefixStore>(
        absl::StrCat(prefix_, "pg/", view.generation, "/"), store_);
    c10d::ProcessGroupOptions po;
    po.backend = "auto";
    po.timeout = coll_timeout_;
    po.name = absl::StrCat("gen", view.generation);
    po.backend_options["shm"] = absl::GetFlag(FLAGS_shm) ? "true" : "false";
    return c10d::ProcessGroup::Create(prefix, view.rank, view.size(),
                                      registry_, po);
  }

  // Optimizer state and step from rank 0 of `pg` (DDP sent the parameters).
  absl::Status SyncState(c10d::ProcessGroup& pg) {
    Tensor step = from_vector<int64_t>({step_});
    std::vector<Tensor> state = sgd_state_.momentum_buffer;
    state.push_back(step);
    RETURN_IF_ERROR(ddp::BroadcastTensors(pg, state, 0, coll_timeout_));
    step_ = step.to_vector<int64_t>()[0];
    return absl::OkStatus();
  }

  std::vector<Tensor> State() const {
    std::vector<Tensor> all = params_;
    all.insert(all.end(), sgd_state_.momentum_buffer.begin(),
               sgd_state_.momentum_buffer.end());
    return all;
  }

  void Announce(absl::string_view event, absl::string_view extra = "") {
    const ddp::QuorumView& v = quorum_->view();
    Say(event, absl::StrCat("gen=", v.generation, " rank=", v.rank,
                            " size=", v.size(), " step=", step_,
                            " members=", absl::StrJoin(v.members, ","),
                            " joined=", absl::StrJoin(v.joined, ","),
                            " hash=", Fingerprint(State()), extra));
  }

  ddp::CommHook KillingHook() {
    ddp::CommHook inner = ddp::AllreduceHook();
    const int64_t die_at = Doomed() ? absl::GetFlag(FLAGS_die_at_step) : -1;
    std::atomic<int64_t>* current = &current_step_;
    return [inner, die_at, current](c10d::ProcessGroup& pg,
                                    const ddp::GradBucket& bucket) {
      if (die_at >= 0 && current->load() == die_at && bucket.index == 1) {
        Say("DYING", absl::StrCat("step=", die_at, " bucket=1"));
        kill(getpid(), SIGKILL);
      }
      return inner(pg, bucket);
    };
  }

  int Refused(const absl::Status& s) {
    if (absl::IsFailedPrecondition(s)) {
      Say("REFUSED", absl::StrCat("step=", step_, " error=", s.ToString()));
      return 3;
    }
    return Fail(s);
  }
  int Fail(const absl::Status& s) {
    Say("ERROR", absl::StrCat("step=", step_, " error=", s.ToString()));
    return 2;
  }

  // Waits (bounded) until a joiner asks for the next generation.
  absl::Status HoldForJoiner() {
    // The quorum has no notification for a joiner: its store key is read
    // every 5 ms, for at most 60 s.
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      ASSIGN_OR_RETURN(bool pending, quorum_->JoinerPending());
      if (pending) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(5));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "member '", g_id, "' generation ", quorum_->view().generation,
        ": no joiner within 60s at step ", step_));
  }

  int Train() {
    const int64_t steps = absl::GetFlag(FLAGS_steps);
    nn::CrossEntropyLoss loss_fn;
    optim::SgdOptions so;
    so.lr = 0.05;
    so.momentum = 0.9;
    // The same data everywhere; each rank takes its slice of each step.
    Tensor centres = randn({kClasses, kDim}, 7).mul(1.5);
    Tensor xs = randn({kSamples, kDim}, 1);
    std::vector<int64_t> labels(kSamples);
    for (int64_t i = 0; i < kSamples; ++i) {
      labels[i] = (i * 7) % kClasses;
      xs[i].add_(centres[labels[i]]);
    }
    Tensor ys = from_vector(labels);
    absl::Time failed_at = absl::InfinitePast();
    const int64_t max_iters = 4 * steps + 50;
    for (int64_t iter = 0; iter < max_iters && step_ < steps; ++iter) {
      const ddp::QuorumView& v = quorum_->view();
      if (step_ == absl::GetFlag(FLAGS_hold_at_step) &&
          v.size() < absl::GetFlag(FLAGS_hold_until_size)) {
        if (absl::Status s = HoldForJoiner(); !s.ok()) return Fail(s);
      }
      if (step_ + 1 == absl::GetFlag(FLAGS_stop_at_step) && !stopped_) {
        stopped_ = true;
        Say("STOPPING", absl::StrCat("step=", step_ + 1));
        raise(SIGSTOP);
        Say("RESUMED", absl::StrCat("step=", step_ + 1));
      }
      current_step_ = step_ + 1;
      for (const Tensor& p : params_) {
        Tensor g = autograd::GradOf(p);
        if (g.defined()) g.zero_();
      }
      const int64_t at =
          ((step_ * v.size() + v.rank) * kBatch) % (kSamples - kBatch);
      Tensor loss = loss_fn(ddp_->Forward(xs.slice(0, at, at + kBatch)),
                            ys.slice(0, at, at + kBatch));
      absl::Status backward = ddp_->Backward(loss);
      if (!backward.ok()) {
        if (failed_at == absl::InfinitePast()) failed_at = absl::Now();
        Say("STEP_FAILED", absl::StrCat("gen=", v.generation, " step=",
                                        step_ + 1, " error=",
                                        backward.ToString()));
      }
      const absl::Time commit_start = absl::Now();
      absl::StatusOr<ddp::StepVerdict> verdict =
          quorum_->Commit(step_ + 1, backward.ok());
      commit_time_ += absl::Now() - commit_start;
      ++commits_;
      if (!verdict.ok()) return Refused(verdict.status());
      if (*verdict != ddp::StepVerdict::kDiscard) {
        std::vector<Tensor> grads;
        for (const Tensor& p : params_) grads.push_back(autograd::GradOf(p));
        if (absl::Status s = optim::SgdStep(params_, grads, sgd_state_, so);
            !s.ok())
          return Fail(s);
        ++step_;
        std::string since;
        if (failed_at != absl::InfinitePast()) {
          since = absl::StrCat(
              " recovery_ms=",
              absl::ToInt64Milliseconds(absl::Now() - failed_at));
          failed_at = absl::InfinitePast();
        }
        Say("STEP", absl::StrCat("gen=", v.generation, " size=", v.size(),
                                 " step=", step_, " loss=", loss.item(),
                                 since));
      } else if (failed_at == absl::InfinitePast()) {
        failed_at = absl::Now();
      }
      if (*verdict == ddp::StepVerdict::kApply) continue;
      // Discard or a joiner waits: the next generation.
      absl::StatusOr<ddp::QuorumView> next = quorum_->Form(1);
      if (!next.ok()) return Refused(next.status());
      Say("FORMED", absl::StrCat("gen=", next->generation,
                                 " size=", next->size()));
      absl::Status s = Reform(*next);
      if (!s.ok()) {
        // The DDP keeps its broken reducer: the next step fails on every
        // member and the quorum forms again.
        Say("REFORM_FAILED", absl::StrCat("gen=", next->generation,
                                          " error=", s.ToString()));
        continue;
      }
      Announce("REFORMED", reform_timing_);
    }
    if (step_ < steps)
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          "member '", g_id, "' stopped after ", max_iters, " iterations")));
    absl::StatusOr<bool> same = BitIdentical(*pg_, State(), coll_timeout_);
    if (!same.ok()) return Fail(same.status());
    const ddp::QuorumView& v = quorum_->view();
    if (*same && v.rank == 0) {
      if (absl::Status d = store_->Set(DoneKey(), std::to_string(step_));
          !d.ok()) {
        return Fail(d);
      }
    }
    Say("FINAL", absl::StrCat("gen=", v.generation, " size=", v.size(),
                              " step=", step_, " identical=", *same ? 1 : 0,
                              " commit_us_mean=",
                              absl::ToInt64Microseconds(commit_time_) /
                                  std::max<int64_t>(commits_, 1),
                              " hash=", Fingerprint(State())));
    return *same ? 0 : 1;
  }

  absl::Status Reform(const ddp::QuorumView& view) {
    // Drop our handle on the old group first: the DDP releases the rest.
    pg_.reset();
    const absl::Time t0 = absl::Now();
    ASSIGN_OR_RETURN(std::shared_ptr<c10d::ProcessGroup> pg, MakeGroup(view));
    const absl::Time t1 = absl::Now();
    RETURN_IF_ERROR(ddp_->Reconfigure(pg));
    const absl::Time t2 = absl::Now();
    RETURN_IF_ERROR(SyncState(*pg));
    pg_ = std::move(pg);
    reform_timing_ = absl::StrCat(
        " group_ms=", absl::ToInt64Milliseconds(t1 - t0),
        " reconfigure_ms=", absl::ToInt64Milliseconds(t2 - t1),
        " state_ms=", absl::ToInt64Milliseconds(absl::Now() - t2));
    return absl::OkStatus();
  }

  // Set (to the last step) by the group's rank 0 once training ended with
  // identical replicas: replacements that find no live member read it.
  std::string DoneKey() const { return prefix_ + "done"; }

  std::shared_ptr<Store> store_;
  std::string prefix_;  // KeyPrefix().
  std::shared_ptr<c10d::BackendRegistry> registry_;
  std::unique_ptr<ddp::Quorum> quorum_;
  absl::Duration coll_timeout_;
  std::shared_ptr<nn::Sequential> model_;
  std::vector<Tensor> params_;
  optim::SgdState sgd_state_;
  std::unique_ptr<ddp::DistributedDataParallel> ddp_;
  std::shared_ptr<c10d::ProcessGroup> pg_;
  int64_t step_ = 0;
  std::atomic<int64_t> current_step_{0};
  bool stopped_ = false;
  std::string reform_timing_;  // Where the last Reform's time went.
  // Time spent in Quorum::Commit (the per-step agreement), and calls.
  absl::Duration commit_time_;
  int64_t commits_ = 0;
};

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ferry::g_id = absl::GetFlag(FLAGS_id);
  if (ferry::g_id.empty()) {
    ferry::g_id = absl::StrCat("rank", ferry::EnvInt("RANK", 0), ".",
                               ferry::EnvInt("FERRY_RUN_RESTART", 0));
  }
  ferry::Trainer trainer;
  if (absl::Status s = trainer.Init(); !s.ok()) {
    ferry::Say("ERROR", absl::StrCat("init error=", s.ToString()));
    return 2;
  }
  return trainer.Run();
}
