// common/metrics: the registry, scrape callbacks and the /metrics endpoint serve valid text
// exposition; the endpoint binds where it is told and refuses a taken port with an error.
#include "common/metrics/metrics.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
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
