// common/metrics: the registry, scrape callbacks and the /metrics endpoint serve valid text
// exposition; the endpoint binds where it is told and refuses a taken port with an error.
#include "common/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/metrics/exposition.h"
#include "tests/common/metrics/http_scrape.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

using testing::HttpGet;

TEST(Metrics, RegistryCallbacksAndEndpointServeValidExposition) {
  auto& c = prometheus::BuildCounter().Name("pstrain_test_events_total").Help("events").Register(Metrics());
  c.Add({{"k", "a"}}).Increment(3);
  auto& h = prometheus::BuildHistogram().Name("pstrain_test_seconds").Help("t").Register(Metrics());
  auto& hist = h.Add({{"k", "a"}}, LatencyBuckets());
  for (double v : {0.0002, 0.003, 0.003, 2.0, 50.0}) hist.Observe(v);
  auto callback = AddScrapeCallback([] {
    std::vector<prometheus::MetricFamily> f;
    f.push_back({"pstrain_test_read_value", "read at scrape", prometheus::MetricType::Gauge,
                 {GaugeSample(42.5, {"shard", "7"})}});
    return f;
  });
  std::vector<testing::Sample> samples;
  const std::string text = ScrapeText();
  ASSERT_EQ(testing::CheckExposition(text, &samples), "") << text;
  EXPECT_EQ(testing::SampleValue(samples, "pstrain_test_events_total", "k=\"a\""), 3);
  EXPECT_EQ(testing::SampleValue(samples, "pstrain_test_read_value", "shard=\"7\""), 42.5);
  EXPECT_EQ(testing::SampleValue(samples, "pstrain_test_seconds_count", "k=\"a\""), 5);
  EXPECT_EQ(testing::SampleValue(samples, "pstrain_test_seconds_bucket", "k=\"a\",le=\"0.004\""), 3);

  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  const std::string http = HttpGet((*endpoint)->port(), "/metrics");
  EXPECT_THAT(http, HasSubstr("200 OK"));
  const size_t body = http.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << http;
  samples.clear();
  ASSERT_EQ(testing::CheckExposition(http.substr(body + 4), &samples), "") << http;
  EXPECT_EQ(testing::SampleValue(samples, "pstrain_test_read_value", "shard=\"7\""), 42.5);

  // The callback is gone with its handle.
  callback.reset();
  EXPECT_THAT(ScrapeText(), ::testing::Not(HasSubstr("pstrain_test_read_value")));

  // A taken port is an error naming the address, not an exception or a crash.
  auto taken = MetricsEndpoint::Start(absl::StrCat("127.0.0.1:", (*endpoint)->port()));
  ASSERT_FALSE(taken.ok());
  EXPECT_TRUE(absl::IsUnavailable(taken.status()));
  EXPECT_THAT(std::string(taken.status().message()),
              HasSubstr(absl::StrCat("cannot listen on 127.0.0.1:", (*endpoint)->port())));
}

// A connection that sends part of a request and then nothing, as a client that stalls would.
int OpenStalledRequest(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  const std::string part = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  if (write(fd, part.data(), part.size()) != static_cast<ssize_t>(part.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Idle connections with partial headers do not block scrapes (issue 26 item 8: two of them
// blocked scrapes for about 60 s: one civetweb thread, its 30 s request timeout). Two of them:
// a scrape beside them is answered at once. More of them than the endpoint has threads: each
// holds a thread for at most request_timeout_ms, so a scrape is answered within
// ceil((K + 1) / threads) timeouts.
TEST(Metrics, StalledConnectionsDoNotBlockScrapes) {
  const MetricsEndpoint::Options options;
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  std::vector<int> stalled;
  for (int i = 0; i < 2; ++i) stalled.push_back(OpenStalledRequest(port));
  absl::SleepFor(absl::Milliseconds(200));  // the endpoint has taken them
  absl::Time t0 = absl::Now();
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("200 OK"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));

  const int k = 2 * options.threads;
  for (int i = 0; i < k; ++i) stalled.push_back(OpenStalledRequest(port));
  for (int fd : stalled) ASSERT_GE(fd, 0);
  absl::SleepFor(absl::Milliseconds(200));
  t0 = absl::Now();
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("200 OK"));
  const absl::Duration bound =
      ((k + 2 + 1 + options.threads - 1) / options.threads) *
          absl::Milliseconds(options.request_timeout_ms) +
      absl::Seconds(1);
  EXPECT_LT(absl::Now() - t0, bound);
  std::printf("a scrape behind %d stalled connections took %.2f s (bound %.1f s)\n", k + 2,
              absl::ToDoubleSeconds(absl::Now() - t0), absl::ToDoubleSeconds(bound));
  for (int fd : stalled) close(fd);
  // Bad options are an error, not civetweb's exception.
  MetricsEndpoint::Options none;
  none.threads = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(MetricsEndpoint::Start("127.0.0.1:0", none).status()));
}

// The checker itself must reject what promtool rejects.
TEST(Metrics, ExpositionCheckerCatchesErrors) {
  std::vector<testing::Sample> s;
  EXPECT_NE(testing::CheckExposition("x_total 1\n", &s), "");  // no TYPE
  EXPECT_NE(testing::CheckExposition("# TYPE x counter\nx{a=b} 1\n", &s), "");  // unquoted label
  EXPECT_NE(testing::CheckExposition("# TYPE x counter\nx -1\n", &s), "");
  EXPECT_NE(testing::CheckExposition(
                "# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n", &s),
            "");
  EXPECT_EQ(testing::CheckExposition(
                "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
                "h_sum 3\nh_count 2\n",
                &s),
            "");
}

}  // namespace
}  // namespace pstrain
