// CachingHostAllocator: pinned (page-locked) host memory for copies between
// the host and devices, kept in a cache, since cudaHostAlloc and
// cudaFreeHost cost far more than a copy (and a page-locked allocation is
// one of the calls CUDA lists as implicitly synchronizing).
//
// Blocks: Storages on Device::CPU() (ordinary host tensors can live in
// them). A request is rounded up to the device allocator's size classes
// (CachingDeviceAllocator::RoundSize) and served from that class's free
// list, else by DeviceMemoryApi::HostAlloc; blocks are never split.
//
// Stream-ordered release: RecordStream(storage, device, stream) declares
// that work queued on that stream (an asynchronous copy) uses the block.
// When the last Storage goes away, a block without such uses is reusable at
// once; otherwise an event is recorded on each stream used and the block
// stays pending until all are done (polled without blocking on Allocate,
// EmptyCache and Stats). If an event cannot be recorded, the releasing
// thread waits for those streams instead: never an early reuse.
//
// Limit and errors: with Options::limit_bytes, pinned bytes held (in use +
// cached + pending) stay within it; a request that does not fit, or that
// HostAlloc refuses, first returns the cached blocks, then is
// ResourceExhausted naming the request, its class, and the bytes in use,
// cached, pending and allowed. Storages not from this allocator or a bad
// device are InvalidArgument naming them.
//
// Ownership: Storages keep the internal state (and the API) alive; cached
// blocks are freed, pending ones after their work, when the state goes.
// Thread safety: every call from any thread (one annotated mutex).
// Design: docs/design/cuda_allocator.md.
#ifndef FERRY_TENSOR_CUDA_PINNED_ALLOCATOR_H_
#define FERRY_TENSOR_CUDA_PINNED_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/storage.h"

namespace ferry {
namespace cuda {

/// The pinned host allocator with a cache (see the top of the file).
class CachingHostAllocator {
 public:
  /// Configuration: limit_bytes bounds the pinned bytes held (0: no limit
  /// but the host's).
  using Options = CachingDeviceAllocator::Options;

  /// An allocator over `api` (which must not be null).
  static absl::StatusOr<std::unique_ptr<CachingHostAllocator>> Create(
      std::shared_ptr<DeviceMemoryApi> api, Options options);
  ~CachingHostAllocator();

  /// `nbytes` uninitialized pinned bytes, a Storage on the CPU.
  absl::StatusOr<Storage> Allocate(size_t nbytes);
  /// Marks `storage` (from this allocator) as used by work queued on
  /// `stream` of `device`: its block is reused only after that work.
  absl::Status RecordStream(const Storage& storage, int device,
                            StreamHandle stream);
  /// Whether `storage`'s bytes are a live block of this allocator.
  bool IsPinned(const Storage& storage);
  /// Returns every cached block to the host (live and pending ones stay);
  /// the first error, if any.
  absl::Status EmptyCache();
  /// Counters (AllocatorStats' device_mallocs and device_frees count
  /// HostAlloc and HostFree calls).
  AllocatorStats Stats();
  /// An Allocator (tensor/storage.h) over this cache, owned by this object,
  /// for Tensor factories (CPU tensors in pinned memory).
  Allocator* allocator();
  /// The API the blocks come from.
  const std::shared_ptr<DeviceMemoryApi>& api() const { return api_; }

 private:
  class State;
  class Adapter;
  CachingHostAllocator(std::shared_ptr<DeviceMemoryApi> api,
                       std::shared_ptr<State> state);
  const std::shared_ptr<DeviceMemoryApi> api_;
  const std::shared_ptr<State> state_;
  std::unique_ptr<Allocator> adapter_;
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_PINNED_ALLOCATOR_H_
