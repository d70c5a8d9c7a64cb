#include "ferry/rref/delete_batcher.h"

#include <algorithm>

namespace ferry::rref {

DeleteBatcher::DeleteBatcher(absl::Duration flush_delay)
    : flush_delay_(flush_delay) {}

DeleteBatch DeleteBatcher::Launch(PerOwner& q) {
  q.in_flight = true;
  q.flush_at = absl::InfiniteFuture();
  DeleteBatch batch;
  batch.swap(q.queued);
  return batch;
}

DeleteBatch DeleteBatcher::Queue(int owner, GlobalId rref_id,
                                 GlobalId fork_id, absl::Time now) {
  PerOwner& q = queues_[owner];
  q.queued.emplace_back(rref_id, fork_id);
  if (q.in_flight) return {};  // Goes with the next batch.
  if (flush_delay_ > absl::ZeroDuration() && !flush_all_) {
    if (q.flush_at == absl::InfiniteFuture()) {
      q.flush_at = now + flush_delay_;
      ++changes_;
    }
    return {};  // Rides on the next request to `owner`, or flushes.
  }
  return Launch(q);
}

DeleteBatch DeleteBatcher::Attach(int owner) {
  auto it = queues_.find(owner);
  if (it == queues_.end() || it->second.in_flight ||
      it->second.queued.empty()) {
    return {};
  }
  return Launch(it->second);
}

DeleteBatcher::Ended DeleteBatcher::EndBatch(int owner, bool owner_failed) {
  PerOwner& q = queues_[owner];
  q.in_flight = false;
  Ended out;
  if (owner_failed) {
    out.dropped = static_cast<int>(q.queued.size());
    q.queued.clear();
    return out;
  }
  // What queued meanwhile waited already: it goes at once, alone.
  if (!q.queued.empty()) out.next = Launch(q);
  return out;
}

absl::Time DeleteBatcher::NextFlush(absl::Time now) const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [owner, q] : queues_) {
    if (!q.in_flight && !q.queued.empty()) next = std::min(next, q.flush_at);
  }
  if (flush_all_ && next != absl::InfiniteFuture()) next = now;
  return next;
}

std::vector<std::pair<int, DeleteBatch>> DeleteBatcher::TakeDue(
    absl::Time now, absl::FunctionRef<bool(int)> is_failed, int* dropped) {
  std::vector<std::pair<int, DeleteBatch>> due;
  for (auto& [owner, q] : queues_) {
    if (q.in_flight || q.queued.empty()) continue;
    if (q.flush_at > now && !flush_all_) continue;
    q.flush_at = absl::InfiniteFuture();
    if (is_failed(owner)) {
      *dropped += static_cast<int>(q.queued.size());
      q.queued.clear();
      continue;
    }
    due.emplace_back(owner, Launch(q));
  }
  return due;
}

void DeleteBatcher::FlushAll() {
  flush_all_ = true;
  ++changes_;
}

bool DeleteBatcher::in_flight(int owner) const {
  auto it = queues_.find(owner);
  return it != queues_.end() && it->second.in_flight;
}

size_t DeleteBatcher::num_queued() const {
  size_t n = 0;
  for (const auto& [owner, q] : queues_) n += q.queued.size();
  return n;
}

bool DeleteBatcher::idle() const {
  for (const auto& [owner, q] : queues_) {
    if (q.in_flight || !q.queued.empty()) return false;
  }
  return true;
}

}  // namespace ferry::rref
