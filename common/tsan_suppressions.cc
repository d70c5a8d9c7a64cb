// ThreadSanitizer suppressions linked into binaries that use gRPC.
//
// Debian's gRPC and gpr shared libraries are not built with TSAN, so TSAN
// sees neither the plain accesses nor the atomics inside them and reports
// races between two accesses it cannot order. Both kinds of line
// below look only at the innermost frame of an access, never deeper:
//   race_top:X          the access itself is code in library X;
//   called_from_lib:X   the access is made by an interceptor (memmove,
//                       epoll_wait, pthread_cond_*) whose immediate caller is
//                       in X; TSAN then skips that interceptor's accesses
//                       (it still sees the synchronization they do).
// A race where Ferry's own code touches the memory, including a Ferry
// callback running on a gRPC thread with gRPC frames below it, is reported.
//
// tools/test_tsan compiles this file with FERRY_TSAN_GRPC_INSTRUMENTED when
// it runs against a TSAN-built gRPC (tools/build_tsan_libs): TSAN then sees
// gRPC's accesses and atomics, and every gRPC line goes.
extern "C" const char* __tsan_default_suppressions() {
  return
#ifndef FERRY_TSAN_GRPC_INSTRUMENTED
      // gRPC core: the event engine's epoll set (epoll_create1 on one
      // thread, epoll_wait on another, ordered by gRPC's own atomics),
      // closures and slices.
      "race_top:libgrpc.so.29\n"
      "called_from_lib:libgrpc.so.29\n"
      // gpr: gRPC's thread, arena and refcount helpers.
      "race_top:libgpr.so.29\n"
      "called_from_lib:libgpr.so.29\n"
      // grpc++: completion-queue and callback plumbing.
      "race_top:libgrpc++.so.1.51\n"
      "called_from_lib:libgrpc++.so.1.51\n"
      // grpc++'s header templates (grpcpp/impl/codegen: call tags, unary
      // handlers), compiled into Ferry's binaries but run as gRPC's own
      // plumbing: they read call state that the caller's thread wrote before
      // handing the call to gRPC core, which orders the two with atomics
      // TSAN cannot see. Ferry's code is never in grpc::internal.
      "race_top:grpc::internal::\n"
#endif
      // OpenSSL (gRPC's TLS, the store's HMAC) is Debian's,
      // not instrumented: its reference counts are atomics TSAN cannot see,
      // so when gRPC drops the last reference to an SSL context on another
      // thread, the lock libcrypto frees (pthread_rwlock_destroy) looks
      // unordered with its last use. Only interceptor calls libcrypto makes
      // itself are skipped; its code was never visible to TSAN anyway.
      "called_from_lib:libcrypto.so.3\n"
      // Abseil needs none: tools/test_tsan loads a TSAN-built Abseil
      // (tools/build_tsan_libs), which also makes gRPC's own locks (all
      // absl::Mutex in gRPC 1.51) visible. Abseil's one false report of its
      // own (Waiter::Post against LowLevelAlloc's mmap) is removed at its
      // source by tools/tsan_libs/abseil-lla-tsan.patch, not here.
      "";
}
