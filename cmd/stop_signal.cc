#include "cmd/stop_signal.h"

#include <signal.h>

namespace pstrain {
namespace {

StopSignals g_signals;

void OnStopSignal(int sig) {
  if (!g_signals.served.load() || g_signals.stop.exchange(true)) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

}  // namespace

StopSignals& InstallStopSignals() {
  static const bool installed = [] {
    signal(SIGTERM, OnStopSignal);
    signal(SIGINT, OnStopSignal);
    return true;
  }();
  (void)installed;
  return g_signals;
}

}  // namespace pstrain
