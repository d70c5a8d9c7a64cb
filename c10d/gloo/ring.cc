#include "c10d/gloo/ring.h"

#include <algorithm>
#include <chrono>

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
                             ReduceFn fn, uint64_t slot)
    : context_(std::move(context)),
      data_(static_cast<char*>(data)),
      numel_(numel),
      itemsize_(itemsize),
      fn_(fn),
      slot_(slot),
      rank_(context_->rank),
      size_(context_->size) {
  Plan();
  scratch_bytes_ = 2 * segment_bytes_ + 1;  // Never empty.
  scratch_.reset(new char[scratch_bytes_]);
  data_buf_ = context_->createUnboundBuffer(data_, numel_ * itemsize_);
  scratch_buf_ = context_->createUnboundBuffer(scratch_.get(), scratch_bytes_);
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
        fn_(dst, dst, scratch_.get() + (i % 2) * segment_bytes_,
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

}  // namespace gloo_internal
}  // namespace c10d
}  // namespace ferry
