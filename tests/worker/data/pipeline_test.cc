#include "worker/data/pipeline.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/worker/data/fake_line_format.h"

namespace pstrain {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using testing_fake::FakeLineSpec;
using testing_fake::Formats;
using testing_fake::Lines;

// One delivered batch, reduced to what identifies it: its epoch and its records' values.
struct Delivered {
  int64_t epoch = 0;
  std::vector<int> values;
  bool operator==(const Delivered& o) const { return epoch == o.epoch && values == o.values; }
};

void PrintTo(const Delivered& d, std::ostream* os) {
  *os << "{epoch " << d.epoch << ", " << d.values.size() << " values}";
}

std::vector<int> Range(int begin, int end) {
  std::vector<int> v;
  for (int i = begin; i < end; ++i) v.push_back(i);
  return v;
}

std::vector<int> Sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Reads up to `max_batches` batches (all when negative). Checks each row against the fake
// format's encoding (id 1, label = value % 2). Stops at the first error and returns it.
absl::Status Drain(Pipeline* p, std::vector<Delivered>* out, int max_batches = -1) {
  Batch batch;
  for (int n = 0; max_batches < 0 || n < max_batches; ++n) {
    int64_t epoch = -1;
    absl::StatusOr<bool> more = p->Next(&batch, &epoch);
    if (!more.ok()) return more.status();
    if (!*more) break;
    Delivered d;
    d.epoch = epoch;
    EXPECT_EQ(batch.num_fields, 1);
    for (int b = 0; b < batch.size; ++b) {
      const int v = static_cast<int>(batch.values[b]);
      EXPECT_EQ(batch.ids[b], 1);
      EXPECT_EQ(batch.labels[b], static_cast<float>(v % 2)) << v;
      d.values.push_back(v);
    }
    out->push_back(std::move(d));
  }
  return absl::OkStatus();
}

std::vector<int> Flatten(const std::vector<Delivered>& batches, int64_t epoch = -1) {
  std::vector<int> v;
  for (const Delivered& d : batches) {
    if (epoch < 0 || d.epoch == epoch) v.insert(v.end(), d.values.begin(), d.values.end());
  }
  return v;
}

// Runs fn on its own thread and fails the test if it has not finished after `seconds`; then
// calls rescue() (which must unblock fn) and waits for it.
void RunBounded(const std::function<void()>& fn, double seconds,
                const std::function<void()>& rescue = {}) {
  absl::Notification done;
  std::thread t([&] {
    fn();
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(seconds))) {
    ADD_FAILURE() << "did not finish within " << seconds << " s";
    if (rescue) rescue();
  }
  t.join();
}

// Releases anyone blocked opening `fifo`, on either side: O_RDWR never blocks on Linux and
// counts as both a reader and a writer; closing it then leaves readers at EOF.
void KickFifo(const std::string& fifo) {
  const int fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  if (fd >= 0) ::close(fd);
}

// Writes `contents` into a FIFO once per session, on a thread: each session blocks in open
// until a reader appears, writes everything (a reader that goes away ends it early: EPIPE) and
// closes. Keep contents under the pipe buffer (64 KiB) so that Finish() never blocks.
class FifoWriter {
 public:
  FifoWriter(std::string path, std::string contents, int sessions)
      : path_(std::move(path)), contents_(std::move(contents)) {
    thread_ = std::thread([this, sessions] {
      for (int s = 0; s < sessions && !stop_; ++s) {
        const int fd = ::open(path_.c_str(), O_WRONLY);
        if (fd < 0) return;
        if (!stop_) {
          size_t done = 0;
          while (done < contents_.size()) {
            const ssize_t n = ::write(fd, contents_.data() + done, contents_.size() - done);
            if (n <= 0) break;  // EPIPE: the reader closed
            done += n;
          }
        }
        ::close(fd);
      }
    });
  }
  // Waits for the sessions to end; a writer still waiting for a reader is released and told to
  // stop.
  void Finish() {
    if (!thread_.joinable()) return;
    stop_ = true;
    const int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK);  // lets a blocked open return
    thread_.join();
    if (fd >= 0) ::close(fd);
  }
  // Waits for all sessions (bounded: fails and releases the writer after `seconds`).
  void Join(double seconds) {
    if (!thread_.joinable()) return;
    absl::Notification done;
    std::thread waiter([&] {
      thread_.join();
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(seconds))) {
      ADD_FAILURE() << "FIFO writer of " << path_ << " did not finish";
      stop_ = true;
      KickFifo(path_);
    }
    waiter.join();
  }
  ~FifoWriter() { Finish(); }

 private:
  std::string path_;
  std::string contents_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::signal(SIGPIPE, SIG_IGN);  // FIFO writers whose reader went away get EPIPE instead
    char tmpl[] = "/tmp/pstrain_pipeline_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_EQ(std::system(("rm -rf " + dir_).c_str()), 0); }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = absl::StrCat(dir_, "/", name);
    const size_t slash = path.rfind('/');
    EXPECT_TRUE(MakeDirs(path.substr(0, slash)).ok());
    EXPECT_TRUE(WriteFileAtomic(path, contents).ok());
    return path;
  }

  // Files <sub>/f<i> holding values base + i * 1000 + [0, sizes[i]).
  std::vector<int> WriteFiles(const std::string& sub, const std::vector<int>& sizes, int base = 0,
                              const std::string& header = "") {
    std::vector<int> all;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<int> v = Range(base + i * 1000, base + i * 1000 + sizes[i]);
      Write(absl::StrCat(sub, "/f", i), header + Lines(v));
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }

  static Channel MakeChannel(const std::string& name, const std::string& path,
                             ShardPolicy policy = SHARD_BY_FILE, double weight = 1.0,
                             DataFormat format = CRITEO_TSV) {
    Channel ch;
    ch.set_name(name);
    ch.add_path(path);
    ch.set_shard_policy(policy);
    ch.set_weight(weight);
    ch.set_format(format);
    return ch;
  }

  static PipelineOptions Options(std::vector<Channel> channels) {
    PipelineOptions o;
    o.channels = std::move(channels);
    o.formats = Formats();
    o.shuffle_files = false;
    return o;
  }

  std::unique_ptr<Pipeline> MustCreate(const PipelineOptions& o) {
    auto p = Pipeline::Create(o, spec_);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  std::vector<Delivered> RunAll(const PipelineOptions& o, PipelineStats* stats = nullptr) {
    std::vector<Delivered> out;
    auto p = MustCreate(o);
    if (!p) return out;
    const absl::Status s = Drain(p.get(), &out);
    EXPECT_TRUE(s.ok()) << s;
    if (stats) *stats = p->stats();
    return out;
  }

  std::string dir_;
  const FeatureSpec spec_ = FakeLineSpec();
};

TEST_F(PipelineTest, OneFileInOrderWithShortLastBatchPerEpoch) {
  Write("a.tsv", Lines(Range(0, 10)));
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/a.tsv")});
  o.batch_size = 4;
  o.epochs = 2;
  PipelineStats stats;
  const std::vector<Delivered> got = RunAll(o, &stats);
  const std::vector<Delivered> want = {{0, {0, 1, 2, 3}}, {0, {4, 5, 6, 7}}, {0, {8, 9}},
                                       {1, {0, 1, 2, 3}}, {1, {4, 5, 6, 7}}, {1, {8, 9}}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(stats.batches, 6u);
  EXPECT_EQ(stats.records_read, 20u);
  EXPECT_EQ(stats.bad_records, 0u);
  ASSERT_EQ(stats.channels.size(), 1u);
  EXPECT_EQ(stats.channels[0].name, "train");
}

TEST_F(PipelineTest, ShardsCoverEveryRecordExactlyOncePerEpoch) {
  const std::vector<int> all = Sorted(WriteFiles("d", {13, 0, 40, 1, 22, 5, 9, 31}));
  for (ShardPolicy policy : {SHARD_BY_FILE, SHARD_BY_RECORD}) {
    for (int n : {1, 2, 3, 5}) {
      for (bool shuffle : {false, true}) {
        SCOPED_TRACE(absl::StrCat("policy ", policy, " shards ", n, " shuffle ", shuffle));
        std::map<int64_t, std::vector<int>> seen;
        for (int s = 0; s < n; ++s) {
          PipelineOptions o = Options({MakeChannel("train", dir_ + "/d", policy)});
          o.batch_size = 4;
          o.epochs = 2;
          o.shard_index = s;
          o.num_shards = n;
          o.shuffle_files = shuffle;
          o.shuffle_buffer = shuffle ? 8 : 0;
          o.reader_threads = 2;
          for (const Delivered& d : RunAll(o)) {
            seen[d.epoch].insert(seen[d.epoch].end(), d.values.begin(), d.values.end());
          }
        }
        ASSERT_EQ(seen.size(), 2u);
        EXPECT_EQ(Sorted(seen[0]), all);
        EXPECT_EQ(Sorted(seen[1]), all);
      }
    }
  }
}

TEST_F(PipelineTest, ReplicatedGivesEveryShardEverythingInItsOwnOrder) {
  const std::vector<int> all = Sorted(WriteFiles("d", {50, 30, 20}));
  std::vector<std::vector<int>> orders;
  for (int s = 0; s < 3; ++s) {
    PipelineOptions o = Options({MakeChannel("train", dir_ + "/d", REPLICATED)});
    o.batch_size = 8;
    o.shard_index = s;
    o.num_shards = 3;
    o.shuffle_buffer = 16;
    orders.push_back(Flatten(RunAll(o)));
    EXPECT_EQ(Sorted(orders.back()), all);
  }
  EXPECT_NE(orders[0], orders[1]);  // the window shuffle is seeded per shard
}

TEST_F(PipelineTest, ShardByFileRefusesAShardWithoutFiles) {
  WriteFiles("d", {3, 3, 3});
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/d", SHARD_BY_FILE)});
  o.num_shards = 4;
  o.shard_index = 0;
  auto p = Pipeline::Create(o, spec_);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("SHARD_BY_RECORD"));
  EXPECT_THAT(p.status().message(), HasSubstr("'train'"));
}

TEST_F(PipelineTest, EpochFileShuffleChangesOrderKeepsRecordsAndIsReproducible) {
  const std::vector<int> all = Sorted(WriteFiles("d", std::vector<int>(10, 20)));
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/d")});
  o.batch_size = 10;
  o.epochs = 3;
  o.shuffle_files = true;
  o.seed = 7;
  const std::vector<Delivered> run = RunAll(o);
  std::vector<std::vector<int>> epochs;
  std::vector<std::vector<int>> file_orders;
  for (int e = 0; e < 3; ++e) {
    epochs.push_back(Flatten(run, e));
    EXPECT_EQ(Sorted(epochs[e]), all) << "epoch " << e;
    // Records inside a file stay in order; files are read one after the other.
    std::vector<int> files;
    for (size_t i = 0; i < epochs[e].size(); ++i) {
      const int v = epochs[e][i];
      if (i % 20 == 0) {
        files.push_back(v / 1000);
        EXPECT_EQ(v % 1000, 0);
      } else {
        EXPECT_EQ(v, epochs[e][i - 1] + 1);
      }
    }
    file_orders.push_back(files);
  }
  EXPECT_NE(file_orders[0], file_orders[1]);
  EXPECT_NE(file_orders[1], file_orders[2]);
  EXPECT_NE(file_orders[0], Range(0, 10));

  EXPECT_EQ(RunAll(o), run);  // same seed, same stream
  o.seed = 8;
  EXPECT_NE(Flatten(RunAll(o)), Flatten(run));
  o.shuffle_files = false;
  const std::vector<Delivered> plain = RunAll(o);
  for (int e = 0; e < 3; ++e) EXPECT_EQ(Flatten(plain, e), all);
}

TEST_F(PipelineTest, WindowShuffleIsBoundedByTheBufferAndDrainsEachEpoch) {
  Write("a.tsv", Lines(Range(0, 500)));
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/a.tsv")});
  o.batch_size = 32;
  o.epochs = 2;
  o.shuffle_buffer = 64;
  const std::vector<Delivered> run = RunAll(o);
  for (const Delivered& d : run) EXPECT_LE(d.values.size(), 32u);
  const std::vector<int> e0 = Flatten(run, 0), e1 = Flatten(run, 1);
  EXPECT_EQ(Sorted(e0), Range(0, 500));
  EXPECT_EQ(Sorted(e1), Range(0, 500));
  EXPECT_NE(e0, Range(0, 500));
  EXPECT_NE(e0, e1);
  // Record v enters the buffer after v - 63 records have left it, so it cannot leave earlier.
  for (size_t pos = 0; pos < e0.size(); ++pos) EXPECT_GE(static_cast<int>(pos), e0[pos] - 63);
}

TEST_F(PipelineTest, InterleaveHonoursWeights) {
  const int per_channel = 4000;
  std::vector<Channel> channels;
  const double weights[3] = {1, 2, 5};
  for (int k = 0; k < 3; ++k) {
    Write(absl::StrCat("c", k, ".tsv"), Lines(Range(k * 100000, k * 100000 + per_channel)));
    channels.push_back(MakeChannel(absl::StrCat("c", k), absl::StrCat(dir_, "/c", k, ".tsv"),
                                   SHARD_BY_FILE, weights[k]));
  }
  PipelineOptions o = Options(channels);
  o.batch_size = 100;
  o.reader_threads = 2;
  PipelineStats stats;
  const std::vector<int> stream = Flatten(RunAll(o, &stats));
  ASSERT_EQ(stream.size(), 3u * per_channel);
  // The first half: every channel still has records, so each record is channel k with
  // probability w_k / 8.
  const int n = 3 * per_channel / 2;
  int count[3] = {0, 0, 0};
  int last[3] = {-1, -1, -1};
  for (int i = 0; i < static_cast<int>(stream.size()); ++i) {
    const int k = stream[i] / 100000;
    EXPECT_GT(stream[i], last[k]);  // each channel keeps its order
    last[k] = stream[i];
    if (i < n) ++count[k];
  }
  for (int k = 0; k < 3; ++k) {
    const double p = weights[k] / 8, mean = n * p, sd = std::sqrt(n * p * (1 - p));
    EXPECT_LT(std::abs(count[k] - mean), 4 * sd) << "channel " << k << ": " << count[k];
    EXPECT_EQ(stats.channels[k].records_read, static_cast<uint64_t>(per_channel));
  }
  EXPECT_EQ(Sorted(stream).back(), 200000 + per_channel - 1);
}

TEST_F(PipelineTest, EpochEndsWhenEveryChannelIsExhausted) {
  Write("small.tsv", Lines(Range(0, 5)));
  Write("big.tsv", Lines(Range(1000, 1100)));
  PipelineOptions o = Options({MakeChannel("small", dir_ + "/small.tsv", SHARD_BY_FILE, 10),
                               MakeChannel("big", dir_ + "/big.tsv")});
  o.batch_size = 16;
  o.epochs = 2;
  const std::vector<Delivered> run = RunAll(o);
  std::vector<int> want = Range(0, 5);
  const std::vector<int> big = Range(1000, 1100);
  want.insert(want.end(), big.begin(), big.end());
  EXPECT_EQ(Sorted(Flatten(run, 0)), want);
  EXPECT_EQ(Sorted(Flatten(run, 1)), want);
}

TEST_F(PipelineTest, PipeModeReadsOneFifoPerEpoch) {
  const std::string pipes = dir_ + "/pipes";
  ASSERT_TRUE(MakeDirs(pipes).ok());
  for (int e = 0; e < 2; ++e) {
    ASSERT_EQ(::mkfifo(absl::StrCat(pipes, "/train_", e).c_str(), 0600), 0);
  }
  FifoWriter w0(pipes + "/train_0", Lines(Range(0, 300)), 1);
  FifoWriter w1(pipes + "/train_1", Lines(Range(1000, 1300)), 1);
  Channel ch;
  ch.set_name("train");
  ch.set_pipe_dir(pipes);
  PipelineOptions o = Options({ch});
  o.batch_size = 32;
  o.epochs = 2;
  o.shuffle_buffer = 16;
  o.shuffle_files = true;  // ignored in pipe mode
  std::vector<Delivered> run;
  RunBounded(
      [&] {
        auto p = MustCreate(o);
        if (p) {
          EXPECT_TRUE(Drain(p.get(), &run).ok());
        }
      },
      30,
      [&] {
        KickFifo(pipes + "/train_0");
        KickFifo(pipes + "/train_1");
      });
  EXPECT_EQ(Sorted(Flatten(run, 0)), Range(0, 300));
  EXPECT_EQ(Sorted(Flatten(run, 1)), Range(1000, 1300));
  EXPECT_NE(Flatten(run, 0), Range(0, 300));  // the window shuffle applies
  w0.Join(10);
  w1.Join(10);
}

TEST_F(PipelineTest, PipeModeRestoreReplaysTheFifoAndSkipsConsumedRecords) {
  const std::string pipes = dir_ + "/pipes";
  ASSERT_TRUE(MakeDirs(pipes).ok());
  const std::string f0 = pipes + "/train_0", f1 = pipes + "/train_1";
  ASSERT_EQ(::mkfifo(f0.c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo(f1.c_str(), 0600), 0);
  const std::string s0 = Lines(Range(0, 400)), s1 = Lines(Range(1000, 1400));
  Channel ch;
  ch.set_name("train");
  ch.set_pipe_dir(pipes);
  ch.set_shard_policy(SHARD_BY_RECORD);
  PipelineOptions o = Options({ch});
  o.batch_size = 24;
  o.epochs = 2;
  o.shuffle_buffer = 10;
  o.num_shards = 2;
  o.shard_index = 1;
  o.prefetch_batches = 2;
  auto kick = [&] {
    KickFifo(f0);
    KickFifo(f1);
  };

  std::vector<Delivered> ref;
  {
    FifoWriter w0(f0, s0, 1), w1(f1, s1, 1);
    RunBounded(
        [&] {
          auto p = MustCreate(o);
          if (p) {
            EXPECT_TRUE(Drain(p.get(), &ref).ok());
          }
        },
        30, kick);
    w0.Join(10);
    w1.Join(10);
  }
  ASSERT_EQ(Flatten(ref).size(), 400u);

  for (int k : {0, 3, 7}) {
    SCOPED_TRACE(absl::StrCat("k = ", k));
    std::vector<Delivered> got;
    PipelinePosition pos;
    {
      // Only epoch 0's writer runs: the first reader may block opening train_1 and must still
      // stop promptly when destroyed.
      FifoWriter w0(f0, s0, 1);
      RunBounded(
          [&] {
            auto p = MustCreate(o);
            if (!p) return;
            EXPECT_TRUE(Drain(p.get(), &got, k).ok());
            pos = p->position();
          },
          30, kick);
      w0.Finish();
    }
    PipelineOptions r = o;
    r.start = pos;
    FifoWriter w0(f0, s0, 1), w1(f1, s1, 1);  // the writer replays the epoch
    RunBounded(
        [&] {
          auto p = MustCreate(r);
          if (p) {
            EXPECT_TRUE(Drain(p.get(), &got).ok());
          }
        },
        30, kick);
    EXPECT_EQ(got, ref);
    w0.Finish();
    w1.Finish();
  }
}

TEST_F(PipelineTest, PositionTakenWhileWaitingForAFifoIsExact) {
  const std::string pipes = dir_ + "/pipes";
  ASSERT_TRUE(MakeDirs(pipes).ok());
  const std::string fm = pipes + "/main_0", fa = pipes + "/aux_0";
  ASSERT_EQ(::mkfifo(fm.c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo(fa.c_str(), 0600), 0);
  const std::string sm = Lines(Range(0, 300)), sa = Lines(Range(5000, 5100));
  std::vector<Channel> channels(2);
  channels[0].set_name("main");
  channels[1].set_name("aux");
  channels[1].set_weight(0.03);
  for (Channel& ch : channels) ch.set_pipe_dir(pipes);
  PipelineOptions o = Options(channels);
  o.batch_size = 8;
  o.shuffle_buffer = 4;
  o.prefetch_batches = 64;
  o.seed = 5;  // draws aux for the first time after a few complete batches
  auto kick = [&] {
    KickFifo(fm);
    KickFifo(fa);
  };
  std::vector<Delivered> ref;
  {
    FifoWriter wm(fm, sm, 1), wa(fa, sa, 1);
    RunBounded(
        [&] {
          auto p = MustCreate(o);
          if (p) {
            EXPECT_TRUE(Drain(p.get(), &ref).ok());
          }
        },
        30, kick);
  }
  ASSERT_EQ(Flatten(ref).size(), 400u);

  // Only main's writer runs, so the producer stops in the open of aux_0 with a batch half
  // formed; position() must not wait for it.
  PipelinePosition pos;
  {
    FifoWriter wm(fm, sm, 1);
    PipelineOptions a = o;
    absl::Notification aux_opening;
    a.formats.open_source = [&, open = o.formats.open_source](
                                DataFormat f, const std::string& path, Channel::Compression c) {
      if (path == fa) aux_opening.Notify();
      return open(f, path, c);
    };
    auto p = MustCreate(a);
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(aux_opening.WaitForNotificationWithTimeout(absl::Seconds(10)));
    RunBounded([&] { pos = p->position(); }, 10, kick);
    RunBounded([&] { p.reset(); }, 10, kick);
    wm.Finish();
  }
  ASSERT_GE(pos.pending_size(), 2);  // complete batches, then the one being formed
  EXPECT_TRUE(pos.pending(pos.pending_size() - 1).incomplete());
  EXPECT_GT(pos.pending(pos.pending_size() - 1).record_size(), 0);
  EXPECT_EQ(pos.pending_channel(), 1);
  EXPECT_EQ(pos.batches_delivered(), 0u);

  PipelineOptions r = o;
  r.start = pos;
  {
    // With no room to read ahead the restored producer cannot start: the restored pipeline
    // reports exactly the position it came from, incomplete batch included.
    r.prefetch_batches = pos.pending_size() - 1;
    auto p = MustCreate(r);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(MessageDifferencer::Equals(p->position(), pos));
    r.prefetch_batches = o.prefetch_batches;
  }
  std::vector<Delivered> got;
  FifoWriter wm(fm, sm, 1), wa(fa, sa, 1);
  RunBounded(
      [&] {
        auto p = MustCreate(r);
        if (p) {
          EXPECT_TRUE(Drain(p.get(), &got).ok());
        }
      },
      30, kick);
  EXPECT_EQ(got, ref);
}

TEST_F(PipelineTest, DestroyingWhileWaitingForAFifoWriterDoesNotHang) {
  const std::string fifo = dir_ + "/train_0";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Channel ch;
  ch.set_name("train");
  ch.set_pipe_dir(dir_);
  PipelineOptions o = Options({ch});
  absl::Notification opening;
  const auto open = o.formats.open_source;
  o.formats.open_source = [&](DataFormat format, const std::string& path,
                              Channel::Compression c) {
    opening.Notify();
    return open(format, path, c);
  };
  auto p = MustCreate(o);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(opening.WaitForNotificationWithTimeout(absl::Seconds(10)));
  RunBounded([&] { p.reset(); }, 10, [&] { KickFifo(fifo); });
  EXPECT_EQ(p, nullptr);
}

TEST_F(PipelineTest, StopAndRestoreContinuesExactly) {
  // Channel a: plain lines with a few corrupt records, sharded by record; channel b: CSV files
  // with a header, sharded by file. Everything that reads ahead is on.
  std::vector<int> a_sizes = {17, 3, 26, 9, 0, 12};
  for (size_t i = 0; i < a_sizes.size(); ++i) {
    std::vector<int> v = Range(i * 1000, i * 1000 + a_sizes[i]);
    std::string text = Lines(v);
    // Two adjacent corrupt records: under SHARD_BY_RECORD one of them is this reader's.
    if (a_sizes[i] > 5) text.insert(text.find('\n', text.size() / 2) + 1, "!corrupt\n!bad\n");
    Write(absl::StrCat("a/f", i), text);
  }
  WriteFiles("b", {11, 23, 4, 15}, 500000, "label,value\n");
  PipelineOptions o = Options({MakeChannel("a", dir_ + "/a", SHARD_BY_RECORD, 1.0),
                               MakeChannel("b", dir_ + "/b", SHARD_BY_FILE, 3.0, CSV)});
  o.batch_size = 7;
  o.epochs = 3;
  o.shard_index = 1;
  o.num_shards = 2;
  o.shuffle_files = true;
  o.shuffle_buffer = 16;
  o.reader_threads = 3;
  o.prefetch_batches = 4;
  o.max_bad_record_fraction = 0.2;
  PipelineStats ref_stats;
  const std::vector<Delivered> ref = RunAll(o, &ref_stats);
  ASSERT_GT(ref.size(), 10u);
  ASSERT_EQ(ref.back().epoch, 2);
  ASSERT_GT(ref_stats.bad_records, 0u);

  for (size_t k = 0; k <= ref.size(); ++k) {
    SCOPED_TRACE(absl::StrCat("k = ", k));
    std::vector<Delivered> got;
    PipelinePosition pos;
    {
      auto p = MustCreate(o);
      ASSERT_NE(p, nullptr);
      ASSERT_TRUE(Drain(p.get(), &got, static_cast<int>(k)).ok());
      pos = p->position();
      EXPECT_EQ(pos.batches_delivered(), k);
    }
    if (k % 2 == 1) {  // through the wire format
      PipelinePosition parsed;
      ASSERT_TRUE(parsed.ParseFromString(pos.SerializeAsString()));
      pos = parsed;
    }
    PipelineOptions r = o;
    r.start = pos;
    auto p = MustCreate(r);
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(Drain(p.get(), &got).ok());
    ASSERT_EQ(got, ref);
    const PipelineStats s = p->stats();
    EXPECT_EQ(s.batches, ref_stats.batches);
    EXPECT_EQ(s.records_read, ref_stats.records_read);
    EXPECT_EQ(s.bad_records, ref_stats.bad_records);
    for (size_t c = 0; c < 2; ++c) {
      EXPECT_EQ(s.channels[c].records_read, ref_stats.channels[c].records_read);
      EXPECT_EQ(s.channels[c].bad_records, ref_stats.channels[c].bad_records);
    }
  }

  // A chain of restores, each one also restored from.
  std::vector<Delivered> got;
  PipelineOptions r = o;
  for (int step : {2, 0, 5, 1, 0, 6}) {
    auto p = MustCreate(r);
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(Drain(p.get(), &got, step).ok());
    r.start = p->position();
  }
  auto p = MustCreate(r);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(Drain(p.get(), &got).ok());
  EXPECT_EQ(got, ref);
}

TEST_F(PipelineTest, RestoreRefusesAnotherShardLayoutOrChannelSet) {
  WriteFiles("d", {10, 10});
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/d", SHARD_BY_RECORD)});
  o.num_shards = 2;
  auto p = MustCreate(o);
  ASSERT_NE(p, nullptr);
  const PipelinePosition pos = p->position();
  p.reset();
  PipelineOptions other = o;
  other.start = pos;
  other.shard_index = 1;
  auto r = Pipeline::Create(other, spec_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("reader 0 of 2"));
  other = o;
  other.start = pos;
  other.channels[0].set_name("renamed");
  r = Pipeline::Create(other, spec_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'train'"));
}

TEST_F(PipelineTest, FirstBadRecordStopsThePipelineWhenNoneAreTolerated) {
  struct Case {
    const char* bad_line;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"1,oops", absl::StatusCode::kInvalidArgument, ":line 6: expected 'label,value'"},
      {"!garbage", absl::StatusCode::kDataLoss, ":line 6: corrupt record"},
      {"#TRUNCATED", absl::StatusCode::kOutOfRange, ": record 6: truncated"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.bad_line);
    const std::string path =
        Write("bad.tsv", absl::StrCat(Lines(Range(0, 5)), c.bad_line, "\n", Lines(Range(5, 10))));
    PipelineOptions o = Options({MakeChannel("train", path)});
    o.batch_size = 4;
    o.reader_threads = 2;
    auto p = MustCreate(o);
    ASSERT_NE(p, nullptr);
    std::vector<Delivered> got;
    const absl::Status s = Drain(p.get(), &got);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr(path + c.message));
    EXPECT_EQ(got, (std::vector<Delivered>{{0, {0, 1, 2, 3}}}));
    Batch b;
    int64_t e;
    EXPECT_EQ(p->Next(&b, &e).status(), s);  // the error sticks
    EXPECT_EQ(p->stats().bad_records, 1u);
  }
}

TEST_F(PipelineTest, BadRecordsWithinToleranceAreSkippedAndCounted) {
  std::string text;
  std::vector<int> good;
  for (int i = 0; i < 2000; ++i) {
    if (i % 50 == 7) {
      text += (i % 100 == 7) ? "!corrupt\n" : "0,not-a-number\n";
    } else {
      absl::StrAppend(&text, i % 2, ",", i, "\n");
      good.push_back(i);
    }
  }
  Write("d/a.tsv", text);
  Write("d/b.tsv",
        absl::StrCat(Lines(Range(5000, 5010)), "#TRUNCATED\n", Lines(Range(6000, 6010))));
  good.insert(good.end(), {5000, 5001, 5002, 5003, 5004, 5005, 5006, 5007, 5008, 5009});
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/d")});
  o.batch_size = 64;
  o.max_bad_record_fraction = 0.1;
  o.reader_threads = 2;
  PipelineStats stats;
  const std::vector<Delivered> run = RunAll(o, &stats);
  EXPECT_EQ(Sorted(Flatten(run)), Sorted(good));
  EXPECT_EQ(stats.bad_records, 41u);  // 40 bad lines + the unreadable rest of b.tsv
  EXPECT_EQ(stats.records_read, 2000u + 10 + 1);
  EXPECT_EQ(stats.channels[0].bad_records, 41u);
  EXPECT_FALSE(stats.last_bad_record.empty());
}

TEST_F(PipelineTest, TooManyBadRecordsFail) {
  std::string text;
  for (int i = 0; i < 3000; ++i) {
    if (i % 5 == 0) {
      text += "x\n";
    } else {
      absl::StrAppend(&text, i % 2, ",", i, "\n");
    }
  }
  Write("a.tsv", text);
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/a.tsv")});
  o.batch_size = 100;
  o.max_bad_record_fraction = 0.1;
  auto p = MustCreate(o);
  ASSERT_NE(p, nullptr);
  std::vector<Delivered> got;
  const absl::Status s = Drain(p.get(), &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("too many bad records"));
  EXPECT_THAT(s.message(), HasSubstr("expected 'label,value'"));
  // The check waits for 1000 records, then fails at the first batch after that.
  EXPECT_EQ(p->stats().records_read, 1000u);
  EXPECT_EQ(got.size(), 9u);

  // Below 1000 records the check runs at the end of the input.
  Write("small.tsv", absl::StrCat(Lines(Range(0, 8)), "x\ny\n"));
  o.channels = {MakeChannel("train", dir_ + "/small.tsv")};
  o.batch_size = 4;
  p = MustCreate(o);
  ASSERT_NE(p, nullptr);
  got.clear();
  EXPECT_EQ(Drain(p.get(), &got).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Flatten(got), Range(0, 8));
}

TEST_F(PipelineTest, DestroyingWithTheConsumerStoppedEarlyDoesNotHang) {
  WriteFiles("d", std::vector<int>(20, 900));
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/d")});
  o.batch_size = 64;
  o.epochs = 0;  // forever
  o.prefetch_batches = 2;
  o.reader_threads = 2;
  o.shuffle_buffer = 100;
  for (int consumed : {0, 3}) {
    auto p = MustCreate(o);
    ASSERT_NE(p, nullptr);
    std::vector<Delivered> got;
    ASSERT_TRUE(Drain(p.get(), &got, consumed).ok());
    EXPECT_EQ(got.size(), static_cast<size_t>(consumed));
    RunBounded([&] { p.reset(); }, 30);
  }
}

TEST_F(PipelineTest, ParserCreationFailureIsFatalAndNamesTheFile) {
  const std::string path = Write("h.csv", "foo,bar\n1,1\n");
  PipelineOptions o = Options({MakeChannel("train", path, SHARD_BY_FILE, 1, CSV)});
  o.max_bad_record_fraction = 0.5;
  auto p = MustCreate(o);
  ASSERT_NE(p, nullptr);
  std::vector<Delivered> got;
  const absl::Status s = Drain(p.get(), &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("CSV header 'foo,bar'"));
}

TEST_F(PipelineTest, ForeverOverEmptyInputFailsInsteadOfSpinning) {
  Write("empty.tsv", "");
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/empty.tsv")});
  o.epochs = 0;
  auto p = MustCreate(o);
  ASSERT_NE(p, nullptr);
  std::vector<Delivered> got;
  EXPECT_EQ(Drain(p.get(), &got).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(PipelineTest, CreateValidatesOptions) {
  Write("a.tsv", Lines(Range(0, 3)));
  const PipelineOptions good = Options({MakeChannel("train", dir_ + "/a.tsv")});
  const std::vector<std::function<void(PipelineOptions*)>> breakers = {
      [](PipelineOptions* o) { o->channels.clear(); },
      [](PipelineOptions* o) { o->batch_size = 0; },
      [](PipelineOptions* o) { o->shard_index = 2; },
      [](PipelineOptions* o) { o->reader_threads = 0; },
      [](PipelineOptions* o) { o->prefetch_batches = 0; },
      [](PipelineOptions* o) { o->max_bad_record_fraction = 1.5; },
      [](PipelineOptions* o) { o->epochs = -1; },
      [](PipelineOptions* o) { o->channels[0].set_weight(0); },
      [](PipelineOptions* o) { o->channels.push_back(o->channels[0]); },
      [](PipelineOptions* o) { o->formats = RecordFormats(); },
  };
  ASSERT_TRUE(Pipeline::Create(good, spec_).ok());
  for (size_t i = 0; i < breakers.size(); ++i) {
    PipelineOptions o = good;
    breakers[i](&o);
    auto p = Pipeline::Create(o, spec_);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << i;
  }
  PipelineOptions missing = Options({MakeChannel("train", dir_ + "/nope.tsv")});
  EXPECT_EQ(Pipeline::Create(missing, spec_).status().code(), absl::StatusCode::kNotFound);
}

TEST(OptionsFromConfig, TrainShufflesEvalDoesNot) {
  DataConfig data;
  data.add_train()->add_path("t");
  data.add_eval()->add_path("e1");
  data.add_eval()->set_name("e2");
  data.set_shuffle_buffer(123);
  data.set_shuffle_seed(9);
  data.set_prefetch_batches(6);
  data.set_max_bad_record_fraction(0.01);
  PipelineOptions t = OptionsFromConfig(data, true, 256, 3, 8, 2, Formats());
  ASSERT_EQ(t.channels.size(), 1u);
  EXPECT_EQ(t.channels[0].path(0), "t");
  EXPECT_EQ(t.batch_size, 256);
  EXPECT_EQ(t.shard_index, 3);
  EXPECT_EQ(t.num_shards, 8);
  EXPECT_EQ(t.epochs, 2);
  EXPECT_EQ(t.seed, 9u);
  EXPECT_TRUE(t.shuffle_files);
  EXPECT_EQ(t.shuffle_buffer, 123);
  EXPECT_EQ(t.prefetch_batches, 6);
  EXPECT_EQ(t.max_bad_record_fraction, 0.01);
  EXPECT_TRUE(t.formats.open_source && t.formats.make_parser);
  PipelineOptions e = OptionsFromConfig(data, false, 4096, 0, 1, 1, Formats());
  ASSERT_EQ(e.channels.size(), 2u);
  EXPECT_EQ(e.channels[1].name(), "e2");
  EXPECT_FALSE(e.shuffle_files);
  EXPECT_EQ(e.shuffle_buffer, 0);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// The validation split (data.validation_fraction): the training part and the held-out part
// partition the records, the same under any sharding, shuffle and epoch, and a training pipeline
// restored from a position mid-epoch delivers exactly what the uninterrupted one would have.
TEST_F(PipelineTest, ValidationSplitPartitionsTheRecordsAndSurvivesAResume) {
  const std::vector<int> all = Sorted(WriteFiles("v", {300, 250, 450}));
  PipelineOptions held = Options({MakeChannel("train", dir_ + "/v")});
  held.batch_size = 64;
  held.validation_fraction = 0.2;
  held.validation_part = true;
  const std::vector<int> validation = Sorted(Flatten(RunAll(held)));
  // About a fifth is held out (1000 records: well inside 0.2 +- 0.05).
  EXPECT_GT(validation.size(), 150u);
  EXPECT_LT(validation.size(), 250u);

  for (bool shuffle : {false, true}) {
    for (int shards : {1, 3}) {
      SCOPED_TRACE(absl::StrCat("shuffle ", shuffle, " shards ", shards));
      std::vector<int> trained;
      for (int s = 0; s < shards; ++s) {
        PipelineOptions o = Options({MakeChannel("train", dir_ + "/v", SHARD_BY_RECORD)});
        o.batch_size = 32;
        o.epochs = 2;
        o.shuffle_files = shuffle;
        o.shuffle_buffer = shuffle ? 50 : 0;
        o.shard_index = s;
        o.num_shards = shards;
        o.validation_fraction = 0.2;
        const std::vector<Delivered> got = RunAll(o);
        for (int64_t epoch : {0, 1}) {
          const std::vector<int> e = Flatten(got, epoch);
          if (epoch == 0) trained.insert(trained.end(), e.begin(), e.end());
        }
      }
      std::vector<int> both = Sorted(trained);
      both.insert(both.end(), validation.begin(), validation.end());
      EXPECT_EQ(Sorted(both), all);  // disjoint, and together every record once
    }
  }

  // Resume mid-epoch: the training part after the position is the uninterrupted run's.
  PipelineOptions o = Options({MakeChannel("train", dir_ + "/v")});
  o.batch_size = 32;
  o.epochs = 2;
  o.shuffle_buffer = 40;
  o.validation_fraction = 0.2;
  const std::vector<Delivered> whole = RunAll(o);
  std::vector<Delivered> first;
  PipelinePosition pos;
  {
    auto p = MustCreate(o);
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(Drain(p.get(), &first, 11).ok());
    pos = p->position();
  }
  PipelineOptions r = o;
  r.start = pos;
  std::vector<Delivered> rest = RunAll(r);
  first.insert(first.end(), rest.begin(), rest.end());
  EXPECT_EQ(first, whole);

  // Out of range: refused.
  o.validation_fraction = 1;
  EXPECT_EQ(Pipeline::Create(o, spec_).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
