// Copies between CPU tensors and device memory, through a DeviceMemoryApi
// and a CachingDeviceAllocator (what CudaContext::To calls).
//
// Synchronous (CopyToDevice, CopyToHost): queued on the caller's stream,
// after the work already there; they return once the copy has run, since
// the source may be pageable memory the caller reuses at once.
// Asynchronous (CopyToDeviceAsync, CopyToHostAsync): the host side is a
// pinned block from a CachingHostAllocator (a pageable source is first
// copied into one on the calling thread; a pinned source is read in place,
// so it must not be written before the event is done);
// the copy is queued on `stream` and the call returns at once with a
// StreamEvent recorded after it. The pinned block (or pinned source) and
// the device storage are declared to their allocators (RecordStream), so
// neither is reused before the copy ran, even if the caller drops the
// tensors and the event at once. Work queued later on the same stream sees
// the bytes; a host reader waits for the event first.
//
// Errors: InvalidArgument naming the op, the devices and the shape for an
// undefined tensor, a source on the wrong kind of device, or a device tensor
// that is not contiguous (no device kernel can compact it yet) or not from
// `alloc`; allocation and copy failures come from the allocators and the
// API, naming the device. Nothing is queued when an error is returned
// before the copy, and after it the error comes from recording the event.
// Thread safety: as the allocators and the API (any thread).
// Design: docs/design/cuda_allocator.md.
#ifndef FERRY_TENSOR_CUDA_COPY_H_
#define FERRY_TENSOR_CUDA_COPY_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/cuda/event.h"
#include "ferry/tensor/cuda/pinned_allocator.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace cuda {

/// A contiguous copy of CPU tensor `src` on `device`, allocated from `alloc`
/// for `stream` and written by a copy queued there (see the top).
absl::StatusOr<Tensor> CopyToDevice(const Tensor& src, int device,
                                    StreamHandle stream,
                                    CachingDeviceAllocator& alloc,
                                    DeviceMemoryApi& api);

/// A new CPU tensor with the elements of contiguous device tensor `src`,
/// read by a copy queued on `stream` (see the top).
absl::StatusOr<Tensor> CopyToHost(const Tensor& src, StreamHandle stream,
                                  DeviceMemoryApi& api);

/// A tensor whose bytes an asynchronous copy writes, and the event after it.
struct AsyncCopy {
  Tensor tensor;     ///< Readable on the host once `done` is done.
  StreamEvent done;  ///< Recorded after the copy on the caller's stream.
};

/// A contiguous copy of CPU tensor `src` on `device`, allocated from `alloc`
/// for `stream`; staged through `pinned` (unless `src` is pinned there) and
/// queued on `stream` without waiting (see the top), with no event: work
/// queued later on `stream` sees the bytes (one wait for many such copies).
/// `pinned` and `alloc` must be over the same API.
absl::StatusOr<Tensor> QueueCopyToDevice(const Tensor& src, int device,
                                         StreamHandle stream,
                                         CachingDeviceAllocator& alloc,
                                         CachingHostAllocator& pinned);

/// As QueueCopyToDevice, with an event recorded after the copy.
absl::StatusOr<AsyncCopy> CopyToDeviceAsync(const Tensor& src, int device,
                                            StreamHandle stream,
                                            CachingDeviceAllocator& alloc,
                                            CachingHostAllocator& pinned);

/// A new CPU tensor in pinned memory from `pinned` that a copy queued on
/// `stream` fills with the elements of contiguous device tensor `src`; no
/// event and no claim on `src`'s allocator: the caller keeps `src` alive and
/// waits for `stream` before reading (one wait for many such copies).
absl::StatusOr<Tensor> QueueCopyToPinned(const Tensor& src,
                                         StreamHandle stream,
                                         CachingHostAllocator& pinned);

/// A QueueCopyToPinned cut in chunks, each followed by its event.
struct ChunkedCopy {
  Tensor tensor;  ///< The pinned copy; bytes valid as its events complete.
  size_t chunk_bytes = 0;  ///< Bytes per chunk (the last may be fewer).
  /// events[k] is done once bytes [0, min((k+1) * chunk_bytes, nbytes))
  /// of `tensor` are written.
  std::vector<StreamEvent> events;
};

/// As QueueCopyToPinned, the copy queued as chunks of `chunk_bytes` (> 0)
/// with an event recorded after each, so a reader can start on the first
/// bytes while the rest still copy. On an error after a chunk was queued,
/// the queued chunks still read `src`: the caller waits for `stream`.
absl::StatusOr<ChunkedCopy> QueueChunkedCopyToPinned(
    const Tensor& src, StreamHandle stream, CachingHostAllocator& pinned,
    size_t chunk_bytes);

/// A new CPU tensor in pinned memory from `pinned` that a copy queued on
/// `stream` fills with the elements of contiguous device tensor `src`
/// (whose storage is from `alloc`); returns without waiting (see the top).
absl::StatusOr<AsyncCopy> CopyToHostAsync(const Tensor& src,
                                          StreamHandle stream,
                                          CachingDeviceAllocator& alloc,
                                          CachingHostAllocator& pinned);

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_COPY_H_
