// Receive buffers of a GrpcAgent, kept for reuse: the streamed path
// (stream_pieces.h) and the same-host channel (shm_channel.h) copy every
// large payload into one aligned buffer, and fresh memory is the slowest part
// of that copy (a page fault per page and the kernel zeroing each page before
// it is written; in a VM each first touch may also fault in the hypervisor).
// A buffer whose tensors are all gone comes back here and serves the next
// payload of about its size, already faulted in.
//
// Bounded: at most `max_buffers` idle buffers and `max_bytes` idle bytes; a
// buffer coming back past either bound evicts the least recently returned
// ones (a buffer larger than `max_bytes` is never kept). Memory from another
// allocator than the CPU one is never pooled.
//
// Thread safety: all methods may be called from any thread. The pool is held
// through a shared_ptr; a buffer handed out keeps only a weak reference, so
// tensors may outlive the pool (their memory is then simply freed).
#ifndef FERRY_RPC_GRPC_BUFFER_POOL_H_
#define FERRY_RPC_GRPC_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/common/sync.h"
#include "ferry/tensor/storage.h"

namespace ferry::rpc::grpc_agent {

class ReceiveBufferPool
    : public std::enable_shared_from_this<ReceiveBufferPool> {
 public:
  struct Limits {
    size_t max_buffers = 4;
    size_t max_bytes = size_t{1} << 30;
  };
  struct Stats {
    uint64_t reused = 0;     // Get served from the pool.
    uint64_t allocated = 0;  // Get served by the allocator.
    size_t idle_buffers = 0;
    size_t idle_bytes = 0;
  };

  static std::shared_ptr<ReceiveBufferPool> Create(Limits limits);
  static std::shared_ptr<ReceiveBufferPool> Create() { return Create({}); }

  // `n` bytes (64-byte aligned): an idle buffer of n to 2n bytes, else fresh
  // from `allocator` (null: the CPU allocator). CPU memory goes back to the
  // pool when the last handle to it is dropped. Errors are the allocator's.
  absl::StatusOr<Storage> Get(size_t n, Allocator* allocator = nullptr);

  Stats stats() const;

 private:
  explicit ReceiveBufferPool(Limits limits) : limits_(limits) {}
  Storage Take(size_t n);
  void Give(Storage block);

  const Limits limits_;
  mutable Mutex mu_;
  // Oldest first.
  std::vector<Storage> idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_BUFFER_POOL_H_
