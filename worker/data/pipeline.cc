#include "worker/data/pipeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/data/file_list.h"
#include "worker/data/validation_split.h"

namespace pstrain {

// An interned file: records point at it for their path (error messages) and parser choice.
struct Pipeline::FileInfo {
  std::string path;
  std::string header;  // CSV header line
  int channel = 0;
};

// A raw record, owned: the source's view dies at its next read, and the record may wait in a
// window buffer or an in-flight batch for a while.
struct Pipeline::Held {
  std::string data;
  const FileInfo* file = nullptr;
  uint64_t number = 0;
};

struct Pipeline::Group {
  enum State { kQueued, kParsing, kReady };
  State state = kQueued;
  int64_t epoch = 0;
  std::vector<Held> records;
  // Set by the producer: corrupt records skipped while forming the group (per channel), the
  // first bad-record error, or a fatal error that ends the stream after this group.
  std::vector<uint64_t> framing_bad;
  absl::Status error;
  bool error_fatal = false;
  // Set by the parser thread.
  Batch batch;
  std::vector<uint64_t> parse_bad;
  uint64_t truncated_lists = 0;  // lists cut to their field's max_length
  absl::Status parse_error;  // the first rejected record
  absl::Status parse_fatal;  // no parser for this format / header
};

struct Pipeline::ChannelState {
  std::vector<std::string> files;  // this epoch's, shuffled and sharded
  size_t cursor = 0;
  std::unique_ptr<RecordSource> src;  // open on files[cursor], or null
  const FileInfo* file = nullptr;     // src's
  // Where to resume in files[cursor] when src is null (set by a restore).
  uint64_t offset = 0;
  uint64_t source_records = 0;
  uint64_t epoch_records = 0;  // framed records this epoch (SHARD_BY_RECORD index)
  bool input_done = false;
  bool exhausted = false;
  Rng shuffle_rng;
  std::vector<Held> buffer;  // window shuffle buffer
};

// Per reader thread: parsers by (format, CSV header), and scratch reused across groups.
class Pipeline::ParserCache {
 public:
  absl::StatusOr<RecordParser*> Get(const FileInfo* file, DataFormat format,
                                    const RecordFormats& formats, const FeatureSpec& spec) {
    if (auto it = by_file_.find(file); it != by_file_.end()) return it->second;
    const std::string key = absl::StrCat(static_cast<int>(format), ":", file->header);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) {
      ASSIGN_OR_RETURN(std::unique_ptr<RecordParser> parser,
                       formats.make_parser(format, spec, file->header));
      it = by_key_.emplace(key, std::move(parser)).first;
    }
    by_file_[file] = it->second.get();
    return it->second.get();
  }

  RawRows raw;
  std::vector<absl::Status> errors;
  std::vector<RecordRef> refs;

 private:
  absl::flat_hash_map<std::string, std::unique_ptr<RecordParser>> by_key_;
  absl::flat_hash_map<const FileInfo*, RecordParser*> by_file_;
};

namespace {

constexpr int kPositionVersion = 1;
constexpr uint64_t kFileOrderTag = 0x66696c65;   // "file"
constexpr uint64_t kShuffleTag = 0x73687566;     // "shuf"
constexpr uint64_t kInterleaveTag = 0x6d697820;  // "mix "
constexpr uint64_t kMinRecordsForFractionCheck = 1000;
constexpr int kMaxLoggedBadRecords = 10;

uint64_t MixSeed(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x243f6a8885a308d3ull;
  for (uint64_t p : parts) h = SplitMix64(h ^ p);
  return h;
}

void SaveRng(const Rng& rng, google::protobuf::RepeatedField<uint64_t>* out) {
  out->Clear();
  for (uint64_t w : rng.state()) out->Add(w);
}

absl::Status LoadRng(const google::protobuf::RepeatedField<uint64_t>& words, absl::string_view what,
                     Rng* rng) {
  if (words.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline position: ", what, " has ", words.size(), " words, expected 4"));
  }
  rng->set_state({words[0], words[1], words[2], words[3]});
  return absl::OkStatus();
}

bool IsPipe(const Channel& ch) { return !ch.pipe_dir().empty(); }

}  // namespace

PipelineOptions OptionsFromConfig(const DataConfig& data, bool train, int batch_size,
                                  int shard_index, int num_shards, int64_t epochs,
                                  RecordFormats formats) {
  PipelineOptions o;
  const auto& channels = train ? data.train() : data.eval();
  o.channels.assign(channels.begin(), channels.end());
  o.batch_size = batch_size;
  o.shard_index = shard_index;
  o.num_shards = num_shards;
  o.epochs = epochs;
  o.seed = data.shuffle_seed();
  o.shuffle_files = train && data.shuffle_files();
  o.shuffle_buffer = train ? data.shuffle_buffer() : 0;
  o.prefetch_batches = data.prefetch_batches();
  o.max_bad_record_fraction = data.max_bad_record_fraction();
  if (train) o.validation_fraction = data.validation_fraction();  // the training part
  // Unless the caller injects its own formats: the registry's, with the config's record limit.
  o.formats = formats.open_source ? std::move(formats)
                                  : RegisteredFormats(static_cast<size_t>(data.max_record_bytes()));
  return o;
}

PipelineOptions ValidationOptionsFromConfig(const DataConfig& data, int batch_size) {
  DataConfig eval = data;
  *eval.mutable_eval() = data.train();
  PipelineOptions o = OptionsFromConfig(eval, /*train=*/false, batch_size, /*shard_index=*/0,
                                        /*num_shards=*/1, /*epochs=*/1);
  o.validation_fraction = data.validation_fraction();
  o.validation_part = true;
  return o;
}

Pipeline::Pipeline(PipelineOptions options, const FeatureSpec& spec)
    : options_(std::move(options)), spec_(spec) {}

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(PipelineOptions options,
                                                           const FeatureSpec& spec) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline options: ", parts...));
  };
  if (options.channels.empty()) return invalid("no channels");
  if (!options.formats.open_source || !options.formats.make_parser) {
    return invalid("formats not set (use RegisteredFormats())");
  }
  if (!(options.validation_fraction >= 0 && options.validation_fraction < 1)) {
    return invalid("validation_fraction must be in [0, 1), got ", options.validation_fraction);
  }
  if (options.batch_size < 1) return invalid("batch_size must be >= 1, got ", options.batch_size);
  // Batch::offsets and the towers' slots are int32: a batch's entries must fit.
  if (const int64_t most = int64_t{options.batch_size} * spec.max_entries_per_example();
      most > std::numeric_limits<int32_t>::max()) {
    return invalid("batch_size ", options.batch_size, " x up to ", spec.max_entries_per_example(),
                   " ids an example (the list fields' max_length) may make ", most,
                   " entries, more than 2^31 - 1; lower the batch size or list.max_length");
  }
  if (options.num_shards < 1 || options.shard_index < 0 ||
      options.shard_index >= options.num_shards) {
    return invalid("shard_index ", options.shard_index,
                   " is not in [0, num_shards = ", options.num_shards, ")");
  }
  if (options.epochs < 0) return invalid("epochs must be >= 0 (0 = forever), got ", options.epochs);
  if (options.reader_threads < 1) {
    return invalid("reader_threads must be >= 1, got ", options.reader_threads);
  }
  if (options.prefetch_batches < 1) {
    return invalid("prefetch_batches must be >= 1, got ", options.prefetch_batches);
  }
  if (!(options.max_bad_record_fraction >= 0 && options.max_bad_record_fraction <= 1)) {
    return invalid("max_bad_record_fraction must be in [0, 1], got ",
                   options.max_bad_record_fraction);
  }
  for (size_t c = 0; c < options.channels.size(); ++c) {
    const Channel& ch = options.channels[c];
    if (ch.name().empty()) return invalid("channel ", c, " has no name");
    for (size_t d = 0; d < c; ++d) {
      if (options.channels[d].name() == ch.name()) {
        return invalid("channel name '", ch.name(), "' appears twice");
      }
    }
    if (!(ch.weight() > 0) || !std::isfinite(ch.weight())) {
      return invalid("channel '", ch.name(), "': weight must be > 0, got ", ch.weight());
    }
    if (ch.path_size() == 0 && !IsPipe(ch)) {
      return invalid("channel '", ch.name(), "': no path and no pipe_dir");
    }
  }
  std::unique_ptr<Pipeline> p(new Pipeline(std::move(options), spec));
  RETURN_IF_ERROR(p->Init());
  return p;
}

absl::Status Pipeline::Init() {
  const size_t nc = options_.channels.size();
  all_files_.resize(nc);
  for (size_t c = 0; c < nc; ++c) {
    const Channel& ch = options_.channels[c];
    if (IsPipe(ch)) continue;
    ASSIGN_OR_RETURN(all_files_[c],
                     ExpandPath(std::vector<std::string>(ch.path().begin(), ch.path().end())));
    if (all_files_[c].empty()) {
      return absl::NotFoundError(absl::StrCat("channel '", ch.name(), "': no files"));
    }
    if (ch.shard_policy() == SHARD_BY_FILE &&
        all_files_[c].size() < static_cast<size_t>(options_.num_shards)) {
      return absl::FailedPreconditionError(
          absl::StrCat("channel '", ch.name(), "': ", all_files_[c].size(),
                       " file(s) cannot be sharded by file ", "over ", options_.num_shards,
                       " readers (each needs at least one file); add files or use ",
                       "shard_policy: SHARD_BY_RECORD"));
    }
  }
  {
    absl::MutexLock l(&mu_);
    for (const Channel& ch : options_.channels) stats_.channels.push_back({ch.name(), 0, 0});
  }
  absl::MutexLock sl(&state_mu_);
  for (size_t c = 0; c < nc; ++c) {
    channels_.push_back(std::make_unique<ChannelState>());
    channels_[c]->shuffle_rng.Seed(
        MixSeed({options_.seed, kShuffleTag, c, static_cast<uint64_t>(options_.shard_index)}));
  }
  interleave_rng_.Seed(
      MixSeed({options_.seed, kInterleaveTag, static_cast<uint64_t>(options_.shard_index)}));
  if (options_.start.has_value()) {
    RETURN_IF_ERROR(Restore(*options_.start));
  } else {
    StartEpoch(0);
  }
  producer_ = std::thread([this] { ProducerLoop(); });
  for (int i = 0; i < options_.reader_threads; ++i) readers_.emplace_back([this] { ReaderLoop(); });
  return absl::OkStatus();
}

Pipeline::~Pipeline() {
  int wake_fd = -1;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    // A producer blocked opening a FIFO that no writer opened yet: become a writer so that the
    // open returns (O_RDWR never blocks on Linux); the newline also releases an opener that reads
    // a CSV header before returning. The producer then sees stop_ and reads nothing.
    if (!opening_fifo_.empty()) {
      wake_fd = ::open(opening_fifo_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
      struct stat st;
      if (wake_fd >= 0 && (::fstat(wake_fd, &st) != 0 || !S_ISFIFO(st.st_mode))) {
        ::close(wake_fd);  // never write into anything but a FIFO
        wake_fd = -1;
      }
      if (wake_fd >= 0 && ::write(wake_fd, "\n", 1) < 0) {
        PSTRAIN_LOG(WARNING) << "waking the reader of " << opening_fifo_ << " failed";
      }
    }
  }
  if (producer_.joinable()) producer_.join();
  for (std::thread& t : readers_) t.join();
  if (wake_fd >= 0) ::close(wake_fd);
}

std::vector<std::string> Pipeline::EpochFiles(int c, int64_t epoch) const {
  const Channel& ch = options_.channels[c];
  if (IsPipe(ch)) return {absl::StrCat(ch.pipe_dir(), "/", ch.name(), "_", epoch)};
  std::vector<std::string> files = all_files_[c];
  if (options_.shuffle_files) {
    // Fisher-Yates on our own RNG: std::shuffle's algorithm is not specified, and every reader
    // (and every build) must agree on the permutation.
    Rng rng(MixSeed(
        {options_.seed, kFileOrderTag, static_cast<uint64_t>(c), static_cast<uint64_t>(epoch)}));
    for (size_t i = files.size(); i > 1; --i) std::swap(files[i - 1], files[rng.Uniform(i)]);
  }
  if (ch.shard_policy() == SHARD_BY_FILE && options_.num_shards > 1) {
    std::vector<std::string> mine;
    for (size_t i = options_.shard_index; i < files.size(); i += options_.num_shards) {
      mine.push_back(std::move(files[i]));
    }
    files = std::move(mine);
  }
  return files;
}

void Pipeline::StartEpoch(int64_t epoch) {
  epoch_ = epoch;
  for (size_t c = 0; c < channels_.size(); ++c) {
    ChannelState& ch = *channels_[c];
    ch.files = EpochFiles(static_cast<int>(c), epoch);
    ch.cursor = 0;
    ch.src.reset();
    ch.file = nullptr;
    ch.offset = ch.source_records = ch.epoch_records = 0;
    ch.input_done = ch.exhausted = false;
    ch.buffer.clear();
  }
}

absl::Status Pipeline::EndEpoch(bool* end) {
  uint64_t framed = 0;
  for (const auto& ch : channels_) framed += ch->epoch_records;
  if (options_.epochs > 0 && epoch_ + 1 >= options_.epochs) {
    done_ = true;
    *end = true;
    return absl::OkStatus();
  }
  if (framed == 0 && options_.epochs == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch ", epoch_, " had no records for reader ", options_.shard_index, " of ",
        options_.num_shards, "; with epochs = 0 (repeat forever) it would never deliver a batch"));
  }
  StartEpoch(epoch_ + 1);
  return absl::OkStatus();
}

const Pipeline::FileInfo* Pipeline::InternFile(int channel, const std::string& path,
                                               const std::string& header) {
  std::string key = absl::StrCat(channel, "\n", path, "\n", header);
  auto it = file_index_.find(key);
  if (it != file_index_.end()) return it->second;
  files_.push_back(std::make_unique<FileInfo>(FileInfo{path, header, channel}));
  file_index_.emplace(std::move(key), files_.back().get());
  return files_.back().get();
}

absl::Status Pipeline::OpenCurrentFile(int c) {
  ChannelState& ch = *channels_[c];
  const Channel& cfg = options_.channels[c];
  const std::string path = ch.files[ch.cursor];
  const bool pipe = IsPipe(cfg);
  {
    absl::MutexLock l(&mu_);
    if (stop_) return absl::CancelledError("pipeline stopped");
    if (pipe) opening_fifo_ = path;
  }
  // An open can block (a FIFO waits for its writer), so position() must not wait for it: the
  // state is consistent here (the forming group and the drawn channel are part of it), and only
  // this thread changes it.
  state_mu_.Unlock();
  auto src = options_.formats.open_source(cfg.format(), path, cfg.compression());
  state_mu_.Lock();
  {
    absl::MutexLock l(&mu_);
    opening_fifo_.clear();
    if (stop_) return absl::CancelledError("pipeline stopped");
  }
  if (!src.ok()) return Annotate(src.status(), absl::StrCat("channel '", cfg.name(), "'"));
  ch.src = std::move(*src);
  if (ch.offset > 0 || ch.source_records > 0) {
    if (pipe) {
      // A FIFO cannot seek: drop the records the saved position had consumed.
      while (ch.src->records() < ch.source_records) {
        if (stop_) return absl::CancelledError("pipeline stopped");
        RecordRef rec;
        bool eof = false;
        const absl::Status s = ch.src->Next(&rec, &eof);
        if (!s.ok() && !absl::IsDataLoss(s)) {
          return Annotate(s, "re-reading a FIFO up to the restored position");
        }
        if (eof) {
          return absl::DataLossError(absl::StrCat(
              path, ": the FIFO ended after ", ch.src->records(), " records, before the restored ",
              "position (", ch.source_records, " records); after a restore the writer must ",
              "replay the epoch's stream from its start"));
        }
      }
    } else {
      RETURN_IF_ERROR(
          Annotate(ch.src->Seek(ch.offset, ch.source_records), "seeking to the restored position"));
    }
  }
  ch.file = InternFile(c, path, std::string(ch.src->header()));
  return absl::OkStatus();
}

absl::Status Pipeline::ReadInput(int c, Group* g, Held* out, bool* eof) {
  ChannelState& ch = *channels_[c];
  const bool by_record =
      options_.channels[c].shard_policy() == SHARD_BY_RECORD && options_.num_shards > 1;
  auto close_file = [&ch] {
    ch.src.reset();
    ch.file = nullptr;
    ch.offset = ch.source_records = 0;
    ++ch.cursor;
  };
  // Counts a bad record; with no tolerance it ends the stream right here.
  auto bad = [&](const absl::Status& s) {
    ++g->framing_bad[c];
    if (g->error.ok()) g->error = s;
    return options_.max_bad_record_fraction > 0 ? absl::OkStatus() : s;
  };
  while (true) {
    if (stop_.load(std::memory_order_relaxed)) return absl::CancelledError("pipeline stopped");
    if (ch.cursor >= ch.files.size()) {
      *eof = true;
      return absl::OkStatus();
    }
    if (!ch.src) RETURN_IF_ERROR(OpenCurrentFile(c));
    RecordRef rec;
    bool end = false;
    const absl::Status s = ch.src->Next(&rec, &end);
    if (s.ok() && end) {
      close_file();
      continue;
    }
    if (s.ok() || absl::IsDataLoss(s)) {
      const uint64_t index = ch.epoch_records++;
      if (by_record && index % options_.num_shards != static_cast<uint64_t>(options_.shard_index)) {
        continue;
      }
      if (!s.ok()) {
        RETURN_IF_ERROR(bad(s));
        continue;
      }
      if (options_.validation_fraction > 0 &&
          InValidationSplit(rec.data, options_.validation_fraction) != options_.validation_part) {
        continue;  // the other side of the validation split
      }
      out->data.assign(rec.data.data(), rec.data.size());
      out->file = ch.file;
      out->number = rec.number;
      *eof = false;
      return absl::OkStatus();
    }
    // The rest of this file cannot be read (truncated, I/O): one bad record, skip the file.
    RETURN_IF_ERROR(bad(Annotate(s, "the rest of the file is skipped")));
    close_file();
  }
}

absl::Status Pipeline::NextRecord(int c, Group* g, bool* got) {
  ChannelState& ch = *channels_[c];
  *got = false;
  if (ch.exhausted) return absl::OkStatus();
  const size_t window = options_.shuffle_buffer > 1 ? options_.shuffle_buffer : 0;
  Held h;
  bool eof = false;
  if (window == 0) {
    RETURN_IF_ERROR(ReadInput(c, g, &h, &eof));
    if (eof) {
      ch.input_done = ch.exhausted = true;
      return absl::OkStatus();
    }
    g->records.push_back(std::move(h));
    *got = true;
    return absl::OkStatus();
  }
  while (!ch.input_done && ch.buffer.size() < window) {
    RETURN_IF_ERROR(ReadInput(c, g, &h, &eof));
    if (eof) {
      ch.input_done = true;
    } else {
      ch.buffer.push_back(std::move(h));
    }
  }
  if (ch.buffer.empty()) {
    ch.exhausted = true;
    return absl::OkStatus();
  }
  const size_t j = ch.shuffle_rng.Uniform(ch.buffer.size());
  g->records.push_back(std::move(ch.buffer[j]));
  if (j + 1 != ch.buffer.size()) ch.buffer[j] = std::move(ch.buffer.back());
  ch.buffer.pop_back();
  *got = true;
  return absl::OkStatus();
}

absl::Status Pipeline::FillGroup(Group* g, bool* end) {
  *end = done_;
  g->epoch = epoch_;
  const size_t nc = channels_.size();
  while (!*end && g->records.size() < static_cast<size_t>(options_.batch_size)) {
    if (pick_ < 0) {
      double total = 0;
      int active = 0, last = -1;
      for (size_t c = 0; c < nc; ++c) {
        if (channels_[c]->exhausted) continue;
        total += options_.channels[c].weight();
        ++active;
        last = static_cast<int>(c);
      }
      if (active == 0) {
        RETURN_IF_ERROR(EndEpoch(end));
        if (!g->records.empty()) break;  // a batch never spans two epochs
        g->epoch = epoch_;
        continue;
      }
      pick_ = last;
      if (active > 1) {
        double r = interleave_rng_.UniformDouble() * total;
        for (size_t i = 0; i < nc; ++i) {
          if (channels_[i]->exhausted) continue;
          r -= options_.channels[i].weight();
          if (r < 0) {
            pick_ = static_cast<int>(i);
            break;
          }
        }
      }
    }
    bool got = false;
    RETURN_IF_ERROR(NextRecord(pick_, g, &got));
    pick_ = -1;
  }
  return absl::OkStatus();
}

bool Pipeline::ProducerMayRun() const {
  return stop_ || queue_.size() < static_cast<size_t>(options_.prefetch_batches);
}

void Pipeline::ProducerLoop() {
  const size_t nc = options_.channels.size();
  while (true) {
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Pipeline::ProducerMayRun));
      if (stop_) return;
    }
    absl::MutexLock sl(&state_mu_);
    std::unique_ptr<Group> g = std::move(resume_);
    if (!g) {
      g = std::make_unique<Group>();
      g->framing_bad.assign(nc, 0);
      g->records.reserve(options_.batch_size);
    }
    bool end = false;
    forming_ = g.get();
    const absl::Status s = FillGroup(g.get(), &end);
    forming_ = nullptr;
    if (stop_) return;
    if (!s.ok()) {
      g->error = s;
      g->error_fatal = true;
      done_ = end = true;
    }
    bool any_bad = false;
    for (uint64_t n : g->framing_bad) any_bad |= n > 0;
    absl::MutexLock l(&mu_);
    if (!g->records.empty() || any_bad || !g->error.ok()) queue_.push_back(std::move(g));
    if (end) {
      producer_done_ = true;
      return;
    }
  }
}

bool Pipeline::HasQueuedGroup() const {
  if (stop_) return true;
  for (const auto& g : queue_) {
    if (g->state == Group::kQueued) return true;
  }
  return false;
}

void Pipeline::ReaderLoop() {
  ParserCache parsers;
  while (true) {
    Group* g = nullptr;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Pipeline::HasQueuedGroup));
      if (stop_) return;
      for (const auto& q : queue_) {
        if (q->state == Group::kQueued) {
          g = q.get();
          break;
        }
      }
      g->state = Group::kParsing;
    }
    // The group is ours alone until it is marked ready: the consumer only takes ready groups.
    ParseGroup(g, &parsers);
    absl::MutexLock l(&mu_);
    g->state = Group::kReady;
  }
}

void Pipeline::ParseGroup(Group* g, ParserCache* parsers) const {
  RawRows& raw = parsers->raw;
  std::vector<absl::Status>& errors = parsers->errors;
  std::vector<RecordRef>& refs = parsers->refs;
  raw.Clear(spec_.num_fields());
  errors.clear();
  g->parse_bad.assign(options_.channels.size(), 0);
  const std::vector<Held>& recs = g->records;
  // Parse runs of records from one file: one parser call per run, with that file's parser.
  for (size_t i = 0; i < recs.size();) {
    const FileInfo* file = recs[i].file;
    refs.clear();
    size_t j = i;
    for (; j < recs.size() && recs[j].file == file; ++j) {
      refs.push_back(RecordRef{recs[j].data, &file->path, recs[j].number});
    }
    auto parser =
        parsers->Get(file, options_.channels[file->channel].format(), options_.formats, spec_);
    if (!parser.ok()) {
      g->parse_fatal = Annotate(parser.status(), absl::StrCat("parser for ", file->path));
      return;
    }
    const size_t errors_before = errors.size();
    const int rows_before = raw.size();
    (*parser)->Parse(refs, &raw, &errors);
    const size_t rejected = errors.size() - errors_before;
    PSTRAIN_CHECK(static_cast<size_t>(raw.size() - rows_before) + rejected == refs.size())
        << "RecordParser must add one row or one error per record";
    g->parse_bad[file->channel] += rejected;
    i = j;
  }
  if (!errors.empty()) g->parse_error = errors.front();
  g->truncated_lists = raw.truncated_lists;
  g->batch.Clear(spec_.num_fields());
  g->batch.Reserve(raw.size());
  spec_.Encode(raw, &g->batch);
}

bool Pipeline::FrontReadyOrDone() const {
  return queue_.empty() ? producer_done_ : queue_.front()->state == Group::kReady;
}

absl::Status Pipeline::CheckBadFraction(bool end_of_input) const {
  const double fraction = options_.max_bad_record_fraction;
  if (fraction == 0 || stats_.bad_records == 0) return absl::OkStatus();
  if (!end_of_input && stats_.records_read < kMinRecordsForFractionCheck) return absl::OkStatus();
  if (static_cast<double>(stats_.bad_records) <= fraction * stats_.records_read) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("too many bad records: ", stats_.bad_records, " of ", stats_.records_read,
                   " records read exceeds max_bad_record_fraction ", fraction,
                   "; last bad record: ", stats_.last_bad_record));
}

absl::Status Pipeline::Account(const Group& g, bool end_of_input) {
  const size_t nc = options_.channels.size();
  std::vector<uint64_t> read(nc, 0);
  for (const Held& h : g.records) ++read[h.file->channel];
  for (size_t c = 0; c < nc; ++c) {
    const uint64_t bad = g.framing_bad[c] + (g.parse_bad.empty() ? 0 : g.parse_bad[c]);
    read[c] += g.framing_bad[c];
    stats_.channels[c].records_read += read[c];
    stats_.channels[c].bad_records += bad;
    stats_.records_read += read[c];
    stats_.bad_records += bad;
  }
  if (!g.parse_fatal.ok()) return g.parse_fatal;
  if (options_.max_bad_record_fraction == 0) {
    // Parse errors come from records read before the framing error that ended the group.
    if (!g.parse_error.ok()) return g.parse_error;
    return g.error;
  }
  if (g.error_fatal) return g.error;
  for (const absl::Status* s : {&g.error, &g.parse_error}) {
    if (s->ok()) continue;
    stats_.last_bad_record = std::string(s->message());
    if (logged_bad_ < kMaxLoggedBadRecords) {
      ++logged_bad_;
      PSTRAIN_LOG(WARNING) << "skipping bad record"
                           << (logged_bad_ == kMaxLoggedBadRecords ? " (last one logged)" : "")
                           << ": " << *s;
    }
  }
  return CheckBadFraction(end_of_input);
}

absl::StatusOr<bool> Pipeline::Next(Batch* out, int64_t* epoch) {
  while (true) {
    if (!final_status_.ok()) return final_status_;
    if (finished_) return false;
    std::unique_ptr<Group> g;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Pipeline::FrontReadyOrDone));
      if (queue_.empty()) {
        final_status_ = CheckBadFraction(/*end_of_input=*/true);
        finished_ = final_status_.ok();
        continue;
      }
      g = std::move(queue_.front());
      queue_.pop_front();
      final_status_ = Account(*g, /*end_of_input=*/false);
      if (final_status_.ok() && g->batch.size > 0) ++stats_.batches;
      stats_.truncated_lists += g->truncated_lists;
    }
    if (!final_status_.ok() || g->batch.size == 0) continue;  // a batch of only bad records
    *out = std::move(g->batch);
    *epoch = g->epoch;
    return true;
  }
}

PipelineStats Pipeline::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

PipelinePosition Pipeline::position() const {
  PipelinePosition pos;
  absl::MutexLock sl(&state_mu_);
  absl::MutexLock l(&mu_);
  pos.set_version(kPositionVersion);
  pos.set_epoch(epoch_);
  pos.set_shard_index(options_.shard_index);
  pos.set_num_shards(options_.num_shards);
  pos.set_producer_done(done_);
  pos.set_batches_delivered(stats_.batches);
  pos.set_last_bad_record(stats_.last_bad_record);
  SaveRng(interleave_rng_, pos.mutable_interleave_rng());
  absl::flat_hash_map<const FileInfo*, int> file_ids;
  auto hold = [&](const Held& h, HeldRecord* r) {
    auto [it, inserted] = file_ids.try_emplace(h.file, pos.file_size());
    if (inserted) {
      PipelineFile* f = pos.add_file();
      f->set_path(h.file->path);
      f->set_header(h.file->header);
      f->set_channel(h.file->channel);
    }
    r->set_data(h.data);
    r->set_file(it->second);
    r->set_number(h.number);
  };
  for (size_t c = 0; c < channels_.size(); ++c) {
    const ChannelState& ch = *channels_[c];
    ChannelPosition* cp = pos.add_channel();
    cp->set_channel(options_.channels[c].name());
    for (const std::string& f : ch.files) cp->add_files(f);
    cp->set_file_cursor(static_cast<int64_t>(ch.cursor));
    cp->set_offset(ch.src ? ch.src->offset() : ch.offset);
    cp->set_source_records(ch.src ? ch.src->records() : ch.source_records);
    cp->set_epoch_records(ch.epoch_records);
    cp->set_input_done(ch.input_done);
    cp->set_exhausted(ch.exhausted);
    SaveRng(ch.shuffle_rng, cp->mutable_shuffle_rng());
    for (const Held& h : ch.buffer) hold(h, cp->add_shuffle_buffer());
    cp->set_records_read(stats_.channels[c].records_read);
    cp->set_bad_records(stats_.channels[c].bad_records);
  }
  // The group being filled: the producer's, or a restored one it has not taken up yet.
  const Group* incomplete = forming_ != nullptr ? forming_ : resume_.get();
  std::vector<const Group*> pending;
  for (const auto& g : queue_) pending.push_back(g.get());
  if (incomplete != nullptr) pending.push_back(incomplete);
  pos.set_pending_channel(pick_);
  for (const Group* g : pending) {
    PendingBatch* pb = pos.add_pending();
    pb->set_incomplete(g == incomplete);
    pb->set_epoch(g->epoch);
    for (const Held& h : g->records) hold(h, pb->add_record());
    for (uint64_t n : g->framing_bad) pb->add_bad_records(n);
    if (!g->error.ok()) {
      pb->set_error_code(static_cast<int>(g->error.code()));
      pb->set_error_message(std::string(g->error.message()));
      pb->set_error_is_fatal(g->error_fatal);
    }
  }
  return pos;
}

absl::Status Pipeline::Restore(const PipelinePosition& pos) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline position: ", parts...));
  };
  if (pos.version() != kPositionVersion) {
    return invalid("version ", pos.version(), " is not supported (expected ", kPositionVersion,
                   ")");
  }
  if (pos.shard_index() != options_.shard_index || pos.num_shards() != options_.num_shards) {
    return invalid("saved by reader ", pos.shard_index(), " of ", pos.num_shards(),
                   ", restored into reader ", options_.shard_index, " of ", options_.num_shards,
                   "; the data position is exact only for the same reader layout");
  }
  const size_t nc = options_.channels.size();
  if (static_cast<size_t>(pos.channel_size()) != nc) {
    return invalid("has ", pos.channel_size(), " channels, the options have ", nc);
  }
  std::vector<const FileInfo*> files;
  for (const PipelineFile& f : pos.file()) {
    if (f.channel() < 0 || static_cast<size_t>(f.channel()) >= nc) {
      return invalid("file ", f.path(), " has channel ", f.channel());
    }
    files.push_back(InternFile(f.channel(), f.path(), f.header()));
  }
  auto held = [&](const HeldRecord& r, Held* h) {
    if (r.file() < 0 || static_cast<size_t>(r.file()) >= files.size()) {
      return invalid("record refers to file ", r.file(), " of ", files.size());
    }
    h->data = r.data();
    h->file = files[r.file()];
    h->number = r.number();
    return absl::OkStatus();
  };
  epoch_ = pos.epoch();
  done_ = pos.producer_done();
  RETURN_IF_ERROR(LoadRng(pos.interleave_rng(), "interleave_rng", &interleave_rng_));
  absl::MutexLock l(&mu_);
  for (size_t c = 0; c < nc; ++c) {
    const ChannelPosition& cp = pos.channel(c);
    if (cp.channel() != options_.channels[c].name()) {
      return invalid("channel ", c, " is '", cp.channel(), "', the options say '",
                     options_.channels[c].name(), "'");
    }
    ChannelState& ch = *channels_[c];
    ch.files.assign(cp.files().begin(), cp.files().end());
    if (cp.file_cursor() < 0 || static_cast<size_t>(cp.file_cursor()) > ch.files.size()) {
      return invalid("channel '", cp.channel(), "': file_cursor ", cp.file_cursor(), " of ",
                     ch.files.size(), " files");
    }
    ch.cursor = cp.file_cursor();
    ch.offset = cp.offset();
    ch.source_records = cp.source_records();
    ch.epoch_records = cp.epoch_records();
    ch.input_done = cp.input_done();
    ch.exhausted = cp.exhausted();
    RETURN_IF_ERROR(LoadRng(cp.shuffle_rng(), "shuffle_rng", &ch.shuffle_rng));
    ch.buffer.resize(cp.shuffle_buffer_size());
    for (int i = 0; i < cp.shuffle_buffer_size(); ++i) {
      RETURN_IF_ERROR(held(cp.shuffle_buffer(i), &ch.buffer[i]));
    }
    stats_.channels[c].records_read = cp.records_read();
    stats_.channels[c].bad_records = cp.bad_records();
    stats_.records_read += cp.records_read();
    stats_.bad_records += cp.bad_records();
  }
  stats_.batches = pos.batches_delivered();
  stats_.last_bad_record = pos.last_bad_record();
  if (pos.pending_channel() < -1 || pos.pending_channel() >= static_cast<int>(nc)) {
    return invalid("pending_channel ", pos.pending_channel(), " of ", nc, " channels");
  }
  pick_ = pos.pending_channel();
  for (int b = 0; b < pos.pending_size(); ++b) {
    const PendingBatch& pb = pos.pending(b);
    if (pb.incomplete() && b + 1 != pos.pending_size()) {
      return invalid("pending batch ", b, " is incomplete but not the last one");
    }
    auto g = std::make_unique<Group>();
    g->epoch = pb.epoch();
    g->records.resize(pb.record_size());
    for (int i = 0; i < pb.record_size(); ++i) RETURN_IF_ERROR(held(pb.record(i), &g->records[i]));
    g->framing_bad.assign(nc, 0);
    for (int i = 0; i < pb.bad_records_size() && static_cast<size_t>(i) < nc; ++i) {
      g->framing_bad[i] = pb.bad_records(i);
    }
    if (pb.error_code() != 0) {
      g->error = absl::Status(static_cast<absl::StatusCode>(pb.error_code()), pb.error_message());
      g->error_fatal = pb.error_is_fatal();
    }
    if (pb.incomplete()) {
      resume_ = std::move(g);
    } else {
      queue_.push_back(std::move(g));
    }
  }
  producer_done_ = done_;
  return absl::OkStatus();
}

}  // namespace pstrain
