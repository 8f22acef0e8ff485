// libFuzzer target: `/metrics` (common/metrics/metrics.h MetricsEndpoint), the HTTP endpoint any
// process with --metrics_port serves. The input is sent as the bytes of one HTTP request over a
// loopback TCP connection to an endpoint started once per process (its write side then closed),
// and the answer read to its end; the process's registry holds a counter, a histogram and a scrape
// callback, so that a GET /metrics renders every kind of family (ScrapeText's serializer).
//
// What this covers and what it does not: the HTTP parsing is civetweb's (inside prometheus-cpp,
// a system library that is not built with coverage or AddressSanitizer), so libFuzzer cannot
// steer into it: for civetweb this is a blind run of mutated requests. A crash of the server
// still fails the run, and so does a connection it neither answers nor closes within 5 s of the
// request's end (its request timeout here is 0.5 s: issue 26 item 8's bound).
// pstrain's own code on this path, the endpoint's options (connection timeouts: issue 26 item 8)
// and the scrape (the registry, the callbacks, the text exposition), is covered. There is no
// other pstrain parser of /metrics bytes.
// Seed corpus: fuzz/corpus/metrics/ (scrapes, partial and malformed requests).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace pstrain;

struct Endpoint {
  std::unique_ptr<MetricsEndpoint> endpoint;
  std::unique_ptr<ScrapeCallback> callback;
};

Endpoint* Start() {
  auto* e = new Endpoint;
  prometheus::Registry& r = Metrics();
  prometheus::BuildCounter().Name("pstrain_fuzz_requests_total").Help("fuzz").Register(r)
      .Add({{"shard", "0"}}).Increment();
  prometheus::BuildHistogram().Name("pstrain_fuzz_seconds").Help("fuzz").Register(r)
      .Add({{"shard", "0"}}, LatencyBuckets()).Observe(0.01);
  e->callback = AddScrapeCallback([] {
    prometheus::MetricFamily f;
    f.name = "pstrain_fuzz_rows";
    f.help = "fuzz";
    f.type = prometheus::MetricType::Gauge;
    f.metric.push_back(GaugeSample(3, {"worker", "1"}));
    return std::vector<prometheus::MetricFamily>{f};
  });
  MetricsEndpoint::Options o;
  o.threads = 2;
  o.request_timeout_ms = 500;
  auto started = MetricsEndpoint::Start("127.0.0.1:0", o);
  if (!started.ok()) fuzz::SetupFailed("metrics", started.status().ToString());
  e->endpoint = *std::move(started);
  return e;
}

// Waits up to 5 s for `fd` to be ready for `events`.
bool Ready(int fd, short events) {
  pollfd p{fd, events, 0};
  return poll(&p, 1, 5000) == 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Endpoint* e = Start();
  (void)ScrapeText();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(e->endpoint->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    size_t sent = 0;
    while (sent < size && Ready(fd, POLLOUT)) {
      const ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
    char buf[4096];
    while (true) {
      if (!Ready(fd, POLLIN)) {
        std::fprintf(stderr, "metrics: the endpoint held a finished request for 5 s\n");
        std::abort();
      }
      if (recv(fd, buf, sizeof(buf), 0) <= 0) break;
    }
  }
  close(fd);
  return 0;
}
