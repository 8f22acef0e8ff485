// What `pstrain tune` tells the user about a search (worker/tune/search.h): a progress line per
// measured setting, the table and the verdict, and the config fragment that a later
// `pstrain train --config base --config tuned.textproto` merges over its base config.
//
// The text is a user interface that scripts and tests read ("global batch N ... is kept",
// "search complete" / "budget spent", "not chosen", "changes what the model learns"): change it
// only together with tests/cmd/tune_test.cc and docs/PERFORMANCE.md.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "pstrain/config.pb.h"
#include "worker/tune/search.h"

namespace pstrain {

// "  towers=4 intra=1 inter=2 batch=128: 51234 ex/s\n".
std::string FormatMeasured(const MeasuredSetting& m);

// The table of every measured setting, fastest first, with ratios within the run; the
// recommended setting; why the search ended (complete, or the budget and what was not tried);
// the grid combinations the space refused; and, when the fastest setting changes the global
// batch, whether it was chosen and its known AUC cost (BatchCostNote). Lines end in "\n".
std::string FormatTuneReport(const TuneResult& result);

// What the measurements of docs/PERFORMANCE.md say about training with global batch `to`
// instead of `from`: that it changes what the model learns, the nearest measured AUC
// difference when the two round to different measured batches, and to check it on your data.
std::string BatchCostNote(int from, int to);

// The config fragment of the recommended setting: its threads; with train.global_batch_size in
// `given`, a global batch only when the recommendation changes it; without, the per-tower batch
// whenever it differs from `given`'s batch_size (the towers changed the share that keeps the
// global batch, or a changed batch was allowed). Nothing else.
Config TunedFragment(const TuneResult& result, const TrainConfig& given);

// The fragment file's text: a comment naming the search (made at `now`, UTC) and the command
// that uses `path`, then the fragment as a text proto.
std::string TunedFragmentText(const Config& fragment, const TuneResult& result,
                              const std::string& path, absl::Time now);

}  // namespace pstrain
