// Zero-copy exchange with other frameworks (LibTorch, CuPy, JAX, ...) through
// DLPack (dlpack.h version 0.6, Debian's libdlpack-dev).
//
// Both directions share memory: ToDLPack hands out a capsule pointing at the
// tensor's elements (keeping its storage alive until the capsule's deleter
// runs); FromDLPack wraps a capsule's memory as a Tensor whose storage calls
// the capsule's deleter when the last Ferry handle goes away.
//
// dtype mapping: floats <-> kDLFloat 16/32/64, bfloat16 <-> kDLBfloat 16,
// int8/32/64 <-> kDLInt, uint8 <-> kDLUInt 8, bool <-> code 6 (kDLBool in
// DLPack >= 0.8) with 8 bits. Devices: kDLCPU and kDLCUDA.
//
// Thread safety: reentrant. The deleter of an imported capsule runs on the
// thread that drops the last handle to the tensor's storage.
#ifndef FERRY_TENSOR_DLPACK_H_
#define FERRY_TENSOR_DLPACK_H_

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "ferry/tensor/tensor.h"

namespace ferry {

// Exports `tensor` (any strides) without copying. The caller owns the result
// and must call `result->deleter(result)` exactly once. InvalidArgument for an
// undefined tensor.
absl::StatusOr<DLManagedTensor*> ToDLPack(const Tensor& tensor);

// Imports `managed` without copying and takes ownership of it in every case:
// on error its deleter has already been called. InvalidArgument (naming the
// field) for a null capsule, unsupported dtype or lanes, negative dims or
// strides, or a shape whose byte size overflows; Unimplemented for devices
// other than CPU and CUDA.
absl::StatusOr<Tensor> FromDLPack(DLManagedTensor* managed);

}  // namespace ferry

#endif  // FERRY_TENSOR_DLPACK_H_
