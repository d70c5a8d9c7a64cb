#include "ferry/c10d/gloo/ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"

namespace ferry {
namespace c10d {
namespace gloo_internal {

std::chrono::milliseconds MillisUntil(absl::Time deadline) {
  int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return std::chrono::milliseconds(std::max<int64_t>(ms, 1));
}

void SendEmpty(::gloo::Context& context, int peer, uint64_t slot, int count,
               absl::Time deadline) {
  if (count <= 0) return;
  char byte = 0;
  auto buf = context.createUnboundBuffer(&byte, sizeof(byte));
  for (int i = 0; i < count; ++i) buf->send(peer, slot, 0, 0);
  for (int i = 0; i < count; ++i) buf->waitSend(MillisUntil(deadline));
}

RingAllreduce::RingAllreduce(std::shared_ptr<::gloo::Context> context,
                             void* data, size_t numel, size_t itemsize,
                             ReduceFn fn, uint64_t slot, char* scratch)
    : context_(std::move(context)),
      data_(static_cast<char*>(data)),
      numel_(numel),
      itemsize_(itemsize),
      fn_(fn),
      slot_(slot),
      rank_(context_->rank),
      size_(context_->size) {
  Plan();
  // Plan() keeps segments within kMaxSegmentBytes (whole elements).
  const size_t scratch_bytes = 2 * segment_bytes_ + 1;  // Never empty.
  scratch_ = scratch;
  if (scratch_ == nullptr || scratch_bytes > kScratchBytes) {
    own_scratch_.reset(new char[scratch_bytes]);
    scratch_ = own_scratch_.get();
  }
  data_buf_ = context_->createUnboundBuffer(data_, numel_ * itemsize_);
  scratch_buf_ = context_->createUnboundBuffer(scratch_, scratch_bytes);
}

RingAllreduce::~RingAllreduce() = default;

void RingAllreduce::Plan() {
  const size_t n = static_cast<size_t>(size_);
  auto chunk_begin = [&](size_t c) { return numel_ * c / n; };
  size_t max_chunk = 0;
  for (size_t c = 0; c < n; ++c) {
    max_chunk = std::max(max_chunk, chunk_begin(c + 1) - chunk_begin(c));
  }
  // Segments per chunk: the same on every rank (depends on the arguments
  // only), at least two so transfer and reduction overlap.
  const size_t per_segment = std::max<size_t>(1, kMaxSegmentBytes / itemsize_);
  const size_t segs =
      std::max<size_t>(2, (max_chunk + per_segment - 1) / per_segment);
  // Element range [begin, end) of segment j of chunk c.
  auto segment = [&](size_t c, size_t j, size_t* off, size_t* bytes) {
    const size_t b = chunk_begin(c), len = chunk_begin(c + 1) - b;
    const size_t s = b + len * j / segs, e = b + len * (j + 1) / segs;
    *off = s * itemsize_;
    *bytes = (e - s) * itemsize_;
    segment_bytes_ = std::max(segment_bytes_, *bytes);
  };
  const size_t r = static_cast<size_t>(rank_);
  auto mod = [n](size_t x) { return x % n; };
  for (int phase = 0; phase < 2; ++phase) {
    for (size_t s = 0; s + 1 < n; ++s) {
      for (size_t j = 0; j < segs; ++j) {
        Transfer t;
        t.reduce = phase == 0;
        // Reduce-scatter step s: send chunk r-s, reduce chunk r-s-1 into
        // place. All-gather step s: send chunk r+1-s, receive chunk r-s.
        const size_t send_chunk =
            phase == 0 ? mod(r + n - s) : mod(r + 1 + n - s);
        const size_t recv_chunk =
            phase == 0 ? mod(r + 2 * n - s - 1) : mod(r + n - s);
        segment(send_chunk, j, &t.send_offset, &t.send_bytes);
        segment(recv_chunk, j, &t.recv_offset, &t.recv_bytes);
        // The all-gather receive overwrites chunk r-s, which reduce-scatter
        // step s sent: that send must be complete first.
        t.first_reader = s * segs + j;
        transfers_.push_back(t);
      }
    }
  }
}

void RingAllreduce::PostReceive(size_t i) {
  const Transfer& t = transfers_[i];
  const int left = (rank_ + size_ - 1) % size_;
  if (t.reduce) {
    scratch_buf_->recv(left, slot_, (i % 2) * segment_bytes_, t.recv_bytes);
  } else {
    data_buf_->recv(left, slot_, t.recv_offset, t.recv_bytes);
  }
  ++posted_recvs_;
}

int RingAllreduce::PostEarlyReceives() {
  // Both are reduce-scatter receives: at least two segments per chunk.
  for (int i = 0; i < kEarlyReceives; ++i) PostReceive(posted_recvs_);
  early_ = posted_recvs_;
  return kEarlyReceives;
}

void RingAllreduce::Run(absl::Time deadline) {
  const int right = (rank_ + 1) % size_;
  const size_t total = transfers_.size();
  size_t sends_done = 0;
  auto wait_sends = [&](size_t upto) {
    for (; sends_done < upto; ++sends_done) {
      data_buf_->waitSend(MillisUntil(deadline));
    }
  };
  auto post_send = [&](size_t i) {
    const Transfer& t = transfers_[i];
    data_buf_->send(right, slot_, t.send_offset, t.send_bytes);
  };
  post_send(0);
  for (size_t i = 0; i < total; ++i) {
    const Transfer& t = transfers_[i];
    // Keep a send queued behind the one in flight, so the link never idles
    // while this rank reduces: send i+1's data was final (reduced or
    // received) at transfer i+1-P <= i-1, since P >= 2.
    if (i + 1 < total) post_send(i + 1);
    if (t.reduce) {
      scratch_buf_->waitRecv(MillisUntil(deadline));
      if (t.recv_bytes > 0) {
        char* dst = data_ + t.recv_offset;
        fn_(dst, dst, scratch_ + (i % 2) * segment_bytes_,
            t.recv_bytes / itemsize_);
      }
    } else {
      data_buf_->waitRecv(MillisUntil(deadline));
    }
    // Keep two receives in flight: the one after next reuses this slot.
    if (posted_recvs_ < total) {
      const Transfer& next = transfers_[posted_recvs_];
      if (!next.reduce) wait_sends(next.first_reader + 1);
      PostReceive(posted_recvs_);
    }
  }
  wait_sends(total);
}

void RingAllreduce::Abandon(absl::Time deadline) {
  for (size_t i = 0; i < early_; ++i) {
    scratch_buf_->waitRecv(MillisUntil(deadline));
  }
}

ChainBroadcast::ChainBroadcast(std::shared_ptr<::gloo::Context> context,
                               void* data, size_t nbytes, int root,
                               uint64_t slot)
    : context_(std::move(context)),
      data_(static_cast<char*>(data)),
      nbytes_(nbytes),
      rank_(context_->rank),
      size_(context_->size),
      position_((rank_ - root + size_) % size_),
      slot_(slot) {
  // Small enough segments that the chain fills quickly, at least two (the
  // early receives), at most kMaxSegmentBytes. Two ranks have no chain to
  // fill: two segments, as few messages as the early receives allow.
  segment_bytes_ =
      size_ == 2
          ? std::max<size_t>(1, (nbytes_ + 1) / 2)
          : std::clamp<size_t>(nbytes_ / 8, 1, RingAllreduce::kMaxSegmentBytes);
  segments_ =
      std::max<size_t>(2, (nbytes_ + segment_bytes_ - 1) / segment_bytes_);
  buf_ = context_->createUnboundBuffer(data_, nbytes_);
}

ChainBroadcast::~ChainBroadcast() = default;

void ChainBroadcast::PostReceive() {
  const size_t k = posted_recvs_++;
  const size_t begin = std::min(nbytes_, k * segment_bytes_);
  const size_t end = std::min(nbytes_, begin + segment_bytes_);
  buf_->recv((rank_ + size_ - 1) % size_, slot_, begin, end - begin);
}

int ChainBroadcast::PostEarlyReceives() {
  if (position_ == 0) return 0;  // The root receives nothing.
  for (int i = 0; i < RingAllreduce::kEarlyReceives; ++i) PostReceive();
  early_ = posted_recvs_;
  return static_cast<int>(early_);
}

void ChainBroadcast::Run(absl::Time deadline) {
  const int right = (rank_ + 1) % size_;
  const bool forwards = position_ < size_ - 1;
  // Segment receives land in distinct parts of the tensor: post them all.
  if (position_ > 0) {
    while (posted_recvs_ < segments_) PostReceive();
  }
  for (size_t k = 0; k < segments_; ++k) {
    if (position_ > 0) buf_->waitRecv(MillisUntil(deadline));
    if (forwards) {
      const size_t begin = std::min(nbytes_, k * segment_bytes_);
      const size_t end = std::min(nbytes_, begin + segment_bytes_);
      buf_->send(right, slot_, begin, end - begin);
    }
  }
  if (forwards) {
    for (size_t k = 0; k < segments_; ++k) {
      buf_->waitSend(MillisUntil(deadline));
    }
  }
}

void ChainBroadcast::Abandon(absl::Time deadline) {
  for (size_t i = 0; i < early_; ++i) buf_->waitRecv(MillisUntil(deadline));
}

int SegmentedRing::PostEarlyReceives() {
  if (size_ < 2) return 0;
  for (int i = 0; i < RingAllreduce::kEarlyReceives; ++i) PostReceive();
  early_ = posted_recvs_;
  return static_cast<int>(early_);
}

size_t SegmentsPerChunk(size_t chunk_bytes) {
  const size_t max = RingAllreduce::kMaxSegmentBytes;
  return std::max<size_t>(2, (chunk_bytes + max - 1) / max);
}

RingReduceScatter::RingReduceScatter(std::shared_ptr<::gloo::Context> context,
                                     std::vector<const char*> inputs, char* out,
                                     char* scratch, size_t numel,
                                     size_t itemsize, ReduceFn fn,
                                     uint64_t slot)
    : SegmentedRing(context->size),
      context_(std::move(context)),
      inputs_(std::move(inputs)),
      targets_{out, scratch},
      numel_(numel),
      itemsize_(itemsize),
      fn_(fn),
      slot_(slot),
      rank_(context_->rank) {
  segs_ = SegmentsPerChunk(numel_ * itemsize_);
  const size_t bytes = numel_ * itemsize_;
  // Gloo only reads from a buffer it sends.
  for (const char* in : inputs_) {
    in_bufs_.push_back(
        context_->createUnboundBuffer(const_cast<char*>(in), bytes));
  }
  for (int k = 0; k < 2; ++k) {
    if (targets_[k] != nullptr) {
      target_bufs_[k] = context_->createUnboundBuffer(targets_[k], bytes);
    }
  }
}

RingReduceScatter::~RingReduceScatter() = default;

size_t RingReduceScatter::Target(size_t step) const {
  return (static_cast<size_t>(size_) - 2 - step) % 2;
}

void RingReduceScatter::PostReceive() {
  const size_t i = posted_recvs_;
  const size_t s = i / segs_, j = i % segs_;
  const size_t begin = numel_ * j / segs_, end = numel_ * (j + 1) / segs_;
  target_bufs_[Target(s)]->recv((rank_ + size_ - 1) % size_, slot_,
                                begin * itemsize_, (end - begin) * itemsize_);
  ++posted_recvs_;
}

void RingReduceScatter::Run(absl::Time deadline) {
  const size_t n = static_cast<size_t>(size_), r = static_cast<size_t>(rank_);
  if (n == 1) {
    std::memmove(targets_[0], inputs_[0], numel_ * itemsize_);
    return;
  }
  const int right = (rank_ + 1) % size_;
  const size_t total = (n - 1) * segs_;
  // Chunks sent and reduced at step s.
  auto send_chunk = [&](size_t s) { return (r + 2 * n - s - 1) % n; };
  auto recv_chunk = [&](size_t s) { return (r + 2 * n - s - 2) % n; };
  // Step 0 sends this rank's input; later steps the previous step's sums.
  auto send_buf = [&](size_t i) -> ::gloo::transport::UnboundBuffer& {
    const size_t s = i / segs_;
    return s == 0 ? *in_bufs_[send_chunk(0)] : *target_bufs_[Target(s - 1)];
  };
  auto range = [&](size_t j, size_t* offset, size_t* count) {
    const size_t begin = numel_ * j / segs_, end = numel_ * (j + 1) / segs_;
    *offset = begin * itemsize_;
    *count = end - begin;
  };
  size_t sends_done = 0;
  auto wait_sends = [&](size_t upto) {
    for (; sends_done < upto; ++sends_done) {
      send_buf(sends_done).waitSend(MillisUntil(deadline));
    }
  };
  auto post_send = [&](size_t i) {
    size_t offset, count;
    range(i % segs_, &offset, &count);
    send_buf(i).send(right, slot_, offset, count * itemsize_);
  };
  post_send(0);
  for (size_t i = 0; i < total; ++i) {
    const size_t s = i / segs_;
    // Send i+1 reads the sums of transfer i+1-segs <= i-1: final already.
    if (i + 1 < total) post_send(i + 1);
    target_bufs_[Target(s)]->waitRecv(MillisUntil(deadline));
    size_t offset, count;
    range(i % segs_, &offset, &count);
    if (count > 0) {
      char* dst = targets_[Target(s)] + offset;
      fn_(dst, dst, inputs_[recv_chunk(s)] + offset, count);
    }
    if (posted_recvs_ < total) {
      // Receive k overwrites what send k-segs (step s-1) read from the same
      // destination: that send must be complete first.
      const size_t k = posted_recvs_;
      if (k >= 2 * segs_) wait_sends(k - segs_ + 1);
      PostReceive();
    }
  }
  wait_sends(total);
}

void RingReduceScatter::Abandon(absl::Time deadline) {
  for (size_t i = 0; i < early_; ++i) {
    target_bufs_[Target(0)]->waitRecv(MillisUntil(deadline));
  }
}

RingAllgather::RingAllgather(std::shared_ptr<::gloo::Context> context,
                             const char* input, std::vector<char*> outputs,
                             size_t nbytes, uint64_t slot)
    : SegmentedRing(context->size),
      context_(std::move(context)),
      input_(input),
      outputs_(std::move(outputs)),
      nbytes_(nbytes),
      slot_(slot),
      rank_(context_->rank) {
  segs_ = SegmentsPerChunk(nbytes_);
  in_buf_ = context_->createUnboundBuffer(const_cast<char*>(input_), nbytes_);
  for (char* out : outputs_) {
    out_bufs_.push_back(context_->createUnboundBuffer(out, nbytes_));
  }
}

RingAllgather::~RingAllgather() = default;

void RingAllgather::PostReceive() {
  const size_t i = posted_recvs_;
  const size_t n = static_cast<size_t>(size_), r = static_cast<size_t>(rank_);
  const size_t s = i / segs_, j = i % segs_;
  const size_t chunk = (r + 2 * n - s - 1) % n;
  out_bufs_[chunk]->recv((rank_ + size_ - 1) % size_, slot_, SegmentBegin(j),
                         SegmentBegin(j + 1) - SegmentBegin(j));
  ++posted_recvs_;
}

void RingAllgather::Run(absl::Time deadline) {
  const size_t n = static_cast<size_t>(size_), r = static_cast<size_t>(rank_);
  const int right = (rank_ + 1) % size_;
  const size_t total = (n - 1) * segs_;
  for (size_t j = 0; j < segs_ && n > 1; ++j) {
    in_buf_->send(right, slot_, SegmentBegin(j),
                  SegmentBegin(j + 1) - SegmentBegin(j));
  }
  // Every receive has its own destination: post them all now.
  while (posted_recvs_ < total) PostReceive();
  if (outputs_[r] != input_) std::memmove(outputs_[r], input_, nbytes_);
  for (size_t i = 0; i < total; ++i) {
    const size_t s = i / segs_, j = i % segs_;
    const size_t chunk = (r + 2 * n - s - 1) % n;
    out_bufs_[chunk]->waitRecv(MillisUntil(deadline));
    // Step s+1 forwards what step s received.
    if (s + 2 < n) {
      out_bufs_[chunk]->send(right, slot_, SegmentBegin(j),
                             SegmentBegin(j + 1) - SegmentBegin(j));
    }
  }
  for (size_t i = 0; i < total; ++i) {
    const size_t s = i / segs_;
    (s == 0 ? *in_buf_ : *out_bufs_[(r + 2 * n - s) % n])
        .waitSend(MillisUntil(deadline));
  }
}

void RingAllgather::Abandon(absl::Time deadline) {
  const size_t n = static_cast<size_t>(size_), r = static_cast<size_t>(rank_);
  for (size_t i = 0; i < early_; ++i) {
    out_bufs_[(r + n - 1) % n]->waitRecv(MillisUntil(deadline));
  }
}

PairwiseAlltoall::PairwiseAlltoall(std::shared_ptr<::gloo::Context> context,
                                   std::vector<Span> send,
                                   std::vector<Span> recv, uint64_t slot)
    : context_(std::move(context)),
      send_(std::move(send)),
      recv_(std::move(recv)),
      slot_(slot),
      rank_(context_->rank),
      size_(context_->size) {
  auto make = [&](const Span& span) {
    return context_->createUnboundBuffer(span.bytes > 0 ? span.data : &empty_,
                                         span.bytes);
  };
  for (int p = 0; p < size_; ++p) {
    send_bufs_.push_back(make(send_[p]));
    recv_bufs_.push_back(make(recv_[p]));
  }
}

PairwiseAlltoall::~PairwiseAlltoall() = default;

int PairwiseAlltoall::PostEarlyReceives() {
  for (int i = 1; i < size_; ++i) {
    const int peer = (rank_ + size_ - i) % size_;
    recv_bufs_[peer]->recv(peer, slot_, 0, recv_[peer].bytes);
  }
  posted_ = true;
  return size_ > 1 ? 1 : 0;
}

void PairwiseAlltoall::Run(absl::Time deadline) {
  if (!posted_) PostEarlyReceives();
  for (int i = 1; i < size_; ++i) {
    const int peer = (rank_ + i) % size_;
    send_bufs_[peer]->send(peer, slot_, 0, send_[peer].bytes);
  }
  if (send_[rank_].bytes > 0) {
    std::memmove(recv_[rank_].data, send_[rank_].data, send_[rank_].bytes);
  }
  for (int i = 1; i < size_; ++i) {
    const int peer = (rank_ + size_ - i) % size_;
    recv_bufs_[peer]->waitRecv(MillisUntil(deadline));
  }
  for (int i = 1; i < size_; ++i) {
    send_bufs_[(rank_ + i) % size_]->waitSend(MillisUntil(deadline));
  }
}

void PairwiseAlltoall::Abandon(absl::Time deadline) {
  for (int i = 1; i < size_; ++i) {
    recv_bufs_[(rank_ + size_ - i) % size_]->waitRecv(MillisUntil(deadline));
  }
}

}  // namespace gloo_internal
}  // namespace c10d
}  // namespace ferry
