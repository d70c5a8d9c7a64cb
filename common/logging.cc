#include "ferry/common/logging.h"

#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "ferry/common/env.h"
#include "ferry/common/sync.h"

namespace ferry {
namespace logging_internal {

namespace {
int InitialThreshold() {
  return static_cast<int>(ParseLogLevel(
      GetEnv("FERRY_LOG_LEVEL").value_or(""), LogLevel::kWarning));
}
}  // namespace

int g_threshold = InitialThreshold();

}  // namespace logging_internal

namespace {

struct DefaultLabel {
  Mutex mu;
  std::string label ABSL_GUARDED_BY(mu);
};

DefaultLabel& GetDefaultLabel() {
  // Leaked on purpose: logging may run during static destruction.
  static DefaultLabel* label = new DefaultLabel;
  return *label;
}

std::atomic<LogSink> g_sink{nullptr};

thread_local std::string* t_label = nullptr;

char LevelChar(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
    case LogLevel::kOff:
      break;
  }
  return '?';
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

LogLevel ParseLogLevel(absl::string_view text, LogLevel fallback) {
  std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "debug") return LogLevel::kDebug;
  if (t == "info") return LogLevel::kInfo;
  if (t == "warning" || t == "warn") return LogLevel::kWarning;
  if (t == "error") return LogLevel::kError;
  if (t == "off" || t == "none") return LogLevel::kOff;
  int n;
  if (absl::SimpleAtoi(t, &n) && n >= 0 && n <= 4)
    return static_cast<LogLevel>(n);
  return fallback;
}

LogLevel GetLogLevel() {
  return static_cast<LogLevel>(
      __atomic_load_n(&logging_internal::g_threshold, __ATOMIC_RELAXED));
}

void SetLogLevel(LogLevel level) {
  __atomic_store_n(&logging_internal::g_threshold, static_cast<int>(level),
                   __ATOMIC_RELAXED);
}

void SetDefaultLogLabel(absl::string_view label) {
  DefaultLabel& d = GetDefaultLabel();
  MutexLock lock(&d.mu);
  d.label = std::string(label);
}

void SetLogSinkForTest(LogSink sink) { g_sink.store(sink); }

ScopedLogLabel::ScopedLogLabel(std::string label)
    : had_previous_(t_label != nullptr) {
  if (had_previous_) {
    previous_ = std::move(*t_label);
    *t_label = std::move(label);
  } else {
    t_label = new std::string(std::move(label));
  }
}

ScopedLogLabel::~ScopedLogLabel() {
  if (had_previous_) {
    *t_label = std::move(previous_);
  } else {
    delete t_label;
    t_label = nullptr;
  }
}

std::string ScopedLogLabel::Current() {
  if (t_label != nullptr) return *t_label;
  DefaultLabel& d = GetDefaultLabel();
  MutexLock lock(&d.mu);
  return d.label;
}

namespace logging_internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level) {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char head[64];
  std::snprintf(head, sizeof(head), "%c%02d%02d %02d:%02d:%02d.%06ld %ld ",
                LevelChar(level), tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<long>(tv.tv_usec),
                static_cast<long>(syscall(SYS_gettid)));
  stream_ << head;
  std::string label = ScopedLogLabel::Current();
  if (!label.empty()) stream_ << label << ' ';
  stream_ << Basename(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string text = std::move(stream_).str();
  if (LogSink sink = g_sink.load()) {
    sink(text);
    return;
  }
  // One write per line keeps concurrent lines whole.
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(STDERR_FILENO, text.data() + off, text.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
}

}  // namespace logging_internal
}  // namespace ferry
