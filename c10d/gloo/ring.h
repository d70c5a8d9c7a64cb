// Ferry's own ring all-reduce, reduce-scatter and all-gather, chain
// broadcast and pairwise all-to-all over Gloo's transport (unbound buffers),
// used by GlooBackend (all-reduce and broadcast when the argument check is
// on; reduce-scatter, all-gather and all-to-all always).
//
// Contract: the first receives are posted before the argument check
// (PostEarlyReceives), so the check adds no network hop; a rank sends a
// payload only after its right neighbour's header equals its own, and when
// headers differ it sends only zero-byte messages (Abandon), so every early
// receive completes and none is left behind. Why: docs/design/
// c10d_shm_and_gloo.md ("Ferry's ring over Gloo's transport").
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
#include "ferry/c10d/reduce.h"

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
  // Whether that many receives await each peer (else the left neighbour).
  virtual bool EarlyFromEveryPeer() const { return false; }
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

  // Receive space for two segments.
  static constexpr size_t kScratchBytes = 2 * kMaxSegmentBytes + 1;

  // Reduces `numel` elements of `itemsize` bytes at `data` in place with
  // `fn`, over `context` (size >= 2), on Gloo slot `slot`. `scratch`:
  // kScratchBytes the caller keeps (so calls fault in no fresh pages), or
  // null to allocate them.
  RingAllreduce(std::shared_ptr<::gloo::Context> context, void* data,
                size_t numel, size_t itemsize, ReduceFn fn, uint64_t slot,
                char* scratch = nullptr);
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
  std::unique_ptr<char[]> own_scratch_;
  char* scratch_ = nullptr;
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

// The rings below: transfer i (step i / segments, segment i % segments)
// receives from the left neighbour; the first kEarlyReceives are posted
// before the check.
class SegmentedRing : public EarlyAlgorithm {
 public:
  int PostEarlyReceives() override;

 protected:
  explicit SegmentedRing(int size) : size_(size) {}
  // Posts transfer posted_recvs_'s receive and counts it.
  virtual void PostReceive() = 0;
  int size_;
  size_t posted_recvs_ = 0;
  size_t early_ = 0;
};

// Ring reduce-scatter: rank r ends with chunk r reduced over every rank.
// n-1 steps; step s sends chunk r-s-1 (its partial sum) to the right and
// receives chunk r-s-2's partial sum from the left straight into its
// destination, then reduces this rank's own input chunk into it in place
// (every ReduceOp is commutative, so the bits are those of
// fn(received, own)). Steps alternate between `out` and `scratch` so that the
// last one lands in `out`: no copy, and scratch is needed from 3 ranks on.
// Chunks are split into segments as in RingAllreduce, two receives in flight.
// Each rank sends and receives (n-1)/n of the input.
//
// `inputs`: `size` chunks of numel elements (read only; may be one flat
// tensor or a list); `out`: numel elements, must not overlap any input
// chunk; `scratch`: numel elements (unused and may be null for 2 ranks).
class RingReduceScatter : public SegmentedRing {
 public:
  RingReduceScatter(std::shared_ptr<::gloo::Context> context,
                    std::vector<const char*> inputs, char* out, char* scratch,
                    size_t numel, size_t itemsize, ReduceFn fn, uint64_t slot);
  ~RingReduceScatter() override;

  void Run(absl::Time deadline) override;
  void Abandon(absl::Time deadline) override;

 private:
  // Destination of step s (out for the last step, alternating before it).
  size_t Target(size_t step) const;
  void PostReceive() override;

  std::shared_ptr<::gloo::Context> context_;
  std::vector<const char*> inputs_;
  char* targets_[2];  // out, scratch.
  size_t numel_, itemsize_;
  ReduceFn fn_;
  uint64_t slot_;
  int rank_;
  size_t segs_ = 0;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> in_bufs_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> target_bufs_[2];
};

// Ring all-gather: each rank copies its input into its own output chunk and
// n-1 steps pass chunks to the right, step s sending chunk r-s and receiving
// chunk r-s-1 straight into the output; a segment is forwarded as soon as
// it arrived. Segments and early receives as above; every receive lands in
// its own place, so all are posted once the call is accepted. Each rank
// sends and receives (n-1)/n of the output.
//
// `input`: nbytes; `outputs`: `size` chunks of nbytes (one flat tensor or a
// list); outputs[rank] may be the input itself.
class RingAllgather : public SegmentedRing {
 public:
  RingAllgather(std::shared_ptr<::gloo::Context> context, const char* input,
                std::vector<char*> outputs, size_t nbytes, uint64_t slot);
  ~RingAllgather() override;

  void Run(absl::Time deadline) override;
  void Abandon(absl::Time deadline) override;

 private:
  void PostReceive() override;
  // Byte range of segment j of a chunk.
  size_t SegmentBegin(size_t j) const { return nbytes_ * j / segs_; }

  std::shared_ptr<::gloo::Context> context_;
  const char* input_;
  std::vector<char*> outputs_;
  size_t nbytes_;
  uint64_t slot_;
  int rank_;
  size_t segs_ = 0;
  std::unique_ptr<::gloo::transport::UnboundBuffer> in_buf_;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> out_bufs_;
};

// Pairwise all-to-all: one message each way between every two ranks, sent
// straight from the input and received straight into the output; the
// receive from every peer is posted before the argument check. Per peer:
// `send[p]` the bytes for rank p, `recv[p]` where rank p's bytes land (the
// own entry is a local copy; lengths may differ per peer and be zero).
class PairwiseAlltoall : public EarlyAlgorithm {
 public:
  struct Span {
    char* data = nullptr;
    size_t bytes = 0;
  };
  PairwiseAlltoall(std::shared_ptr<::gloo::Context> context,
                   std::vector<Span> send, std::vector<Span> recv,
                   uint64_t slot);
  ~PairwiseAlltoall() override;

  int PostEarlyReceives() override;
  bool EarlyFromEveryPeer() const override { return true; }
  void Run(absl::Time deadline) override;
  void Abandon(absl::Time deadline) override;

 private:
  std::shared_ptr<::gloo::Context> context_;
  std::vector<Span> send_, recv_;
  uint64_t slot_;
  int rank_, size_;
  char empty_ = 0;  // Stands in for an empty span.
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> send_bufs_,
      recv_bufs_;
  bool posted_ = false;
};

// Segments per chunk of `chunk_bytes` for the rings above: at most
// RingAllreduce::kMaxSegmentBytes each, at least two (the early receives).
size_t SegmentsPerChunk(size_t chunk_bytes);

}  // namespace gloo_internal
}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_GLOO_RING_H_
