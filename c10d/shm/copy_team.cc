#include "ferry/c10d/shm/copy_team.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ferry {
namespace c10d {
namespace {

// How long a helper spins for the next job before sleeping: longer than a
// collective usually spends between its jobs (in a barrier, waiting for the
// slowest rank's copies), since a futex wake-up costs tens of microseconds
// in a VM. The team has only the cores the ranks leave (copy_team.h).
constexpr auto kHelperSpin = std::chrono::microseconds(500);
// Pause-loop iterations the caller spins for the helpers before yielding.
constexpr int kSpins = 4000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Copies into memory this rank does not read again soon; with `streaming`,
// through non-temporal stores (no read-for-ownership of `dst`, no eviction of
// the shared slots from the caches), fenced before returning.
void CopyOut(char* dst, const char* src, size_t n, bool streaming) {
#if defined(__x86_64__)
  if (streaming && n >= 256) {
    const size_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
    std::memcpy(dst, src, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
      const __m128i a =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, n - i);
    _mm_sfence();
    return;
  }
#endif
  (void)streaming;
  if (n > 0) std::memcpy(dst, src, n);
}

// dst = ((src[0] op src[1]) op src[2]) ... over elements [lo, hi) of `isz`
// bytes, a cache-sized block at a time so the partial result stays in L1
// (one pass over each source, one write of dst).
void ReduceBlocked(ReduceFn fn, char* dst, absl::Span<const char* const> src,
                   size_t lo, size_t hi, size_t isz) {
  const size_t block = std::max<size_t>(1, 8192 / isz);
  for (size_t at = lo; at < hi; at += block) {
    const size_t len = std::min(block, hi - at);
    const size_t skip = at * isz;
    if (src.size() == 1) {
      std::memcpy(dst + skip, src[0] + skip, len * isz);
      continue;
    }
    fn(dst + skip, src[0] + skip, src[1] + skip, len);
    for (size_t q = 2; q < src.size(); ++q) {
      fn(dst + skip, dst + skip, src[q] + skip, len);
    }
  }
}

// Where part p of `parts` starts in [0, total), in multiples of `align`.
size_t Cut(size_t total, int p, int parts, size_t align) {
  if (p >= parts) return total;
  return total / parts * p / align * align;
}

}  // namespace

CopyTeam::CopyTeam(int threads, const std::string& name, size_t min_part_bytes)
    : threads_(std::max(threads, 1)),
      min_part_bytes_(std::max<size_t>(min_part_bytes, 64)) {
  for (int i = 1; i < threads_; ++i) {
    helpers_.emplace_back([this, i] { Helper(i); });
    const std::string thread_name =
        (name + "-" + std::to_string(i)).substr(0, 15);  // The kernel's limit.
    pthread_setname_np(helpers_.back().native_handle(), thread_name.c_str());
  }
}

CopyTeam::~CopyTeam() {
  if (helpers_.empty()) return;
  stop_ = true;
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void CopyTeam::Helper(int index) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = generation_.load(std::memory_order_acquire);
    const auto until = std::chrono::steady_clock::now() + kHelperSpin;
    for (int spin = 1; now == seen; ++spin) {
      CpuRelax();
      now = generation_.load(std::memory_order_acquire);
      if (spin % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
    }
    while (now == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_) return;
    if (index < parts_) (*job_)(index);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

void CopyTeam::Run(int parts, absl::FunctionRef<void(int)> fn) {
  parts = std::clamp(parts, 1, threads_);
  if (parts == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  parts_ = parts;
  pending_.store(threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  fn(0);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpins) {
      CpuRelax();
    } else {
      std::this_thread::yield();  // A helper lost its core: let it run.
    }
  }
  job_ = nullptr;
}

int CopyTeam::PartsFor(size_t bytes) const {
  return static_cast<int>(std::clamp<size_t>(bytes / min_part_bytes_, 1,
                                             static_cast<size_t>(threads_)));
}

void CopyTeam::Copy(absl::Span<const Move> moves, bool streaming) {
  size_t total = 0;
  for (const Move& m : moves) total += m.n;
  if (total == 0) return;
  const int parts = PartsFor(total);
  Run(parts, [&](int p) {
    // This part's bytes, [lo, hi) of the moves laid end to end.
    const size_t lo = Cut(total, p, parts, 64);
    const size_t hi = Cut(total, p + 1, parts, 64);
    size_t at = 0;
    for (const Move& m : moves) {
      const size_t from = std::max(lo, at), to = std::min(hi, at + m.n);
      if (from < to) {
        CopyOut(m.dst + (from - at), m.src + (from - at), to - from, streaming);
      }
      at += m.n;
      if (at >= hi) break;
    }
  });
}

void CopyTeam::Reduce(ReduceFn fn, char* dst, absl::Span<const char* const> src,
                      int64_t count, size_t isz) {
  if (count <= 0) return;
  const int parts = PartsFor(static_cast<size_t>(count) * isz);
  Run(parts, [&](int p) {
    const size_t n = static_cast<size_t>(count);
    ReduceBlocked(fn, dst, src, Cut(n, p, parts, 16), Cut(n, p + 1, parts, 16),
                  isz);
  });
}

}  // namespace c10d
}  // namespace ferry
