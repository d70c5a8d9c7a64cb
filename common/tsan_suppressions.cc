// ThreadSanitizer suppressions linked into binaries that use gRPC.
//
// Debian's gRPC and Abseil shared libraries are not built with TSAN, so TSAN
// cannot see the synchronization inside them and reports races between
// gRPC's own threads (its event engine's epoll set, Abseil's deadlock-graph
// bookkeeping). Only reports with a frame inside those shared libraries are
// silenced (matched by module name); races whose frames are all in Ferry's
// code, including Abseil templates inlined into it, still fail the tsan
// build. Unused (and harmless) in other builds.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so.29\n"
         "called_from_lib:libgpr.so.29\n"
         "called_from_lib:libgrpc++.so.1.51\n"
         "race:libgrpc.so.29\n"
         "race:libgpr.so.29\n"
         "race:libgrpc++.so.1.51\n"
         "race:libabsl_\n"
         "called_from_lib:libabsl_synchronization.so.20220623\n"
         "called_from_lib:libabsl_graphcycles_internal.so.20220623\n";
}
