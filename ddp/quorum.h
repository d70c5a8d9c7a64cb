// Quorum: per-generation membership of a fault-tolerant DDP job, agreed
// through a Store (torchft's quorum, without a coordination service).
//
//   ASSIGN_OR_RETURN(auto q, Quorum::Create(store, "replica-7", options));
//   ASSIGN_OR_RETURN(QuorumView v, q->Form(min_size));   // generation g
//   ... train; on a failed collective: q->Form(1) again (generation g+1).
//
// Each member heartbeats (a thread sets "<prefix>hb/<id>" to its wall time
// in ms every heartbeat_interval); a member whose heartbeat is older than
// heartbeat_timeout, or whose probe refuses (probe_host), is dead.
// Form(g+1): every participant posts
// "want/<id>" under g+1; the proposer (the first live member of g in rank
// order, else the first live joiner) waits until every live member of g has
// posted, then commits the member list with CompareSet (first proposal
// wins, so all read the same list). Old members keep their order, joiners
// follow in arrival order: dense ranks, and rank 0 always holds state.
//
// Invariants: generations are committed once, in order ("current" only
// grows); a member of an older generation is refused (FailedPrecondition
// naming the member and both generations) and never writes to a newer one.
// Errors name the member id, the generation and the store key involved.
// Every wait is bounded by form_timeout / commit_timeout and polls at
// `tick`. Liveness compares wall clocks: hosts must agree well within
// heartbeat_timeout (NTP).
//
// Thread safety: one thread drives a Quorum (Form / Commit / Current); the
// heartbeat thread is internal and stops in the destructor. The Store must
// be safe for concurrent use (every Ferry store is); the Quorum keeps a
// clone for the heartbeat.
// Design: docs/design/ddp_quorum.md
#ifndef FERRY_DDP_QUORUM_H_
#define FERRY_DDP_QUORUM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"

namespace ferry::ddp {

// How a Quorum heartbeats, detects death and bounds its waits.
struct QuorumOptions {
  // Namespace of every key in the store.
  std::string prefix = "ftddp/";
  // How often the heartbeat key is refreshed.
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  // A heartbeat older than this: the member is dead (torchft's default).
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // The poll period of every wait (torchft's quorum tick).
  absl::Duration tick = absl::Milliseconds(100);
  // Bounds one Form call.
  absl::Duration form_timeout = absl::Seconds(60);
  // Bounds one Commit call.
  absl::Duration commit_timeout = absl::Seconds(60);
  // Liveness probe (off when empty): an IPv4 address this member's
  // listening socket binds (port 0) and is published at, e.g. "127.0.0.1"
  // for a job on one host. A peer whose connect() to it is refused has
  // exited (the kernel closed the socket), so it is dead at once instead of
  // after heartbeat_timeout. A stalled process still accepts: for it the
  // heartbeat decides. Any other probe outcome decides nothing.
  std::string probe_host;
  // Bounds one probe's connect().
  absl::Duration probe_timeout = absl::Milliseconds(200);
};

// One committed generation as a member sees it.
struct QuorumView {
  int64_t generation = 0;            // 1, 2, ...
  std::vector<std::string> members;  // Member ids; index = dense rank.
  int rank = -1;                     // This member's index in `members`.
  // Members that were not in the previous generation (joiners).
  std::vector<std::string> joined;
  // The number of members.
  int size() const { return static_cast<int>(members.size()); }
};

// What the members agreed about one training step (Commit).
enum class StepVerdict {
  kApply,           // Every member succeeded: apply the step.
  kApplyAndReform,  // Apply, then Form the next generation (a joiner waits).
  kDiscard,         // Some member failed or died: skip the step, Form next.
};

// Membership agreement through a Store (see the top of this file).
class Quorum {
 public:
  // Starts the heartbeat for member `id` (non-empty, no ','; unique per
  // process life: a restarted process takes a new id). Errors: the store's,
  // or InvalidArgument for a bad id.
  static absl::StatusOr<std::unique_ptr<Quorum>> Create(
      std::shared_ptr<Store> store, std::string id, QuorumOptions options = {});

  // Stops the heartbeat thread (the member then looks dead to the others).
  ~Quorum();
  Quorum(const Quorum&) = delete;
  Quorum& operator=(const Quorum&) = delete;

  // Joins the next generation (the first one when this member has none):
  // returns once it is committed. A new job's first generation waits until
  // `min_size` live participants asked. FailedPrecondition when this member
  // is left out (it is then stale: create a new Quorum with a new id to
  // join again); DeadlineExceeded after form_timeout naming the generation
  // and the members still awaited.
  absl::StatusOr<QuorumView> Form(int min_size = 1);

  // Agrees on step `step` of the current generation: `ok` is this member's
  // outcome. Returns kApply only when every member reported success;
  // kDiscard when one reported failure or its heartbeat went stale;
  // FailedPrecondition when a newer generation exists (this member is
  // stale). The first member to complete the count decides whether a
  // joiner waits (kApplyAndReform for all).
  absl::StatusOr<StepVerdict> Commit(int64_t step, bool ok);

  // The view of the last Form (generation 0 before any).
  const QuorumView& view() const { return view_; }
  // The newest committed generation in the store (0: none).
  absl::StatusOr<int64_t> CurrentGeneration();
  // This member's id.
  const std::string& id() const { return id_; }
  // Whether a live joiner asked for the generation after the current view
  // (so a member can hold a step until one arrives, by a bounded poll).
  absl::StatusOr<bool> JoinerPending();

 private:
  Quorum(std::shared_ptr<Store> store, std::shared_ptr<Store> heartbeat_store,
         std::string id, QuorumOptions options);
  void HeartbeatLoop();
  std::string Key(absl::string_view suffix) const;
  std::string GenKey(int64_t generation, absl::string_view suffix) const;
  // Whether `member`'s heartbeat is fresh (false when absent).
  absl::StatusOr<bool> Alive(const std::string& member);
  // Whether `member`'s probe refused a connection (false without a probe).
  absl::StatusOr<bool> Gone(const std::string& member);
  // Accepts and closes pending probe connections (heartbeat thread).
  void DrainProbe();
  // Registered joiners, in arrival order.
  absl::StatusOr<std::vector<std::string>> Joiners();
  // Members of committed generation g (NotFound when not committed).
  absl::StatusOr<std::vector<std::string>> Members(int64_t generation);
  // Whether `member` posted want for `generation`.
  absl::StatusOr<bool> Wants(int64_t generation, const std::string& member);
  // Proposer's step: commits generation g when ready. Returns false while
  // waiting for live members of g-1.
  absl::StatusOr<bool> TryPropose(int64_t generation, int min_size,
                                  std::vector<std::string>* awaited);

  const std::shared_ptr<Store> store_;
  const std::shared_ptr<Store> heartbeat_store_;
  const std::string id_;
  const QuorumOptions options_;
  QuorumView view_;
  bool registered_as_joiner_ = false;
  // The probe's listening socket (-1: none); set before the heartbeat
  // thread starts, closed after it stops.
  int probe_fd_ = -1;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status heartbeat_error_ ABSL_GUARDED_BY(mu_);
  std::thread heartbeat_;
};

// "a,b,c" <-> {"a","b","c"} (the committed member list's encoding).
std::string EncodeMembers(const std::vector<std::string>& members);
// Inverse of EncodeMembers ("" -> {}).
std::vector<std::string> DecodeMembers(absl::string_view text);

}  // namespace ferry::ddp

#endif  // FERRY_DDP_QUORUM_H_
