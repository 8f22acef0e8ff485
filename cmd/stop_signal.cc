#include "cmd/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace pstrain {
namespace {

StopSignals g_signals;
std::atomic<int> g_grace_seconds{300};

void OnGraceExpired(int) {
  static const char kMessage[] =
      "pstrain: still running after the stop signal's grace period (a wait that needs a dead "
      "peer?); exiting\n";
  ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  (void)ignored;
  _exit(kExitStopGraceExpired);
}

void OnStopSignal(int sig) {
  if (!g_signals.served.load() || g_signals.stop.exchange(true)) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  if (const int child = g_signals.forward_to.load(); child > 0) kill(child, SIGTERM);
  alarm(static_cast<unsigned>(g_grace_seconds.load()));
}

}  // namespace

StopSignals& InstallStopSignals() {
  static const bool installed = [] {
    signal(SIGALRM, OnGraceExpired);
    signal(SIGTERM, OnStopSignal);
    signal(SIGINT, OnStopSignal);
    return true;
  }();
  (void)installed;
  return g_signals;
}

void SetStopGrace(int seconds) { g_grace_seconds = seconds < 1 ? 1 : seconds; }

void ExitWithin(absl::Duration limit, int code, std::string message) {
  std::thread([limit, code, message = std::move(message)] {
    absl::Notification never;  // a deadline, not a poll: nothing notifies it
    never.WaitForNotificationWithTimeout(limit);
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    _exit(code);
  }).detach();
}

void ExitSoonAfterFailure(const char* command, const absl::Status& why) {
  ExitWithin(kFailedExitLimit, 1,
             absl::StrCat("pstrain ", command, ": ", why.message(), " (the process had not ended ",
                          absl::FormatDuration(kFailedExitLimit), " after it: exiting)"));
}

}  // namespace pstrain
