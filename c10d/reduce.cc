#include "ferry/c10d/reduce.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "ferry/c10d/backend.h"
#include "ferry/common/status.h"

namespace ferry {
namespace c10d {
namespace {

template <typename T>
T Combine(ReduceOp op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        return a || b;
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return a && b;
      case ReduceOp::kBxor:
        return a != b;
      default:
        return a;
    }
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    // Promote through unsigned so overflow wraps instead of being undefined.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return static_cast<T>(
            static_cast<U>(static_cast<W>(static_cast<U>(a)) +
                           static_cast<W>(static_cast<U>(b))));
      case ReduceOp::kProduct:
        return static_cast<T>(
            static_cast<U>(static_cast<W>(static_cast<U>(a)) *
                           static_cast<W>(static_cast<U>(b))));
      case ReduceOp::kMin:
        return std::min(a, b);
      case ReduceOp::kMax:
        return std::max(a, b);
      case ReduceOp::kBand:
        return static_cast<T>(a & b);
      case ReduceOp::kBor:
        return static_cast<T>(a | b);
      case ReduceOp::kBxor:
        return static_cast<T>(a ^ b);
    }
    return a;
  } else {
    // Floating: NaN propagates through MIN/MAX as in PyTorch.
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return a + b;
      case ReduceOp::kProduct:
        return a * b;
      case ReduceOp::kMin:
        return (a != a || b != b) ? (a != a ? a : b) : std::min(a, b);
      case ReduceOp::kMax:
        return (a != a || b != b) ? (a != a ? a : b) : std::max(a, b);
      default:
        return a;
    }
  }
}

template <typename T, ReduceOp kOp>
void Kernel(void* out, const void* a, const void* b, size_t n) {
  using C = ComputeType<T>;
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<C, T>) {
      o[i] = Combine<T>(kOp, x[i], y[i]);
    } else {
      o[i] = T(Combine<C>(kOp, static_cast<C>(x[i]), static_cast<C>(y[i])));
    }
  }
}

template <typename T>
ReduceFn KernelFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &Kernel<T, ReduceOp::kSum>;
    case ReduceOp::kProduct:
      return &Kernel<T, ReduceOp::kProduct>;
    case ReduceOp::kMin:
      return &Kernel<T, ReduceOp::kMin>;
    case ReduceOp::kMax:
      return &Kernel<T, ReduceOp::kMax>;
    case ReduceOp::kBand:
      return &Kernel<T, ReduceOp::kBand>;
    case ReduceOp::kBor:
      return &Kernel<T, ReduceOp::kBor>;
    case ReduceOp::kBxor:
      return &Kernel<T, ReduceOp::kBxor>;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<ReduceFn> GetReduceFn(DType dtype, ReduceOp op) {
  RETURN_IF_ERROR(CheckReduceOp(OpType::kAllreduce, op, dtype));
  return DispatchDType(dtype, [&]<typename T>() -> ReduceFn {
    if constexpr (std::is_integral_v<T>) {
      return KernelFor<T>(op);
    } else {
      // Bitwise ops were rejected above; the compiler still instantiates
      // them, so route floating types through a table without them.
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          return &Kernel<T, ReduceOp::kSum>;
        case ReduceOp::kProduct:
          return &Kernel<T, ReduceOp::kProduct>;
        case ReduceOp::kMin:
          return &Kernel<T, ReduceOp::kMin>;
        case ReduceOp::kMax:
          return &Kernel<T, ReduceOp::kMax>;
        default:
          return nullptr;
      }
    }
  });
}

absl::Status ReduceInto(Tensor& acc, const Tensor& other, ReduceOp op) {
  if (acc.dtype() != other.dtype() || acc.numel() != other.numel() ||
      !acc.is_contiguous() || !other.is_contiguous() ||
      !acc.device().is_cpu() || !other.device().is_cpu()) {
    return absl::InvalidArgumentError(
        "ReduceInto: tensors must be contiguous CPU tensors of the same dtype "
        "and element count");
  }
  ASSIGN_OR_RETURN(ReduceFn fn, GetReduceFn(acc.dtype(), op));
  fn(acc.data_ptr(), acc.data_ptr(), other.data_ptr(),
     static_cast<size_t>(acc.numel()));
  return absl::OkStatus();
}

void FinishAverage(Tensor& t, int size) {
  if (t.numel() > 0) t.div_(static_cast<double>(size));
}

}  // namespace c10d
}  // namespace ferry
