// Memory of serve's hot reload over exports of a churning dynamic table (issue 28: "serve reloads
// 10 deltas' worth of exports with its memory bounded by the live rows"; docs/PERFORMANCE.md
// "Dynamic rows: serve's reloads").
//
// Writes `versions` exports (serving/export.h, format version 3) of a model whose dynamic table
// `user` holds `live` rows each version, `churn` of them replaced by new keys from one version to
// the next (so that every version has keys no earlier one had), then reads them one after the
// other as `pstrain serve`'s reload does (ReadExport into a new ServingModel, swapped in for the
// old one, which is freed when the swap drops it), printing after each the model's rows, its
// measured bytes and the process's resident memory (/proc/self/statm). The reads run in this one
// process (not the serve binary): the memory is the reload path's, without gRPC's.
//
//   cmake --build build/release -j2 --target serve_reload_app
//   build/release/bench/serve_reload_app --live 1000000 --versions 10 --out /tmp/reload
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/app_util.h"
#include "common/flags.h"
#include "common/random.h"
#include "google/protobuf/text_format.h"
#include "serving/export.h"
#include "serving/serving_model.h"

namespace pstrain {
namespace {

ModelDescription Description(int dim) {
  ModelDescription d;
  google::protobuf::TextFormat::ParseFromString(
      absl::StrCat(R"pb(
        features {
          preset: NO_PRESET
          field { name: "c1" vocab_size: 100 }
          field { name: "user" table: "user" }
          table { name: "user" dynamic { } dim: )pb",
                   dim, R"pb( }
          hash_seed: 3
        }
        model { type: DEEPFM embedding_dim: )pb",
                   dim, R"pb( hidden: [ 16 ] }
        init_seed: 1
        init_rule: 1)pb"),
      &d);
  return d;
}

int Main(int argc, char** argv) {
  int versions = 10, dim = 16;
  int64_t live = 1000000;
  double churn = 0.2;
  std::string out = "/tmp/serve_reload";
  FlagSet flags("serve_reload_app",
                "Resident memory of reloading exports of a churning dynamic table.");
  flags.Int("versions", &versions, "export versions to write and reload");
  flags.Int64("live", &live, "live rows of the dynamic table in each version");
  flags.Double("churn", &churn, "fraction of the rows with new keys in each next version");
  flags.Int("dim", &dim, "the table's dim (rows of 1 + dim floats)");
  flags.String("out", &out, "the export base directory (emptied first)");
  if (std::optional<int> rc = ParseAppFlags(flags, argc, argv)) return *rc;
  if (versions < 1 || live < 1 || churn < 0 || churn > 1 || dim < 1) {
    std::fprintf(stderr, "serve_reload_app: need versions >= 1, live >= 1, churn in [0, 1]\n");
    return 2;
  }
  std::system(("rm -rf '" + out + "'").c_str());
  const ModelDescription description = Description(dim);
  const int64_t step = static_cast<int64_t>(live * churn);
  Rng rng(1);
  for (int v = 1; v <= versions; ++v) {
    auto m = ServingModel::Create(description, ServingModel::Origin{"bench", v, v});
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      return 1;
    }
    // Version v's keys: the identities [v x step, v x step + live), spread by a multiplier.
    std::vector<uint64_t> keys(live);
    for (int64_t i = 0; i < live; ++i) {
      keys[i] = (static_cast<uint64_t>(v * step + i) + 1) * 0x9e3779b97f4a7c15ull >> 9;
    }
    std::sort(keys.begin(), keys.end());
    std::vector<float> rows(live * (1 + dim));
    for (float& x : rows) x = static_cast<float>(rng.UniformDouble() - 0.5);
    if (absl::Status s = (*m)->StoreDynamicRows(0, keys, rows.data()); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    ExportOptions o;
    o.version = v;
    if (auto info = WriteExport(**m, out, o); !info.ok()) {
      std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
      return 1;
    }
  }
  std::printf("version  dynamic_rows  model_MB  resident_MB\n");
  std::shared_ptr<const ServingModel> serving;
  for (int v = 1; v <= versions; ++v) {
    auto read = ReadExport(absl::StrCat(out, "/", v));
    if (!read.ok()) {
      std::fprintf(stderr, "%s\n", read.status().ToString().c_str());
      return 1;
    }
    serving = std::shared_ptr<const ServingModel>(*std::move(read));  // the old one is freed
    std::printf("%7d  %12lld  %8.1f  %11.1f\n", v,
                static_cast<long long>(serving->dynamic_rows()), serving->memory_bytes() / 1e6,
                ResidentBytes() / 1e6);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

PSTRAIN_APP_MAIN()
