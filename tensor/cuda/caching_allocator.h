// CachingDeviceAllocator: device memory for tensors, kept in a cache so that
// a training step's allocations stop reaching the device after the first
// step (cudaMalloc and cudaFree synchronize and cost tens of microseconds).
//
// Blocks: a request is rounded up to a size class (512-byte steps up to
// 1 MiB, then four classes per power of two: at most 25% rounding) and served
// from the free list of (device, stream, class), else from the device. A
// block is never split or merged (see the design note for what that costs).
//
// Stream-ordered release: a block belongs to the stream it was allocated on.
// When its last Storage goes away it is reusable at once on that stream,
// since later work there runs after the work that used it. If RecordStream
// said other streams used it too, an event is recorded on each and the block
// waits, pending, until every event is done; pending blocks are collected
// without blocking on each Allocate, EmptyCache and stats call.
//
// Limit and errors: with Options::limit_bytes, a device's reserved bytes
// (in use + cached + pending) stay within it. A request that does not fit
// first releases the device's cached blocks; if it still does not fit, or
// the device itself is out of memory, ResourceExhausted names the device,
// the request, its class, and the bytes in use, cached, pending and allowed.
//
// Ownership: Storages from it keep its internal state alive, so they may
// outlive the allocator; cached blocks are freed when the state goes.
// Thread safety: every call is safe from any thread (one annotated mutex;
// device calls are made under it). Design: docs/design/cuda_allocator.md.
#ifndef FERRY_TENSOR_CUDA_CACHING_ALLOCATOR_H_
#define FERRY_TENSOR_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/storage.h"

namespace ferry {
namespace cuda {

/// Counters of one device (bytes are block sizes, after rounding).
struct AllocatorStats {
  uint64_t allocated_bytes = 0;       ///< In live Storages.
  uint64_t cached_bytes = 0;          ///< Free, ready for reuse.
  uint64_t pending_bytes = 0;         ///< Freed, waiting for other streams.
  uint64_t reserved_bytes = 0;        ///< The three above: held from the device.
  uint64_t peak_allocated_bytes = 0;  ///< Highest allocated_bytes seen.
  uint64_t allocations = 0;           ///< Allocate calls that succeeded.
  uint64_t cache_hits = 0;            ///< Of those, served from the cache.
  uint64_t device_mallocs = 0;        ///< DeviceMemoryApi::Malloc calls.
  uint64_t device_frees = 0;          ///< DeviceMemoryApi::Free calls.
  uint64_t out_of_memory = 0;         ///< ResourceExhausted answers.
};

/// "B bytes in use, C cached, P pending, limit L" (L "none" when 0): the
/// end of both caching allocators' out-of-memory messages.
std::string DescribeHeldBytes(const AllocatorStats& stats, uint64_t limit);

/// The device allocator with a cache (see the top of the file).
class CachingDeviceAllocator {
 public:
  /// Configuration.
  struct Options {
    /// Most bytes reserved per device; 0: no limit but the device's.
    uint64_t limit_bytes = 0;
  };

  /// An allocator over `api` (which must not be null).
  static absl::StatusOr<std::unique_ptr<CachingDeviceAllocator>> Create(
      std::shared_ptr<DeviceMemoryApi> api, Options options);
  ~CachingDeviceAllocator();

  /// The size class a request of `nbytes` is served from.
  static size_t RoundSize(size_t nbytes);

  /// `nbytes` uninitialized bytes on `device` for work on `stream`.
  absl::StatusOr<Storage> Allocate(int device, size_t nbytes,
                                   StreamHandle stream);
  /// Marks `storage` (from this allocator) as used by work queued on
  /// `stream` as well: its block is reused only after that work is done.
  absl::Status RecordStream(const Storage& storage, StreamHandle stream);
  /// Returns every cached block of every device to the device (pending and
  /// live blocks stay). The first error, if any, names the device.
  absl::Status EmptyCache();
  /// Counters of `device` (zeros for an unknown device).
  AllocatorStats Stats(int device);
  /// An Allocator (tensor/storage.h) for `device` and `stream`, owned by
  /// this object, for Tensor factories that take one.
  absl::StatusOr<Allocator*> ForStream(int device, StreamHandle stream);

 private:
  class State;
  explicit CachingDeviceAllocator(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_CACHING_ALLOCATOR_H_
