#include "serving/server/serve_metrics.h"

#include <utility>
#include <vector>

namespace pstrain {

ServeMetrics::ServeMetrics(std::function<ServeCounters()> counters) {
  latency_ = &prometheus::BuildHistogram()
                  .Name("pstrain_serve_predict_seconds")
                  .Help("Time from a Predict call's arrival to its answer (parse, queue, batch, "
                        "score)")
                  .Register(Metrics())
                  .Add({}, LatencyBuckets());
  callback_ = AddScrapeCallback([counters = std::move(counters)] {
    const ServeCounters c = counters();
    std::vector<prometheus::MetricFamily> out;
    using T = prometheus::MetricType;
    auto add = [&](const char* name, const char* help, T type, double v) {
      prometheus::ClientMetric m;  // one server a process: no labels
      (type == T::Counter ? m.counter.value : m.gauge.value) = v;
      out.push_back({name, help, type, {m}});
    };
    add("pstrain_serve_requests_total", "Predict calls accepted", T::Counter, c.requests);
    add("pstrain_serve_rejected_total",
        "Predict calls refused: bad request, full queue or stopping", T::Counter, c.rejected);
    add("pstrain_serve_rows_total", "Rows scored", T::Counter, c.rows);
    add("pstrain_serve_padded_rows_total", "Rows computed, batch padding included", T::Counter,
        c.padded_rows);
    add("pstrain_serve_batches_total", "Batches scored", T::Counter, c.batches);
    add("pstrain_serve_reloads_total", "Newer export versions swapped in", T::Counter,
        c.reloads);
    add("pstrain_serve_model_version", "The export version served", T::Gauge, c.version);
    return out;
  });
}

}  // namespace pstrain
