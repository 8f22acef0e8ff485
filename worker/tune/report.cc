#include "worker/tune/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"

namespace pstrain {
namespace {

// The test-AUC cost of a larger global batch, measured with configs/deepfm_criteo.textproto on
// datagen data (2M rows, Bayes AUC 0.803; docs/PERFORMANCE.md "What the tuning found"), relative
// to global batch 512.
struct BatchCost {
  int global_batch;
  double auc_delta;
};
constexpr BatchCost kMeasuredBatchCost[] = {{512, 0.0}, {1024, -0.003}, {2048, -0.004},
                                            {8192, -0.013}};

BatchCost NearestMeasured(int global_batch) {
  auto distance = [global_batch](const BatchCost& c) {
    return std::abs(std::log2(static_cast<double>(c.global_batch) / global_batch));
  };
  const BatchCost* best = &kMeasuredBatchCost[0];
  for (const BatchCost& c : kMeasuredBatchCost) {
    if (distance(c) < distance(*best)) best = &c;
  }
  return *best;
}

std::string TableRow(const MeasuredSetting& m, const TuneResult& r) {
  const int used = std::min(r.space.cores, m.c.towers * m.c.intra);
  return absl::StrFormat("| %d | %d | %d | %d | %d%s | %.0f | %.0f | %.2f |\n", m.c.towers,
                         m.c.intra, m.c.inter, m.c.batch(), m.c.step,
                         m.c.step != r.global_batch ? " (changed)" : "", m.examples_per_sec,
                         m.examples_per_sec / used,
                         m.examples_per_sec / r.fastest.examples_per_sec);
}

// Why the search ended where it did, and what it did not run.
std::string SearchEnd(const TuneResult& r) {
  std::string out;
  if (r.not_tried.empty()) {
    absl::StrAppendFormat(&out,
                          "search complete: every allowed setting was measured (%zu in %.0f s of "
                          "the %.0f s budget)\n",
                          r.measured.size(), r.seconds, r.budget_s);
  } else {
    std::vector<std::string> names;
    for (const TuneCandidate& c : r.not_tried) names.push_back(c.Name());
    absl::StrAppendFormat(&out,
                          "budget spent: %zu settings measured in %.0f s; not tried: %s (towers x "
                          "intra x inter @ batch/tower)\n",
                          r.measured.size(), r.seconds, absl::StrJoin(names, " "));
  }
  if (r.not_allowed > 0) {
    absl::StrAppendFormat(
        &out,
        "%d combinations of the powers-of-two grid were not allowed: towers x intra_op above the "
        "%d cores (OpenMP teams would oversubscribe them)%s%s\n",
        r.not_allowed, r.space.cores,
        r.space.search_inter ? ", or parser threads beyond the cores the compute leaves plus a "
                               "quarter of the cores"
                             : "",
        r.space.intra_cap < r.space.cores ? ", or intra_op above OMP_NUM_THREADS" : "");
  }
  return out;
}

}  // namespace

std::string FormatMeasured(const MeasuredSetting& m) {
  return absl::StrFormat("  towers=%d intra=%d inter=%d batch=%d: %.0f ex/s\n", m.c.towers,
                         m.c.intra, m.c.inter, m.c.batch(), m.examples_per_sec);
}

std::string FormatTuneReport(const TuneResult& r) {
  std::vector<MeasuredSetting> sorted = r.measured;
  std::sort(sorted.begin(), sorted.end(), [](const MeasuredSetting& a, const MeasuredSetting& b) {
    return a.examples_per_sec > b.examples_per_sec;
  });
  std::string out =
      "\n| towers | intra_op | inter_op | batch/tower | global batch | ex/s | ex/s per core "
      "| vs best |\n|---|---|---|---|---|---|---|---|\n";
  for (const MeasuredSetting& m : sorted) out += TableRow(m, r);
  const MeasuredSetting& top = r.recommended;
  absl::StrAppendFormat(&out,
                        "\nbest: towers=%d intra_op_threads=%d inter_op_threads=%d batch_size=%d "
                        "(global %d): %.0f ex/s\n",
                        top.c.towers, top.c.intra, top.c.inter, top.c.batch(), top.c.step,
                        top.examples_per_sec);
  out += SearchEnd(r);
  if (r.batch_changes()) {
    const MeasuredSetting& f = r.fastest;
    absl::StrAppendFormat(&out, "%s: batch_size=%d (global %d) at %.0f ex/s, %.2fx the best at "
                                "global %d. %s.\n",
                          r.allow_batch_change ? "chosen (--allow_batch_change)" : "not chosen",
                          f.c.batch(), f.c.step, f.examples_per_sec,
                          f.examples_per_sec / r.best_fixed.examples_per_sec, r.global_batch,
                          BatchCostNote(r.global_batch, f.c.step));
  }
  return out;
}

std::string BatchCostNote(int from, int to) {
  const BatchCost a = NearestMeasured(from), b = NearestMeasured(to);
  std::string note = absl::StrFormat(
      "global batch %d instead of %d changes what the model learns, not only its speed", to, from);
  if (a.global_batch != b.global_batch) {
    absl::StrAppendFormat(&note,
                          "; measured with configs/deepfm_criteo.textproto on datagen data: "
                          "global batch %d had %+.3f test AUC against %d (docs/PERFORMANCE.md)",
                          b.global_batch, b.auc_delta - a.auc_delta, a.global_batch);
  }
  return note + "; check the AUC on your data before using it";
}

Config TunedFragment(const TuneResult& result, const TrainConfig& given) {
  const TuneCandidate& top = result.recommended.c;
  Config fragment;
  fragment.mutable_threads()->set_towers(top.towers);
  fragment.mutable_threads()->set_intra_op_threads(top.intra);
  fragment.mutable_threads()->set_inter_op_threads(top.inter);
  // With train.global_batch_size the towers split it: only a changed global batch
  // (--allow_batch_change) is written. Without, the towers changed the per-tower batch that keeps
  // the global batch (or --allow_batch_change chose another one): write it whenever it differs
  // from the config's.
  if (given.global_batch_size() > 0) {
    if (top.step != result.global_batch) fragment.mutable_train()->set_global_batch_size(top.step);
  } else if (top.batch() != given.batch_size()) {
    fragment.mutable_train()->set_batch_size(top.batch());
  }
  return fragment;
}

std::string TunedFragmentText(const Config& fragment, const TuneResult& result,
                              const std::string& path, absl::Time now) {
  return absl::StrCat(
      "# pstrain tune, ", absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", now, absl::UTCTimeZone()),
      ": best of ", result.measured.size(), " measured settings on ", result.space.cores,
      " cores, ", absl::StrFormat("%.0f", result.recommended.examples_per_sec),
      " ex/s.\n# Use: pstrain train --config <base config> --config ", path, "\n",
      ConfigToText(fragment));
}

}  // namespace pstrain
