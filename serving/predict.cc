#include "serving/predict.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/file.h"
#include "common/status.h"
#include "serving/scorer.h"
#include "worker/data/pipeline.h"
#include "worker/eval/metrics.h"

namespace pstrain {
namespace {

// A parser for rows without a label: each record is given a label column (0) before the trainer's
// parser of the format reads it. criteo_tsv: "0\t" in front; csv: ",<label>" after the header and
// ",0" after each line.
class UnlabelledParser : public RecordParser {
 public:
  UnlabelledParser(DataFormat format, std::unique_ptr<RecordParser> inner)
      : format_(format), inner_(std::move(inner)) {}
  void Parse(absl::Span<const RecordRef> records, RawRows* rows,
             std::vector<absl::Status>* errors) override {
    text_.resize(records.size());
    refs_.resize(records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      text_[i] = format_ == CRITEO_TSV ? absl::StrCat("0\t", records[i].data)
                                       : absl::StrCat(records[i].data, ",0");
      refs_[i] = records[i];
      refs_[i].data = text_[i];
    }
    inner_->Parse(refs_, rows, errors);
  }

 private:
  const DataFormat format_;
  std::unique_ptr<RecordParser> inner_;
  std::vector<std::string> text_;
  std::vector<RecordRef> refs_;
};

RecordFormats UnlabelledFormats() {
  RecordFormats f = RegisteredFormats();
  auto make = f.make_parser;
  f.make_parser = [make](DataFormat format, const FeatureSpec& spec,
                         absl::string_view header) -> absl::StatusOr<std::unique_ptr<RecordParser>> {
    const std::string labelled =
        format == CSV ? absl::StrCat(header, ",", spec.label_name()) : std::string(header);
    ASSIGN_OR_RETURN(std::unique_ptr<RecordParser> inner, make(format, spec, labelled));
    return std::unique_ptr<RecordParser>(new UnlabelledParser(format, std::move(inner)));
  };
  return f;
}

// The scores file, written in input order by whichever scoring thread completes the next batch.
class OrderedOutput {
 public:
  OrderedOutput(FILE* file, bool labels, int max_waiting)
      : file_(file), labels_(labels), max_waiting_(max_waiting) {}

  // Blocks while too many scored batches wait for an earlier one (bounds the memory).
  void WaitForRoom(int64_t seq) {
    absl::MutexLock l(&mu_);
    auto room = [this, seq]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return seq < next_ + max_waiting_ || !status_.ok();
    };
    mu_.Await(absl::Condition(&room));
  }

  // Hands in batch `seq`; writes it and every batch after it that is ready.
  void Deliver(int64_t seq, std::vector<float> probs, std::vector<float> labels) {
    absl::MutexLock l(&mu_);
    waiting_[seq] = {std::move(probs), std::move(labels)};
    for (auto it = waiting_.find(next_); it != waiting_.end(); it = waiting_.find(next_)) {
      Write(it->second.first, it->second.second);
      waiting_.erase(it);
      ++next_;
    }
  }

  void Fail(absl::Status s) {
    absl::MutexLock l(&mu_);
    if (status_.ok()) status_ = std::move(s);
  }
  absl::Status status() {
    absl::MutexLock l(&mu_);
    return status_;
  }
  const AucAccumulator& metrics() const { return acc_; }  // after every thread joined

 private:
  void Write(const std::vector<float>& probs, const std::vector<float>& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < probs.size(); ++i) {
      if (labels_) acc_.Add(probs[i], labels[i]);
      if (file_ == nullptr) continue;
      char line[64];
      const int n = labels_ ? std::snprintf(line, sizeof(line), "%.9g\t%.9g\n", probs[i], labels[i])
                            : std::snprintf(line, sizeof(line), "%.9g\n", probs[i]);
      if (std::fwrite(line, 1, n, file_) != static_cast<size_t>(n) && status_.ok()) {
        status_ = absl::UnavailableError("writing the scores: short write (disk full?)");
      }
    }
  }

  FILE* const file_;
  const bool labels_;
  const int max_waiting_;
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> waiting_
      ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  AucAccumulator acc_;  // written under mu_, read after the threads joined
};

}  // namespace

absl::StatusOr<PredictResult> RunPredict(std::shared_ptr<const ServingModel> model,
                                         const PredictOptions& o) {
  if (o.inputs.empty()) return absl::InvalidArgumentError("predict: no input (--input)");
  if (o.batch_size < 1 || o.towers < 1 || o.intra_op_threads < 1 || o.reader_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "predict: batch_size ", o.batch_size, ", towers ", o.towers, ", intra_op_threads ",
        o.intra_op_threads, " and reader_threads ", o.reader_threads, " must be >= 1"));
  }
  if (!o.has_labels && o.format != CRITEO_TSV && o.format != CSV) {
    return absl::InvalidArgumentError(absl::StrCat(
        "predict: rows without a label are read in criteo_tsv and csv only, not ",
        DataFormatName(o.format), " (whose records name their label)"));
  }
  DataConfig data;
  Channel* channel = data.add_eval();
  channel->set_name("predict");
  channel->set_format(o.format);
  for (const std::string& p : o.inputs) channel->add_path(p);
  PipelineOptions po =
      OptionsFromConfig(data, /*train=*/false, o.batch_size, /*shard_index=*/0, /*num_shards=*/1,
                        /*epochs=*/1, o.has_labels ? RegisteredFormats() : UnlabelledFormats());
  po.reader_threads = o.reader_threads;
  po.prefetch_batches = std::max(4, 2 * o.towers);
  po.max_bad_record_fraction = 0;  // a score for every row, or an error naming the bad one
  ASSIGN_OR_RETURN(auto pipeline, Pipeline::Create(std::move(po), model->spec()));

  std::vector<std::unique_ptr<Scorer>> scorers;
  for (int t = 0; t < o.towers; ++t) {
    ASSIGN_OR_RETURN(auto s, Scorer::Create(model, o.batch_size, o.intra_op_threads));
    scorers.push_back(std::move(s));
  }

  // The scores go to a temporary file renamed at the end: no partial output on failure.
  FILE* file = nullptr;
  std::string tmp;
  if (o.out == "-") {
    file = stdout;
  } else if (!o.out.empty()) {
    tmp = absl::StrCat(o.out, ".tmp.", getpid());
    // The temporary's name is predictable: never written through what is planted there.
    ASSIGN_OR_RETURN(const int fd, CreateFreshFile(tmp));
    file = ::fdopen(fd, "w");
    if (file == nullptr) {
      absl::Status s = ErrnoError("fdopen", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    std::setvbuf(file, nullptr, _IOFBF, 1 << 20);
  }
  OrderedOutput output(file, o.has_labels, 2 * o.towers);

  const double start = o.env->MonotonicSeconds();
  absl::Mutex read_mu;  // one thread at a time reads the pipeline (its one consumer)
  int64_t next_seq = 0;
  bool input_done = false;
  auto run = [&](Scorer* scorer) {
    Batch batch;
    std::vector<float> probs;
    while (true) {
      int64_t seq;
      {
        absl::MutexLock l(&read_mu);
        if (input_done) return;
        int64_t epoch;
        absl::StatusOr<bool> more = pipeline->Next(&batch, &epoch);
        if (!more.ok() || !*more) {
          input_done = true;
          if (!more.ok()) output.Fail(more.status());
          return;
        }
        seq = next_seq++;
      }
      output.WaitForRoom(seq);
      probs.resize(batch.size);
      absl::Status s =
          scorer->Score(batch.size, batch.ids.data(), batch.values.data(), nullptr, probs.data(),
                        batch.offsets.empty() ? nullptr : batch.offsets.data());
      if (!s.ok()) {
        output.Fail(std::move(s));
        absl::MutexLock l(&read_mu);
        input_done = true;
        return;
      }
      output.Deliver(seq, std::move(probs), std::move(batch.labels));
      probs = {};
      batch.labels = {};
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < o.towers; ++t) threads.emplace_back(run, scorers[t].get());
  run(scorers[0].get());
  for (std::thread& t : threads) t.join();

  absl::Status status = output.status();
  if (file != nullptr && file != stdout) {
    if (std::fclose(file) != 0 && status.ok()) status = ErrnoError("close", tmp);
  } else if (file == stdout) {
    std::fflush(stdout);
  }
  if (status.ok() && !tmp.empty() && std::rename(tmp.c_str(), o.out.c_str()) != 0) {
    status = ErrnoError("rename to " + o.out, tmp);
  }
  if (!status.ok()) {
    if (!tmp.empty()) std::remove(tmp.c_str());
    return status;
  }

  PredictResult r;
  r.seconds = o.env->MonotonicSeconds() - start;
  r.has_labels = o.has_labels;
  r.auc = r.logloss = r.positive_rate = std::nan("");
  const AucAccumulator& acc = output.metrics();
  if (o.has_labels) {
    r.examples = acc.count();
    ASSIGN_OR_RETURN(r.auc, acc.Auc());
    ASSIGN_OR_RETURN(r.logloss, acc.LogLoss());
    r.positive_rate = acc.PositiveRate();
  } else {
    r.examples = static_cast<int64_t>(pipeline->stats().records_read);
  }
  return r;
}

}  // namespace pstrain
