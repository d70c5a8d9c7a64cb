// ThreadSanitizer suppressions for c10d's tests, compiled into the test
// binaries (TSAN reads __tsan_default_suppressions at startup; other builds
// never call it).
//
// Gloo needs none: tools/test_tsan runs these tests against a TSAN-built
// libgloo (tools/build_tsan_libs), so TSAN sees Gloo's own accesses and
// locks. What is left is libstdc++.so, which is not instrumented: an
// exception_ptr's reference count (Gloo's loop thread throws an IoException
// into a pair; the owner rethrows and destroys it) is released by its
// out-of-line code, ordered by atomics in libstdc++. The line skips only
// interceptors (operator delete, memcpy) called directly from libstdc++.so's
// own code; string code inlined into Ferry's or Gloo's objects is checked.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libstdc++.so\n";
}
