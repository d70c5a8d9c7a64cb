#include "ferry/tensor/cuda/context.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/cuda_device_api.h"

namespace ferry {
namespace cuda {

// cuBLAS's entry points, from dlopen (the library stays loaded).
struct CudaContext::Blas {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasDgemm_v2) dgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_batched;
  decltype(&cublasDgemmStridedBatched) dgemm_batched;
  // cuBLAS's C++ header overloads these (a legacy cudaDataType compute
  // type), so the exported signatures are spelled out.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t,
                            cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*,
                            cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  cublasStatus_t (*gemm_batched_ex)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
      const void*, const void*, cudaDataType, int, long long int,  // NOLINT
      const void*, cudaDataType, int, long long int,               // NOLINT
      const void*, void*, cudaDataType, int, long long int,        // NOLINT
      int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) status_string;

  static absl::StatusOr<std::unique_ptr<Blas>> Load() {
    // The cuBLAS of the CUDA major version Ferry was built with.
    const std::string name =
        absl::StrCat("libcublas.so.", CUDART_VERSION / 1000);
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuBLAS: cannot load ", name, " (", dlerror(),
          "); put its directory on LD_LIBRARY_PATH"));
    }
    auto blas = std::make_unique<Blas>();
    bool ok = true;
    auto sym = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
          dlsym(lib, symbol));
      ok = ok && fn != nullptr;
    };
    sym(blas->create, "cublasCreate_v2");
    sym(blas->destroy, "cublasDestroy_v2");
    sym(blas->set_stream, "cublasSetStream_v2");
    sym(blas->sgemm, "cublasSgemm_v2");
    sym(blas->dgemm, "cublasDgemm_v2");
    sym(blas->sgemm_batched, "cublasSgemmStridedBatched");
    sym(blas->dgemm_batched, "cublasDgemmStridedBatched");
    sym(blas->gemm_ex, "cublasGemmEx");
    sym(blas->gemm_batched_ex, "cublasGemmStridedBatchedEx");
    sym(blas->status_string, "cublasGetStatusString");
    if (!ok) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuBLAS: ", name, " lacks an entry point Ferry uses"));
    }
    return blas;
  }
};

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(
    Options options) {
  ASSIGN_OR_RETURN(std::shared_ptr<CudaDeviceApi> api, CudaDeviceApi::Create());
  return CreateForApi(std::move(api), options, /*runs_kernels=*/true);
}

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::CreateForApi(
    std::shared_ptr<DeviceMemoryApi> api, Options options, bool runs_kernels) {
  if (api == nullptr) {
    return absl::InvalidArgumentError("CudaContext: null device API");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CachingDeviceAllocator> alloc,
                   CachingDeviceAllocator::Create(api, options.allocator));
  ASSIGN_OR_RETURN(std::unique_ptr<CachingHostAllocator> pinned,
                   CachingHostAllocator::Create(api, options.pinned));
  return std::unique_ptr<CudaContext>(new CudaContext(
      std::move(api), std::move(alloc), std::move(pinned), runs_kernels));
}

CudaContext::CudaContext(std::shared_ptr<DeviceMemoryApi> api,
                         std::unique_ptr<CachingDeviceAllocator> alloc,
                         std::unique_ptr<CachingHostAllocator> pinned,
                         bool runs_kernels)
    : api_(std::move(api)), alloc_(std::move(alloc)),
      pinned_(std::move(pinned)),
      streams_(static_cast<size_t>(std::max(api_->DeviceCount(), 0))),
      runs_kernels_(runs_kernels) {}

CudaContext::~CudaContext() {
  if (compute_ != nullptr) compute_->Detach();
  absl::MutexLock lock(&mu_);
  for (const auto& [device, s] : owned_streams_) {
    absl::Status done = api_->SynchronizeStream(device, s);
    done.Update(api_->DestroyStream(device, s));
    if (!done.ok()) FERRY_LOG(WARNING) << "CudaContext: " << done;
  }
  for (auto& [device, handle] : cublas_) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    blas_->destroy(static_cast<cublasHandle_t>(handle));
    cudaSetDevice(previous);
  }
}

absl::Status CudaContext::CheckCudaDevice(const char* op,
                                          Device device) const {
  if (!device.is_cuda() || device.index < 0 ||
      device.index >= device_count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": device ", device.ToString(), " is not one of the ",
        device_count(), " ", api_->name(), " devices"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CudaContext::Empty(const std::vector<int64_t>& sizes,
                                          DType dtype, Device device) {
  if (device.is_cpu()) return Tensor::TryEmpty(sizes, dtype);
  RETURN_IF_ERROR(CheckCudaDevice("Empty", device));
  ASSIGN_OR_RETURN(Allocator * a,
                   alloc_->ForStream(device.index, stream(device.index)));
  ASSIGN_OR_RETURN(Tensor t, Tensor::TryEmpty(sizes, dtype, a));
  return Attach(std::move(t));
}

absl::StatusOr<Tensor> CudaContext::Attach(Tensor t) const {
  if (compute_ == nullptr) return t;
  const Storage& s = t.storage();
  Storage with = Storage::Wrap(s.data(), s.nbytes(), s.device(),
                               std::make_shared<Storage>(s), compute_);
  return Tensor::FromStorage(std::move(with), t.dtype(), t.sizes(),
                             t.strides(), t.storage_offset());
}

void ContextBoundOps::Detach() {
  absl::WriterMutexLock lock(&mu_);
  ctx_ = nullptr;
}

absl::StatusOr<CudaContext*> ContextBoundOps::Context(const char* op) const {
  if (ctx_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(), " ", op, ": the CudaContext that made the operands is gone"));
  }
  return ctx_;
}

namespace {
// A thread's own current streams: (context, device) -> stream. Few entries
// (one per guard alive on the thread), so a vector.
struct ThreadStream {
  const CudaContext* ctx;
  int device;
  StreamHandle stream;
};
thread_local std::vector<ThreadStream> t_streams;
}  // namespace

StreamHandle CudaContext::stream(int device) const {
  if (device < 0 || device >= static_cast<int>(streams_.size())) return 0;
  for (const ThreadStream& t : t_streams) {
    if (t.ctx == this && t.device == device) return t.stream;
  }
  return streams_[device].load(std::memory_order_acquire);
}

absl::StatusOr<std::optional<StreamHandle>> CudaContext::SetThreadStream(
    Device device, std::optional<StreamHandle> stream) {
  RETURN_IF_ERROR(CheckCudaDevice("SetThreadStream", device));
  std::optional<StreamHandle> previous;
  auto it = std::find_if(t_streams.begin(), t_streams.end(),
                         [&](const ThreadStream& t) {
                           return t.ctx == this && t.device == device.index;
                         });
  if (it != t_streams.end()) {
    previous = it->stream;
    t_streams.erase(it);
  }
  if (stream.has_value()) t_streams.push_back({this, device.index, *stream});
  return previous;
}

absl::Status CudaContext::StreamWaitStream(Device device, StreamHandle waiter,
                                           StreamHandle producer) {
  RETURN_IF_ERROR(CheckCudaDevice("StreamWaitStream", device));
  if (waiter == producer) return absl::OkStatus();  // Ordered already.
  ASSIGN_OR_RETURN(StreamEvent e,
                   StreamEvent::Record(api_, device.index, producer));
  return e.MakeStreamWait(device.index, waiter);
}

absl::StatusOr<uintptr_t> ContextBoundOps::NewStream(Device device) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CudaContext * c, Context("new_stream"));
  return c->NewStream(device);
}

absl::StatusOr<uintptr_t> ContextBoundOps::CurrentStream(Device device) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CudaContext * c, Context("current_stream"));
  RETURN_IF_ERROR(c->CheckCudaDevice("current_stream", device));
  return c->stream(device.index);
}

absl::StatusOr<std::optional<uintptr_t>> ContextBoundOps::SetThreadStream(
    Device device, std::optional<uintptr_t> stream) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CudaContext * c, Context("set_thread_stream"));
  return c->SetThreadStream(device, stream);
}

absl::Status ContextBoundOps::StreamWaitStream(Device device, uintptr_t waiter,
                                               uintptr_t producer) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CudaContext * c, Context("stream_wait_stream"));
  return c->StreamWaitStream(device, waiter, producer);
}

absl::Status ContextBoundOps::CopyAsync(const Tensor& dst, const Tensor& src,
                                        uintptr_t stream) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CudaContext * c, Context("copy_async"));
  if (!dst.defined() || !src.defined() || dst.device() != src.device() ||
      dst.dtype() != src.dtype() || dst.numel() != src.numel() ||
      !dst.is_contiguous() || !src.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), " copy_async: needs contiguous tensors of one device, dtype "
        "and element count (dst ", DescribeOperand(dst), "; src ",
        DescribeOperand(src), ")"));
  }
  RETURN_IF_ERROR(c->CheckCudaDevice("copy_async", dst.device()));
  dst.storage().BumpVersion();
  return c->api().MemcpyAsync(dst.device().index, dst.data_ptr(),
                              src.data_ptr(), dst.nbytes(), stream);
}

absl::Status ContextBoundOps::RecordStream(const Tensor& t, uintptr_t stream) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CudaContext * c, Context("record_stream"));
  if (!t.defined() || !t.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), " record_stream: needs a device tensor (", DescribeOperand(t),
        ")"));
  }
  return c->allocator().RecordStream(t.storage(), stream);
}

absl::Status CudaContext::SetStream(Device device, StreamHandle stream) {
  RETURN_IF_ERROR(CheckCudaDevice("SetStream", device));
  streams_[device.index].store(stream, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<StreamHandle> CudaContext::NewStream(Device device) {
  RETURN_IF_ERROR(CheckCudaDevice("NewStream", device));
  ASSIGN_OR_RETURN(StreamHandle s, api_->CreateStream(device.index));
  absl::MutexLock lock(&mu_);
  owned_streams_.emplace_back(device.index, s);
  return s;
}

absl::StatusOr<StreamEvent> CudaContext::RecordEvent(Device device) {
  RETURN_IF_ERROR(CheckCudaDevice("RecordEvent", device));
  return StreamEvent::Record(api_, device.index, stream(device.index));
}

absl::Status CudaContext::StreamWait(Device device, const StreamEvent& event) {
  RETURN_IF_ERROR(CheckCudaDevice("StreamWait", device));
  return event.MakeStreamWait(device.index, stream(device.index));
}

absl::StatusOr<Tensor> CudaContext::To(const Tensor& t, Device device,
                                       bool non_blocking) {
  if (!t.defined()) return absl::InvalidArgumentError("To: undefined tensor");
  if (device.is_cuda()) RETURN_IF_ERROR(CheckCudaDevice("To", device));
  if (t.device().is_cuda()) RETURN_IF_ERROR(CheckCudaDevice("To", t.device()));
  if (t.device() == device) return t;
  Tensor host = t;
  if (t.device().is_cuda()) {
    const StreamHandle from = stream(t.device().index);
    if (non_blocking) {
      ASSIGN_OR_RETURN(AsyncCopy c,
                       CopyToHostAsync(t, from, *alloc_, *pinned_));
      if (device.is_cpu()) return std::move(c.tensor);
      // The second half, on another device's stream, reads the pinned bytes
      // after the first half wrote them.
      RETURN_IF_ERROR(StreamWait(device, c.done));
      host = std::move(c.tensor);
    } else {
      ASSIGN_OR_RETURN(host, CopyToHost(t, from, *api_));
      if (device.is_cpu()) return host;
    }
  }
  const StreamHandle to = stream(device.index);
  if (non_blocking) {
    ASSIGN_OR_RETURN(AsyncCopy c, CopyToDeviceAsync(host, device.index, to,
                                                    *alloc_, *pinned_));
    return Attach(std::move(c.tensor));
  }
  ASSIGN_OR_RETURN(Tensor out,
                   CopyToDevice(host, device.index, to, *alloc_, *api_));
  return Attach(std::move(out));
}

absl::Status CudaContext::Synchronize(Device device) {
  RETURN_IF_ERROR(CheckCudaDevice("Synchronize", device));
  return api_->SynchronizeStream(device.index, stream(device.index));
}

absl::StatusOr<void*> CudaContext::CublasHandle(int device) {
  RETURN_IF_ERROR(CheckCudaDevice("cuBLAS", Device::CUDA(device)));
  if (!runs_kernels_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuBLAS: the context's ", api_->name(), " devices run no kernels"));
  }
  absl::MutexLock lock(&mu_);
  if (blas_ == nullptr) {
    if (!blas_error_.ok()) return blas_error_;
    absl::StatusOr<std::unique_ptr<Blas>> b = Blas::Load();
    if (!b.ok()) {
      blas_error_ = b.status();
      return blas_error_;
    }
    blas_ = *std::move(b);
  }
  auto it = cublas_.find(device);
  if (it != cublas_.end()) return it->second;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  cublasHandle_t handle = nullptr;
  cublasStatus_t st = blas_->create(&handle);
  cudaSetDevice(previous);
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (handle != nullptr) blas_->destroy(handle);
    return absl::InternalError(absl::StrCat("cublasCreate on cuda:", device,
                                            ": ", blas_->status_string(st)));
  }
  cublas_[device] = handle;
  return static_cast<void*>(handle);
}

absl::Status CudaContext::Gemm(int device, DType dtype, bool transpose_a,
                               bool transpose_b, int m, int n, int k,
                               const void* a, int lda, const void* b, int ldb,
                               void* c, int batch, int64_t stride_a,
                               int64_t stride_b) {
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: batch ", batch, " is not positive"));
  }
  ASSIGN_OR_RETURN(void* h, CublasHandle(device));
  // Held for the call: the handle is bound to the current stream, which
  // another thread may have changed since.
  absl::MutexLock lock(&mu_);
  const Blas* blas = blas_.get();  // Set once, never replaced.
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a
  // row-major matrix read column-major is its transpose: same flags, B first.
  const cublasOperation_t opa = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasHandle_t handle = static_cast<cublasHandle_t>(h);
  cublasStatus_t st = blas->set_stream(
      handle, reinterpret_cast<cudaStream_t>(stream(device)));
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaSetDevice(previous);
    return absl::InternalError(absl::StrCat("cublasSetStream on cuda:", device,
                                            ": ", blas->status_string(st)));
  }
  const int64_t stride_c = static_cast<int64_t>(m) * n;
  if (dtype == DType::kFloat64 && batch > 1) {
    const double one = 1, zero = 0;
    st = blas->dgemm_batched(handle, opb, opa, n, m, k, &one,
                             static_cast<const double*>(b), ldb, stride_b,
                             static_cast<const double*>(a), lda, stride_a,
                             &zero, static_cast<double*>(c), n, stride_c,
                             batch);
  } else if (dtype == DType::kFloat32 && batch > 1) {
    const float one = 1, zero = 0;
    st = blas->sgemm_batched(handle, opb, opa, n, m, k, &one,
                             static_cast<const float*>(b), ldb, stride_b,
                             static_cast<const float*>(a), lda, stride_a,
                             &zero, static_cast<float*>(c), n, stride_c,
                             batch);
  } else if (dtype == DType::kFloat64) {
    const double one = 1, zero = 0;
    st = blas->dgemm(handle, opb, opa, n, m, k, &one,
                     static_cast<const double*>(b), ldb,
                     static_cast<const double*>(a), lda, &zero,
                     static_cast<double*>(c), n);
  } else if (dtype == DType::kFloat32) {
    const float one = 1, zero = 0;
    st = blas->sgemm(handle, opb, opa, n, m, k, &one,
                     static_cast<const float*>(b), ldb,
                     static_cast<const float*>(a), lda, &zero,
                     static_cast<float*>(c), n);
  } else if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    // 16-bit operands and result, float32 accumulation and scalars.
    const cudaDataType_t t =
        dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
    const float one = 1, zero = 0;
    if (batch > 1) {
      st = blas->gemm_batched_ex(handle, opb, opa, n, m, k, &one, b, t, ldb,
                                 stride_b, a, t, lda, stride_a, &zero, c, t,
                                 n, stride_c, batch, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT);
    } else {
      st = blas->gemm_ex(handle, opb, opa, n, m, k, &one, b, t, ldb, a, t, lda,
                         &zero, c, t, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
    }
  } else {
    cudaSetDevice(previous);
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm: dtype ", DTypeName(dtype),
        " is not float32, float64, float16 or bfloat16"));
  }
  cudaSetDevice(previous);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat(
        "cuBLAS gemm on cuda:", device, " (m ", m, ", n ", n, ", k ", k,
        ", batch ", batch, "): ", blas->status_string(st)));
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace ferry
