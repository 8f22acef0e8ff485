// Full vs incremental checkpoint of `pstrain train`'s in-process parameters (docs/PERFORMANCE.md
// "Incremental checkpoints"): the rows of a config's embedding table touched by the first
// --examples examples of real data are trained (one optimizer update per batch of ids, with
// random gradients: which rows a step touches comes from the data, the values do not matter for
// size and time), a full checkpoint is written, then --steps more batches are trained and a delta
// is written (checkpoint.incremental_every > 1), as SaveCheckpoint writes them. Repeated
// --repeats times (each a new full + delta pair); prints every checkpoint's bytes, wall seconds and
// the CPU seconds of the saving thread (the stores run single-threaded here, so that is all the
// save's work; the wall time also waits for the disk and, on a shared machine, for a core), then
// the medians and the ratios. A save's time includes its retention (deleting checkpoints no
// longer kept: --keep): with the default 4, from the third pair on each delta's commit deletes the
// oldest full checkpoint, whose unlink is a large part of a delta's wall time. --fill_rows adds
// rows (random weights, initial slots) spread over the table until the store holds that many, for
// a table larger than the data trains.
//
// usage: incremental_checkpoint_app --config configs/deepfm_criteo.textproto
//            --train '/work/benchdata/train/part-*' --format TFRECORD --model_dir /tmp/incr
//            [--examples 2000000] [--steps 100] [--repeats 3] [--fill_rows 0] [--keep 4]
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/app_util.h"
#include "checkpoint/layout.h"
#include "common/config.h"
#include "common/flags.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/data/pipeline.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "incremental_checkpoint_app: %s\n", s.ToString().c_str());
  return 1;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

uint64_t DirBytes(const std::string& ckpt, const CheckpointManifest& m) {
  uint64_t bytes = 0;
  for (const auto& f : m.file()) bytes += f.bytes();
  struct stat st;
  if (::stat((ckpt + "/MANIFEST").c_str(), &st) == 0) bytes += st.st_size;
  return bytes;
}

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  std::string config_path, train, format = "TFRECORD", model_dir;
  int64_t examples = 2000000, fill_rows = 0;
  int steps = 100, repeats = 3, keep = 4;
  FlagSet flags("incremental_checkpoint_app", "Times a full and an incremental checkpoint.");
  flags.String("config", &config_path, "the training config (required)");
  flags.String("train", &train, "training data paths (required)");
  flags.String("format", &format, "its DataFormat name");
  flags.String("model_dir", &model_dir, "where the checkpoints go (required; emptied)");
  flags.Int64("examples", &examples, "examples whose rows are trained before the full checkpoint");
  flags.Int("steps", &steps, "batches trained between the full and the incremental checkpoint");
  flags.Int("repeats", &repeats, "full + delta pairs");
  flags.Int("keep", &keep,
            "checkpoint.keep_last: with 4, from the third pair on each delta's commit deletes "
            "the oldest full checkpoint (retention); with >= 2 x repeats no save deletes any");
  flags.Int64("fill_rows", &fill_rows, "rows the store holds at least before the first save");
  if (std::optional<int> code = ParseAppFlags(flags, argc, argv)) return *code;
  DataFormat data_format;
  if (config_path.empty() || train.empty() || model_dir.empty() ||
      !DataFormat_Parse(format, &data_format) || repeats < 1 || steps < 1 || keep < 1) {
    std::fprintf(stderr, "--config, --train, --model_dir are required; --format a DataFormat\n");
    return 2;
  }
  absl::StatusOr<Config> loaded = LoadConfigFile(config_path);
  if (!loaded.ok()) return Fail(loaded.status());
  Config config = *loaded;
  ApplyConfigDefaults(&config);
  config.mutable_data()->clear_train();
  Channel* channel = config.mutable_data()->add_train();
  channel->add_path(train);
  channel->set_format(data_format);
  absl::StatusOr<FeatureSpec> spec = FeatureSpec::Create(config.features());
  if (!spec.ok()) return Fail(spec.status());
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(config.model(), spec->num_fields());
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<std::unique_ptr<LocalParams>> params =
      LocalParams::Create(**model, spec->total_rows(), config, /*threads=*/1);
  if (!params.ok()) return Fail(params.status());
  absl::StatusOr<ModelDescription> description = DescribeModel(config);
  if (!description.ok()) return Fail(description.status());
  const int batch = config.train().global_batch_size() > 0
                        ? config.train().global_batch_size()
                        : config.train().batch_size() * std::max(1, config.threads().towers());
  PipelineOptions po = OptionsFromConfig(config.data(), /*train=*/true, batch, 0, 1,
                                         /*epochs=*/0);
  absl::StatusOr<std::unique_ptr<Pipeline>> pipeline = Pipeline::Create(std::move(po), *spec);
  if (!pipeline.ok()) return Fail(pipeline.status());

  const int dim = (*params)->row_dim();
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> grad(-0.01f, 0.01f);
  std::vector<float> grads, dense((*params)->dense_size());
  Batch b;
  int64_t step = 0, trained = 0;
  // One update of the batch's distinct rows and the dense vector: a training step's push.
  auto train_step = [&]() -> absl::Status {
    int64_t epoch;
    absl::StatusOr<bool> got = (*pipeline)->Next(&b, &epoch);
    if (!got.ok()) return got.status();
    std::vector<int64_t> ids = b.ids;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    grads.resize(ids.size() * dim);
    for (float& g : grads) g = grad(rng);
    for (float& g : dense) g = grad(rng);
    trained += b.size;
    return (*params)->Push(ids, grads.data(), dense.data(), ++step);
  };

  std::system(("rm -rf " + model_dir).c_str());
  const std::string& dir = model_dir;
  ReplicaDeltas deltas(/*incremental_every=*/2);
  std::vector<double> full_s, delta_s, full_c, delta_c, full_b, delta_b;
  auto save = [&](std::vector<double>* secs, std::vector<double>* cpu,
                  std::vector<double>* bytes) -> absl::Status {
    WorkerState state;
    state.set_step(step);
    const auto t = std::chrono::steady_clock::now();
    const double c = ThreadCpuSeconds();
    absl::StatusOr<std::string> saved =
        SaveCheckpoint(dir, state, **params, keep, *description, &deltas);
    if (!saved.ok()) return saved.status();
    cpu->push_back(ThreadCpuSeconds() - c);
    secs->push_back(Seconds(t));
    CheckpointManifest m;
    if (absl::Status s = ReadManifest(*saved, &m); !s.ok()) return s;
    bytes->push_back(static_cast<double>(DirBytes(*saved, m)));
    absl::PrintF("%s (%s): %d bytes in %.3f s (cpu %.3f s), %d rows stored, after %d examples\n",
                 *saved, m.has_delta() ? "delta" : "full", static_cast<int64_t>(bytes->back()),
                 secs->back(), cpu->back(), (*params)->embedding()->stats().rows_initialized,
                 trained);
    return absl::OkStatus();
  };
  const auto fill = std::chrono::steady_clock::now();
  while (trained < examples) {
    if (absl::Status s = train_step(); !s.ok()) return Fail(s);
  }
  absl::PrintF("trained the rows of %d examples (%d steps of %d) in %.1f s\n", trained, step,
               batch, Seconds(fill));
  const int64_t stored = (*params)->embedding()->stats().rows_initialized;
  if (fill_rows > stored) {
    // Rows spread over the table (a stride), with random weights and initial slots; rows already
    // trained keep theirs.
    const int64_t table = spec->total_rows(), add = fill_rows - stored;
    std::normal_distribution<float> value(0, 0.05f);
    std::vector<int64_t> ids;
    std::vector<float> weights;
    for (int64_t i = 0; i < table && static_cast<int64_t>(ids.size()) < add; ++i) {
      const int64_t row = (i * 7919) % table;
      if ((*params)->embedding()->Snapshot(row, row + 1).rows() > 0) continue;
      ids.push_back(row);
      for (int j = 0; j < dim; ++j) weights.push_back(value(rng));
    }
    std::sort(ids.begin(), ids.end());
    if (absl::Status s = (*params)->embedding()->RestoreRows(ids, weights.data(), nullptr);
        !s.ok()) {
      return Fail(s);
    }
    absl::PrintF("filled to %d rows\n", (*params)->embedding()->stats().rows_initialized);
  }
  auto train_steps = [&]() -> absl::Status {
    for (int i = 0; i < steps; ++i) RETURN_IF_ERROR(train_step());
    return absl::OkStatus();
  };
  // incremental_every 2: full and delta alternate, each after --steps steps.
  for (int r = 0; r < repeats; ++r) {
    if (absl::Status s = save(&full_s, &full_c, &full_b); !s.ok()) return Fail(s);
    if (absl::Status s = train_steps(); !s.ok()) return Fail(s);
    if (absl::Status s = save(&delta_s, &delta_c, &delta_b); !s.ok()) return Fail(s);
    if (absl::Status s = train_steps(); !s.ok()) return Fail(s);
  }
  auto range = [](const std::vector<double>& v) {
    return absl::StrFormat("%.3f s [%.3f, %.3f]", Median(v), *std::min_element(v.begin(), v.end()),
                           *std::max_element(v.begin(), v.end()));
  };
  absl::PrintF(
      "median of %d: full %.0f bytes, wall %s, cpu %s; delta after %d steps %.0f bytes, wall %s, "
      "cpu %s; smaller %.1fx, wall %.1fx, cpu %.1fx\n",
      repeats, Median(full_b), range(full_s), range(full_c), steps, Median(delta_b),
      range(delta_s), range(delta_c), Median(full_b) / Median(delta_b),
      Median(full_s) / Median(delta_s), Median(full_c) / Median(delta_c));
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) { return pstrain::Main(argc, argv); }
