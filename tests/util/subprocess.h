// Child processes for tests: spawn a binary with pipes, read what it prints,
// and wait for it with a deadline. One copy of what every multi-process test
// needs, so none of them polls or sleeps to see a child exit.
//
//   ASSIGN_OR_RETURN(auto child, Subprocess::Spawn({RunfilePath("x/worker")},
//                                   SpawnOptions().CaptureStdout()));
//   std::string line = child->ReadLine(absl::Now() + absl::Seconds(10));
//   absl::StatusOr<int> code = child->Wait(absl::Now() + absl::Seconds(30));
//
// Thread safety: a Subprocess is used from one thread at a time.
#ifndef FERRY_TESTS_UTIL_SUBPROCESS_H_
#define FERRY_TESTS_UTIL_SUBPROCESS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry::testutil {

// $TEST_SRCDIR/$TEST_WORKSPACE/<path>: a data dependency of the running test
// named by its workspace-relative path ("tests/rpc/worker_main").
std::string RunfilePath(absl::string_view path);

struct SpawnOptions {
  // Set in the child's environment (on top of the parent's).
  std::map<std::string, std::string> env;
  // Gives the child a stdin pipe (else it inherits ours); closing it with
  // CloseStdin() is how some children are told to finish.
  bool pipe_stdin = false;
  // The child's stdout goes to a pipe read by ReadLine / ReadUntil.
  bool capture_stdout = false;
  // With capture_stdout: the child's stderr goes to the same pipe.
  bool merge_stderr = false;

  // Chainable setters: SpawnOptions().CaptureStdout().MergeStderr().
  SpawnOptions& PipeStdin() {
    pipe_stdin = true;
    return *this;
  }
  SpawnOptions& CaptureStdout() {
    capture_stdout = true;
    return *this;
  }
  SpawnOptions& MergeStderr() {
    merge_stderr = true;
    return *this;
  }
};

class Subprocess {
 public:
  // Starts argv[0] (a path, not searched in PATH). Errors: the spawn's.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(
      std::vector<std::string> argv, SpawnOptions options = {});

  // A child still running is killed (SIGKILL) and reaped.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Waits for the child to exit, without polling. Returns its exit code, or
  // Aborted naming the signal that killed it, or DeadlineExceeded (the child
  // is left running; the destructor kills it).
  absl::StatusOr<int> Wait(absl::Time deadline);

  // Sends `signal` to a child that has not been reaped.
  absl::Status Signal(int signal);

  // Reads captured output until `done(text so far)` holds, EOF or the
  // deadline; returns the text read by this call (plus any left over by
  // ReadLine).
  std::string ReadUntil(absl::Time deadline,
                        const std::function<bool(const std::string&)>& done);
  // One line of captured output without its '\n'; what was read if EOF or
  // the deadline comes first.
  std::string ReadLine(absl::Time deadline);
  // Everything until EOF or the deadline.
  std::string ReadAll(absl::Time deadline);

  // Writes `text` to the child's stdin pipe (PipeStdin). FailedPrecondition
  // without one; Unavailable when the child has closed it.
  absl::Status WriteStdin(absl::string_view text);

  // Closes the child's stdin pipe (EOF for the child). Idempotent.
  void CloseStdin();

 private:
  Subprocess() = default;

  pid_t pid_ = -1;
  int pidfd_ = -1;       // Readable once the child has exited.
  int stdin_ = -1;       // Our end of its stdin.
  int stdout_ = -1;      // Our end of its stdout.
  std::string pending_;  // Read past the end of the last line.
};

// Runs argv to completion with stdout and stderr captured: {exit code or -1
// (signal, timeout or spawn failure), output}. Kills it after `limit`.
std::pair<int, std::string> RunCommand(std::vector<std::string> argv,
                                       std::map<std::string, std::string> env,
                                       absl::Duration limit);

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_UTIL_SUBPROCESS_H_
