// A resume is a resume; new data is a new pass. Every checkpoint's worker state records the data
// spec of its training pass (the train channels with their paths expanded) and, through
// CommitCheckpoint, whether the whole job finished (checkpoint/layout.h). At the start of a run,
// DecidePass compares that with this run's data spec and train.on_new_data:
//
//   saved job   data spec   on_new_data   what happens
//   (none)      -           any           a fresh start: pass 0 over this run's data
//   unfinished  same        AUTO          an exact resume (the pipeline at its saved position)
//   unfinished  different   AUTO          refused (FAILED_PRECONDITION naming both specs and
//                                          --on_new_data)
//   finished    different   AUTO          a new pass over this run's data from the saved
//                                          parameters and optimizer slots
//   finished    same        AUTO          nothing to do (a message; the run trains nothing,
//                                          evaluates nothing and succeeds)
//   any         any         CONTINUE      as "same" above: resume the saved pass on its files
//   any         any         NEW_PASS      a new pass over this run's data
//
// The decision is a pure function of the restored state and this run's config, so the workers of
// a PS job and the ranks of an allreduce job, which restore the same checkpoint with the same
// config, all reach the same one. A checkpoint written before the spec was recorded has no
// data_spec: it resumes as before (an exact resume, or nothing to do once finished).
//
// Thread-safety: pure functions (ResolveDataSpec reads the file system).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"
#include "pstrain/state.pb.h"

namespace pstrain {

// The train channels of `data`, each with its name, format and expanded paths
// (worker/data/file_list.h ExpandPath) or, in pipe mode, its FIFO directory. Errors: a path that
// does not expand (NOT_FOUND naming it).
absl::StatusOr<DataSpec> ResolveDataSpec(const DataConfig& data);

// One line for messages: "train CRITEO_TSV [day1.tsv]", at most `max_files` names per channel
// then "... (N files)".
std::string DescribeDataSpec(const DataSpec& spec, int max_files = 3);

bool SameDataSpec(const DataSpec& a, const DataSpec& b);

enum class PassAction {
  kFresh,    // no checkpoint: the first pass
  kResume,   // continue the restored pass from its saved position
  kNewPass,  // a new pass over this run's data, from the restored parameters
  kNothing,  // the restored pass finished: train nothing
};

struct PassDecision {
  PassAction action = PassAction::kFresh;
  std::string message;  // one line for the log (empty for kFresh and a plain kResume)
};

// `restored` is this worker's state in the restored checkpoint (null for a fresh start), `end`
// that checkpoint's PassEnd when it ends its job's pass (checkpoint/layout.h ReadPassEnd; null
// otherwise), `checkpoint` its directory for messages; `train` gives on_new_data and max_steps.
// A pass that ended at max_steps is not finished for a run whose max_steps allows more steps of
// it (0, or more than it trained): that run resumes it. Error: FAILED_PRECONDITION for a changed
// spec under an unfinished job (AUTO).
absl::StatusOr<PassDecision> DecidePass(const WorkerState* restored, const PassEnd* end,
                                        const std::string& checkpoint, const DataSpec& now,
                                        const TrainConfig& train);

// A run that trains nothing is an error unless it was asked to do nothing (kNothing): the error
// of a pass that ended having trained no example in the whole job, FAILED_PRECONDITION naming
// the data spec.
absl::Status NoExamplesError(const DataSpec& spec);

}  // namespace pstrain
