// Element types of Ferry tensors.
//
// DType names the nine element types a Tensor can hold. Half and BFloat16 are
// 16-bit storage types that convert to and from float (round to nearest even);
// arithmetic on them is done in float by the ops in tensor.h.
//
// Thread safety: everything here is stateless.
#ifndef FERRY_TENSOR_DTYPE_H_
#define FERRY_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace ferry {

// The numeric values are stable: they appear in the wire encoding
// (proto/tensor.proto, field `dtype`), shifted by one.
enum class DType : int8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt64 = 4,
  kInt32 = 5,
  kInt8 = 6,
  kUInt8 = 7,
  kBool = 8,
};

// Every DType, in value order (for tests and loops over them).
inline constexpr DType kAllDTypes[] = {
    DType::kFloat32,  DType::kFloat64, DType::kFloat16,
    DType::kBFloat16, DType::kInt64,   DType::kInt32,
    DType::kInt8,     DType::kUInt8,   DType::kBool,
};

// Bytes per element.
size_t ItemSize(DType dtype);
// "float32", "float64", "float16", "bfloat16", "int64", "int32", "int8",
// "uint8", "bool".
absl::string_view DTypeName(DType dtype);
// Inverse of DTypeName; nullopt for unknown names.
std::optional<DType> DTypeFromName(absl::string_view name);
bool IsFloatingPoint(DType dtype);  // float32, float64, float16 or bfloat16.

// IEEE 754 binary16.
struct Half {
  uint16_t bits = 0;  // The binary16 encoding.
  Half() = default;
  explicit Half(float value);  // `value` rounded to the nearest binary16.
  explicit operator float() const;  // Exact.
  // The Half whose bits are `b`.
  static Half FromBits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

// bfloat16: the upper half of a float32.
struct BFloat16 {
  uint16_t bits = 0;  // The upper 16 bits of a float32.
  BFloat16() = default;
  explicit BFloat16(float value);  // Rounded to nearest even; NaN stays NaN.
  explicit operator float() const;  // Exact.
  // The BFloat16 whose bits are `b`.
  static BFloat16 FromBits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

// DTypeOf<T>::value is the DType of C++ element type T.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> : std::integral_constant<DType, DType::kFloat32> {};
template <>
struct DTypeOf<double> : std::integral_constant<DType, DType::kFloat64> {};
template <>
struct DTypeOf<Half> : std::integral_constant<DType, DType::kFloat16> {};
template <>
struct DTypeOf<BFloat16> : std::integral_constant<DType, DType::kBFloat16> {};
template <>
struct DTypeOf<int64_t> : std::integral_constant<DType, DType::kInt64> {};
template <>
struct DTypeOf<int32_t> : std::integral_constant<DType, DType::kInt32> {};
template <>
struct DTypeOf<int8_t> : std::integral_constant<DType, DType::kInt8> {};
template <>
struct DTypeOf<uint8_t> : std::integral_constant<DType, DType::kUInt8> {};
template <>
struct DTypeOf<bool> : std::integral_constant<DType, DType::kBool> {};

// Calls `f.template operator()<T>()` with T the C++ type of `dtype` and
// returns its result:
//   DispatchDType(t.dtype(), [&]<typename T>() { ... });
template <typename F>
decltype(auto) DispatchDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat64:
      return f.template operator()<double>();
    case DType::kFloat16:
      return f.template operator()<Half>();
    case DType::kBFloat16:
      return f.template operator()<BFloat16>();
    case DType::kInt64:
      return f.template operator()<int64_t>();
    case DType::kInt32:
      return f.template operator()<int32_t>();
    case DType::kInt8:
      return f.template operator()<int8_t>();
    case DType::kUInt8:
      return f.template operator()<uint8_t>();
    case DType::kBool:
      return f.template operator()<bool>();
    case DType::kFloat32:
    default:
      return f.template operator()<float>();
  }
}

// The type arithmetic on T is carried out in: float for the 16-bit floating
// types, T otherwise.
template <typename T>
using ComputeType =
    std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>,
                       float, T>;

// Converts between element types the way Tensor::to does: floating to
// integral truncates toward zero (out-of-range values are clamped), anything
// to bool is "!= 0".
template <typename To, typename From>
To ConvertElement(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<From, Half> ||
                       std::is_same_v<From, BFloat16>) {
    return ConvertElement<To, float>(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, Half> ||
                       std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From(0);
  } else if constexpr (std::is_integral_v<To> &&
                       std::is_floating_point_v<From>) {
    // Converting an out-of-range float to an integer is undefined behaviour.
    if (!(value == value)) return To(0);
    constexpr double kLo = static_cast<double>(std::numeric_limits<To>::min());
    constexpr double kHi = static_cast<double>(std::numeric_limits<To>::max());
    double d = static_cast<double>(value);
    if (d <= kLo) return std::numeric_limits<To>::min();
    if (d >= kHi) return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else {
    return static_cast<To>(value);
  }
}

}  // namespace ferry

#endif  // FERRY_TENSOR_DTYPE_H_
