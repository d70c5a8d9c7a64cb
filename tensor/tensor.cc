#include "ferry/tensor/tensor.h"

#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ferry {

void TensorFail(const std::string& msg) {
  std::fprintf(stderr, "ferry tensor error: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// Calls f(off_a, off_b) for every index of `sizes` in row-major order, where
// off_a / off_b are element offsets under strides `sa` / `sb`.
template <typename F>
void ForEachElement2(const std::vector<int64_t>& sizes,
                     const std::vector<int64_t>& sa,
                     const std::vector<int64_t>& sb, F&& f) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  if (n == 0) return;
  const int nd = static_cast<int>(sizes.size());
  if (nd == 0) {
    f(0, 0);
    return;
  }
  // The innermost dimension as a plain loop (the same order as stepping
  // the full index, at a fraction of the per-element cost).
  const int64_t inner = sizes[nd - 1], ia = sa[nd - 1], ib = sb[nd - 1];
  std::vector<int64_t> idx(nd, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < n; i += inner) {
    for (int64_t j = 0; j < inner; ++j) f(oa + j * ia, ob + j * ib);
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < sizes[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (sizes[d] - 1);
      ob -= sb[d] * (sizes[d] - 1);
      idx[d] = 0;
    }
  }
}

int64_t NormalizeDim(int64_t d, int64_t ndim, const char* op) {
  int64_t r = d < 0 ? d + ndim : d;
  if (r < 0 || r >= ndim) {
    TensorFail(absl::StrCat(op, ": dimension ", d, " out of range for a ", ndim,
                            "-d tensor"));
  }
  return r;
}

// Generator for rand/randn: SplitMix64, so results do not depend on the
// standard library's distributions.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

template <typename T>
using ArithType =
    std::conditional_t<std::is_same_v<T, bool>, int, ComputeType<T>>;

}  // namespace

absl::Status CheckShape(const std::vector<int64_t>& sizes, DType dtype,
                        int64_t* nbytes) {
  if (static_cast<int64_t>(sizes.size()) > kMaxTensorDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor has ", sizes.size(),
                     " dimensions, more than the limit of ", kMaxTensorDims));
  }
  int64_t n = 1;
  bool overflow = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor dimension ", i, " is negative (", sizes[i], ")"));
    }
    // Keep checking the remaining dims for negatives even after an overflow.
    if (!overflow && __builtin_mul_overflow(n, sizes[i], &n)) overflow = true;
  }
  int64_t bytes = 0;
  if (overflow || __builtin_mul_overflow(
                      n, static_cast<int64_t>(ItemSize(dtype)), &bytes)) {
    bool zero = false;
    for (int64_t s : sizes) zero |= (s == 0);
    if (!zero) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor shape ", ShapeStr(sizes), " of ", DTypeName(dtype),
          " overflows: numel * itemsize exceeds 2^63"));
    }
    bytes = 0;
  }
  if (nbytes != nullptr) *nbytes = bytes;
  return absl::OkStatus();
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

Tensor Tensor::Make(Storage storage, DType dtype, std::vector<int64_t> sizes,
                    std::vector<int64_t> strides, int64_t offset) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  Tensor t;
  t.impl_ = std::make_shared<const Impl>(
      Impl{std::move(storage), dtype, std::move(sizes), std::move(strides),
           offset, n, nullptr});
  return t;
}

absl::StatusOr<Tensor> Tensor::FromStorage(Storage storage, DType dtype,
                                           std::vector<int64_t> sizes,
                                           std::vector<int64_t> strides,
                                           int64_t storage_offset) {
  int64_t nbytes = 0;
  absl::Status st = CheckShape(sizes, dtype, &nbytes);
  if (!st.ok()) return st;
  if (strides.size() != sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromStorage: ", strides.size(), " strides for ",
                     sizes.size(), " dims"));
  }
  if (storage_offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromStorage: negative storage offset ", storage_offset));
  }
  // Highest element index touched, checked against the storage size.
  int64_t last = storage_offset;
  bool empty_tensor = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (strides[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FromStorage: negative stride ", strides[i], " in dimension ", i));
    }
    if (sizes[i] == 0) empty_tensor = true;
    int64_t span;
    if (sizes[i] > 0 &&
        (__builtin_mul_overflow(sizes[i] - 1, strides[i], &span) ||
         __builtin_add_overflow(last, span, &last))) {
      return absl::InvalidArgumentError("FromStorage: strides overflow");
    }
  }
  if (!empty_tensor) {
    int64_t end_bytes;
    if (__builtin_mul_overflow(last + 1, static_cast<int64_t>(ItemSize(dtype)),
                               &end_bytes) ||
        static_cast<uint64_t>(end_bytes) > storage.nbytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FromStorage: shape ", ShapeStr(sizes), " with strides ",
          ShapeStr(strides), " and offset ", storage_offset,
          " reaches past the storage's ", storage.nbytes(), " bytes"));
    }
  }
  return Make(std::move(storage), dtype, std::move(sizes), std::move(strides),
              storage_offset);
}

absl::StatusOr<Tensor> Tensor::TryEmpty(const std::vector<int64_t>& sizes,
                                        DType dtype, Allocator* allocator) {
  int64_t nbytes = 0;
  absl::Status st = CheckShape(sizes, dtype, &nbytes);
  if (!st.ok()) return st;
  if (allocator == nullptr) allocator = GetCpuAllocator();
  absl::StatusOr<Storage> storage =
      allocator->Allocate(static_cast<size_t>(nbytes));
  if (!storage.ok()) return storage.status();
  return Make(*std::move(storage), dtype, sizes, ContiguousStrides(sizes), 0);
}

Tensor empty(const std::vector<int64_t>& sizes, DType dtype,
             Allocator* allocator) {
  absl::StatusOr<Tensor> t = Tensor::TryEmpty(sizes, dtype, allocator);
  if (!t.ok()) TensorFail(absl::StrCat("empty: ", t.status().message()));
  return *std::move(t);
}

void Tensor::CheckDefined(const char* op) const {
  if (!impl_) TensorFail(absl::StrCat(op, ": tensor is undefined"));
}

void Tensor::CheckCpu(const char* op) const {
  CheckDefined(op);
  if (!device().is_cpu()) {
    TensorFail(absl::StrCat(op, ": only CPU tensors are supported, got ",
                            device().ToString()));
  }
}

void Tensor::CheckDType(DType expected, const char* op) const {
  CheckDefined(op);
  if (dtype() != expected) {
    TensorFail(absl::StrCat(op, ": expected dtype ", DTypeName(expected),
                            ", tensor is ", DTypeName(dtype())));
  }
}

DType Tensor::dtype() const {
  CheckDefined("dtype");
  return impl_->dtype;
}
Device Tensor::device() const {
  CheckDefined("device");
  return impl_->storage.device();
}
const std::vector<int64_t>& Tensor::sizes() const {
  CheckDefined("sizes");
  return impl_->sizes;
}
const std::vector<int64_t>& Tensor::strides() const {
  CheckDefined("strides");
  return impl_->strides;
}
int64_t Tensor::dim() const { return static_cast<int64_t>(sizes().size()); }
int64_t Tensor::size(int64_t d) const {
  return sizes()[NormalizeDim(d, dim(), "size")];
}
int64_t Tensor::numel() const {
  CheckDefined("numel");
  return impl_->numel;
}
size_t Tensor::itemsize() const { return ItemSize(dtype()); }
size_t Tensor::nbytes() const {
  return static_cast<size_t>(numel()) * itemsize();
}
int64_t Tensor::storage_offset() const {
  CheckDefined("storage_offset");
  return impl_->offset;
}
const Storage& Tensor::storage() const {
  CheckDefined("storage");
  return impl_->storage;
}

void* Tensor::data_ptr() const {
  CheckDefined("data_ptr");
  return static_cast<char*>(impl_->storage.data()) +
         impl_->offset * static_cast<int64_t>(ItemSize(impl_->dtype));
}

bool Tensor::is_contiguous() const {
  CheckDefined("is_contiguous");
  if (impl_->numel == 0) return true;
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->sizes[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->sizes[i];
  }
  return true;
}

// --- Copies ------------------------------------------------------------------

AutogradMetaInterface* Tensor::autograd_meta() const {
  return impl_ ? impl_->autograd_meta.get() : nullptr;
}
std::shared_ptr<AutogradMetaInterface> Tensor::shared_autograd_meta() const {
  return impl_ ? impl_->autograd_meta : nullptr;
}
void Tensor::set_autograd_meta(
    std::shared_ptr<AutogradMetaInterface> meta) const {
  CheckDefined("set_autograd_meta");
  impl_->autograd_meta = std::move(meta);
}
uint64_t Tensor::version() const {
  return impl_ ? impl_->storage.version() : 0;
}

Tensor& Tensor::copy_(const Tensor& src_in) {
  CheckCpu("copy_");
  storage().BumpVersion();
  src_in.CheckCpu("copy_");
  if (sizes() != src_in.sizes()) {
    TensorFail(absl::StrCat("copy_: source shape ", ShapeStr(src_in.sizes()),
                            " does not match destination shape ",
                            ShapeStr(sizes())));
  }
  Tensor src = src_in;
  if (src.storage().is_same(storage()) &&
      !(src.storage_offset() == storage_offset() &&
        src.strides() == strides() && src.dtype() == dtype())) {
    src = src.clone();  // Overlapping views: read from a snapshot.
  }
  if (numel() == 0) return *this;
  if (src.dtype() == dtype() && is_contiguous() && src.is_contiguous()) {
    if (data_ptr() != src.data_ptr())
      std::memmove(data_ptr(), src.data_ptr(), nbytes());
    return *this;
  }
  DispatchDType(dtype(), [&]<typename D>() {
    DispatchDType(src.dtype(), [&]<typename S>() {
      D* d = static_cast<D*>(data_ptr());
      const S* s = static_cast<const S*>(src.data_ptr());
      ForEachElement2(
          sizes(), strides(), src.strides(),
          [&](int64_t od, int64_t os) { d[od] = ConvertElement<D>(s[os]); });
    });
  });
  return *this;
}

Tensor& Tensor::fill_(double value) {
  CheckCpu("fill_");
  storage().BumpVersion();
  DispatchDType(dtype(), [&]<typename T>() {
    const T v = ConvertElement<T>(value);
    T* d = static_cast<T*>(data_ptr());
    ForEachElement2(sizes(), strides(), strides(),
                    [&](int64_t o, int64_t) { d[o] = v; });
  });
  return *this;
}

Tensor Tensor::clone() const {
  CheckCpu("clone");
  Tensor out = empty(sizes(), dtype());
  out.copy_(*this);
  return out;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::to(DType d) const {
  CheckDefined("to");
  if (d == dtype()) return *this;
  CheckCpu("to");
  Tensor out = empty(sizes(), d);
  out.copy_(*this);
  return out;
}

// --- Views -------------------------------------------------------------------

Tensor Tensor::view(std::vector<int64_t> new_sizes) const {
  CheckDefined("view");
  int64_t infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < new_sizes.size(); ++i) {
    if (new_sizes[i] == -1) {
      if (infer >= 0) TensorFail("view: only one dimension may be -1");
      infer = static_cast<int64_t>(i);
    } else if (new_sizes[i] < 0) {
      TensorFail(absl::StrCat("view: invalid size ", new_sizes[i]));
    } else {
      known *= new_sizes[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0) {
      TensorFail(absl::StrCat("view: cannot infer -1 in ", ShapeStr(new_sizes),
                              " for ", numel(), " elements"));
    }
    new_sizes[infer] = numel() / known;
    known = numel();
  }
  if (known != numel()) {
    TensorFail(absl::StrCat("view: shape ", ShapeStr(new_sizes),
                            " does not hold ", numel(), " elements of shape ",
                            ShapeStr(sizes())));
  }
  if (!is_contiguous()) {
    TensorFail("view: tensor is not contiguous; use reshape() or contiguous()");
  }
  std::vector<int64_t> st = ContiguousStrides(new_sizes);
  return Make(storage(), dtype(), std::move(new_sizes), std::move(st),
              storage_offset());
}

Tensor Tensor::reshape(std::vector<int64_t> new_sizes) const {
  return contiguous().view(std::move(new_sizes));
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end,
                     int64_t step) const {
  CheckDefined("slice");
  d = NormalizeDim(d, dim(), "slice");
  if (step <= 0)
    TensorFail(absl::StrCat("slice: step must be positive, got ", step));
  const int64_t n = sizes()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, 0, n);
  std::vector<int64_t> sz = sizes(), st = strides();
  sz[d] = end > start ? (end - start + step - 1) / step : 0;
  const int64_t offset = storage_offset() + start * st[d];
  st[d] *= step;
  return Make(storage(), dtype(), std::move(sz), std::move(st), offset);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  CheckDefined("select");
  d = NormalizeDim(d, dim(), "select");
  const int64_t n = sizes()[d];
  const int64_t i = index < 0 ? index + n : index;
  if (i < 0 || i >= n) {
    TensorFail(
        absl::StrCat("select: index ", index, " out of range for size ", n));
  }
  std::vector<int64_t> sz = sizes(), st = strides();
  const int64_t offset = storage_offset() + i * st[d];
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  return Make(storage(), dtype(), std::move(sz), std::move(st), offset);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  CheckDefined("transpose");
  d0 = NormalizeDim(d0, dim(), "transpose");
  d1 = NormalizeDim(d1, dim(), "transpose");
  std::vector<int64_t> sz = sizes(), st = strides();
  std::swap(sz[d0], sz[d1]);
  std::swap(st[d0], st[d1]);
  return Make(storage(), dtype(), std::move(sz), std::move(st),
              storage_offset());
}

Tensor Tensor::t() const {
  if (dim() != 2)
    TensorFail(absl::StrCat("t: expected a 2-d tensor, got ", dim(), "-d"));
  return transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  CheckDefined("permute");
  if (static_cast<int64_t>(dims.size()) != dim()) {
    TensorFail(absl::StrCat("permute: ", dims.size(), " dims given for a ",
                            dim(), "-d tensor"));
  }
  std::vector<int64_t> sz(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = NormalizeDim(dims[i], dim(), "permute");
    if (seen[d])
      TensorFail(absl::StrCat("permute: dimension ", d, " repeated"));
    seen[d] = true;
    sz[i] = sizes()[d];
    st[i] = strides()[d];
  }
  return Make(storage(), dtype(), std::move(sz), std::move(st),
              storage_offset());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  CheckDefined("unsqueeze");
  const int64_t pos = NormalizeDim(d, dim() + 1, "unsqueeze");
  std::vector<int64_t> sz = sizes(), st = strides();
  const int64_t stride = pos < dim() ? st[pos] * sz[pos] : 1;
  sz.insert(sz.begin() + pos, 1);
  st.insert(st.begin() + pos, stride);
  return Make(storage(), dtype(), std::move(sz), std::move(st),
              storage_offset());
}

Tensor Tensor::squeeze(int64_t d) const {
  CheckDefined("squeeze");
  d = NormalizeDim(d, dim(), "squeeze");
  if (sizes()[d] != 1) {
    TensorFail(absl::StrCat("squeeze: dimension ", d, " has size ", sizes()[d],
                            ", not 1"));
  }
  std::vector<int64_t> sz = sizes(), st = strides();
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  return Make(storage(), dtype(), std::move(sz), std::move(st),
              storage_offset());
}

// --- Arithmetic --------------------------------------------------------------

namespace {

struct AddOp {
  template <typename C>
  C operator()(C a, C b) const {
    return a + b;
  }
};
struct SubOp {
  template <typename C>
  C operator()(C a, C b) const {
    return a - b;
  }
};
struct MulOp {
  template <typename C>
  C operator()(C a, C b) const {
    return a * b;
  }
};
struct DivOp {
  template <typename C>
  C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      if (b == 0) TensorFail("div: integer division by zero");
      if (std::is_signed_v<C> && b == C(-1))
        return C(0) - a;  // Avoid MIN / -1.
    }
    return a / b;
  }
};

// out[i] = op(a[i], b[i]) (b == nullptr: op(a[i], scalar)) for contiguous
// CPU tensors of one dtype; `out` may alias `a` or `b` exactly.
template <typename Op>
void RunElementwise(const Tensor& out, const Tensor& a, const Tensor* b,
                    double scalar, Op op) {
  DispatchDType(out.dtype(), [&]<typename T>() {
    using C = ArithType<T>;
    T* po = static_cast<T*>(out.data_ptr());
    const T* pa = static_cast<const T*>(a.data_ptr());
    const int64_t n = out.numel();
    if (b != nullptr) {
      const T* pb = static_cast<const T*>(b->data_ptr());
      for (int64_t i = 0; i < n; ++i) {
        po[i] =
            ConvertElement<T>(op(static_cast<C>(pa[i]), static_cast<C>(pb[i])));
      }
    } else {
      const C s = ConvertElement<C>(scalar);
      for (int64_t i = 0; i < n; ++i) {
        po[i] = ConvertElement<T>(op(static_cast<C>(pa[i]), s));
      }
    }
  });
}

void CheckBinary(const Tensor& a, const Tensor& b, const char* name) {
  if (!a.defined() || !b.defined())
    TensorFail(absl::StrCat(name, ": undefined tensor"));
  a.CheckCpu(name);  // Names the device.
  b.CheckCpu(name);
  if (a.dtype() != b.dtype()) {
    TensorFail(absl::StrCat(name, ": dtype mismatch (", DTypeName(a.dtype()),
                            " vs ", DTypeName(b.dtype()), ")"));
  }
  if (a.sizes() != b.sizes()) {
    TensorFail(absl::StrCat(name, ": shape mismatch (", ShapeStr(a.sizes()),
                            " vs ", ShapeStr(b.sizes()), ")"));
  }
}

template <typename Op>
Tensor BinaryOut(const Tensor& a, const Tensor* b, double scalar,
                 const char* name, Op op) {
  if (b != nullptr) {
    CheckBinary(a, *b, name);
  } else {
    a.CheckCpu(name);
  }
  Tensor ac = a.contiguous();
  Tensor bc = b != nullptr ? b->contiguous() : Tensor();
  Tensor out = empty(a.sizes(), a.dtype());
  RunElementwise(out, ac, b != nullptr ? &bc : nullptr, scalar, op);
  return out;
}

template <typename Op>
void BinaryInPlace(Tensor& self, const Tensor* b, double scalar,
                   const char* name, Op op) {
  if (b != nullptr) {
    CheckBinary(self, *b, name);
  } else {
    self.CheckCpu(name);
  }
  self.storage().BumpVersion();
  if (!self.is_contiguous()) {
    self.copy_(BinaryOut(self, b, scalar, name, op));
    return;
  }
  Tensor bc;
  if (b != nullptr) {
    bc = b->contiguous();
    // A different view of self's bytes would be overwritten while read.
    if (bc.storage().is_same(self.storage()) &&
        bc.data_ptr() != self.data_ptr()) {
      bc = bc.clone();
    }
  }
  RunElementwise(self, self, b != nullptr ? &bc : nullptr, scalar, op);
}

}  // namespace

Tensor Tensor::add(const Tensor& o) const {
  return BinaryOut(*this, &o, 0, "add", AddOp{});
}
Tensor Tensor::sub(const Tensor& o) const {
  return BinaryOut(*this, &o, 0, "sub", SubOp{});
}
Tensor Tensor::mul(const Tensor& o) const {
  return BinaryOut(*this, &o, 0, "mul", MulOp{});
}
Tensor Tensor::div(const Tensor& o) const {
  return BinaryOut(*this, &o, 0, "div", DivOp{});
}
Tensor Tensor::add(double o) const {
  return BinaryOut(*this, nullptr, o, "add", AddOp{});
}
Tensor Tensor::sub(double o) const {
  return BinaryOut(*this, nullptr, o, "sub", SubOp{});
}
Tensor Tensor::mul(double o) const {
  return BinaryOut(*this, nullptr, o, "mul", MulOp{});
}
Tensor Tensor::div(double o) const {
  return BinaryOut(*this, nullptr, o, "div", DivOp{});
}
Tensor& Tensor::add_(const Tensor& o) {
  BinaryInPlace(*this, &o, 0, "add_", AddOp{});
  return *this;
}
Tensor& Tensor::sub_(const Tensor& o) {
  BinaryInPlace(*this, &o, 0, "sub_", SubOp{});
  return *this;
}
Tensor& Tensor::mul_(const Tensor& o) {
  BinaryInPlace(*this, &o, 0, "mul_", MulOp{});
  return *this;
}
Tensor& Tensor::div_(const Tensor& o) {
  BinaryInPlace(*this, &o, 0, "div_", DivOp{});
  return *this;
}
Tensor& Tensor::add_(double o) {
  BinaryInPlace(*this, nullptr, o, "add_", AddOp{});
  return *this;
}
Tensor& Tensor::sub_(double o) {
  BinaryInPlace(*this, nullptr, o, "sub_", SubOp{});
  return *this;
}
Tensor& Tensor::mul_(double o) {
  BinaryInPlace(*this, nullptr, o, "mul_", MulOp{});
  return *this;
}
Tensor& Tensor::div_(double o) {
  BinaryInPlace(*this, nullptr, o, "div_", DivOp{});
  return *this;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return a.add(b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return a.sub(b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return a.mul(b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return a.div(b); }
Tensor operator+(const Tensor& a, double b) { return a.add(b); }
Tensor operator-(const Tensor& a, double b) { return a.sub(b); }
Tensor operator*(const Tensor& a, double b) { return a.mul(b); }
Tensor operator/(const Tensor& a, double b) { return a.div(b); }

// --- Reductions
// ----------------------------------------------------------------

namespace {

bool AccumulatesAsFloat(DType d) { return IsFloatingPoint(d); }
DType SumDType(DType d) { return IsFloatingPoint(d) ? d : DType::kInt64; }

}  // namespace

Tensor Tensor::sum() const {
  CheckCpu("sum");
  Tensor out = empty({}, SumDType(dtype()));
  DispatchDType(dtype(), [&]<typename T>() {
    const T* p = static_cast<const T*>(data_ptr());
    if (AccumulatesAsFloat(dtype())) {
      double acc = 0;
      ForEachElement2(sizes(), strides(), strides(), [&](int64_t o, int64_t) {
        acc += ConvertElement<double>(p[o]);
      });
      out.fill_(acc);
    } else {
      uint64_t acc = 0;  // Unsigned: wraps instead of overflowing.
      ForEachElement2(sizes(), strides(), strides(), [&](int64_t o, int64_t) {
        acc += static_cast<uint64_t>(ConvertElement<int64_t>(p[o]));
      });
      *out.data<int64_t>() = static_cast<int64_t>(acc);
    }
  });
  return out;
}

Tensor Tensor::sum(int64_t d, bool keepdim) const {
  CheckCpu("sum");
  d = NormalizeDim(d, dim(), "sum");
  std::vector<int64_t> keep_sizes = sizes();
  keep_sizes[d] = 1;
  // Accumulate into a double / int64 buffer indexed by the output position.
  std::vector<int64_t> out_strides = ContiguousStrides(keep_sizes);
  out_strides[d] = 0;
  const DType out_dtype = SumDType(dtype());
  Tensor acc = zeros(
      keep_sizes, IsFloatingPoint(dtype()) ? DType::kFloat64 : DType::kInt64);
  DispatchDType(dtype(), [&]<typename T>() {
    const T* p = static_cast<const T*>(data_ptr());
    if (IsFloatingPoint(dtype())) {
      double* a = acc.data<double>();
      ForEachElement2(sizes(), strides(), out_strides,
                      [&](int64_t o, int64_t oa) {
                        a[oa] += ConvertElement<double>(p[o]);
                      });
    } else {
      int64_t* a = acc.data<int64_t>();
      ForEachElement2(
          sizes(), strides(), out_strides, [&](int64_t o, int64_t oa) {
            a[oa] = static_cast<int64_t>(
                static_cast<uint64_t>(a[oa]) +
                static_cast<uint64_t>(ConvertElement<int64_t>(p[o])));
          });
    }
  });
  Tensor out = acc.to(out_dtype);
  if (!keepdim) {
    std::vector<int64_t> s = sizes();
    s.erase(s.begin() + d);
    out = out.view(s);
  }
  return out;
}

Tensor Tensor::mean() const {
  CheckCpu("mean");
  if (!IsFloatingPoint(dtype())) {
    TensorFail(absl::StrCat("mean: expected a floating dtype, got ",
                            DTypeName(dtype())));
  }
  const double total = sum().item<double>();
  return full(
      {}, numel() == 0 ? std::nan("") : total / static_cast<double>(numel()),
      dtype());
}

Tensor Tensor::matmul(const Tensor& other) const {
  CheckCpu("matmul");
  other.CheckCpu("matmul");
  if (dim() != 2 || other.dim() != 2) {
    TensorFail(absl::StrCat("matmul: expected 2-d tensors, got ",
                            ShapeStr(sizes()), " and ",
                            ShapeStr(other.sizes())));
  }
  if (dtype() != other.dtype() ||
      (dtype() != DType::kFloat32 && dtype() != DType::kFloat64)) {
    TensorFail(absl::StrCat(
        "matmul: expected two float32 or two float64 tensors, got ",
        DTypeName(dtype()), " and ", DTypeName(other.dtype())));
  }
  const int64_t m = size(0), k = size(1), n = other.size(1);
  if (other.size(0) != k) {
    TensorFail(absl::StrCat("matmul: inner dimensions differ: ",
                            ShapeStr(sizes()), " x ", ShapeStr(other.sizes())));
  }
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (m > kIntMax || n > kIntMax || k > kIntMax)
    TensorFail("matmul: dimension exceeds INT_MAX");
  Tensor out = zeros({m, n}, dtype());
  if (m == 0 || n == 0 || k == 0) return out;
  Tensor a = contiguous(), b = other.contiguous();
  const int im = static_cast<int>(m), in = static_cast<int>(n),
            ik = static_cast<int>(k);
  if (dtype() == DType::kFloat32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, in, ik, 1.0f,
                a.data<float>(), ik, b.data<float>(), in, 0.0f,
                out.data<float>(), in);
  } else {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, in, ik, 1.0,
                a.data<double>(), ik, b.data<double>(), in, 0.0,
                out.data<double>(), in);
  }
  return out;
}

// --- Comparison and printing -------------------------------------------------

bool Tensor::equal(const Tensor& other) const {
  CheckCpu("equal");
  other.CheckCpu("equal");
  if (dtype() != other.dtype() || sizes() != other.sizes()) return false;
  bool same = true;
  DispatchDType(dtype(), [&]<typename T>() {
    const T* a = static_cast<const T*>(data_ptr());
    const T* b = static_cast<const T*>(other.data_ptr());
    ForEachElement2(sizes(), strides(), other.strides(),
                    [&](int64_t oa, int64_t ob) {
                      if (!(static_cast<ArithType<T>>(a[oa]) ==
                            static_cast<ArithType<T>>(b[ob])))
                        same = false;
                    });
  });
  return same;
}

bool Tensor::allclose(const Tensor& other, double rtol, double atol) const {
  CheckCpu("allclose");
  other.CheckCpu("allclose");
  if (sizes() != other.sizes()) return false;
  Tensor a = to(DType::kFloat64), b = other.to(DType::kFloat64);
  const double* pa = static_cast<const double*>(a.data_ptr());
  const double* pb = static_cast<const double*>(b.data_ptr());
  bool close = true;
  ForEachElement2(sizes(), a.strides(), b.strides(),
                  [&](int64_t oa, int64_t ob) {
                    const double x = pa[oa], y = pb[ob];
                    if (x == y) return;  // Also equal infinities.
                    if (!std::isfinite(x) || !std::isfinite(y) ||
                        std::fabs(x - y) > atol + rtol * std::fabs(y)) {
                      close = false;
                    }
                  });
  return close;
}

namespace {

template <typename T>
std::string FormatElement(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return absl::StrCat(static_cast<int64_t>(v));
  } else {
    return absl::StrFormat("%.6g", static_cast<double>(static_cast<float>(
                                       static_cast<ComputeType<T>>(v))));
  }
}

template <>
std::string FormatElement<double>(double v) {
  return absl::StrFormat("%.6g", v);
}

template <typename T>
void FormatDim(const Tensor& t, const T* base, int64_t d, int64_t offset,
               int64_t max, std::string* out) {
  if (d == t.dim()) {
    absl::StrAppend(out, FormatElement<T>(base[offset]));
    return;
  }
  const int64_t n = t.sizes()[d];
  out->push_back('[');
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * max && i == max) {
      absl::StrAppend(out, "..., ");
      i = n - max - 1;
      continue;
    }
    FormatDim(t, base, d + 1, offset + i * t.strides()[d], max, out);
    if (i + 1 < n) absl::StrAppend(out, ", ");
  }
  out->push_back(']');
}

}  // namespace

std::string Tensor::ToString(int64_t max_per_dim) const {
  if (!defined()) return "Tensor(undefined)";
  std::string out = absl::StrCat("Tensor(shape=", ShapeStr(sizes()),
                                 ", dtype=", DTypeName(dtype()),
                                 ", device=", device().ToString(), ")");
  if (!device().is_cpu()) return out;
  out.push_back('\n');
  DispatchDType(dtype(), [&]<typename T>() {
    FormatDim<T>(*this, static_cast<const T*>(data_ptr()), 0, 0,
                 std::max<int64_t>(max_per_dim, 1), &out);
  });
  return out;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.ToString();
}

// --- Factories
// -----------------------------------------------------------------

Tensor zeros(const std::vector<int64_t>& sizes, DType dtype) {
  Tensor t = empty(sizes, dtype);
  if (t.nbytes() > 0) std::memset(t.data_ptr(), 0, t.nbytes());
  return t;
}

Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.dtype()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.dtype()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.dtype()); }
Tensor full_like(const Tensor& t, double value) {
  return full(t.sizes(), value, t.dtype());
}

Tensor ones(const std::vector<int64_t>& sizes, DType dtype) {
  return full(sizes, 1.0, dtype);
}

Tensor full(const std::vector<int64_t>& sizes, double value, DType dtype) {
  Tensor t = empty(sizes, dtype);
  t.fill_(value);
  return t;
}

Tensor arange(int64_t end, DType dtype) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype);
}

Tensor arange(double start, double end, double step, DType dtype) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(end) ||
      !std::isfinite(step)) {
    TensorFail(absl::StrCat("arange: invalid range start=", start, " end=", end,
                            " step=", step));
  }
  const double count = std::ceil((end - start) / step);
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  Tensor t = empty({n}, dtype);
  DispatchDType(dtype, [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i)
      p[i] = ConvertElement<T>(start + static_cast<double>(i) * step);
  });
  return t;
}

Tensor rand(const std::vector<int64_t>& sizes, uint64_t seed, DType dtype) {
  Tensor t = empty(sizes, dtype);
  SplitMix64 gen(seed);
  DispatchDType(dtype, [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i)
      p[i] = ConvertElement<T>(gen.Uniform());
  });
  return t;
}

Tensor randn(const std::vector<int64_t>& sizes, uint64_t seed, DType dtype) {
  Tensor t = empty(sizes, dtype);
  SplitMix64 gen(seed);
  DispatchDType(dtype, [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      // Box-Muller; 1 - u keeps the logarithm's argument in (0, 1].
      const double u1 = 1.0 - gen.Uniform(), u2 = gen.Uniform();
      const double z =
          std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      p[i] = ConvertElement<T>(z);
    }
  });
  return t;
}

}  // namespace ferry
