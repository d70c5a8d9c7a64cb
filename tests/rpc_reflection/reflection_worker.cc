// A one-worker Ferry group for inspection by outside gRPC clients.
//
//   reflection_worker [--name=NAME] [--enable_invoke]
//                     [--tls_ca=F --tls_cert=F --tls_key=F
//                      [--require_client_cert]]
//
// Starts a GrpcAgent (rank 0 of 1, over an in-process HashStore) serving a
// few functions, prints "ADDRESS <host:port>" on stdout, and serves until its
// stdin reaches end of file or it gets SIGTERM/SIGINT; then it shuts down
// gracefully and exits 0. Used by reflection_test (a Node reflection client
// lists, describes and calls its services).
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "ferry/common/future.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/tensor.h"

namespace {

absl::Status RegisterFunctions(ferry::rpc::FunctionRegistry& registry) {
  using ferry::Tensor;
  absl::Status s = registry.Register(
      "add", [](Tensor a, Tensor b) { return a.add(b); },
      "Element-wise sum of two tensors.");
  if (!s.ok()) return s;
  s = registry.Register(
      "greet",
      [](std::string who, int64_t times) {
        std::string out;
        for (int64_t i = 0; i < times && i < 16; ++i) out += "hello " + who;
        return out;
      },
      "Greets `who`, `times` times (at most 16).");
  if (!s.ok()) return s;
  return registry.Register(
      "later", [](int64_t x) { return ferry::MakeReadyFuture<int64_t>(x + 1); },
      "Replies x + 1 through a future.");
}

// Serves until stdin closes or SIGTERM/SIGINT arrives.
int WaitForStop(int signal_fd) {
  pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {signal_fd, POLLIN, 0}};
  for (;;) {
    int n = poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::perror("poll");
      return 1;
    }
    if (fds[1].revents & POLLIN) return 0;
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[256];
      ssize_t r = read(STDIN_FILENO, buf, sizeof(buf));
      if (r <= 0) return 0;  // EOF (or a broken stdin): stop.
    }
    if (fds[0].revents & POLLNVAL) fds[0].fd = -1;  // No stdin: signals only.
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = "inspector";
  ferry::rpc::GrpcAgentOptions options;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--name=")) {
      name = std::string(arg);
    } else if (arg == "--enable_invoke") {
      options.enable_admin_invoke = true;
    } else if (absl::ConsumePrefix(&arg, "--tls_ca=")) {
      options.tls.ca_file = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--tls_cert=")) {
      options.tls.cert_file = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--tls_key=")) {
      options.tls.key_file = std::string(arg);
    } else if (arg == "--require_client_cert") {
      options.tls.require_client_cert = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--name=NAME] [--enable_invoke] [--tls_ca=F "
                   "--tls_cert=F --tls_key=F [--require_client_cert]]\n",
                   argv[0]);
      return 2;
    }
  }
  // Block the stop signals before any thread starts, so every thread
  // inherits the mask and they arrive on the signalfd only.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  const int signal_fd = signalfd(-1, &stop, SFD_CLOEXEC);
  if (signal_fd < 0) {
    std::perror("signalfd");
    return 1;
  }

  auto registry = std::make_shared<ferry::rpc::FunctionRegistry>();
  if (absl::Status s = RegisterFunctions(*registry); !s.ok()) {
    std::fprintf(stderr, "register: %s\n", s.ToString().c_str());
    return 1;
  }
  auto agent = ferry::rpc::GrpcAgent::Start(
      name, /*rank=*/0, /*world_size=*/1, std::make_shared<ferry::HashStore>(),
      options, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "start: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  std::printf("ADDRESS %s\n", (*agent)->address().c_str());
  std::fflush(stdout);

  int rc = WaitForStop(signal_fd);
  absl::Status s = (*agent)->Shutdown(/*graceful=*/true, absl::Seconds(10));
  if (!s.ok()) {
    std::fprintf(stderr, "shutdown: %s\n", s.ToString().c_str());
    rc = 1;
  }
  close(signal_fd);
  return rc;
}
