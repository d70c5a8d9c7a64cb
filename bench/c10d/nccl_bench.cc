// The nccl backend's cost per call on one GPU (bench/c10d/run_nccl.sh runs it
// beside PyTorch's ProcessGroupNCCL, torch_nccl_bench.py).
//
//   nccl_bench [--sizes=4096,...,67108864] [--budget_s=0.5]
//
// One rank, one GPU: an in-place all-reduce of one rank moves no data, and
// NCCL launches nothing for it, so these rows measure what a call costs
// above NCCL itself, against the floor of the same NCCL call made directly
// (ncclAllReduce on a stream, then cudaStreamSynchronize). Rows, float32
// SUM, in place:
//   allreduce      ferry: Allreduce(t)->Wait() per call (Wait returns once
//                  the result is in device memory);
//                  raw-nccl: ncclAllReduce + cudaStreamSynchronize per call.
//   allreduce x16  16 calls issued, then the last waited on (per call):
//                  what a training step that overlaps calls sees.
//   h2d / d2h      ferry: CopyToCuda (cudaMalloc + cudaMemcpy from pageable
//                  memory) / CopyToCpu (allocate + cudaMemcpy);
//                  raw: cudaMemcpy between preallocated buffers.
// One JSON line per figure: {"impl","op","bytes","us","gbps"}.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ferry/bench/util/procs.h"
#include "ferry/c10d/nccl/cuda_util.h"
#include "ferry/c10d/nccl/nccl_backend.h"
#include "ferry/store/hash_store.h"

namespace ferry {
namespace c10d {
namespace {

using bench::Die;
using bench::OrDie;

// Checks for the timed loops: no message is built unless the call failed.
void CudaOrDie(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
void NcclOrDie(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) Die(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}
void OkOrDie(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

struct Figure {
  std::string impl, op;
  int64_t bytes;
  double us;
};

// Seconds per call of fn(n) doing n calls: warm up, then enough calls for
// about `budget` seconds (3..2000), best of three batches.
double TimePerCall(const std::function<void(int)>& fn, double budget) {
  fn(3);
  absl::Time t0 = absl::Now();
  fn(1);
  double one = std::max(1e-6, absl::ToDoubleSeconds(absl::Now() - t0));
  int n = static_cast<int>(std::clamp(budget / 3 / one, 3.0, 2000.0));
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    t0 = absl::Now();
    fn(n);
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0) / n);
  }
  return best;
}

std::vector<Figure> Run(const std::vector<int64_t>& sizes, double budget) {
  std::vector<Figure> out;
  std::unique_ptr<NcclBackend> backend =
      OrDie(NcclBackend::Create(std::make_shared<HashStore>(), 0, 1,
                                absl::Seconds(60)),
            "NcclBackend::Create");
  Backend& ferry = *backend;
  ncclComm_t comm;
  int dev = 0;
  CudaOrDie(cudaSetDevice(0), "cudaSetDevice");
  NcclOrDie(ncclCommInitAll(&comm, 1, &dev), "ncclCommInitAll");
  cudaStream_t stream;
  CudaOrDie(cudaStreamCreate(&stream), "cudaStreamCreate");
  constexpr int kBatch = 16;
  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    Tensor host = ones({n});
    Tensor t = OrDie(CopyToCuda(host, 0), "CopyToCuda");
    auto ferry_calls = [&](int calls) {
      for (int i = 0; i < calls; ++i) {
        OkOrDie(ferry.Allreduce(t)->Wait(absl::Seconds(60)), "Allreduce");
      }
    };
    auto raw_calls = [&](int calls) {
      for (int i = 0; i < calls; ++i) {
        NcclOrDie(ncclAllReduce(t.data_ptr(), t.data_ptr(), n, ncclFloat32,
                                ncclSum, comm, stream),
                  "ncclAllReduce");
        CudaOrDie(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      }
    };
    auto ferry_batch = [&](int calls) {
      for (int i = 0; i < calls; ++i) {
        std::shared_ptr<Work> last;
        for (int k = 0; k < kBatch; ++k) last = ferry.Allreduce(t);
        OkOrDie(last->Wait(absl::Seconds(60)), "Allreduce");
      }
    };
    auto raw_batch = [&](int calls) {
      for (int i = 0; i < calls; ++i) {
        for (int k = 0; k < kBatch; ++k) {
          NcclOrDie(ncclAllReduce(t.data_ptr(), t.data_ptr(), n, ncclFloat32,
                                  ncclSum, comm, stream),
                    "ncclAllReduce");
        }
        CudaOrDie(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      }
    };
    void* dbuf = nullptr;
    CudaOrDie(cudaMalloc(&dbuf, bytes), "cudaMalloc");
    auto ferry_h2d = [&](int calls) {
      for (int i = 0; i < calls; ++i) {
        OkOrDie(CopyToCuda(host, 0).status(), "CopyToCuda");
      }
    };
    auto raw_h2d = [&](int calls) {
      for (int i = 0; i < calls; ++i) {
        CudaOrDie(
            cudaMemcpy(dbuf, host.data_ptr(), bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy");
      }
    };
    auto ferry_d2h = [&](int calls) {
      for (int i = 0; i < calls; ++i) {
        OkOrDie(CopyToCpu(t).status(), "CopyToCpu");
      }
    };
    auto raw_d2h = [&](int calls) {
      for (int i = 0; i < calls; ++i) {
        CudaOrDie(
            cudaMemcpy(host.data_ptr(), dbuf, bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy");
      }
    };
    struct Row {
      const char* impl;
      const char* op;
      std::function<void(int)> fn;
      int per;
    };
    std::vector<Row> rows = {
        {"ferry-nccl", "allreduce", ferry_calls, 1},
        {"raw-nccl", "allreduce", raw_calls, 1},
        {"ferry-nccl", "allreduce_x16", ferry_batch, kBatch},
        {"raw-nccl", "allreduce_x16", raw_batch, kBatch},
        {"ferry-nccl", "h2d", ferry_h2d, 1},
        {"raw-cuda", "h2d", raw_h2d, 1},
        {"ferry-nccl", "d2h", ferry_d2h, 1},
        {"raw-cuda", "d2h", raw_d2h, 1},
    };
    for (Row& r : rows) {
      double s = TimePerCall(r.fn, budget) / r.per;
      out.push_back({r.impl, r.op, bytes, s * 1e6});
    }
    cudaFree(dbuf);
  }
  ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
  return out;
}

int Main(int argc, char** argv) {
  std::string sizes_flag = "4096,65536,1048576,4194304,16777216,67108864";
  double budget = 0.5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--sizes=", 0) == 0) {
      sizes_flag = a.substr(8);
    } else if (a.rfind("--budget_s=", 0) == 0) {
      if (!absl::SimpleAtod(a.substr(11), &budget)) Die("bad " + a);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "nccl_bench: no CUDA device\n");
    return 3;
  }
  std::vector<int64_t> sizes;
  for (absl::string_view s : absl::StrSplit(sizes_flag, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(s, &v) || v < 4 || v % 4 != 0) {  // float32
      Die(absl::StrCat("--sizes: ", s, " is not a positive multiple of 4"));
    }
    sizes.push_back(v);
  }
  std::vector<Figure> figs = Run(sizes, budget);
  std::printf("%-12s %-14s %10s %12s %10s\n", "impl", "op", "bytes", "us/call",
              "GB/s");
  for (const Figure& f : figs) {
    std::printf("%-12s %-14s %10lld %12.2f %10.2f\n", f.impl.c_str(),
                f.op.c_str(), static_cast<long long>(f.bytes), f.us,
                f.bytes / f.us / 1e3);
  }
  for (const Figure& f : figs) {
    std::printf(
        "{\"impl\": \"%s\", \"op\": \"%s\", \"bytes\": %lld, \"us\": %.3f, "
        "\"gbps\": %.3f}\n",
        f.impl.c_str(), f.op.c_str(), static_cast<long long>(f.bytes), f.us,
        f.bytes / f.us / 1e3);
  }
  return 0;
}

}  // namespace
}  // namespace c10d
}  // namespace ferry

int main(int argc, char** argv) { return ferry::c10d::Main(argc, argv); }
