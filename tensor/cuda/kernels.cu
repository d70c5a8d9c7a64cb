// Ferry's CUDA kernels (see kernels.h for the contract and kernel_math.h for
// the per-element math they share with the host tests). Compiled by nvcc
// through tools/cuda.bzl; docs/design/cuda_kernels.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ferry/tensor/cuda/kernel_math.h"
#include "ferry/tensor/cuda/kernels.h"

namespace ferry {
namespace cuda {
namespace kernels {
namespace {

constexpr int kThreads = 256;

// Blocks for n elements with a grid-stride loop (capped: the loop covers
// the rest).
int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

cudaStream_t S(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

int Last() { return static_cast<int>(cudaGetLastError()); }

#define FERRY_GRID_LOOP(i, n)                                           \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) +      \
                   threadIdx.x;                                         \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

template <typename T>
__global__ void UnaryKernel(math::UnaryOp op, const T* x,
                            math::StridedIndexer ix, T* out, int64_t n) {
  FERRY_GRID_LOOP(i, n) {
    out[i] = math::Store<T>(math::Unary(op, math::Load(x[ix.Offset(i)])));
  }
}

template <typename T>
__global__ void BinaryKernel(math::BinaryOp op, const T* a,
                             math::StridedIndexer ia, const T* b,
                             math::StridedIndexer ib, T* out, int64_t n) {
  FERRY_GRID_LOOP(i, n) {
    out[i] = math::Store<T>(math::Binary(op, math::Load(a[ia.Offset(i)]),
                                         math::Load(b[ib.Offset(i)])));
  }
}

template <typename T>
__global__ void ScalarKernel(math::BinaryOp op, const T* x, math::Acc<T> s,
                             T* out, int64_t n) {
  FERRY_GRID_LOOP(i, n) {
    out[i] = math::Store<T>(math::Binary(op, math::Load(x[i]), s));
  }
}

template <typename T>
__global__ void BackwardKernel(math::BackwardOp op, const T* g, const T* saved,
                               T* out, int64_t n) {
  FERRY_GRID_LOOP(i, n) {
    out[i] = math::Store<T>(
        math::Backward(op, math::Load(g[i]), math::Load(saved[i])));
  }
}

template <typename T>
__global__ void FillKernel(T* out, T v, int64_t n) {
  FERRY_GRID_LOOP(i, n) out[i] = v;
}

// Sum of `v` over the block (every thread gets it); kThreads threads.
template <typename T>
__device__ T BlockSum(T v) {
  __shared__ T buf[kThreads];
  __syncthreads();  // A previous call's readers are done with buf.
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
    __syncthreads();
  }
  return buf[0];
}

// SoftmaxAcc merged over the block (every thread gets it).
template <typename T>
__device__ math::SoftmaxAcc<T> BlockSoftmaxAcc(math::SoftmaxAcc<T> acc) {
  __shared__ T mx[kThreads];
  __shared__ T sm[kThreads];
  __syncthreads();
  mx[threadIdx.x] = acc.max;
  sm[threadIdx.x] = acc.sum;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      math::SoftmaxAcc<T> a{mx[threadIdx.x], sm[threadIdx.x]};
      a.Merge(math::SoftmaxAcc<T>{mx[threadIdx.x + w], sm[threadIdx.x + w]});
      mx[threadIdx.x] = a.max;
      sm[threadIdx.x] = a.sum;
    }
    __syncthreads();
  }
  return math::SoftmaxAcc<T>{mx[0], sm[0]};
}

// Partial sums (in Acc): block b writes part[b] (fixed order:
// deterministic).
template <typename T>
__global__ void PartialSumKernel(const T* x, int64_t n, math::Acc<T>* part) {
  using A = math::Acc<T>;
  A acc = A(0);
  FERRY_GRID_LOOP(i, n) acc += math::Load(x[i]);
  const A s = BlockSum(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// *out = scale * the sum of n Acc partials, rounded to T.
template <typename T>
__global__ void FinalSumKernel(const math::Acc<T>* part, int64_t n,
                               math::Acc<T> scale, T* out) {
  using A = math::Acc<T>;
  A acc = A(0);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += part[i];
  const A s = BlockSum(acc);
  if (threadIdx.x == 0) *out = math::Store<T>(s * scale);
}

template <typename T>
__global__ void SumDimKernel(const T* x, int64_t outer, int64_t n,
                             int64_t inner, math::Acc<T> scale, T* out) {
  using A = math::Acc<T>;
  FERRY_GRID_LOOP(j, outer * inner) {
    const int64_t o = j / inner, i = j % inner;
    const T* p = x + o * n * inner + i;
    A acc = A(0);
    for (int64_t k = 0; k < n; ++k) acc += math::Load(p[k * inner]);
    out[j] = math::Store<T>(acc * scale);
  }
}

// One block per row.
template <typename T>
__global__ void SoftmaxKernel(const T* x, int64_t cols, bool log, T* out) {
  using A = math::Acc<T>;
  const T* row = x + blockIdx.x * cols;
  T* orow = out + blockIdx.x * cols;
  math::SoftmaxAcc<A> acc = math::EmptySoftmaxAcc<A>();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    acc.Add(math::Load(row[j]));
  }
  acc = BlockSoftmaxAcc(acc);
  const A lse = acc.LogSumExp();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const A shifted = math::Load(row[j]) - lse;
    orow[j] = math::Store<T>(log ? shifted : exp(shifted));
  }
}

template <typename T>
__global__ void SoftmaxBackwardKernel(const T* g, const T* y, int64_t cols,
                                      bool log, T* out) {
  using A = math::Acc<T>;
  const int64_t base = blockIdx.x * cols;
  A acc = A(0);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const A gv = math::Load(g[base + j]);
    acc += log ? gv : gv * math::Load(y[base + j]);
  }
  const A r = BlockSum(acc);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const int64_t k = base + j;
    const A gv = math::Load(g[k]), yv = math::Load(y[k]);
    out[k] = math::Store<T>(log ? math::LogSoftmaxBackward(gv, yv, r)
                                : math::SoftmaxBackward(gv, yv, r));
  }
}

template <typename T>
__global__ void CrossEntropyRowKernel(const T* x, const int64_t* target,
                                      int64_t cols, T* lse,
                                      math::Acc<T>* row_loss, int32_t* bad) {
  using A = math::Acc<T>;
  const T* row = x + blockIdx.x * cols;
  math::SoftmaxAcc<A> acc = math::EmptySoftmaxAcc<A>();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    acc.Add(math::Load(row[j]));
  }
  acc = BlockSoftmaxAcc(acc);
  if (threadIdx.x == 0) {
    const A l = acc.LogSumExp();
    lse[blockIdx.x] = math::Store<T>(l);
    const int64_t t = target[blockIdx.x];
    if (t < 0 || t >= cols) {
      atomicExch(bad, 1);
      row_loss[blockIdx.x] = NAN;
    } else {
      row_loss[blockIdx.x] = l - math::Load(row[t]);
    }
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(const T* x, const int64_t* target,
                                           const T* lse, const T* g,
                                           int64_t rows, int64_t cols,
                                           T* out) {
  FERRY_GRID_LOOP(k, rows * cols) {
    const int64_t r = k / cols, c = k % cols;
    out[k] = math::Store<T>(math::CrossEntropyBackward(
        math::Load(x[k]), math::Load(lse[r]), target[r] == c,
        math::Load(*g), rows));
  }
}

template <typename T>
__global__ void EmbeddingKernel(const T* w, const int64_t* idx, int64_t n,
                                int64_t vocab, int64_t width, T* out,
                                int32_t* bad) {
  FERRY_GRID_LOOP(k, n * width) {
    const int64_t i = k / width, c = k % width, r = idx[i];
    if (r < 0 || r >= vocab) {
      atomicExch(bad, 1);
      out[k] = NAN;
    } else {
      out[k] = w[r * width + c];
    }
  }
}

template <typename T>
__global__ void EmbeddingBackwardKernel(const T* g, const int64_t* idx,
                                        int64_t n, int64_t vocab,
                                        int64_t width, T* gw) {
  FERRY_GRID_LOOP(k, n * width) {
    const int64_t i = k / width, c = k % width, r = idx[i];
    if (r >= 0 && r < vocab) atomicAdd(gw + r * width + c, g[k]);
  }
}

template <typename T>
__global__ void StridedCopyKernel(const T* src, math::StridedIndexer is,
                                  T* dst, math::StridedIndexer id, int64_t n) {
  FERRY_GRID_LOOP(i, n) dst[id.Offset(i)] = src[is.Offset(i)];
}

__device__ double LoadAs(const void* p, CastType t, int64_t i) {
  switch (t) {
    case CastType::kFloat32: return static_cast<const float*>(p)[i];
    case CastType::kFloat64: return static_cast<const double*>(p)[i];
    case CastType::kFloat16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

__device__ void StoreAs(void* p, CastType t, int64_t i, double v) {
  switch (t) {
    case CastType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case CastType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case CastType::kFloat16:
      static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v));
      break;
    default:
      static_cast<__nv_bfloat16*>(p)[i] =
          __float2bfloat16_rn(static_cast<float>(v));
  }
}

__global__ void CastKernel(const void* x, CastType from, void* out,
                           CastType to, int64_t n) {
  FERRY_GRID_LOOP(i, n) StoreAs(out, to, i, LoadAs(x, from, i));
}

template <typename T>
__global__ void WhereKernel(const bool* c, math::StridedIndexer ic,
                            const T* a, math::StridedIndexer ia, const T* b,
                            math::StridedIndexer ib, T* out, int64_t n) {
  FERRY_GRID_LOOP(i, n) {
    out[i] = c[ic.Offset(i)] ? a[ia.Offset(i)] : b[ib.Offset(i)];
  }
}

template <typename T>
__global__ void NllRowKernel(const T* x, math::StridedIndexer ix,
                             const int64_t* target, int64_t rows,
                             int64_t cols, T* row_loss, int32_t* bad) {
  FERRY_GRID_LOOP(r, rows) {
    const int64_t t = target[r];
    if (t < 0 || t >= cols) {
      atomicExch(bad, 1);
      row_loss[r] = NAN;
    } else {
      row_loss[r] = -x[ix.Offset(r * cols + t)];
    }
  }
}

template <typename T>
__global__ void NllBackwardKernel(const int64_t* target, const T* g,
                                  int64_t rows, int64_t cols, T* out) {
  FERRY_GRID_LOOP(k, rows * cols) {
    const int64_t r = k / cols, c = k % cols;
    out[k] = math::NllLossBackward(target[r] == c, *g, rows);
  }
}

template <typename T>
__global__ void DropoutMaskKernel(uint64_t seed, uint64_t offset, double p,
                                  T* out, int64_t n) {
  FERRY_GRID_LOOP(i, n) {
    out[i] = math::DropoutScale<T>(seed, offset + static_cast<uint64_t>(i), p);
  }
}

template <typename T>
__global__ void SgdKernel(math::SgdParams o, T* p, const T* g, T* buf,
                          int64_t n) {
  using A = math::Acc<T>;
  FERRY_GRID_LOOP(i, n) {
    A pv = math::Load(p[i]), bv = buf ? math::Load(buf[i]) : A(0);
    math::SgdElement(o, pv, math::Load(g[i]), bv);
    p[i] = math::Store<T>(pv);
    if (buf) buf[i] = math::Store<T>(bv);
  }
}

template <typename T>
__global__ void AdamKernel(math::AdamParams o, T* p, const T* g, T* m, T* v,
                           int64_t n) {
  using A = math::Acc<T>;
  FERRY_GRID_LOOP(i, n) {
    A pv = math::Load(p[i]), mv = math::Load(m[i]), vv = math::Load(v[i]);
    math::AdamElement(o, pv, math::Load(g[i]), mv, vv);
    p[i] = math::Store<T>(pv);
    m[i] = math::Store<T>(mv);
    v[i] = math::Store<T>(vv);
  }
}

template <typename T>
__global__ void AdagradKernel(math::AdagradParams o, T* p, const T* g, T* sum,
                              int64_t n) {
  using A = math::Acc<T>;
  FERRY_GRID_LOOP(i, n) {
    A pv = math::Load(p[i]), sv = math::Load(sum[i]);
    math::AdagradElement(o, pv, math::Load(g[i]), sv);
    p[i] = math::Store<T>(pv);
    sum[i] = math::Store<T>(sv);
  }
}

// Queues kernel<<<blocks, kThreads>>>(args...) on s unless there is no work
// (`work` elements; a grid of 0 blocks is a launch error).
template <typename... Params, typename... Args>
int Launch(void (*kernel)(Params...), int64_t blocks, int64_t work, Stream s,
           Args... args) {
  if (work == 0 || blocks == 0) return 0;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, S(s)>>>(args...);
  return Last();
}

}  // namespace

const char* ErrorString(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

int Cast(const void* x, CastType from, void* out, CastType to, int64_t n,
         Stream s) {
  return Launch(CastKernel, Blocks(n), n, s, x, from, out, to, n);
}

template <typename T>
int Unary(math::UnaryOp op, const T* x, const math::StridedIndexer& ix, T* out,
          int64_t n, Stream s) {
  return Launch(UnaryKernel<T>, Blocks(n), n, s, op, x, ix, out, n);
}

template <typename T>
int Binary(math::BinaryOp op, const T* a, const math::StridedIndexer& ia,
           const T* b, const math::StridedIndexer& ib, T* out, int64_t n,
           Stream s) {
  return Launch(BinaryKernel<T>, Blocks(n), n, s, op, a, ia, b, ib, out, n);
}

template <typename T>
int Scalar(math::BinaryOp op, const T* x, math::Acc<T> scalar, T* out,
           int64_t n, Stream s) {
  return Launch(ScalarKernel<T>, Blocks(n), n, s, op, x, scalar, out, n);
}

template <typename T>
int Backward(math::BackwardOp op, const T* g, const T* saved, T* out,
             int64_t n, Stream s) {
  return Launch(BackwardKernel<T>, Blocks(n), n, s, op, g, saved, out, n);
}

template <typename T>
int Fill(T* out, T value, int64_t n, Stream s) {
  return Launch(FillKernel<T>, Blocks(n), n, s, out, value, n);
}

template <typename T>
int SumAll(const T* x, int64_t n, math::Acc<T> scale, math::Acc<T>* scratch,
           T* out, Stream s) {
  PartialSumKernel<T><<<kSumBlocks, kThreads, 0, S(s)>>>(x, n, scratch);
  FinalSumKernel<T><<<1, kThreads, 0, S(s)>>>(scratch, kSumBlocks, scale,
                                              out);
  return Last();
}

template <typename T>
int SumDim(const T* x, int64_t outer, int64_t n, int64_t inner,
           math::Acc<T> scale, T* out, Stream s) {
  const int64_t total = outer * inner;
  return Launch(SumDimKernel<T>, Blocks(total), total, s, x, outer, n, inner,
                scale, out);
}

template <typename T>
int Softmax(const T* x, int64_t rows, int64_t cols, bool log, T* out,
            Stream s) {
  return Launch(SoftmaxKernel<T>, rows, rows * cols, s, x, cols, log, out);
}

template <typename T>
int SoftmaxBackward(const T* g, const T* y, int64_t rows, int64_t cols,
                    bool log, T* out, Stream s) {
  return Launch(SoftmaxBackwardKernel<T>, rows, rows * cols, s, g, y, cols, log,
                out);
}

// *out = mean of the `rows` per-row losses (Acc) at the head of `scratch`
// (its tail, kSumBlocks elements, holds the partial sums), rounded to T;
// nothing for 0 rows.
namespace {
template <typename T>
int MeanOfRows(math::Acc<T>* scratch, int64_t rows, T* out, Stream s) {
  using A = math::Acc<T>;
  if (rows == 0) return 0;
  PartialSumKernel<A><<<kSumBlocks, kThreads, 0, S(s)>>>(scratch, rows,
                                                         scratch + rows);
  FinalSumKernel<T><<<1, kThreads, 0, S(s)>>>(
      scratch + rows, kSumBlocks, A(1) / static_cast<A>(rows), out);
  return Last();
}
}  // namespace

template <typename T>
int CrossEntropy(const T* x, const int64_t* target, int64_t rows, int64_t cols,
                 T* lse, math::Acc<T>* scratch, T* loss, int32_t* bad,
                 Stream s) {
  if (int e = Launch(CrossEntropyRowKernel<T>, rows, rows, s, x, target, cols,
                     lse, scratch, bad);
      e != 0) {
    return e;
  }
  return MeanOfRows(scratch, rows, loss, s);
}

template <typename T>
int CrossEntropyBackward(const T* x, const int64_t* target, const T* lse,
                         const T* g, int64_t rows, int64_t cols, T* out,
                         Stream s) {
  const int64_t n = rows * cols;
  return Launch(CrossEntropyBackwardKernel<T>, Blocks(n), n, s, x, target, lse,
                g, rows, cols, out);
}

template <typename T>
int Embedding(const T* weight, const int64_t* idx, int64_t n, int64_t vocab,
              int64_t width, T* out, int32_t* bad, Stream s) {
  return Launch(EmbeddingKernel<T>, Blocks(n * width), n * width, s, weight,
                idx, n, vocab, width, out, bad);
}

template <typename T>
int EmbeddingBackward(const T* g, const int64_t* idx, int64_t n, int64_t vocab,
                      int64_t width, T* grad_weight, Stream s) {
  return Launch(EmbeddingBackwardKernel<T>, Blocks(n * width), n * width, s, g,
                idx, n, vocab, width, grad_weight);
}

template <typename T>
int StridedCopy(const T* src, const math::StridedIndexer& is, T* dst,
                const math::StridedIndexer& id, int64_t n, Stream s) {
  return Launch(StridedCopyKernel<T>, Blocks(n), n, s, src, is, dst, id, n);
}

template <typename T>
int Where(const bool* cond, const math::StridedIndexer& ic, const T* a,
          const math::StridedIndexer& ia, const T* b,
          const math::StridedIndexer& ib, T* out, int64_t n, Stream s) {
  return Launch(WhereKernel<T>, Blocks(n), n, s, cond, ic, a, ia, b, ib, out,
                n);
}

template <typename T>
int NllLoss(const T* x, const math::StridedIndexer& ix, const int64_t* target,
            int64_t rows, int64_t cols, T* scratch, T* loss, int32_t* bad,
            Stream s) {
  if (int e = Launch(NllRowKernel<T>, Blocks(rows), rows, s, x, ix, target,
                     rows, cols, scratch, bad);
      e != 0) {
    return e;
  }
  return MeanOfRows(scratch, rows, loss, s);
}

template <typename T>
int NllLossBackward(const int64_t* target, const T* g, int64_t rows,
                    int64_t cols, T* out, Stream s) {
  const int64_t n = rows * cols;
  return Launch(NllBackwardKernel<T>, Blocks(n), n, s, target, g, rows, cols,
                out);
}

template <typename T>
int DropoutMask(uint64_t seed, uint64_t offset, double p, T* out, int64_t n,
                Stream s) {
  return Launch(DropoutMaskKernel<T>, Blocks(n), n, s, seed, offset, p, out,
                n);
}

template <typename T>
int SgdStep(const math::SgdParams& o, T* p, const T* g, T* buf, int64_t n,
            Stream s) {
  return Launch(SgdKernel<T>, Blocks(n), n, s, o, p, g,
                o.momentum != 0 ? buf : nullptr, n);
}

template <typename T>
int AdamStep(const math::AdamParams& o, T* p, const T* g, T* m, T* v,
             int64_t n, Stream s) {
  return Launch(AdamKernel<T>, Blocks(n), n, s, o, p, g, m, v, n);
}

template <typename T>
int AdagradStep(const math::AdagradParams& o, T* p, const T* g, T* sum,
                int64_t n, Stream s) {
  return Launch(AdagradKernel<T>, Blocks(n), n, s, o, p, g, sum, n);
}

// The launchers of every floating element type (F16 and BF16 compute in
// float).
#define FERRY_INSTANTIATE_MATH(T)                                             \
  template int Unary<T>(math::UnaryOp, const T*, const math::StridedIndexer&, \
                        T*, int64_t, Stream);                                 \
  template int Binary<T>(math::BinaryOp, const T*,                            \
                         const math::StridedIndexer&, const T*,               \
                         const math::StridedIndexer&, T*, int64_t, Stream);   \
  template int Scalar<T>(math::BinaryOp, const T*, math::Acc<T>, T*, int64_t, \
                         Stream);                                             \
  template int Backward<T>(math::BackwardOp, const T*, const T*, T*, int64_t, \
                           Stream);                                           \
  template int Fill<T>(T*, T, int64_t, Stream);                               \
  template int SumAll<T>(const T*, int64_t, math::Acc<T>, math::Acc<T>*, T*,  \
                         Stream);                                             \
  template int SumDim<T>(const T*, int64_t, int64_t, int64_t, math::Acc<T>,   \
                         T*, Stream);                                         \
  template int Softmax<T>(const T*, int64_t, int64_t, bool, T*, Stream);      \
  template int SoftmaxBackward<T>(const T*, const T*, int64_t, int64_t, bool, \
                                  T*, Stream);                                \
  template int CrossEntropy<T>(const T*, const int64_t*, int64_t, int64_t,    \
                               T*, math::Acc<T>*, T*, int32_t*, Stream);      \
  template int CrossEntropyBackward<T>(const T*, const int64_t*, const T*,    \
                                       const T*, int64_t, int64_t, T*,        \
                                       Stream);                               \
  template int Where<T>(const bool*, const math::StridedIndexer&, const T*,   \
                        const math::StridedIndexer&, const T*,                \
                        const math::StridedIndexer&, T*, int64_t, Stream);    \
  template int SgdStep<T>(const math::SgdParams&, T*, const T*, T*, int64_t,  \
                          Stream);                                            \
  template int AdamStep<T>(const math::AdamParams&, T*, const T*, T*, T*,     \
                           int64_t, Stream);                                  \
  template int AdagradStep<T>(const math::AdagradParams&, T*, const T*, T*,   \
                              int64_t, Stream);

// The rest, float32 and float64 only.
#define FERRY_INSTANTIATE(T)                                                  \
  FERRY_INSTANTIATE_MATH(T)                                                   \
  template int Embedding<T>(const T*, const int64_t*, int64_t, int64_t,       \
                            int64_t, T*, int32_t*, Stream);                   \
  template int EmbeddingBackward<T>(const T*, const int64_t*, int64_t,        \
                                    int64_t, int64_t, T*, Stream);            \
  template int StridedCopy<T>(const T*, const math::StridedIndexer&, T*,      \
                              const math::StridedIndexer&, int64_t, Stream);  \
  template int NllLoss<T>(const T*, const math::StridedIndexer&,              \
                          const int64_t*, int64_t, int64_t, T*, T*, int32_t*, \
                          Stream);                                            \
  template int NllLossBackward<T>(const int64_t*, const T*, int64_t, int64_t, \
                                  T*, Stream);                                \
  template int DropoutMask<T>(uint64_t, uint64_t, double, T*, int64_t,        \
                              Stream);

FERRY_INSTANTIATE(float)
FERRY_INSTANTIATE(double)
FERRY_INSTANTIATE_MATH(math::F16)
FERRY_INSTANTIATE_MATH(math::BF16)

// StridedCopy moves the bits of any element type, by size.
#define FERRY_INSTANTIATE_COPY(T)                                         \
  template int StridedCopy<T>(const T*, const math::StridedIndexer&, T*,  \
                              const math::StridedIndexer&, int64_t, Stream);
FERRY_INSTANTIATE_COPY(uint8_t)
FERRY_INSTANTIATE_COPY(uint16_t)
FERRY_INSTANTIATE_COPY(uint32_t)
FERRY_INSTANTIATE_COPY(uint64_t)

}  // namespace kernels
}  // namespace cuda
}  // namespace ferry
