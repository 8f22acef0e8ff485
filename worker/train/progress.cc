#include "worker/train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "common/json_writer.h"
#include "common/metrics/metrics.h"
#include "common/status.h"

namespace pstrain {
namespace {

std::string Duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, (t / 60) % 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%ds", t);
}

}  // namespace

struct ProgressReporter::Gauges {
  explicit Gauges(int worker) {
    const std::map<std::string, std::string> label{{"worker", absl::StrCat(worker)}};
    worker_label = absl::StrCat(worker);
    auto gauge = [&label](const char* name, const char* help) {
      return &prometheus::BuildGauge().Name(name).Help(help).Register(Metrics()).Add(label);
    };
    examples = &prometheus::BuildCounter()
                    .Name("pstrain_worker_examples_total")
                    .Help("Examples trained by this worker in this run, as of its last logged step")
                    .Register(Metrics())
                    .Add(label);
    examples_per_sec = gauge("pstrain_worker_examples_per_second",
                             "Examples per second over the last logged interval");
    loss = gauge("pstrain_worker_loss", "Mean training loss over the last logged interval");
    step = gauge("pstrain_worker_step", "Training step");
    eval_auc = gauge("pstrain_worker_eval_auc", "AUC of the last evaluation (chief)");
    eval_logloss = gauge("pstrain_worker_eval_logloss", "Logloss of the last evaluation (chief)");
    auto& phases = prometheus::BuildCounter()
                       .Name("pstrain_worker_step_phase_seconds_total")
                       .Help("Trainer time per step phase: dedup, pull (waiting for it), compute "
                             "(the towers), reduce, push (waiting for it)")
                       .Register(Metrics());
    for (const char* p : {"dedup", "pull", "compute", "reduce", "push"}) {
      auto l = label;
      l["phase"] = p;
      phase.push_back(&phases.Add(l));
    }
  }
  // The dynamic tables' gauges (DynamicTables), by table: one per counter, made at first sight.
  std::vector<prometheus::Gauge*>& Dynamic(const std::string& table) {
    auto [it, inserted] = dynamic.try_emplace(table);
    if (inserted) {
      for (int i = 0; i < kDynamicCounters; ++i) {
        it->second.push_back(
            &prometheus::BuildGauge()
                 .Name(absl::StrCat("pstrain_worker_dynamic_", kDynamicNames[i]))
                 .Help(kDynamicHelp[i])
                 .Register(Metrics())
                 .Add({{"worker", worker_label}, {"table", table}}));
      }
    }
    return it->second;
  }
  static constexpr int kDynamicCounters = 7;
  static constexpr const char* kDynamicNames[kDynamicCounters] = {
      "rows_live", "admitted", "rejected", "evicted_ttl", "evicted_capacity",
      "new_ids_last_step", "bytes"};
  static constexpr const char* kDynamicHelp[kDynamicCounters] = {
      "Live rows of the dynamic table",
      "Rows the dynamic table created (ids admitted), since the job began",
      "Updates the dynamic table dropped (ids not admitted yet), since the job began",
      "Rows evicted by the TTL, since the job began",
      "Rows evicted above the row or byte cap, since the job began",
      "Rows created by the last step's update (new ids)",
      "Bytes the dynamic table's store holds"};
  std::string worker_label;
  std::map<std::string, std::vector<prometheus::Gauge*>> dynamic;
  prometheus::Counter* examples;
  prometheus::Gauge *examples_per_sec, *loss, *step, *eval_auc, *eval_logloss;
  std::vector<prometheus::Counter*> phase;
  double last_phase[5] = {0, 0, 0, 0, 0};
};

absl::StatusOr<std::unique_ptr<ProgressReporter>> ProgressReporter::Create(
    const std::string& model_dir, bool tty, double flush_seconds, int worker, Env* env) {
  RETURN_IF_ERROR(MakeDirs(model_dir));
  std::unique_ptr<ProgressReporter> p(new ProgressReporter());
  p->env_ = env;
  p->tty_ = tty;
  p->flush_seconds_ = flush_seconds;
  p->last_flush_ = env->MonotonicSeconds();
  p->gauges_ = std::make_unique<Gauges>(worker);
  const std::string path = model_dir + "/metrics.jsonl";
  // A regular file of the job's own: a FIFO or a symlink planted there is refused at once
  // (common/file.h OpenForAppend), never waited on or written through.
  ASSIGN_OR_RETURN(const int fd, OpenForAppend(path));
  p->jsonl_ = ::fdopen(fd, "a");
  if (p->jsonl_ == nullptr) {
    absl::Status s = ErrnoError("fdopen", path);
    ::close(fd);
    return s;
  }
  ASSIGN_OR_RETURN(p->events_, EventWriter::Create(model_dir, env));
  return p;
}

ProgressReporter::~ProgressReporter() {
  if (line_open_) std::fputc('\n', stderr);
  if (jsonl_) std::fclose(jsonl_);
}

void ProgressReporter::Line(const std::string& text, bool transient) {
  if (tty_ && transient) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    line_open_ = true;
  } else {
    if (line_open_) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stderr, "%s\n", text.c_str());
    line_open_ = false;
  }
  std::fflush(stderr);
}

void ProgressReporter::Train(int64_t step, int64_t epoch, double loss, double eps,
                             int64_t total_steps, double elapsed) {
  std::string text = absl::StrFormat("step %d  epoch %d  %.0f ex/s  loss %.4f", step, epoch + 1,
                                     eps, loss);
  if (last_auc_ >= 0) absl::StrAppend(&text, absl::StrFormat("  auc %.4f", last_auc_));
  if (total_steps > 0 && step > 0) {
    const double eta = elapsed / step * std::max<int64_t>(0, total_steps - step);
    absl::StrAppend(&text, absl::StrFormat("  %d%%  ETA %s", 100 * step / total_steps, Duration(eta)));
  }
  Line(text, /*transient=*/true);
  std::fprintf(jsonl_, "%s\n",
               JsonObject()
                   .Add("wall_time", env_->WallSeconds())
                   .Add("step", step)
                   .Add("epoch", epoch)
                   .Add("loss", loss).Add("examples_per_sec", eps).str().c_str());
  Record(events_->AddScalar("train/loss", step, loss));
  Record(events_->AddScalar("train/examples_per_sec", step, eps));
  gauges_->examples_per_sec->Set(eps);
  gauges_->loss->Set(loss);
  gauges_->step->Set(static_cast<double>(step));
  // Without periodic evaluation the points would otherwise wait in the buffers until the end.
  const double now = env_->MonotonicSeconds();
  if (now - last_flush_ >= flush_seconds_) Flush();
}

void ProgressReporter::Examples(int64_t n) { gauges_->examples->Increment(static_cast<double>(n)); }

void ProgressReporter::StepPhases(double dedup, double pull, double compute, double reduce,
                                  double push) {
  const double v[5] = {dedup, pull, compute, reduce, push};
  for (int i = 0; i < 5; ++i) {
    if (v[i] > gauges_->last_phase[i]) gauges_->phase[i]->Increment(v[i] - gauges_->last_phase[i]);
    gauges_->last_phase[i] = v[i];
  }
}

void ProgressReporter::DynamicTables(int64_t step,
                                     const std::vector<DynamicTableMetrics>& tables) {
  for (const DynamicTableMetrics& t : tables) {
    const int64_t v[Gauges::kDynamicCounters] = {t.rows_live,        t.admitted,
                                                 t.rejected,         t.evicted_ttl,
                                                 t.evicted_capacity, t.new_ids_last_step,
                                                 t.bytes};
    JsonObject j;
    j.Add("wall_time", env_->WallSeconds()).Add("step", step).Add("dynamic_table", t.table);
    std::vector<prometheus::Gauge*>& gauges = gauges_->Dynamic(t.table);
    for (int i = 0; i < Gauges::kDynamicCounters; ++i) {
      j.Add(Gauges::kDynamicNames[i], v[i]);
      gauges[i]->Set(static_cast<double>(v[i]));
      Record(events_->AddScalar(absl::StrCat("dynamic/", t.table, "/", Gauges::kDynamicNames[i]),
                                step, static_cast<double>(v[i])));
    }
    std::fprintf(jsonl_, "%s\n", j.str().c_str());
  }
}

void ProgressReporter::Eval(int64_t step, double auc, double logloss, int64_t examples,
                            bool final_eval) {
  last_auc_ = auc;
  Line(absl::StrFormat("%s at step %d: auc %.5f  logloss %.5f  (%d examples)",
                       final_eval ? "final eval" : "eval", step, auc, logloss, examples),
       /*transient=*/false);
  std::fprintf(jsonl_, "%s\n",
               JsonObject()
                   .Add("wall_time", env_->WallSeconds())
                   .Add("step", step)
                   .Add("eval_auc", auc)
                   .Add("eval_logloss", logloss).Add("eval_examples", examples).str().c_str());
  gauges_->eval_auc->Set(auc);
  gauges_->eval_logloss->Set(logloss);
  Record(events_->AddScalar("eval/auc", step, auc));
  Record(events_->AddScalar("eval/logloss", step, logloss));
  Flush();
}

void ProgressReporter::Record(const absl::Status& s) {
  // Metrics are for people watching the run: a full disk must not stop training, but it must not
  // go unnoticed either. Say it once.
  if (!s.ok() && !events_failed_) {
    events_failed_ = true;
    Line(absl::StrCat("warning: TensorBoard events are no longer written: ", s.ToString()),
         /*transient=*/false);
  }
}

void ProgressReporter::Message(const std::string& text) { Line(text, /*transient=*/false); }

void ProgressReporter::Flush() {
  last_flush_ = env_->MonotonicSeconds();
  std::fflush(jsonl_);
  Record(events_->Flush());
}

}  // namespace pstrain
