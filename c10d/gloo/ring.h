// Ferry's own ring all-reduce and chain broadcast over Gloo's transport
// (unbound buffers), used by GlooBackend when the argument check is on.
//
// Why not Gloo's: with the check on, every rank learns every rank's argument
// header before any payload moves (see gloo_backend.h). Gloo's algorithms
// post their receives only when called, so they would start one network hop
// after the check. This ring posts its first receives from the left
// neighbour before the check (PostEarlyReceives), so the check and the first
// receive's "ready" notice cross the network together and the data of the
// first step flows as soon as the headers agree: no hop is added.
//
// Safety: Gloo's TCP pair moves a payload only after the receiver posted a
// receive for its slot, and aborts the process when the payload is longer
// than the posted receive. Here a rank sends a payload only after it has
// seen its right neighbour's header equal its own (so the neighbour posted
// exactly the sizes this rank sends); when headers differ it sends only
// zero-byte messages, which fit any posted receive (Abandon), so early
// receives always complete and no stale receive is left behind.
//
// Algorithm: the tensor is split into `size` chunks, each into segments of
// at most kMaxSegmentBytes (at least two per chunk). Reduce-scatter: n-1
// steps, each sending one chunk's partial sum to the right and reducing the
// chunk from the left into the tensor; then all-gather: n-1 steps passing the
// reduced chunks on. Two receives are in flight at any time, so a segment's
// transfer overlaps the reduction of the previous one. Each rank sends and
// receives 2 (n-1)/n of the tensor (busbw formula of a ring all-reduce).
//
// Not thread-safe: one instance is driven by one thread. Methods may throw
// Gloo's exceptions (the caller catches them).
#ifndef FERRY_C10D_GLOO_RING_H_
#define FERRY_C10D_GLOO_RING_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "c10d/reduce.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace ferry {
namespace c10d {
namespace gloo_internal {

// Gloo wait timeout for what is left until `deadline` (at least 1 ms: Gloo
// reads 0 as "no timeout").
std::chrono::milliseconds MillisUntil(absl::Time deadline);

// Completes a neighbour's early receives when a call was refused: sends
// `count` zero-byte messages to `peer` on `slot` and waits for them.
void SendEmpty(::gloo::Context& context, int peer, uint64_t slot, int count,
               absl::Time deadline);

// An algorithm whose first receives are posted before the argument check
// (see GlooBackend::RunOp). Exactly one of Run and Abandon follows
// PostEarlyReceives.
class EarlyAlgorithm {
 public:
  virtual ~EarlyAlgorithm() = default;
  // Posts the first receives; returns how many (the left neighbour learns
  // the count from this rank's header and completes them on refusal).
  virtual int PostEarlyReceives() = 0;
  // Runs the algorithm; every rank's arguments were found equal.
  virtual void Run(absl::Time deadline) = 0;
  // The call was refused on every rank: waits for the zero-byte messages
  // that complete the early receives.
  virtual void Abandon(absl::Time deadline) = 0;
};

class RingAllreduce : public EarlyAlgorithm {
 public:
  static constexpr size_t kMaxSegmentBytes = size_t{1} << 20;
  // Receives posted before the argument check (and in flight at any time).
  static constexpr int kEarlyReceives = 2;

  // Reduces `numel` elements of `itemsize` bytes at `data` in place with
  // `fn`, over `context` (size >= 2), on Gloo slot `slot`.
  RingAllreduce(std::shared_ptr<::gloo::Context> context, void* data,
                size_t numel, size_t itemsize, ReduceFn fn, uint64_t slot);
  ~RingAllreduce() override;

  // Posts kEarlyReceives receives from the left neighbour.
  int PostEarlyReceives() override;
  void Run(absl::Time deadline) override;
  void Abandon(absl::Time deadline) override;

 private:
  struct Transfer {
    size_t send_offset, send_bytes;
    size_t recv_offset, recv_bytes;
    bool reduce;          // Reduce-scatter step (else all-gather).
    size_t first_reader;  // Send that read recv's region (all-gather).
  };
  void Plan();
  void PostReceive(size_t i);

  std::shared_ptr<::gloo::Context> context_;
  char* data_;
  size_t numel_, itemsize_;
  ReduceFn fn_;
  uint64_t slot_;
  int rank_, size_;
  size_t segment_bytes_ = 0;
  std::vector<Transfer> transfers_;
  // Two segments for reduce-scatter receives (left uninitialized).
  std::unique_ptr<char[]> scratch_;
  size_t scratch_bytes_ = 0;
  std::unique_ptr<::gloo::transport::UnboundBuffer> data_buf_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> scratch_buf_;
  size_t posted_recvs_ = 0;
  size_t early_ = 0;
};

// Pipelined chain broadcast: ranks in order from the root (root, root+1,
// ...), each receiving segments from its predecessor straight into the
// tensor and forwarding each one as soon as it arrived. Every link carries
// the tensor once (Gloo's broadcast sends it n-1 times from the root), and
// the segments overlap along the chain. Early receives as above.
class ChainBroadcast : public EarlyAlgorithm {
 public:
  ChainBroadcast(std::shared_ptr<::gloo::Context> context, void* data,
                 size_t nbytes, int root, uint64_t slot);
  ~ChainBroadcast() override;

  int PostEarlyReceives() override;
  void Run(absl::Time deadline) override;
  void Abandon(absl::Time deadline) override;

 private:
  void PostReceive();

  std::shared_ptr<::gloo::Context> context_;
  char* data_;
  size_t nbytes_;
  int rank_, size_;
  int position_;  // Distance from the root along the chain.
  uint64_t slot_;
  size_t segment_bytes_ = 0, segments_ = 0;
  std::unique_ptr<::gloo::transport::UnboundBuffer> buf_;
  size_t posted_recvs_ = 0;
  size_t early_ = 0;
};

}  // namespace gloo_internal
}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_GLOO_RING_H_
