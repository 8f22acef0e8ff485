#include "common/metrics/metrics.h"

#include <exception>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace pstrain {
namespace {

// The scrape callbacks, as one Collectable registered with every endpoint.
class Callbacks : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    std::vector<prometheus::MetricFamily> out;
    for (const auto& [id, fn] : fns_) {
      std::vector<prometheus::MetricFamily> f = fn();
      out.insert(out.end(), std::make_move_iterator(f.begin()), std::make_move_iterator(f.end()));
    }
    return out;
  }
  int Add(std::function<std::vector<prometheus::MetricFamily>()> fn) {
    absl::MutexLock lock(&mu_);
    fns_.emplace_back(++next_, std::move(fn));
    return next_;
  }
  void Remove(int id) {
    absl::MutexLock lock(&mu_);
    for (auto it = fns_.begin(); it != fns_.end(); ++it) {
      if (it->first == id) {
        fns_.erase(it);
        return;
      }
    }
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::pair<int, std::function<std::vector<prometheus::MetricFamily>()>>> fns_
      ABSL_GUARDED_BY(mu_);
  int next_ ABSL_GUARDED_BY(mu_) = 0;
};

// Both live for the whole process (endpoints hold weak pointers to them).
const std::shared_ptr<prometheus::Registry>& SharedRegistry() {
  static const auto* r = new std::shared_ptr<prometheus::Registry>(
      std::make_shared<prometheus::Registry>());
  return *r;
}
const std::shared_ptr<Callbacks>& SharedCallbacks() {
  static const auto* c = new std::shared_ptr<Callbacks>(std::make_shared<Callbacks>());
  return *c;
}

class CallbackHandle : public ScrapeCallback {
 public:
  explicit CallbackHandle(int id) : id_(id) {}
  ~CallbackHandle() override { SharedCallbacks()->Remove(id_); }

 private:
  const int id_;
};

}  // namespace

prometheus::Registry& Metrics() { return *SharedRegistry(); }

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      1e-4, 2.5e-4, 6.25e-4, 1.6e-3, 4e-3, 1e-2, 2.5e-2, 6.25e-2, 0.16, 0.4, 1, 2.5, 10};
  return *b;
}

std::unique_ptr<ScrapeCallback> AddScrapeCallback(
    std::function<std::vector<prometheus::MetricFamily>()> collect) {
  return std::make_unique<CallbackHandle>(SharedCallbacks()->Add(std::move(collect)));
}

prometheus::ClientMetric GaugeSample(double value, prometheus::ClientMetric::Label label) {
  prometheus::ClientMetric m;
  m.label.push_back(std::move(label));
  m.gauge.value = value;
  return m;
}

prometheus::ClientMetric CounterSample(double value, prometheus::ClientMetric::Label label) {
  prometheus::ClientMetric m;
  m.label.push_back(std::move(label));
  m.counter.value = value;
  return m;
}

std::string ScrapeText() {
  std::vector<prometheus::MetricFamily> families = SharedRegistry()->Collect();
  std::vector<prometheus::MetricFamily> more = SharedCallbacks()->Collect();
  families.insert(families.end(), more.begin(), more.end());
  return prometheus::TextSerializer().Serialize(families);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address,
                                                                        const Options& options) {
  if (options.threads < 1 || options.request_timeout_ms < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics endpoint: threads and request_timeout_ms must be >= 1, got ", options.threads,
        " and ", options.request_timeout_ms));
  }
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  // prometheus-cpp (civetweb) reports a failure to listen by throwing; no exception leaves here.
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", absl::StrCat(options.threads),
        "request_timeout_ms", absl::StrCat(options.request_timeout_ms)});
  } catch (const std::exception& ex) {
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint: cannot listen on ", address, ": ", ex.what()));
  }
  e->exposer_->RegisterCollectable(SharedRegistry());
  e->exposer_->RegisterCollectable(SharedCallbacks());
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? 0 : ports[0];
  return e;
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace pstrain
