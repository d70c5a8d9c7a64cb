#include "ferry/tests/util/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ferry::testutil {
namespace {

// Milliseconds left until `deadline` for poll(), at least 0.
int MillisLeft(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
}

// Waits until `fd` is readable or the deadline passes.
bool PollReadable(int fd, absl::Time deadline) {
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, MillisLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

// The parent's environment with `env` laid over it, as "K=V" strings.
std::vector<std::string> MergedEnv(
    const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view kv(*e);
    if (!env.contains(std::string(kv.substr(0, kv.find('='))))) {
      out.emplace_back(kv);
    }
  }
  for (const auto& [k, v] : env) out.push_back(absl::StrCat(k, "=", v));
  return out;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

}  // namespace

std::string RunfilePath(absl::string_view path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", ws ? ws : "ferry", "/", path);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(
    std::vector<std::string> argv, SpawnOptions options) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  std::unique_ptr<Subprocess> child(new Subprocess());
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if ((options.pipe_stdin && pipe2(in, O_CLOEXEC) != 0) ||
      (options.capture_stdout && pipe2(out, O_CLOEXEC) != 0)) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (options.pipe_stdin) posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  if (options.capture_stdout) {
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    if (options.merge_stderr) {
      posix_spawn_file_actions_adddup2(&actions, out[1], 2);
    }
  }
  std::vector<char*> args = CStrings(argv);
  std::vector<std::string> env_strings = MergedEnv(options.env);
  std::vector<char*> envp = CStrings(env_strings);
  const int rc = posix_spawn(&child->pid_, argv[0].c_str(), &actions, nullptr,
                             args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  CloseFd(&in[0]);
  CloseFd(&out[1]);
  child->stdin_ = in[1];
  child->stdout_ = out[0];
  if (rc != 0) {
    child->pid_ = -1;
    return absl::InternalError(
        absl::StrCat("posix_spawn ", argv[0], ": ", strerror(rc)));
  }
  child->pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, child->pid_, 0));
  if (child->pidfd_ < 0) {
    return absl::InternalError(absl::StrCat("pidfd_open: ", strerror(errno)));
  }
  return child;
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  CloseFd(&pidfd_);
  CloseFd(&stdin_);
  CloseFd(&stdout_);
}

absl::StatusOr<int> Subprocess::Wait(absl::Time deadline) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no child to wait for");
  if (!PollReadable(pidfd_, deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("child ", pid_, " still running at the deadline"));
  }
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) {
    return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
  }
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return absl::AbortedError(
      absl::StrCat("child killed by signal ", WTERMSIG(status)));
}

absl::Status Subprocess::Signal(int signal) {
  if (pid_ <= 0 || kill(pid_, signal) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot signal child ", pid_));
  }
  return absl::OkStatus();
}

std::string Subprocess::ReadUntil(
    absl::Time deadline, const std::function<bool(const std::string&)>& done) {
  std::string text = std::move(pending_);
  pending_.clear();
  char buf[4096];
  while (stdout_ >= 0 && !done(text) && PollReadable(stdout_, deadline)) {
    const ssize_t n = read(stdout_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, n);
  }
  return text;
}

std::string Subprocess::ReadLine(absl::Time deadline) {
  std::string text = ReadUntil(deadline, [](const std::string& t) {
    return t.find('\n') != std::string::npos;
  });
  const size_t nl = text.find('\n');
  if (nl == std::string::npos) return text;
  pending_ = text.substr(nl + 1);
  text.resize(nl);
  return text;
}

std::string Subprocess::ReadAll(absl::Time deadline) {
  return ReadUntil(deadline, [](const std::string&) { return false; });
}

absl::Status Subprocess::WriteStdin(absl::string_view text) {
  if (stdin_ < 0) {
    return absl::FailedPreconditionError("the child has no stdin pipe");
  }
  while (!text.empty()) {
    ssize_t n = ::write(stdin_, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("writing to the child's stdin: ", std::strerror(errno)));
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

void Subprocess::CloseStdin() { CloseFd(&stdin_); }

std::pair<int, std::string> RunCommand(std::vector<std::string> argv,
                                       std::map<std::string, std::string> env,
                                       absl::Duration limit) {
  const std::string name = argv.empty() ? "" : argv[0];
  SpawnOptions options;
  options.env = std::move(env);
  absl::StatusOr<std::unique_ptr<Subprocess>> child =
      Subprocess::Spawn(std::move(argv), options.CaptureStdout().MergeStderr());
  if (!child.ok()) return {-1, absl::StrCat("cannot start ", name)};
  const absl::Time deadline = absl::Now() + limit;
  std::string out = (*child)->ReadAll(deadline);
  absl::StatusOr<int> code = (*child)->Wait(deadline);
  return {code.ok() ? *code : -1, out};
}

}  // namespace ferry::testutil
