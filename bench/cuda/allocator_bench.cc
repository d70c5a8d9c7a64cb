// The caching device allocator's cost per alloc/free cycle, beside the
// floors: `cycles` cycles of mixed sizes (512 B to 64 MiB, log-uniform, the
// same seeded sequence as torch_allocator.py), each allocating one block and
// releasing the oldest of the last `window`, with no device synchronization.
//
//   allocator_bench [--cycles=10000] [--window=16] [--reps=5] [--apis=fake,cuda]
//
// Rows: "ferry caching" over each API (fake: host memory, so the row is the
// allocator's bookkeeping; cuda: the real device), the pinned host
// allocator's bookkeeping over the fake API, and the floors: host
// aligned_alloc/free, and on a GPU cudaMalloc/cudaFree and the driver's
// stream-ordered pool (cudaMallocAsync/cudaFreeAsync). The best of `reps`
// runs; ns per cycle. A table, then one JSON line per figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/pinned_allocator.h"
#ifdef FERRY_WITH_CUDA
#include <cuda_runtime_api.h>

#include "ferry/tensor/cuda/cuda_device_api.h"
#endif

namespace {

using ferry::Storage;
using ferry::cuda::CachingDeviceAllocator;

// The size sequence (torch_allocator.py computes the same one).
std::vector<size_t> Sizes(int n) {
  std::vector<size_t> out;
  uint64_t x = 42;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int bits = 9 + static_cast<int>((x >> 33) % 18);
    out.push_back((size_t{1} << bits) + (x >> 20) % (size_t{1} << bits));
  }
  return out;
}

template <typename Alloc, typename Free>
double NsPerCycle(const std::vector<size_t>& sizes, int window, int reps,
                  Alloc alloc, Free release) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    std::deque<decltype(alloc(size_t{1}))> live;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t n : sizes) {
      live.push_back(alloc(n));
      if (static_cast<int>(live.size()) > window) {
        release(live.front());
        live.pop_front();
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    while (!live.empty()) {
      release(live.front());
      live.pop_front();
    }
    best = std::min(
        best, std::chrono::duration<double, std::nano>(t1 - t0).count() /
                  sizes.size());
  }
  return best;
}

struct Row {
  std::string api, impl;
  double ns;
};

// NsPerCycle of `allocate(n)` (a caching allocator's call returning a
// StatusOr<Storage>), exiting on the first error.
template <typename Allocate>
double StorageCycles(const std::vector<size_t>& sizes, int window, int reps,
                     Allocate allocate) {
  return NsPerCycle(
      sizes, window, reps,
      [&](size_t n) {
        absl::StatusOr<Storage> s = allocate(n);
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
          std::exit(1);
        }
        return *std::move(s);
      },
      [](Storage& s) { s = Storage(); });
}

// Exits naming the error unless `made` is OK.
template <typename T>
T Made(absl::StatusOr<T> made) {
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(made);
}

uint64_t HitPermille(const ferry::cuda::AllocatorStats& st) {
  return st.cache_hits * 1000 / std::max<uint64_t>(st.allocations, 1);
}

double Caching(std::shared_ptr<ferry::cuda::DeviceMemoryApi> api,
               const std::vector<size_t>& sizes, int window, int reps,
               uint64_t* hits) {
  auto alloc = Made(CachingDeviceAllocator::Create(api, {}));
  const double ns = StorageCycles(sizes, window, reps, [&](size_t n) {
    return alloc->Allocate(0, n, 0);
  });
  *hits = HitPermille(alloc->Stats(0));
  return ns;
}

// The pinned host allocator on the same sequence (no copies: bookkeeping
// and, on CUDA, cudaHostAlloc for each block the cache lacks).
double Pinned(std::shared_ptr<ferry::cuda::DeviceMemoryApi> api,
              const std::vector<size_t>& sizes, int window, int reps,
              uint64_t* hits) {
  auto alloc = Made(ferry::cuda::CachingHostAllocator::Create(api, {}));
  const double ns = StorageCycles(sizes, window, reps, [&](size_t n) {
    return alloc->Allocate(n);
  });
  *hits = HitPermille(alloc->Stats());
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  int cycles = 10000, window = 16, reps = 5;
  std::vector<std::string> apis = {"fake", "cuda"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--cycles=", 0) == 0) {
      absl::SimpleAtoi(a.substr(9), &cycles);
    } else if (a.rfind("--window=", 0) == 0) {
      absl::SimpleAtoi(a.substr(9), &window);
    } else if (a.rfind("--reps=", 0) == 0) {
      absl::SimpleAtoi(a.substr(7), &reps);
    } else if (a.rfind("--apis=", 0) == 0) {
      apis = absl::StrSplit(a.substr(7), ',');
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const std::vector<size_t> sizes = Sizes(cycles);
  std::vector<Row> rows;
  for (const std::string& api : apis) {
    if (api == "fake") {
      uint64_t permille = 0;
      rows.push_back({"host", "ferry caching (fake api)",
                      Caching(std::make_shared<ferry::cuda::FakeDeviceApi>(
                                  1, uint64_t{64} << 30),
                              sizes, window, reps, &permille)});
      rows.push_back(
          {"host", "aligned_alloc/free floor",
           NsPerCycle(sizes, window, reps,
                      [](size_t n) {
                        return std::aligned_alloc(256, (n + 255) / 256 * 256);
                      },
                      [](void* p) { std::free(p); })});
      std::printf("# fake api: %.1f%% of allocations served from the cache\n",
                  permille / 10.0);
      rows.push_back({"host", "ferry pinned caching (fake api)",
                      Pinned(std::make_shared<ferry::cuda::FakeDeviceApi>(
                                 1, uint64_t{64} << 30),
                             sizes, window, reps, &permille)});
      std::printf("# fake api, pinned: %.1f%% served from the cache\n",
                  permille / 10.0);
    } else if (api == "cuda") {
#ifdef FERRY_WITH_CUDA
      auto cuda = ferry::cuda::CudaDeviceApi::Create();
      if (!cuda.ok()) {
        std::printf("# cuda: %s\n", cuda.status().ToString().c_str());
        continue;
      }
      uint64_t permille = 0;
      rows.push_back({"cuda", "ferry caching",
                      Caching(*cuda, sizes, window, reps, &permille)});
      std::printf("# cuda: %.1f%% of allocations served from the cache\n",
                  permille / 10.0);
      rows.push_back({"cuda", "cudaMalloc/cudaFree floor",
                      NsPerCycle(sizes, window, reps,
                                 [](size_t n) {
                                   void* p = nullptr;
                                   if (cudaMalloc(&p, n) != cudaSuccess) {
                                     std::exit(1);
                                   }
                                   return p;
                                 },
                                 [](void* p) { cudaFree(p); })});
      rows.push_back({"cuda", "cudaMallocAsync/cudaFreeAsync (driver pool)",
                      NsPerCycle(sizes, window, reps,
                                 [](size_t n) {
                                   void* p = nullptr;
                                   if (cudaMallocAsync(&p, n, 0) != cudaSuccess) {
                                     std::exit(1);
                                   }
                                   return p;
                                 },
                                 [](void* p) { cudaFreeAsync(p, 0); })});
      cudaDeviceSynchronize();
#else
      std::printf("# cuda: not built with CUDA\n");
#endif
    } else {
      std::fprintf(stderr, "unknown api %s\n", api.c_str());
      return 2;
    }
  }
  std::printf("%-6s %-44s %12s\n", "api", "impl", "ns/cycle");
  for (const Row& r : rows) {
    std::printf("%-6s %-44s %12.1f\n", r.api.c_str(), r.impl.c_str(), r.ns);
  }
  for (const Row& r : rows) {
    std::printf(
        "{\"bench\":\"cuda_allocator\",\"api\":\"%s\",\"impl\":\"%s\","
        "\"cycles\":%d,\"window\":%d,\"ns_per_cycle\":%.1f}\n",
        r.api.c_str(), r.impl.c_str(), cycles, window, r.ns);
  }
  return 0;
}
