#include "worker/train/data_pass.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/data/file_list.h"
#include "worker/data/record_io.h"

namespace pstrain {

absl::StatusOr<DataSpec> ResolveDataSpec(const DataConfig& data) {
  DataSpec spec;
  for (const Channel& c : data.train()) {
    DataSpec::Channel* out = spec.add_channel();
    out->set_name(c.name());
    out->set_format(c.format());
    if (!c.pipe_dir().empty()) {
      out->set_pipe_dir(c.pipe_dir());
      continue;
    }
    const std::vector<std::string> paths(c.path().begin(), c.path().end());
    ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandPath(paths));
    for (std::string& f : files) out->add_file(std::move(f));
  }
  return spec;
}

std::string DescribeDataSpec(const DataSpec& spec, int max_files) {
  std::vector<std::string> parts;
  for (const DataSpec::Channel& c : spec.channel()) {
    std::string files;
    if (!c.pipe_dir().empty()) {
      files = absl::StrCat("pipe ", c.pipe_dir());
    } else {
      const int n = c.file_size();
      const int shown = std::min(n, max_files);
      files = absl::StrJoin(c.file().begin(), c.file().begin() + shown, ", ");
      if (n > shown) absl::StrAppend(&files, ", ... (", n, " files)");
    }
    parts.push_back(absl::StrCat(c.name(), " ", DataFormatName(c.format()), " [", files, "]"));
  }
  return parts.empty() ? "no train channel" : absl::StrJoin(parts, "; ");
}

bool SameDataSpec(const DataSpec& a, const DataSpec& b) {
  // Deterministic serialization of the same message type: equal bytes iff equal fields.
  return a.SerializeAsString() == b.SerializeAsString();
}

absl::Status NoExamplesError(const DataSpec& spec) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the training pass over ", DescribeDataSpec(spec),
      " trained 0 examples: its files hold no record (an empty file, or every record rejected)"));
}

absl::StatusOr<PassDecision> DecidePass(const WorkerState* restored, const PassEnd* end,
                                        const std::string& checkpoint, const DataSpec& now,
                                        const TrainConfig& train) {
  const TrainConfig::OnNewData mode = train.on_new_data();
  PassDecision d;
  if (restored == nullptr) return d;  // kFresh
  // A checkpoint from before the spec was recorded: the pass it belongs to is unknown.
  const bool legacy = !restored->has_data_spec();
  const bool same = legacy || SameDataSpec(restored->data_spec(), now);
  // A pass stopped at max_steps goes on when this run allows more of its steps.
  const int64_t pass_steps = restored->step() - restored->pass_first_step();
  const bool more_steps =
      end != nullptr && end->max_steps_reached() &&
      (train.max_steps() == 0 || train.max_steps() > pass_steps);
  const bool finished =
      end != nullptr && !((same || mode == TrainConfig::CONTINUE) && more_steps);
  const std::string saved = legacy ? "(not recorded)" : DescribeDataSpec(restored->data_spec());
  if (mode == TrainConfig::NEW_PASS || (mode == TrainConfig::AUTO && finished && !same)) {
    d.action = PassAction::kNewPass;
    d.message = absl::StrCat(
        "new training pass over ", DescribeDataSpec(now), " from the parameters and optimizer "
        "slots of ", checkpoint, " (step ", restored->step(), ", ",
        finished ? "whose pass over " : "abandoning its unfinished pass over ", saved,
        finished ? " finished" : "", ")");
    return d;
  }
  if (mode == TrainConfig::AUTO && !same) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the training data changed under an unfinished job: ", checkpoint, " (step ",
        restored->step(), ") is part of a pass over ", saved, ", and this run's data is ",
        DescribeDataSpec(now),
        ". Choose: --on_new_data=continue resumes the saved pass on its own files; "
        "--on_new_data=new_pass abandons it and starts a new pass over this run's data from the "
        "saved parameters (or use a new --model_dir)"));
  }
  if (finished) {
    d.action = PassAction::kNothing;
    d.message = absl::StrCat(
        "nothing to train: ", checkpoint, " (step ", restored->step(),
        ") finished its pass over ", legacy ? DescribeDataSpec(now) : saved,
        end != nullptr && end->max_steps_reached()
            ? absl::StrCat(" (stopped at train.max_steps, ", pass_steps,
                           " steps: a larger max_steps continues it)")
            : "",
        ". New data starts a new pass by itself; --on_new_data=new_pass trains another pass over "
        "the same data");
    return d;
  }
  d.action = PassAction::kResume;
  if (mode == TrainConfig::CONTINUE && !same) {
    d.message = absl::StrCat("--on_new_data=continue: resuming the saved pass over ", saved,
                             "; this run's data (", DescribeDataSpec(now), ") is not read");
  }
  return d;
}

}  // namespace pstrain
