// Memory of a dynamic embedding store (ps/store/dynamic_store.h) over days of drifting ids, at
// component level (no trainer: the store alone, fed the unique keys of a day's batches): does
// TTL eviction hold its live rows and memory flat while ids come and go? (issue 28's "flat
// memory" target; docs/PERFORMANCE.md "Dynamic rows: flat memory").
//
// Day d's ids are the identities [d x R, d x R + live), R = live x churn: each day R new ids
// appear and R stop for good. A day is `batches` batches of `batch` keys (made unique) drawn
// uniformly from the day's ids (the 64-bit hash of the identity), an Apply each (Adagrad, dim
// 17); at the
// end of the day the store runs Evict and a checkpointer's BeginGeneration (which drops the
// older change logs), then the app prints the day's live rows, the store's measured bytes and the
// process's resident memory (/proc/self/statm). Run it once with --ttl_passes 2 and once with
// --ttl_passes 0 (no eviction): one store per process, so that the resident memory is its own.
//
//   cmake --build build/release -j2 --target dynamic_days_app
//   build/release/bench/dynamic_days_app --ttl_passes 2
//   build/release/bench/dynamic_days_app --ttl_passes 0
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/app_util.h"
#include "common/flags.h"
#include "common/hash.h"
#include "common/random.h"
#include "ps/store/dynamic_store.h"

namespace pstrain {
namespace {

int Main(int argc, char** argv) {
  int days = 10, ttl_passes = 2, batches = 100, batch = 20000, dim = 17;
  int64_t live = 1000000;
  double churn = 0.2;
  FlagSet flags("dynamic_days_app",
                "Live rows and memory of a dynamic store over days of drifting ids.");
  flags.Int("days", &days, "days (passes) to simulate");
  flags.Int64("live", &live, "ids alive on any day");
  flags.Double("churn", &churn, "fraction of the ids replaced by new ones each day");
  flags.Int("ttl_passes", &ttl_passes, "evict rows not updated in the last N passes (0: never)");
  flags.Int("batches", &batches, "batches a day");
  flags.Int("batch", &batch, "distinct keys a batch");
  flags.Int("dim", &dim, "floats a row");
  if (std::optional<int> rc = ParseAppFlags(flags, argc, argv)) return *rc;
  if (days < 1 || live < 1 || churn < 0 || churn > 1 || batch < 1 || batch > live) {
    std::fprintf(stderr, "dynamic_days_app: need days >= 1, live >= 1, churn in [0, 1] and "
                         "1 <= batch <= live\n");
    return 2;
  }
  OptimizerConfig oc;
  oc.set_type(ADAGRAD);
  oc.set_learning_rate(0.01f);
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(oc);
  DynamicEmbeddingStore::Options o;
  o.dim = dim;
  o.optimizer = std::shared_ptr<const Optimizer>(std::move(opt).value());
  o.ttl_passes = ttl_passes;
  absl::StatusOr<std::unique_ptr<DynamicEmbeddingStore>> made =
      DynamicEmbeddingStore::Create(std::move(o));
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 2;
  }
  DynamicEmbeddingStore& store = **made;
  Rng rng(1);
  std::vector<float> grads(static_cast<size_t>(batch) * dim);
  for (auto& g : grads) g = static_cast<float>(rng.Normal() * 0.01);
  const uint64_t per_day = static_cast<uint64_t>(static_cast<double>(live) * churn);
  std::printf("ttl_passes %d, live ids %lld, churn %.2f, %d x %d keys a day, dim %d\n",
              ttl_passes, static_cast<long long>(live), churn, batches, batch, dim);
  std::printf("day  rows_live  new_rows  evicted  store_MB  rss_MB\n");
  int64_t step = 0;
  std::vector<uint64_t> keys;
  for (int day = 0; day < days; ++day) {
    store.SetPass(day);
    const int64_t admitted_before = store.metrics().admitted;
    for (int b = 0; b < batches; ++b) {
      // Unique keys, as the worker sends them (a few fewer than `batch` when draws repeat).
      keys.resize(batch);
      for (auto& k : keys) k = Fmix64(day * per_day + rng.Uniform(static_cast<uint64_t>(live)));
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      store.Apply(keys, grads.data(), ++step);
    }
    const DynamicEmbeddingStore::EvictionResult e = store.Evict();
    store.BeginGeneration(day + 2, day + 2);  // a full checkpoint a day
    const DynamicEmbeddingStore::Metrics m = store.metrics();
    std::printf("%3d  %9lld  %8lld  %7lld  %8.1f  %6.1f\n", day + 1,
                static_cast<long long>(m.rows_live),
                static_cast<long long>(m.admitted - admitted_before),
                static_cast<long long>(e.ttl + e.capacity), m.bytes / 1e6,
                ResidentBytes() / 1e6);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) { return pstrain::Main(argc, argv); }
