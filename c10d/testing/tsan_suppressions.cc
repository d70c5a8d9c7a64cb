// ThreadSanitizer suppressions for c10d's tests, compiled into the test
// binaries (TSAN reads __tsan_default_suppressions at startup; other builds
// never call it).
//
// libgloo is a Debian system library built without -fsanitize=thread: TSAN
// sees its pthread calls but not its memory accesses or atomics, so it
// reports races between Gloo's internal threads (e.g. the TCP loop thread
// signalling an unbound buffer's condition variable while the owner
// destroys it after a closed pair) that it cannot order. Only races whose
// stack is inside libgloo are suppressed; races in Ferry's code still fail.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libgloo.so\n";
}
