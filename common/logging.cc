#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "absl/time/time.h"
#include "common/env.h"

namespace pstrain {
namespace {
std::atomic<int> g_min_level{0};
}

void SetMinLogLevel(int level) { g_min_level.store(level); }

namespace internal {

LogMessage::LogMessage(const char* file, int line, LogSeverity severity) : severity_(severity) {
  static const char kLetters[] = {'I', 'W', 'E', 'F'};
  // Logging is process-wide: it stamps lines with the real wall clock.
  const absl::Time now = Env::Default()->Now();
  const std::time_t t = absl::ToTimeT(now);
  const int ms = static_cast<int>(absl::ToUnixMillis(now) % 1000);
  std::tm tm;
  localtime_r(&t, &tm);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  const char* base = std::strrchr(file, '/');
  stream_ << kLetters[static_cast<int>(severity)] << ' ' << buf << ' ' << (base ? base + 1 : file)
          << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  if (static_cast<int>(severity_) >= g_min_level.load() || severity_ == LogSeverity::kFatal) {
    stream_ << '\n';
    const std::string s = stream_.str();
    ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
    (void)unused;
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace internal
}  // namespace pstrain
