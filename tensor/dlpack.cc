#include "ferry/tensor/dlpack.h"

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"

namespace ferry {
namespace {

// kDLBool is not in dlpack.h 0.6; newer versions use this code.
constexpr uint8_t kDLBoolCode = 6;

DLDataType ToDLDataType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return {kDLFloat, 32, 1};
    case DType::kFloat64:
      return {kDLFloat, 64, 1};
    case DType::kFloat16:
      return {kDLFloat, 16, 1};
    case DType::kBFloat16:
      return {kDLBfloat, 16, 1};
    case DType::kInt64:
      return {kDLInt, 64, 1};
    case DType::kInt32:
      return {kDLInt, 32, 1};
    case DType::kInt8:
      return {kDLInt, 8, 1};
    case DType::kUInt8:
      return {kDLUInt, 8, 1};
    case DType::kBool:
      return {kDLBoolCode, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

absl::StatusOr<DType> FromDLDataType(DLDataType t) {
  if (t.lanes != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FromDLPack: vector dtypes are not supported (lanes = ", t.lanes, ")"));
  }
  for (DType d : kAllDTypes) {
    DLDataType x = ToDLDataType(d);
    if (x.code == t.code && x.bits == t.bits) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "FromDLPack: unsupported dtype (code ", static_cast<int>(t.code),
      ", bits ", static_cast<int>(t.bits), ")"));
}

struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed;
};

void DeleteExport(DLManagedTensor* self) {
  delete static_cast<ExportContext*>(self->manager_ctx);
}

}  // namespace

absl::StatusOr<DLManagedTensor*> ToDLPack(const Tensor& tensor) {
  if (!tensor.defined())
    return absl::InvalidArgumentError("ToDLPack: undefined tensor");
  auto ctx = std::make_unique<ExportContext>();
  ctx->tensor = tensor;
  ctx->shape = tensor.sizes();
  ctx->strides = tensor.strides();
  DLManagedTensor& m = ctx->managed;
  m.dl_tensor.data = tensor.data_ptr();
  const Device dev = tensor.device();
  m.dl_tensor.device = {dev.is_cuda() ? kDLCUDA : kDLCPU,
                        dev.is_cuda() ? dev.index : 0};
  m.dl_tensor.ndim = static_cast<int>(ctx->shape.size());
  m.dl_tensor.dtype = ToDLDataType(tensor.dtype());
  m.dl_tensor.shape = ctx->shape.data();
  m.dl_tensor.strides = ctx->strides.data();
  m.dl_tensor.byte_offset = 0;
  m.manager_ctx = ctx.get();
  m.deleter = &DeleteExport;
  return &ctx.release()->managed;
}

absl::StatusOr<Tensor> FromDLPack(DLManagedTensor* managed) {
  if (managed == nullptr)
    return absl::InvalidArgumentError("FromDLPack: null capsule");
  // From here on the capsule is ours: released with the storage, or now.
  std::shared_ptr<DLManagedTensor> owner(managed, [](DLManagedTensor* m) {
    if (m->deleter != nullptr) m->deleter(m);
  });
  const DLTensor& t = managed->dl_tensor;
  if (t.ndim < 0 || t.ndim > kMaxTensorDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromDLPack: invalid ndim ", t.ndim));
  }
  if (t.ndim > 0 && t.shape == nullptr) {
    return absl::InvalidArgumentError("FromDLPack: null shape");
  }
  absl::StatusOr<DType> dtype = FromDLDataType(t.dtype);
  if (!dtype.ok()) return dtype.status();
  Device device;
  switch (t.device.device_type) {
    case kDLCPU:
      device = Device::CPU();
      break;
    case kDLCUDA:
      device = Device::CUDA(t.device.device_id);
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat("FromDLPack: unsupported device type ",
                       static_cast<int>(t.device.device_type)));
  }
  std::vector<int64_t> sizes(t.shape, t.shape + t.ndim);
  int64_t nbytes = 0;
  absl::Status shape_ok = CheckShape(sizes, *dtype, &nbytes);
  if (!shape_ok.ok()) return Annotate(shape_ok, "FromDLPack");
  std::vector<int64_t> strides =
      t.strides != nullptr ? std::vector<int64_t>(t.strides, t.strides + t.ndim)
                           : ContiguousStrides(sizes);
  // Bytes spanned from the first element to the last.
  int64_t last = 0;
  bool empty = false;
  for (int i = 0; i < t.ndim; ++i) {
    if (strides[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FromDLPack: negative stride ", strides[i], " in dimension ", i));
    }
    if (sizes[i] == 0) empty = true;
    int64_t span;
    if (sizes[i] > 0 &&
        (__builtin_mul_overflow(sizes[i] - 1, strides[i], &span) ||
         __builtin_add_overflow(last, span, &last))) {
      return absl::InvalidArgumentError("FromDLPack: strides overflow");
    }
  }
  int64_t extent = 0;
  if (!empty &&
      __builtin_mul_overflow(last + 1, static_cast<int64_t>(ItemSize(*dtype)),
                             &extent)) {
    return absl::InvalidArgumentError("FromDLPack: tensor extent overflows");
  }
  if (extent > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(
        "FromDLPack: null data for a non-empty tensor");
  }
  char* data = static_cast<char*>(t.data) + t.byte_offset;
  Storage storage = Storage::Wrap(data, static_cast<size_t>(extent), device,
                                  std::move(owner));
  return Tensor::FromStorage(std::move(storage), *dtype, std::move(sizes),
                             std::move(strides), 0);
}

}  // namespace ferry
