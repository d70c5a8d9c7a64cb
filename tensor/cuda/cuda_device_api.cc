#include "ferry/tensor/cuda/cuda_device_api.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {
namespace cuda {
namespace {

absl::Status Failed(cudaError_t err, int device, absl::string_view call) {
  const std::string msg = absl::StrCat("cuda:", device, ": ", call, ": ",
                                       cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(msg);
  }
  if (err == cudaErrorInvalidDevice || err == cudaErrorInvalidValue) {
    return absl::InvalidArgumentError(msg);
  }
  return absl::InternalError(msg);
}

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes);

// The allocation holding `ptr` (the current device's), through the driver's
// cuMemGetAddressRange, reached without linking libcuda.
absl::Status AddressRange(int device, const void* ptr, char** base,
                          size_t* bytes) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion(
      "cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found);
  if (err != cudaSuccess || fn == nullptr ||
      found != cudaDriverEntryPointSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, ": the driver has no cuMemGetAddressRange"));
  }
  CUdeviceptr b = 0;
  const CUresult r = reinterpret_cast<Fn>(fn)(
      &b, bytes, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cuda:%d: cuMemGetAddressRange(%p): error %d (not device memory?)",
        device, ptr, static_cast<int>(r)));
  }
  *base = reinterpret_cast<char*>(b);
  return absl::OkStatus();
}

// Checks `device` against `api`, makes it current for the scope and
// restores the previous one; status() says why not.
class DeviceScope {
 public:
  DeviceScope(const DeviceMemoryApi& api, int device)
      : status_(CheckDevice(api, device)) {
    if (!status_.ok()) return;
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    cudaError_t err = previous_ == device ? cudaSuccess : cudaSetDevice(device);
    if (err != cudaSuccess) status_ = Failed(err, device, "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess &&
        now != previous_) {
      cudaSetDevice(previous_);
    }
  }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  int previous_ = -1;
};

}  // namespace

absl::StatusOr<std::shared_ptr<CudaDeviceApi>> CudaDeviceApi::Create() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA: no usable device: cudaGetDeviceCount: ",
                     cudaGetErrorName(err), " (", cudaGetErrorString(err),
                     ")"));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("CUDA: no device is visible");
  }
  return std::shared_ptr<CudaDeviceApi>(new CudaDeviceApi(count));
}

absl::StatusOr<void*> CudaDeviceApi::Malloc(int device, size_t nbytes) {
  DeviceScope scope(*this, device);
  if (!scope.status().ok()) return scope.status();
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, nbytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Out of memory is not sticky: clear it.
    return Failed(err, device, absl::StrCat("cudaMalloc of ", nbytes, " bytes"));
  }
  return p;
}

absl::Status CudaDeviceApi::Free(int device, void* ptr) {
  DeviceScope scope(*this, device);
  if (!scope.status().ok()) return scope.status();
  cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess) {
    return Failed(err, device, absl::StrFormat("cudaFree(%p)", ptr));
  }
  return absl::OkStatus();
}

absl::StatusOr<EventHandle> CudaDeviceApi::RecordEvent(int device,
                                                       StreamHandle stream) {
  DeviceScope scope(*this, device);
  if (!scope.status().ok()) return scope.status();
  cudaEvent_t ev = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err != cudaSuccess) return Failed(err, device, "cudaEventCreate");
  err = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    cudaEventDestroy(ev);
    return Failed(err, device, "cudaEventRecord");
  }
  return reinterpret_cast<EventHandle>(ev);
}

absl::StatusOr<bool> CudaDeviceApi::EventDone(int device, EventHandle event) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  cudaError_t err = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  return Failed(err, device, "cudaEventQuery");
}

absl::Status CudaDeviceApi::DestroyEvent(int device, EventHandle event) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  cudaError_t err = cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event));
  if (err != cudaSuccess) return Failed(err, device, "cudaEventDestroy");
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::MemcpyAsync(int device, void* dst, const void* src,
                                        size_t nbytes, StreamHandle stream) {
  DeviceScope scope(*this, device);
  if (!scope.status().ok()) return scope.status();
  cudaError_t err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault,
                                    reinterpret_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    return Failed(err, device,
                  absl::StrCat("cudaMemcpyAsync of ", nbytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::SynchronizeStream(int device,
                                              StreamHandle stream) {
  DeviceScope scope(*this, device);
  if (!scope.status().ok()) return scope.status();
  cudaError_t err =
      cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) return Failed(err, device, "cudaStreamSynchronize");
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaDeviceApi::HostAlloc(size_t nbytes) {
  if (nbytes == 0) {
    return absl::InvalidArgumentError("cuda:host: HostAlloc of 0 bytes");
  }
  void* p = nullptr;
  cudaError_t err = cudaHostAlloc(&p, nbytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Out of memory is not sticky: clear it.
    const std::string msg =
        absl::StrCat("cuda:host: cudaHostAlloc of ", nbytes, " bytes: ",
                     cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
    if (err == cudaErrorMemoryAllocation) {
      return absl::ResourceExhaustedError(msg);
    }
    return absl::InternalError(msg);
  }
  return p;
}

absl::Status CudaDeviceApi::HostFree(void* ptr) {
  cudaError_t err = cudaFreeHost(ptr);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrFormat(
        "cuda:host: cudaFreeHost(%p): %s (%s)", ptr, cudaGetErrorName(err),
        cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::WaitEvent(int device, EventHandle event) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  cudaError_t err = cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(event));
  if (err != cudaSuccess) return Failed(err, device, "cudaEventSynchronize");
  return absl::OkStatus();
}

absl::StatusOr<StreamHandle> CudaDeviceApi::CreateStream(int device) {
  DeviceScope scope(*this, device);
  if (!scope.status().ok()) return scope.status();
  cudaStream_t s = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess) return Failed(err, device, "cudaStreamCreate");
  return reinterpret_cast<StreamHandle>(s);
}

absl::Status CudaDeviceApi::DestroyStream(int device, StreamHandle stream) {
  DeviceScope scope(*this, device);
  if (!scope.status().ok()) return scope.status();
  if (stream == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda:", device, ": DestroyStream of the default stream"));
  }
  cudaError_t err = cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) return Failed(err, device, "cudaStreamDestroy");
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::StreamWaitEvent(int device, StreamHandle stream,
                                            EventHandle event) {
  DeviceScope scope(*this, device);
  if (!scope.status().ok()) return scope.status();
  cudaError_t err =
      cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream),
                          reinterpret_cast<cudaEvent_t>(event), 0);
  if (err != cudaSuccess) return Failed(err, device, "cudaStreamWaitEvent");
  return absl::OkStatus();
}

// Makes `device` current for the rest of the function (see DeviceScope).
#define FERRY_CUDA_SCOPE(device)         \
  DeviceScope scope(*this, device);        \
  if (!scope.status().ok()) return scope.status()


absl::StatusOr<IpcMemory> CudaDeviceApi::ExportMemory(int device,
                                                      const void* ptr) {
  FERRY_CUDA_SCOPE(device);
  char* base = nullptr;
  size_t bytes = 0;
  absl::Status range = AddressRange(device, ptr, &base, &bytes);
  if (!range.ok()) return range;
  cudaIpcMemHandle_t h;
  cudaError_t err = cudaIpcGetMemHandle(&h, base);
  if (err != cudaSuccess) {
    return Failed(err, device, absl::StrFormat("cudaIpcGetMemHandle(%p)", base));
  }
  IpcMemory out;
  out.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  out.offset = static_cast<uint64_t>(static_cast<const char*>(ptr) - base);
  out.allocation_bytes = bytes;
  return out;
}

absl::StatusOr<IpcMapping> CudaDeviceApi::OpenMemory(int device,
                                                     absl::string_view handle) {
  FERRY_CUDA_SCOPE(device);
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", device, ": cudaIpcOpenMemHandle: a handle of ",
                     handle.size(), " bytes (", sizeof(cudaIpcMemHandle_t),
                     " expected)"));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  cudaError_t err =
      cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, ": cudaIpcOpenMemHandle: ", cudaGetErrorName(err),
        " (", cudaGetErrorString(err),
        "; another host or container, the exporting process itself, or a "
        "freed allocation)"));
  }
  char* base = nullptr;
  size_t bytes = 0;
  absl::Status range = AddressRange(device, p, &base, &bytes);
  if (!range.ok()) {
    cudaIpcCloseMemHandle(p);
    return range;
  }
  return IpcMapping{p, bytes};
}

absl::Status CudaDeviceApi::CloseMemory(int device, void* base) {
  FERRY_CUDA_SCOPE(device);
  cudaError_t err = cudaIpcCloseMemHandle(base);
  if (err != cudaSuccess) {
    return Failed(err, device, absl::StrFormat("cudaIpcCloseMemHandle(%p)", base));
  }
  return absl::OkStatus();
}

absl::StatusOr<EventHandle> CudaDeviceApi::CreateIpcEvent(int device) {
  FERRY_CUDA_SCOPE(device);
  cudaEvent_t ev = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(
      &ev, cudaEventDisableTiming | cudaEventInterprocess);
  if (err != cudaSuccess) {
    return Failed(err, device, "cudaEventCreate(interprocess)");
  }
  return reinterpret_cast<EventHandle>(ev);
}

absl::Status CudaDeviceApi::RecordIpcEvent(int device, EventHandle event,
                                           StreamHandle stream) {
  FERRY_CUDA_SCOPE(device);
  cudaError_t err = cudaEventRecord(reinterpret_cast<cudaEvent_t>(event),
                                    reinterpret_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) return Failed(err, device, "cudaEventRecord");
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaDeviceApi::ExportEvent(int device,
                                                       EventHandle event) {
  FERRY_CUDA_SCOPE(device);
  cudaIpcEventHandle_t h;
  cudaError_t err =
      cudaIpcGetEventHandle(&h, reinterpret_cast<cudaEvent_t>(event));
  if (err != cudaSuccess) return Failed(err, device, "cudaIpcGetEventHandle");
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

absl::StatusOr<EventHandle> CudaDeviceApi::OpenEvent(int device,
                                                     absl::string_view handle) {
  FERRY_CUDA_SCOPE(device);
  if (handle.size() != sizeof(cudaIpcEventHandle_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", device, ": cudaIpcOpenEventHandle: a handle of ",
                     handle.size(), " bytes"));
  }
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaEvent_t ev = nullptr;
  cudaError_t err = cudaIpcOpenEventHandle(&ev, h);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, ": cudaIpcOpenEventHandle: ", cudaGetErrorName(err),
        " (", cudaGetErrorString(err), ")"));
  }
  return reinterpret_cast<EventHandle>(ev);
}

absl::Status CudaDeviceApi::DestroyIpcEvent(int device, EventHandle event) {
  FERRY_CUDA_SCOPE(device);
  cudaError_t err = cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event));
  if (err != cudaSuccess) return Failed(err, device, "cudaEventDestroy");
  return absl::OkStatus();
}

#undef FERRY_CUDA_SCOPE

}  // namespace cuda
}  // namespace ferry
