// The input pipeline: files or FIFOs of one or more channels -> sharded, shuffled, interleaved
// batches of encoded examples, read ahead on background threads, with an exact, serializable
// position for checkpoints. docs/DATA.md is the user-facing description.
//
// Stages ("batch first, then parse"):
//   1. One producer thread frames raw records (RecordSource), keeps this reader's share
//      (ShardPolicy), passes each channel through its window shuffle buffer, interleaves the
//      channels by weight and cuts the stream into groups of batch_size raw records. It is the
//      only stage with state, and it is deterministic: the stream of groups is a pure function of
//      the options, the files and the start position.
//   2. reader_threads parser threads each take a whole group, parse it (RecordParser, one per
//      thread and format/CSV header) and encode it (FeatureSpec::Encode) into a Batch.
//   3. Next() hands the batches out strictly in order. At most prefetch_batches groups are in
//      flight (read and not yet delivered); the producer waits for room.
//
// Epochs. Epoch e of a channel is one pass over its files (or the FIFO <pipe_dir>/<name>_<e>).
// The pipeline's epoch e ends when every channel has run out of records for epoch e; the last
// batch of an epoch may be short and no batch spans two epochs. Every channel therefore makes the
// same number of passes, whatever its weight or size.
//
// Interleave (tf.data sample_from_datasets): each record comes from a channel drawn at random
// with probability weight / (sum of the weights of the channels that still have records in this
// epoch).
//
// Sharding. shard_index / num_shards number the readers of the whole job (hosts x workers). Per
// channel: SHARD_BY_FILE gives reader s the files i % num_shards == s of the epoch's file order
// (the order is the same on every reader, so the readers cover the files disjointly; Create fails
// if a reader would get no file); SHARD_BY_RECORD makes every reader read all files in the same
// order and keep the records whose index in the epoch (counting every framed record, corrupt
// ones too) is i % num_shards == s; REPLICATED gives every reader everything.
//
// Shuffling. With shuffle_files, the file list of each epoch is permuted from (seed, channel,
// epoch): the same permutation on every reader. Records inside a file are read in order. A window
// buffer of shuffle_buffer records per channel then reorders records (tf.data shuffle semantics:
// fill the buffer, emit a uniformly chosen element, refill), seeded from (seed, channel,
// shard_index) so replicated readers see different orders. The buffer drains at the end of each
// epoch.
//
// Pipe mode (Channel.pipe_dir set; Channel.path is then ignored). Epoch e of channel NAME reads
// the FIFO <pipe_dir>/<NAME>_<e> to EOF, as SageMaker's pipe mode provides it; no file shuffle,
// the window shuffle still applies. SHARD_BY_FILE and REPLICATED read the whole FIFO (SageMaker
// shards by host before writing it); SHARD_BY_RECORD keeps i % num_shards == s. Opening a FIFO
// blocks until a writer opens it, and reads block while the writer is silent: providing the
// data is the writer's job. Destroying the pipeline while it waits in the open wakes it up; a
// writer that keeps its end open without writing blocks destruction until it writes or closes.
// A source opener used with FIFOs must not wait for data before returning (the wake-up writes a
// single newline so that an opener that reads a CSV header returns too).
//
// Bad records. A record counts as bad when RecordSource::Next returns DATA_LOSS for it (only the
// reader that owns the record under SHARD_BY_RECORD counts it) or when the parser rejects it. A
// non-skippable source error (truncated file, I/O error) counts as one bad record and the rest of
// that file is skipped. With max_bad_record_fraction == 0 the first bad record ends the pipeline:
// Next returns its error (naming the file, the line or record, and what was expected). Otherwise
// bad records are skipped, counted and logged (the first 10), and Next fails with
// FAILED_PRECONDITION once bad > fraction * records_read, where records_read counts this reader's
// framed records (good and bad). The check runs after every batch once at least 1000 records have
// been read, and at the end of the input. A batch loses the rows of the parse-rejected records in
// it (it is shorter than batch_size by that many); corrupt framing is skipped before batching. An
// error opening a file or creating a parser is always fatal.
//
// Exact position. position() describes the state right after the last batch Next() delivered. A
// pipeline created with that position as `start` delivers exactly the batches that would have
// followed: no record lost, none repeated, the same batch boundaries. The producer and parsers
// run ahead, so the position holds the raw records of the batches read but not yet delivered,
// besides each channel's file list, file cursor, byte offset, record counts, window buffer
// contents and RNG states. A FIFO cannot seek: a restore re-opens the current epoch's FIFO and
// reads and drops the records already consumed, which is exact when the writer replays the same
// stream for that epoch (SageMaker re-streams the channel from its start). The file list of
// later epochs is expanded again at Create, so files added before a restart join from the next
// epoch on.
//
// Thread-safety: Next() and position() must be called from one consumer thread; stats() may be
// called from any thread. Destruction stops and joins every thread promptly, whether or not the
// consumer read to the end.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/random.h"
#include "pstrain/config.pb.h"
#include "pstrain/state.pb.h"
#include "worker/data/batch.h"
#include "worker/data/feature_spec.h"
#include "worker/data/record_io.h"

namespace pstrain {

// The data-format seams: how the pipeline opens a file or FIFO and makes a parser. Production
// uses RegisteredFormats() (record_io.h's OpenRecordSource / CreateRecordParser); tests inject
// fakes. Both functions are called from the pipeline's threads and must be thread-safe.
struct RecordFormats {
  std::function<absl::StatusOr<std::unique_ptr<RecordSource>>(DataFormat, const std::string&,
                                                              Channel::Compression)>
      open_source;
  std::function<absl::StatusOr<std::unique_ptr<RecordParser>>(DataFormat, const FeatureSpec&,
                                                              absl::string_view csv_header)>
      make_parser;
};

// OpenRecordSource and CreateRecordParser. Defined in pipeline_defaults.cc, apart from the
// pipeline, so that code which injects its own formats (the pipeline's tests and bench) does not
// link the format registry.
// `max_record_bytes`: RecordSourceOptions' (data.max_record_bytes).
RecordFormats RegisteredFormats(size_t max_record_bytes = size_t{16} << 20);

struct PipelineOptions {
  // Channels to read, interleaved by Channel.weight. Channel names must be distinct.
  std::vector<Channel> channels;
  // Records per batch; the last batch of an epoch may be shorter.
  int batch_size = 1024;
  // This reader's index among all readers of the job (hosts x workers), and their number.
  int shard_index = 0;
  int num_shards = 1;
  // Passes over the data; 0 = repeat forever.
  int64_t epochs = 1;
  uint64_t seed = 1;
  // Reshuffle the file order every epoch (ignored in pipe mode).
  bool shuffle_files = true;
  // Window shuffle buffer in records, per channel; 0 or 1 disables it.
  int shuffle_buffer = 0;
  // Parser threads (>= 1).
  int reader_threads = 1;
  // Batches read ahead of the consumer (read, being parsed or parsed), >= 1.
  int prefetch_batches = 4;
  // Fraction of bad records tolerated; 0 = the first bad record is an error. In [0, 1].
  double max_bad_record_fraction = 0.0;
  // The validation split (data.validation_fraction, worker/data/validation_split.h), in [0, 1):
  // when > 0, every channel keeps only the records of one side, the training part
  // (validation_part false) or the held-out part; the others are skipped as another reader's
  // records are under SHARD_BY_RECORD (a record whose framing is corrupt has no content to hash:
  // both sides count it as bad).
  double validation_fraction = 0;
  bool validation_part = false;
  // Resume from this position (from position() of a pipeline with the same channels and shard).
  std::optional<PipelinePosition> start;
  // Must be set (OptionsFromConfig sets RegisteredFormats() by default).
  RecordFormats formats;
};

// Options for the train channels (train = true: shuffled as the config says) or the eval
// channels (train = false: never shuffled) of `data`. Sets channels, shuffle_files,
// shuffle_buffer, seed (data.shuffle_seed), prefetch_batches and max_bad_record_fraction from the
// config and the arguments; reader_threads and start keep their defaults for the caller to set.
// A caller that omits `formats` gets the format registry (and links it).
PipelineOptions OptionsFromConfig(const DataConfig& data, bool train, int batch_size,
                                  int shard_index, int num_shards, int64_t epochs,
                                  RecordFormats formats = RecordFormats());

// Options for the validation split of `data` (data.validation_fraction > 0): the held-out part of
// the train channels, read once, in order (no shuffle), by one reader.
PipelineOptions ValidationOptionsFromConfig(const DataConfig& data, int batch_size);

struct ChannelStats {
  std::string name;
  uint64_t records_read = 0;  // framed records of this reader, good and bad
  uint64_t bad_records = 0;   // of which skipped as corrupt or unparseable
};

// Counters as of the last delivered batch; they survive a restore from a position.
struct PipelineStats {
  std::vector<ChannelStats> channels;
  uint64_t records_read = 0;
  uint64_t bad_records = 0;
  uint64_t batches = 0;         // batches delivered
  uint64_t truncated_lists = 0; // lists cut to their field's list.max_length (TRUNCATE)
  std::string last_bad_record;  // message of the latest bad record, if any
};

class Pipeline {
 public:
  // Expands the channels' paths (worker/data/file_list.h), validates the options and starts the
  // threads (from options.start when set). Errors: INVALID_ARGUMENT for bad options or a
  // position that does not fit them, NOT_FOUND for missing paths, FAILED_PRECONDITION when
  // SHARD_BY_FILE would leave a reader without files.
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(PipelineOptions options,
                                                          const FeatureSpec& spec);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Stores the next batch in *out (its previous contents are replaced) and its epoch (0-based)
  // in *epoch. Returns false after the last batch of the last epoch. An error (bad records, I/O)
  // is returned again by every later call.
  absl::StatusOr<bool> Next(Batch* out, int64_t* epoch);

  // The exact position after the last batch Next() delivered (see the top of this file). It
  // waits while the producer reads a record (a FIFO whose writer is silent can make that long),
  // but not while it waits for a file or FIFO to open: the batch being formed is then saved as
  // an incomplete pending batch. Not meaningful after Next() returned an error.
  PipelinePosition position() const;

  PipelineStats stats() const;

 private:
  struct FileInfo;
  struct Held;
  struct Group;
  struct ChannelState;
  class ParserCache;

  Pipeline(PipelineOptions options, const FeatureSpec& spec);
  absl::Status Init();
  absl::Status Restore(const PipelinePosition& pos);

  // Producer stage (producer thread; state_mu_ held while a group is formed).
  void ProducerLoop();
  absl::Status FillGroup(Group* g, bool* end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  absl::Status NextRecord(int c, Group* g, bool* got) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  absl::Status ReadInput(int c, Group* g, Held* out, bool* eof)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  absl::Status OpenCurrentFile(int c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  absl::Status EndEpoch(bool* end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  void StartEpoch(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  std::vector<std::string> EpochFiles(int c, int64_t epoch) const;
  const FileInfo* InternFile(int channel, const std::string& path, const std::string& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);

  // Parser stage (reader threads).
  void ReaderLoop();
  void ParseGroup(Group* g, ParserCache* parsers) const;

  // Consumer-side accounting of a delivered group; returns the error that ends the pipeline.
  absl::Status Account(const Group& g, bool end_of_input) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckBadFraction(bool end_of_input) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bool HasQueuedGroup() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FrontReadyOrDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ProducerMayRun() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PipelineOptions options_;
  const FeatureSpec spec_;
  std::vector<std::vector<std::string>> all_files_;  // per channel, from ExpandPath (file mode)

  // Producer state. Lock order: state_mu_ before mu_.
  mutable absl::Mutex state_mu_;
  int64_t epoch_ ABSL_GUARDED_BY(state_mu_) = 0;
  bool done_ ABSL_GUARDED_BY(state_mu_) = false;  // the last epoch has ended
  Rng interleave_rng_ ABSL_GUARDED_BY(state_mu_);
  std::vector<std::unique_ptr<ChannelState>> channels_ ABSL_GUARDED_BY(state_mu_);
  Group* forming_ ABSL_GUARDED_BY(state_mu_) = nullptr;       // the group FillGroup is filling
  std::unique_ptr<Group> resume_ ABSL_GUARDED_BY(state_mu_);  // restored incomplete group
  int pick_ ABSL_GUARDED_BY(state_mu_) = -1;  // channel drawn for the next record, not yet read
  // Interned files; entries are immutable and never freed, so records point at them freely.
  std::vector<std::unique_ptr<FileInfo>> files_ ABSL_GUARDED_BY(state_mu_);
  absl::flat_hash_map<std::string, const FileInfo*> file_index_ ABSL_GUARDED_BY(state_mu_);

  // Queue of groups in flight, in delivery order, and the consumer-side counters.
  mutable absl::Mutex mu_;
  std::atomic<bool> stop_{false};  // written under mu_ so that waiters re-check it
  std::deque<std::unique_ptr<Group>> queue_ ABSL_GUARDED_BY(mu_);
  bool producer_done_ ABSL_GUARDED_BY(mu_) = false;
  std::string opening_fifo_ ABSL_GUARDED_BY(mu_);  // FIFO the producer is opening, if any
  PipelineStats stats_ ABSL_GUARDED_BY(mu_);
  int logged_bad_ ABSL_GUARDED_BY(mu_) = 0;

  // Consumer thread only.
  absl::Status final_status_;
  bool finished_ = false;

  std::thread producer_;
  std::vector<std::thread> readers_;
};

}  // namespace pstrain
