// The same-host channel of a GrpcAgent: tensor payloads between two workers
// on one host skip TCP. Envelopes (metadata, control, errors) still travel
// over gRPC; a payload that qualifies stays in the sender's memory, and the
// envelope carries a SameHostPayload (proto/rpc.proto) describing where its
// bytes are. The receiver copies them once, with cross-memory attach
// (process_vm_readv), into aligned storage that becomes the tensors'
// storage: 0 bytes copied on send, 1 copy on receive, no shared segment, no
// file descriptor. Receive buffers come from the agent's ReceiveBufferPool
// (buffer_pool.h): memory already faulted in.
//
// Negotiation, per pair of workers, at rendezvous (before the group is
// used): every worker publishes whether its channel is on, its host identity
// (common/same_host.h: boot id, /dev/shm, network namespace), its pid and
// the address of a probe word. After the join each worker tries to read the
// probe word of every worker with its identity (this is what the kernel's
// ptrace access rules, e.g. Yama's ptrace_scope, allow or refuse) and
// publishes which workers it can read. A worker that joins the running group
// (rpc/agent.h, Membership) does the same pair by pair with the members
// (ProbeMembers below). A pair uses the channel only if both
// are on and each can read the other; everything else (other
// hosts or namespaces, a refused probe, the channel turned off on either
// side, payloads under `min_bytes`, no free lease slot) goes over gRPC as
// before. The channel is off when FERRY_RPC_SAME_HOST=0.
//
// Leases: a sent payload's tensors are held in a lease slot with a fresh
// nonce in the slot's token word. The receiver checks the token after
// copying, so bytes the sender has released already are never taken for the
// payload (the call fails with Aborted instead); for a reply it then writes
// the nonce into the slot's ack word (a request's descriptor has no ack
// address). A request's lease ends when its call
// completes; a reply's lease ends when the caller acknowledges it, or after
// `lease_timeout` (a caller that died or gave up), checked whenever the
// channel sends or receives. A dead peer leaves nothing behind: there is no
// segment to unlink, and a reader of a dead sender fails with Unavailable
// naming the worker.
//
// Trust: the receiver reads only from the pid the rendezvous published for
// the worker the envelope names, and checks every size against WireLimits;
// a malformed descriptor is InvalidArgument, never a crash. Workers of one
// group trust each other's envelopes as they already do over gRPC.
//
// Thread safety: all methods may be called from any thread after Negotiate.
#ifndef FERRY_RPC_GRPC_SHM_CHANNEL_H_
#define FERRY_RPC_GRPC_SHM_CHANNEL_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "ferry/proto/rpc.pb.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/grpc/buffer_pool.h"
#include "ferry/store/store.h"
#include "ferry/tensor/storage.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc::grpc_agent {

struct SameHostOptions {
  bool enabled = true;
  // Payloads whose tensor bytes are fewer go over gRPC (a few syscalls cost
  // more than sending small tensors inline).
  size_t min_bytes = size_t{64} << 10;
  // How long a reply's payload waits for the caller to read it.
  absl::Duration lease_timeout = absl::Seconds(60);
  // Payloads in flight at once; beyond, payloads go over gRPC.
  int max_leases = 1024;
  // The receiver's GrpcAgentOptions::max_message_bytes (the agent sets it;
  // < 0: none): a larger payload is refused with ResourceExhausted before
  // anything is allocated, as gRPC refuses an oversize message.
  int64_t max_message_bytes = -1;
};

// Counters (monotonic, relaxed). bytes_sent were left in place (0 copied),
// bytes_received were copied exactly once (by the kernel).
struct SameHostStats {
  std::atomic<uint64_t> payloads_sent{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> payloads_received{0};
  std::atomic<uint64_t> bytes_received{0};
  // Payloads that qualified but went over gRPC (no free lease slot).
  std::atomic<uint64_t> fallbacks{0};
};

// Owned through a shared_ptr: a request's lease handle keeps it alive.
class SameHostChannel : public std::enable_shared_from_this<SameHostChannel> {
 public:
  // `options.enabled` is combined with FERRY_RPC_SAME_HOST. Receive buffers
  // come from `pool` (null: a pool of the channel's own).
  SameHostChannel(SameHostOptions options, std::string self_name,
                  std::shared_ptr<ReceiveBufferPool> pool = nullptr);
  ~SameHostChannel();  // Ends every lease.

  SameHostChannel(const SameHostChannel&) = delete;
  SameHostChannel& operator=(const SameHostChannel&) = delete;

  bool enabled() const { return enabled_; }

  // Rendezvous step 1, before joining the group: publishes this worker's
  // record under "rpc/same_host/" in `store`.
  absl::Status Publish(Store& store, int rank);
  // Step 2, once every worker joined (so every record is there): probes,
  // publishes what this worker can read, waits for the others' answers and
  // decides per peer. A refused probe only turns that pair off; an error is
  // the store's (or DeadlineExceeded after `timeout`), and the agent fails
  // to start with it, as it would joining.
  absl::Status Negotiate(Store& store, const std::vector<WorkerInfo>& group,
                         int rank, absl::Duration timeout);

  // Joining a running group, by id (ids are never reused): the joiner
  // publishes its record (Publish with its id) before its join event, then
  // probes the present `members` and answers which it can read
  // (ProbeMembers), then announces itself. A member told of a joiner
  // probes it, answers, and decides (AddJoiner: the joiner answered
  // first). Once its announcement was answered the joiner decides
  // (SettleJoin). A pair missing either answer (a member not told, the
  // channel off on one side) uses gRPC. Errors are the store's; the pair
  // then uses gRPC. A worker that left has no channel (RemovePeer).
  absl::Status ProbeMembers(Store& store,
                            const std::vector<WorkerInfo>& members, int self);
  // AddJoiner uses its own connection (a clone of `store`, made once): the
  // agent's may be held by a long wait (the shutdown barrier) while workers
  // join.
  absl::Status AddJoiner(Store& store, const WorkerInfo& joiner, int self);
  absl::Status SettleJoin(Store& store, const std::vector<WorkerInfo>& members,
                          int self);
  void RemovePeer(int id);

  // Whether payloads to `peer` go over the channel.
  bool UsableTo(int peer) const;
  // Peers the channel is usable to (for logs and tests).
  int usable_peers() const;

  // Sender. If `payload` qualifies for `peer`, leaves it in a lease, writes
  // its descriptor to `out`, clears `payload` and returns true. With
  // `end_with` set, the lease ends when *end_with is destroyed (a request:
  // the call holds it); otherwise on acknowledgement or timeout (a reply).
  bool Offer(int peer, EncodedValue& payload, v1::SameHostPayload* out,
             std::shared_ptr<void>* end_with);

  // Receiver: copies the payload `d` from `peer`'s memory; the result is the
  // whole wire stream in one aligned chunk that owns its memory.
  absl::StatusOr<WireChunk> Fetch(int peer, const v1::SameHostPayload& d,
                                  const WireLimits& limits);

  const SameHostStats& stats() const { return stats_; }
  // Leases not ended yet (after ending those acknowledged or timed out).
  int live_leases();

 private:
  struct Slot;
  struct Lease;
  struct PeerRecord {
    bool candidate = false;  // On, same identity: worth probing.
    bool can_read = false;   // This worker can read the peer's memory.
    bool usable = false;     // And the peer can read this worker's.
    pid_t pid = 0;
    std::string name;
  };

  // `record` (Publish's) of worker `id`, probed.
  PeerRecord Probe(const std::string& record, const std::string& name,
                   int id) const;
  // The record `w` published, probed (not a candidate when there is none).
  absl::StatusOr<PeerRecord> ProbeWorker(Store& store,
                                         const WorkerInfo& w) const;
  void SetPeer(int id, PeerRecord record);
  void EndLease(int slot, uint64_t nonce);
  // Ends acknowledged and timed-out reply leases.
  void Sweep();
  absl::StatusOr<PeerRecord> Reader(int peer) const;

  const SameHostOptions options_;
  const std::string self_name_;
  const bool enabled_;
  // Read by peers through cross-memory attach during negotiation.
  const uint64_t probe_value_;
  std::unique_ptr<uint64_t> probe_word_;
  // Token and ack words of the lease slots, at fixed addresses peers read
  // and write; lives as long as the channel.
  std::unique_ptr<Slot[]> slots_;
  const std::shared_ptr<ReceiveBufferPool> pool_;
  SameHostStats stats_;

  // Serializes AddJoiner; taken before mu_.
  Mutex member_store_mu_;
  std::unique_ptr<Store> member_store_ ABSL_GUARDED_BY(member_store_mu_);

  mutable Mutex mu_;
  std::vector<PeerRecord> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Lease>> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_nonce_ ABSL_GUARDED_BY(mu_);
  // Live leases that end on acknowledgement or timeout (Sweep's work).
  int reply_leases_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_SHM_CHANNEL_H_
