#include "ferry/tensor/cuda/copy.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/common/status.h"

namespace ferry {
namespace cuda {
namespace {

std::string Describe(const Tensor& t) {
  return absl::StrCat("tensor of shape [", absl::StrJoin(t.sizes(), ", "),
                      "] on ", t.device().ToString());
}

absl::Status CheckHostSource(const char* op, const Tensor& src,
                             absl::string_view api, int device) {
  if (!src.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": undefined tensor"));
  }
  if (!src.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, " to ", api, ":", device, ": the source is a ", Describe(src),
        ", not on cpu"));
  }
  return absl::OkStatus();
}

absl::Status CheckDeviceSource(const char* op, const Tensor& src) {
  if (!src.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": undefined tensor"));
  }
  if (!src.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the source is a ", Describe(src), ", not a device tensor"));
  }
  if (!src.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the source, a ", Describe(src),
        ", is not contiguous (no device kernel compacts it yet)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> CopyToDevice(const Tensor& src, int device,
                                    StreamHandle stream,
                                    CachingDeviceAllocator& alloc,
                                    DeviceMemoryApi& api) {
  RETURN_IF_ERROR(CheckHostSource("CopyToDevice", src, api.name(), device));
  const Tensor host = src.contiguous();
  ASSIGN_OR_RETURN(Storage storage,
                   alloc.Allocate(device, host.nbytes(), stream));
  RETURN_IF_ERROR(api.MemcpyAsync(device, storage.data(), host.data_ptr(),
                                  host.nbytes(), stream));
  RETURN_IF_ERROR(api.SynchronizeStream(device, stream));
  return Tensor::FromStorage(std::move(storage), host.dtype(), host.sizes(),
                             ContiguousStrides(host.sizes()));
}

absl::StatusOr<Tensor> CopyToHost(const Tensor& src, StreamHandle stream,
                                  DeviceMemoryApi& api) {
  RETURN_IF_ERROR(CheckDeviceSource("CopyToHost", src));
  const int device = src.device().index;
  ASSIGN_OR_RETURN(Tensor out, Tensor::TryEmpty(src.sizes(), src.dtype()));
  RETURN_IF_ERROR(api.MemcpyAsync(device, out.data_ptr(), src.data_ptr(),
                                  src.nbytes(), stream));
  RETURN_IF_ERROR(api.SynchronizeStream(device, stream));
  return out;
}

absl::StatusOr<Tensor> QueueCopyToDevice(const Tensor& src, int device,
                                         StreamHandle stream,
                                         CachingDeviceAllocator& alloc,
                                         CachingHostAllocator& pinned) {
  DeviceMemoryApi& api = *pinned.api();
  RETURN_IF_ERROR(
      CheckHostSource("CopyToDeviceAsync", src, api.name(), device));
  RETURN_IF_ERROR(CheckDevice(api, device));
  const Tensor host = src.contiguous();
  const size_t nbytes = host.nbytes();
  // The host side: `host` itself when it is pinned here, else a staged copy.
  Storage staged = host.storage();
  const void* from = host.data_ptr();
  if (!pinned.IsPinned(staged)) {
    ASSIGN_OR_RETURN(staged, pinned.Allocate(nbytes));
    if (nbytes > 0) std::memcpy(staged.data(), host.data_ptr(), nbytes);
    from = staged.data();
  }
  ASSIGN_OR_RETURN(Storage storage, alloc.Allocate(device, nbytes, stream));
  RETURN_IF_ERROR(pinned.RecordStream(staged, device, stream));
  RETURN_IF_ERROR(api.MemcpyAsync(device, storage.data(), from, nbytes, stream));
  return Tensor::FromStorage(std::move(storage), host.dtype(), host.sizes(),
                             ContiguousStrides(host.sizes()));
}

absl::StatusOr<AsyncCopy> CopyToDeviceAsync(const Tensor& src, int device,
                                            StreamHandle stream,
                                            CachingDeviceAllocator& alloc,
                                            CachingHostAllocator& pinned) {
  ASSIGN_OR_RETURN(Tensor out,
                   QueueCopyToDevice(src, device, stream, alloc, pinned));
  ASSIGN_OR_RETURN(StreamEvent done,
                   StreamEvent::Record(pinned.api(), device, stream));
  return AsyncCopy{std::move(out), std::move(done)};
}

absl::StatusOr<Tensor> QueueCopyToPinned(const Tensor& src,
                                         StreamHandle stream,
                                         CachingHostAllocator& pinned) {
  RETURN_IF_ERROR(CheckDeviceSource("QueueCopyToPinned", src));
  const int device = src.device().index;
  DeviceMemoryApi& api = *pinned.api();
  RETURN_IF_ERROR(CheckDevice(api, device));
  ASSIGN_OR_RETURN(Tensor out,
                   Tensor::TryEmpty(src.sizes(), src.dtype(),
                                    pinned.allocator()));
  RETURN_IF_ERROR(pinned.RecordStream(out.storage(), device, stream));
  RETURN_IF_ERROR(api.MemcpyAsync(device, out.data_ptr(), src.data_ptr(),
                                  src.nbytes(), stream));
  return out;
}

absl::StatusOr<ChunkedCopy> QueueChunkedCopyToPinned(
    const Tensor& src, StreamHandle stream, CachingHostAllocator& pinned,
    size_t chunk_bytes) {
  RETURN_IF_ERROR(CheckDeviceSource("QueueChunkedCopyToPinned", src));
  if (chunk_bytes == 0) {
    return absl::InvalidArgumentError(
        "QueueChunkedCopyToPinned: chunk_bytes is 0");
  }
  const int device = src.device().index;
  DeviceMemoryApi& api = *pinned.api();
  RETURN_IF_ERROR(CheckDevice(api, device));
  ChunkedCopy out;
  ASSIGN_OR_RETURN(out.tensor, Tensor::TryEmpty(src.sizes(), src.dtype(),
                                                pinned.allocator()));
  RETURN_IF_ERROR(pinned.RecordStream(out.tensor.storage(), device, stream));
  out.chunk_bytes = chunk_bytes;
  const size_t total = src.nbytes();
  char* dst = static_cast<char*>(out.tensor.data_ptr());
  const char* from = static_cast<const char*>(src.data_ptr());
  out.events.reserve((total + chunk_bytes - 1) / chunk_bytes);
  for (size_t at = 0; at < total; at += chunk_bytes) {
    const size_t n = std::min(chunk_bytes, total - at);
    RETURN_IF_ERROR(api.MemcpyAsync(device, dst + at, from + at, n, stream));
    ASSIGN_OR_RETURN(StreamEvent done,
                     StreamEvent::Record(pinned.api(), device, stream));
    out.events.push_back(std::move(done));
  }
  return out;
}

absl::StatusOr<AsyncCopy> CopyToHostAsync(const Tensor& src,
                                          StreamHandle stream,
                                          CachingDeviceAllocator& alloc,
                                          CachingHostAllocator& pinned) {
  RETURN_IF_ERROR(CheckDeviceSource("CopyToHostAsync", src));
  const int device = src.device().index;
  DeviceMemoryApi& api = *pinned.api();
  RETURN_IF_ERROR(CheckDevice(api, device));
  // The device block may belong to another stream: order its reuse too.
  absl::Status recorded = alloc.RecordStream(src.storage(), stream);
  if (!recorded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyToHostAsync: the source, a ", Describe(src),
        ", is not from the given device allocator: ", recorded.message()));
  }
  ASSIGN_OR_RETURN(Tensor out, QueueCopyToPinned(src, stream, pinned));
  ASSIGN_OR_RETURN(StreamEvent done,
                   StreamEvent::Record(pinned.api(), device, stream));
  return AsyncCopy{std::move(out), std::move(done)};
}

}  // namespace cuda
}  // namespace ferry
