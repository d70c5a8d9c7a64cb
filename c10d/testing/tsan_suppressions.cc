// ThreadSanitizer suppressions for c10d's tests, compiled into the test
// binaries (TSAN reads __tsan_default_suppressions at startup; other builds
// never call it).
//
// libgloo is a Debian system library built without -fsanitize=thread: TSAN
// sees its pthread calls but not its memory accesses or atomics, so it
// reports races between Gloo's internal threads that it cannot order (e.g.
// the TCP loop thread broadcasting an unbound buffer's condition variable in
// signalException while the owner destroys the buffer after a closed pair).
// Both lines look only at the innermost frame of an access: `race_top:` when
// the access is code in libgloo, `called_from_lib:` when it is made by an
// interceptor (pthread_cond_destroy, memcpy) called directly from libgloo.
// A race on memory that Ferry's code touches is still reported.
extern "C" const char* __tsan_default_suppressions() {
  return "race_top:libgloo.so\n"
         "called_from_lib:libgloo.so\n"
         // Gloo's loop thread throws an IoException into a pair; the owner
         // destroys it (the destructor, inlined from gloo's header, is the
         // top frame) after receiving the exception_ptr through libgloo's
         // uninstrumented hand-off.
         "race_top:gloo::IoException::~IoException\n"
         // libstdc++.so is uninstrumented too: exception_ptr's refcount (and
         // the exception's message string) are released by its out-of-line
         // code on the owner's thread after gloo's thread threw, ordered by
         // atomics in libstdc++. Only interceptors (operator delete, memcpy)
         // called directly from libstdc++.so's own code are skipped; string
         // code inlined into Ferry's objects is still checked.
         "called_from_lib:libstdc++.so\n";
}
