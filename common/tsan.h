// Happens-before annotations for ThreadSanitizer, for the points where Ferry
// hands an object to an uninstrumented library (gRPC) on one thread and the
// library gives it back to Ferry (a callback, a deleter) on another.
//
// Debian's gRPC and Abseil are not built with TSAN, so the ordering they
// establish between those two threads (their own atomics, absl::Mutex) is
// invisible to it, and Ferry's accesses on both sides look like a race.
//
//   FERRY_TSAN_RELEASE(p)  on the handing-over thread, right before the
//                          library call that hands `p` over;
//   FERRY_TSAN_ACQUIRE(p)  on the receiving thread, first thing in the
//                          callback that gets `p` back.
//
// Together they tell TSAN about exactly that one edge (the release's thread
// history happens before whatever follows the acquire), nothing else. Each use
// names the library ordering it stands for. Use them only for such library
// hand-offs: a race between two of Ferry's own threads is fixed, not
// annotated.
//
// Both expand to nothing unless the build is a TSAN build (--config=tsan sets
// FERRY_SANITIZER and -fsanitize=thread); FERRY_TSAN is 1 there, else 0, for
// code that exists only to carry such an annotation.
#ifndef FERRY_COMMON_TSAN_H_
#define FERRY_COMMON_TSAN_H_

#if defined(FERRY_SANITIZER) && defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#include <sanitizer/tsan_interface.h>

namespace ferry::tsan_internal {
inline void Release(const volatile void* p) {
  __tsan_release(const_cast<void*>(p));
}
inline void Acquire(const volatile void* p) {
  __tsan_acquire(const_cast<void*>(p));
}
}  // namespace ferry::tsan_internal

#define FERRY_TSAN_RELEASE(p) ::ferry::tsan_internal::Release(p)
#define FERRY_TSAN_ACQUIRE(p) ::ferry::tsan_internal::Acquire(p)
#else
#define FERRY_TSAN 0
#define FERRY_TSAN_RELEASE(p) static_cast<void>(p)
#define FERRY_TSAN_ACQUIRE(p) static_cast<void>(p)
#endif

#endif  // FERRY_COMMON_TSAN_H_
