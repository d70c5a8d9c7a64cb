// CopyTeam: a rank's own threads for the bulk copies and reductions of a
// shared-memory collective, so a rank uses the cores its host has beyond one
// per rank (one thread copies at a fraction of what the memory system moves:
// bench/c10d/memcpy_floor).
//
// The calling thread takes part 0 of every job; `threads - 1` helpers take
// the others. Between jobs a helper spins briefly (collectives issue jobs
// back to back, a barrier apart; up to 500 us) and then sleeps on a futex. A
// job's parts are disjoint byte or element ranges, so the result does not
// depend on the thread count (reductions keep their per-element order).
//
// Thread safety: Run and the helpers built on it are called by one thread at
// a time (the backend's runner). Jobs never block, so Run returns once every
// part has run. The destructor stops and joins the helpers.
#ifndef FERRY_C10D_SHM_COPY_TEAM_H_
#define FERRY_C10D_SHM_COPY_TEAM_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "ferry/c10d/reduce.h"

namespace ferry {
namespace c10d {

class CopyTeam {
 public:
  // One move of `n` bytes from `src` to `dst` (not overlapping).
  struct Move {
    char* dst;
    const char* src;
    size_t n;
  };

  // `threads` >= 1 (1: no helpers, everything on the caller). `name` names
  // the helper threads (with their index). A job is split into parts of at
  // least `min_part_bytes` (smaller ones are not worth a helper's wake-up).
  CopyTeam(int threads, const std::string& name,
           size_t min_part_bytes = kDefaultMinPartBytes);
  ~CopyTeam();
  CopyTeam(const CopyTeam&) = delete;
  CopyTeam& operator=(const CopyTeam&) = delete;

  int threads() const { return threads_; }

  // Runs fn(p) for every p in [0, parts) (parts <= threads()), p = 0 on the
  // calling thread, and returns when all have returned.
  void Run(int parts, absl::FunctionRef<void(int)> fn);

  // Performs every move, their bytes split evenly over the team (ranges of
  // at least min_part_bytes; 64-byte aligned cuts). `streaming`: through
  // non-temporal stores (see CopyOut in copy_team.cc).
  void Copy(absl::Span<const Move> moves, bool streaming = false);
  void Copy(char* dst, const char* src, size_t n, bool streaming = false) {
    const Move m{dst, src, n};
    Copy(absl::MakeConstSpan(&m, 1), streaming);
  }

  // dst[i] = src[0][i] op src[1][i] op ... for i in [0, count) elements of
  // `isz` bytes, left to right; one source: a copy. Split by element range.
  void Reduce(ReduceFn fn, char* dst, absl::Span<const char* const> src,
              int64_t count, size_t isz);

  static constexpr size_t kDefaultMinPartBytes = size_t{64} << 10;

 private:
  void Helper(int index);
  int PartsFor(size_t bytes) const;

  const int threads_;
  const size_t min_part_bytes_;
  // Bumped (release) to hand helpers a job; the futex word they sleep on.
  std::atomic<uint32_t> generation_{0};
  // Helpers yet to finish the current job.
  std::atomic<int> pending_{0};
  // The current job; written before `generation_` is bumped.
  absl::FunctionRef<void(int)>* job_ = nullptr;
  int parts_ = 0;
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_SHM_COPY_TEAM_H_
