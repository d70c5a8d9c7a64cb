// Tensor: Ferry's n-dimensional array.
//
// A Tensor is a cheap, reference-counted handle (copying it shares the same
// elements, like at::Tensor): dtype, sizes, strides (in elements), a storage
// offset (in elements) and a Storage. Views (view, reshape of a contiguous
// tensor, slice, select, transpose) share storage; in-place ops (suffix `_`)
// write through to every handle and view of the same storage.
//
// Errors: Ferry reports bad *input* (wire bytes, DLPack capsules, user data)
// as absl::Status. The ops here are math on tensors the program built itself;
// violating an op's precondition (mismatched shapes, a CUDA tensor passed to a
// CPU-only op, a negative dimension in a factory) is a programming error and
// aborts the process with a message naming the op and the offending values,
// the way an out-of-range std::vector::at would without exceptions. Code that
// handles untrusted shapes validates them first (see CheckShape) or uses the
// StatusOr factories (Tensor::FromStorage, TryEmpty).
//
// Ops here are for CPU tensors (a CUDA operand aborts naming the op and the
// device); CUDA tensors compute through tensor/cuda/ops.h and a CudaContext.
//
// Thread safety: a Tensor handle is like a shared_ptr: distinct handles may be
// used from different threads; concurrent writes to the same elements are a
// data race, as are writes concurrent with reads.
#ifndef FERRY_TENSOR_TENSOR_H_
#define FERRY_TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/tensor/dtype.h"
#include "ferry/tensor/storage.h"

namespace ferry {

// Largest number of dimensions a tensor may have.
inline constexpr int64_t kMaxTensorDims = 64;

// Checks that `sizes` is a valid shape for `dtype`: at most kMaxTensorDims
// dims, none negative, and numel * itemsize fits in int64. On success stores
// the byte count in `*nbytes` (when non-null). InvalidArgument otherwise,
// naming the offending dimension or the overflow.
absl::Status CheckShape(const std::vector<int64_t>& sizes, DType dtype,
                        int64_t* nbytes = nullptr);

// Prints `msg` to stderr and aborts (precondition failure; see top).
[[noreturn]] void TensorFail(const std::string& msg);

// Opaque per-tensor state owned by a layer above tensor/ (autograd keeps
// requires_grad, grad and grad_fn here). tensor/ only stores and returns it,
// so a Tensor carried inside a Value still knows its autograd state.
class AutogradMetaInterface {
 public:
  virtual ~AutogradMetaInterface() = default;
};

// Row-major (C order) strides for `sizes`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes);

// An n-dimensional array: a cheap shared handle to typed, strided elements
// in a Storage (see the top of this file for sharing and thread safety).
class Tensor {
 public:
  // An undefined tensor (defined() is false). Only defined(), operator= and
  // ToString may be called on it.
  Tensor() = default;

  // A tensor over `storage`; validates that the shape is sane, strides are
  // non-negative, and every element lies inside the storage.
  static absl::StatusOr<Tensor> FromStorage(Storage storage, DType dtype,
                                            std::vector<int64_t> sizes,
                                            std::vector<int64_t> strides,
                                            int64_t storage_offset = 0);
  // Uninitialized contiguous tensor; errors instead of aborting on a bad
  // shape or failed allocation. `allocator` null means CPU.
  static absl::StatusOr<Tensor> TryEmpty(const std::vector<int64_t>& sizes,
                                         DType dtype,
                                         Allocator* allocator = nullptr);

  bool defined() const { return impl_ != nullptr; }  // Not default-constructed.
  DType dtype() const;  // The element type.
  Device device() const;  // Where the elements live.
  const std::vector<int64_t>& sizes() const;  // The shape.
  // Elements to skip per dimension.
  const std::vector<int64_t>& strides() const;
  int64_t dim() const;  // The number of dimensions.
  // Size of dimension `d`; negative `d` counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const;  // The number of elements.
  size_t itemsize() const;  // Bytes per element.
  // numel() * itemsize(): the bytes the elements occupy when contiguous.
  size_t nbytes() const;
  int64_t storage_offset() const;  // In elements, into storage().
  const Storage& storage() const;  // The memory the elements are in.
  bool is_contiguous() const;  // Row-major without gaps.
  // Number of handles to this tensor object (0 when undefined); with
  // storage().use_count() it tells whether anything else can see the
  // elements (autograd reuses a gradient buffer only then).
  long use_count() const { return impl_.use_count(); }
  // Whether both handles are the same tensor object (not just equal values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // Address of the first element.
  void* data_ptr() const;
  // Typed address of the first element; aborts unless T matches dtype().
  template <typename T>
  T* data() const {
    CheckDType(DTypeOf<T>::value, "data<T>");
    return static_cast<T*>(data_ptr());
  }

  // The single element of a one-element tensor, converted to T.
  template <typename T>
  T item() const;
  double item() const { return item<double>(); }  // item<double>().
  // All elements in row-major order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;

  // Abort with a message naming `op` unless defined / on CPU / of `expected`
  // dtype (used by ops, including ones outside this class).
  void CheckDefined(const char* op) const;
  void CheckCpu(const char* op) const;  // See CheckDefined.
  void CheckDType(DType expected, const char* op) const;  // See CheckDefined.

  // Autograd state of this tensor object (views and copies have their own);
  // null until a layer above sets it. Setting it is not synchronized: do it
  // before the tensor is shared between threads.
  AutogradMetaInterface* autograd_meta() const;
  // autograd_meta(), shared.
  std::shared_ptr<AutogradMetaInterface> shared_autograd_meta() const;
  // Sets autograd_meta() (see there).
  void set_autograd_meta(std::shared_ptr<AutogradMetaInterface> meta) const;
  // The storage's version counter (see Storage::version).
  uint64_t version() const;

  // --- Copies and conversions -------------------------------------------
  Tensor clone() const;          // Contiguous copy.
  Tensor contiguous() const;     // *this when already contiguous, else clone().
  Tensor to(DType dtype) const;  // *this when already `dtype`.
  // Copies `src` (same shape, any dtype) into this tensor's elements.
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);  // Sets every element to `value`.
  Tensor& zero_() { return fill_(0); }  // fill_(0).

  // --- Views --------------------------------------------------------------
  // Same elements with a new shape; one size may be -1 (inferred). Requires
  // a contiguous tensor.
  Tensor view(std::vector<int64_t> sizes) const;
  // view() when contiguous, otherwise a contiguous copy with the new shape.
  Tensor reshape(std::vector<int64_t> sizes) const;
  // Elements [start, end) of dimension `dim` with `step` (> 0). Negative
  // start/end count from the end; both are clamped to [0, size].
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  // slice(0, start, end).
  Tensor operator()(int64_t start, int64_t end) const {
    return slice(0, start, end);
  }
  // Index `index` of dimension `dim`, dropping that dimension.
  Tensor select(int64_t dim, int64_t index) const;
  // select(0, index).
  Tensor operator[](int64_t index) const { return select(0, index); }
  // A view with d0 and d1 swapped.
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // transpose(0, 1) of a 2-D tensor.
  // Dimensions reordered: result dim i is input dim dims[i].
  Tensor permute(const std::vector<int64_t>& dims) const;
  // Inserts a size-1 dimension at `d` (0 <= d <= dim(); negative counts from
  // the end, -1 meaning append).
  Tensor unsqueeze(int64_t d) const;
  // Removes dimension `d`, which must have size 1.
  Tensor squeeze(int64_t d) const;

  // --- Arithmetic (same shape and dtype, or a scalar) ----------------------
  // Integer division truncates toward zero; dividing an integer by zero
  // aborts. On bool, add is "or", mul is "and".
  Tensor add(const Tensor& other) const;
  Tensor sub(const Tensor& other) const;  // *this - other.
  Tensor mul(const Tensor& other) const;  // *this * other.
  Tensor div(const Tensor& other) const;  // *this / other.
  Tensor add(double other) const;  // *this + other.
  Tensor sub(double other) const;  // *this - other.
  Tensor mul(double other) const;  // *this * other.
  Tensor div(double other) const;  // *this / other.
  Tensor& add_(const Tensor& other);  // In place: *this += other.
  Tensor& sub_(const Tensor& other);  // In place: *this -= other.
  Tensor& mul_(const Tensor& other);  // In place: *this *= other.
  Tensor& div_(const Tensor& other);  // In place: *this /= other.
  Tensor& add_(double other);  // In place: *this += other.
  Tensor& sub_(double other);  // In place: *this -= other.
  Tensor& mul_(double other);  // In place: *this *= other.
  Tensor& div_(double other);  // In place: *this /= other.
  Tensor neg() const { return mul(-1.0); }  // -*this.

  // Sum of all elements as a 0-d tensor: same dtype for floating types,
  // int64 for integral and bool.
  Tensor sum() const;
  // Sum over dimension `dim` (dtype as for sum()).
  Tensor sum(int64_t dim, bool keepdim = false) const;
  // Mean of all elements (floating dtypes only), 0-d, same dtype.
  Tensor mean() const;
  // Matrix product of 2-D float32 or float64 tensors (BLAS gemm).
  Tensor matmul(const Tensor& other) const;

  // Same dtype, shape and element values (NaN is unequal to itself).
  bool equal(const Tensor& other) const;
  // Same shape and |a - b| <= atol + rtol * |b| elementwise, any dtypes.
  bool allclose(const Tensor& other, double rtol = 1e-5,
                double atol = 1e-8) const;

  // "Tensor(shape=[2, 3], dtype=float32, device=cpu)\n[[...], ...]" with at
  // most `max_per_dim` leading/trailing entries shown per dimension.
  std::string ToString(int64_t max_per_dim = 3) const;

 private:
  struct Impl {
    Storage storage;
    DType dtype;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
    int64_t offset;
    int64_t numel;
    mutable std::shared_ptr<AutogradMetaInterface> autograd_meta;
  };
  static Tensor Make(Storage storage, DType dtype, std::vector<int64_t> sizes,
                     std::vector<int64_t> strides, int64_t offset);

  std::shared_ptr<const Impl> impl_;

  friend Tensor empty(const std::vector<int64_t>&, DType, Allocator*);
};

Tensor operator+(const Tensor& a, const Tensor& b);  // a.add(b).
Tensor operator-(const Tensor& a, const Tensor& b);  // a.sub(b).
Tensor operator*(const Tensor& a, const Tensor& b);  // a.mul(b).
Tensor operator/(const Tensor& a, const Tensor& b);  // a.div(b).
Tensor operator+(const Tensor& a, double b);  // a.add(b).
Tensor operator-(const Tensor& a, double b);  // a.sub(b).
Tensor operator*(const Tensor& a, double b);  // a.mul(b).
Tensor operator/(const Tensor& a, double b);  // a.div(b).
// Writes t.ToString().
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// --- Factories (abort on a negative dimension or failed allocation) --------
// `allocator` null means CPU; element-writing factories need a CPU allocator.
Tensor empty(const std::vector<int64_t>& sizes, DType dtype = DType::kFloat32,
             Allocator* allocator = nullptr);
// Filled with 0.
Tensor zeros(const std::vector<int64_t>& sizes, DType dtype = DType::kFloat32);
// Filled with 1.
Tensor ones(const std::vector<int64_t>& sizes, DType dtype = DType::kFloat32);
// Filled with `value`.
Tensor full(const std::vector<int64_t>& sizes, double value,
            DType dtype = DType::kFloat32);
// Same shape and dtype as `t` (contiguous, on CPU).
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);  // zeros of t's shape and dtype.
Tensor ones_like(const Tensor& t);  // ones of t's shape and dtype.
// full of t's shape and dtype.
Tensor full_like(const Tensor& t, double value);
// 0, 1, ..., end - 1.
Tensor arange(int64_t end, DType dtype = DType::kInt64);
// start, start + step, ... while < end (> end for negative step).
Tensor arange(double start, double end, double step, DType dtype);
// Uniform in [0, 1) / standard normal, deterministic for a given seed on
// every platform (own generator, not `<random>`'s distributions).
Tensor rand(const std::vector<int64_t>& sizes, uint64_t seed,
            DType dtype = DType::kFloat32);
// Standard normal (see rand).
Tensor randn(const std::vector<int64_t>& sizes, uint64_t seed,
             DType dtype = DType::kFloat32);
// A tensor holding `values` (shape defaults to {values.size()}).
template <typename T>
Tensor from_vector(const std::vector<T>& values,
                   std::vector<int64_t> sizes = {});

// --- Template definitions -------------------------------------------------

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(DTypeOf<T>::value).contiguous();
  const T* p = c.template data<T>();
  return std::vector<T>(p, p + c.numel());
}

template <typename T>
T Tensor::item() const {
  CheckDefined("item");
  CheckCpu("item");
  if (numel() != 1) {
    TensorFail("item: tensor has " + std::to_string(numel()) +
               " elements, not 1");
  }
  return DispatchDType(dtype(), [&]<typename S>() -> T {
    return ConvertElement<T>(*static_cast<const S*>(data_ptr()));
  });
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, std::vector<int64_t> sizes) {
  if (sizes.empty() && values.size() != 1)
    sizes = {static_cast<int64_t>(values.size())};
  Tensor t = empty(sizes, DTypeOf<T>::value);
  if (t.numel() != static_cast<int64_t>(values.size())) {
    TensorFail("from_vector: " + std::to_string(values.size()) +
               " values do not fill the shape");
  }
  T* p = t.template data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

}  // namespace ferry

#endif  // FERRY_TENSOR_TENSOR_H_
