#include "cmd/stop_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

StopSignals g_signals;
std::atomic<int> g_grace_seconds{0};  // 0: no grace timer

sigset_t StopSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// Ends the process with `sig`'s default action, from the signal thread (which blocks it).
[[noreturn]] void EndWithDefaultAction(int sig) {
  ::signal(sig, SIG_DFL);
  pthread_kill(pthread_self(), sig);  // pending on this thread until unblocked below
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  _exit(128 + sig);  // not reached: the default action ends the process
}

void OnStopSignal(int sig) {
  if (!g_signals.served.load()) EndWithDefaultAction(sig);
  if (g_signals.stop.exchange(true)) {
    if (g_signals.repeat_ends_process.load()) EndWithDefaultAction(sig);
    if (g_signals.on_stop) g_signals.on_stop(sig);
    return;
  }
  g_signals.signal = sig;
  if (const int child = g_signals.forward_to.load(); child > 0) kill(child, SIGTERM);
  if (const int grace = g_grace_seconds.load(); grace > 0) {
    ExitWithin(absl::Seconds(grace), kExitStopGraceExpired,
               "pstrain: still running after the stop signal's grace period (a wait that needs "
               "a dead peer?); exiting");
  }
  g_signals.stopped.Notify();
  if (g_signals.on_stop) g_signals.on_stop(sig);
}

// The signal thread: takes the stop signals one at a time, for the life of the process. Every
// other signal is blocked here, so that none meant for another thread (a SIGCHLD that a
// sigtimedwait expects) is taken by this one.
void TakeStopSignals() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  const sigset_t stop = StopSet();
  while (true) {
    int sig = 0;
    if (sigwait(&stop, &sig) == 0) OnStopSignal(sig);
  }
}

}  // namespace

StopSignals& InstallStopSignals() {
  static const bool installed = [] {
    const sigset_t stop = StopSet();
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    std::thread(TakeStopSignals).detach();
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
