// Leveled logging to stderr.
//
//   FERRY_LOG(INFO) << "listening on " << addr;
//
// A line is "I1121 10:20:13.123456 12345 worker0:1 file.cc:42] message": level,
// UTC date and time, thread id, the label of the worker the current thread is
// working for (when known), source location, then the message. Each line is
// written with a single write(2), so lines from concurrent threads and
// processes do not interleave.
//
// The threshold comes from FERRY_LOG_LEVEL (debug, info, warning, error, off;
// default warning), read once, and can be changed with SetLogLevel. A disabled
// statement costs one relaxed atomic load: its operands are not evaluated.
//
// Labels: several workers may share a process, so the label is per thread
// (ScopedLogLabel, set by the threads a worker owns), falling back to a
// process default (SetDefaultLogLabel) for single-worker programs.
//
// Thread safety: all functions are safe to call from any thread.
#ifndef FERRY_COMMON_LOGGING_H_
#define FERRY_COMMON_LOGGING_H_

#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

enum class LogLevel : int {
  kDebug = 0,
  kInfo = 1,
  kWarning = 2,
  kError = 3,
  kOff = 4
};

// Parses "debug", "info", "warning"/"warn", "error", "off" or "0".."4".
// Unknown text yields `fallback`.
LogLevel ParseLogLevel(absl::string_view text, LogLevel fallback);

LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
inline bool LogEnabled(LogLevel level);

// Label for lines logged by threads without a ScopedLogLabel.
void SetDefaultLogLabel(absl::string_view label);

// Sets this thread's label for the lifetime of the object, restoring the
// previous one afterwards. Not copyable; must be destroyed on the same thread.
class ScopedLogLabel {
 public:
  explicit ScopedLogLabel(std::string label);
  ~ScopedLogLabel();
  ScopedLogLabel(const ScopedLogLabel&) = delete;
  ScopedLogLabel& operator=(const ScopedLogLabel&) = delete;

  // The label of the calling thread ("" when none and no default is set).
  static std::string Current();

 private:
  std::string previous_;
  bool had_previous_;
};

// Where lines go; for tests. nullptr restores stderr. The sink must outlive
// its installation; it is called with one complete line (with '\n').
using LogSink = void (*)(absl::string_view line);
void SetLogSinkForTest(LogSink sink);

namespace logging_internal {

extern int g_threshold;  // Accessed atomically via LogEnabled.

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // Emits the line.
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Makes `cond ? (void)0 : Voidify() & stream` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal

inline bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >=
         __atomic_load_n(&logging_internal::g_threshold, __ATOMIC_RELAXED);
}

}  // namespace ferry

#define FERRY_LOG_LEVEL_DEBUG ::ferry::LogLevel::kDebug
#define FERRY_LOG_LEVEL_INFO ::ferry::LogLevel::kInfo
#define FERRY_LOG_LEVEL_WARNING ::ferry::LogLevel::kWarning
#define FERRY_LOG_LEVEL_ERROR ::ferry::LogLevel::kError

#define FERRY_LOG(severity)                                                   \
  !::ferry::LogEnabled(FERRY_LOG_LEVEL_##severity)                            \
      ? (void)0                                                               \
      : ::ferry::logging_internal::Voidify() &                                \
            ::ferry::logging_internal::LogMessage(FERRY_LOG_LEVEL_##severity, \
                                                  __FILE__, __LINE__)         \
                .stream()

#endif  // FERRY_COMMON_LOGGING_H_
