#include "ferry/rpc/grpc/buffer_pool.h"

#include <utility>

#include "ferry/common/status.h"

namespace ferry::rpc::grpc_agent {

std::shared_ptr<ReceiveBufferPool> ReceiveBufferPool::Create(Limits limits) {
  return std::shared_ptr<ReceiveBufferPool>(new ReceiveBufferPool(limits));
}

absl::StatusOr<Storage> ReceiveBufferPool::Get(size_t n, Allocator* allocator) {
  Allocator* cpu = GetCpuAllocator();
  if (allocator != nullptr && allocator != cpu) return allocator->Allocate(n);
  Storage block = Take(n);
  if (!block.defined()) {
    ASSIGN_OR_RETURN(block, cpu->Allocate(n));
  }
  void* data = block.data();
  std::weak_ptr<ReceiveBufferPool> pool = weak_from_this();
  auto owner = std::shared_ptr<const void>(
      data,
      [pool = std::move(pool), block = std::move(block)](const void*) mutable {
        if (auto p = pool.lock()) p->Give(std::move(block));
      });
  return Storage::Wrap(data, n, Device::CPU(), std::move(owner));
}

Storage ReceiveBufferPool::Take(size_t n) {
  MutexLock lock(&mu_);
  // The most recently returned buffer that fits: likely still in cache.
  for (size_t i = idle_.size(); i-- > 0;) {
    const size_t size = idle_[i].nbytes();
    if (size >= n && size / 2 <= n) {
      Storage s = std::move(idle_[i]);
      idle_.erase(idle_.begin() + i);
      idle_bytes_ -= size;
      ++reused_;
      return s;
    }
  }
  ++allocated_;
  return Storage();
}

void ReceiveBufferPool::Give(Storage block) {
  std::vector<Storage> evicted;  // Freed after the lock.
  MutexLock lock(&mu_);
  if (block.nbytes() > limits_.max_bytes || limits_.max_buffers == 0) return;
  idle_bytes_ += block.nbytes();
  idle_.push_back(std::move(block));
  size_t drop = 0;
  while (idle_.size() - drop > limits_.max_buffers ||
         idle_bytes_ > limits_.max_bytes) {
    idle_bytes_ -= idle_[drop].nbytes();
    evicted.push_back(std::move(idle_[drop]));
    ++drop;
  }
  idle_.erase(idle_.begin(), idle_.begin() + drop);
}

ReceiveBufferPool::Stats ReceiveBufferPool::stats() const {
  MutexLock lock(&mu_);
  return Stats{reused_, allocated_, idle_.size(), idle_bytes_};
}

}  // namespace ferry::rpc::grpc_agent
