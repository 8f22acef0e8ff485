// checkpoint/layout.h: names, LATEST, listing, the commit order, choosing with fallback, and
// retention. (tests/checkpoint/fixtures_test.cc pins the bytes of the files.)
#include "checkpoint/layout.h"

#include <dirent.h>
#include <google/protobuf/text_format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "checkpoint/delta_chain.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fake_env.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  std::string templ = testing::TempDir() + "/layout_" + name + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return testing::TempDir() + "/layout_" + name;
  return templ;
}

std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : "<" + s.status().ToString() + ">";
}

TEST(CheckpointLayout, JobCheckpointDirIsCheckpointDirElseModelDir) {
  Config config;
  config.mutable_train()->set_model_dir("/m");
  EXPECT_EQ(JobCheckpointDir(config), "/m");
  config.mutable_checkpoint()->set_dir("/c");
  EXPECT_EQ(JobCheckpointDir(config), "/c");
}

TEST(CheckpointLayout, CheckpointNames) {
  EXPECT_EQ(CheckpointName(0), "ckpt-0");
  EXPECT_EQ(CheckpointName(42), "ckpt-42");
  EXPECT_EQ(CheckpointPath("/d", 7), "/d/ckpt-7");
  EXPECT_EQ(ParseCheckpointName("ckpt-0"), 0);
  EXPECT_EQ(ParseCheckpointName("ckpt-42"), 42);
  EXPECT_EQ(ParseCheckpointName("ckpt-9223372036854775807"), INT64_MAX);
  // Only what CheckpointName writes: another spelling of a step would name another directory.
  for (const char* bad : {"ckpt-", "ckpt-+5", "ckpt- 5", "ckpt-5 ", "ckpt-05", "ckpt--1", "ckpt-5x",
                          "ckpt-9223372036854775808", "CKPT-5", "ckpt5", "xckpt-5", ""}) {
    EXPECT_EQ(ParseCheckpointName(bad), std::nullopt) << bad;
  }
}

TEST(CheckpointLayout, FileNames) {
  EXPECT_EQ(ShardFileName(0, 1), "shard-0-of-1");
  EXPECT_EQ(ShardFileName(2, 3), "shard-2-of-3");
  EXPECT_EQ(WorkerStateFileName(4), "worker-4.state");
  EXPECT_TRUE(IsShardFileName("shard-0-of-1"));
  EXPECT_TRUE(IsShardFileName("shard-11-of-12"));
  for (const char* other : {"shard-3-of-3", "shard-01-of-2", "shard-0-of-", "shard-0", "shard-",
                            "shard-0-of-1.tmp.12", "worker-0.state", "MANIFEST", "xshard-0-of-1"}) {
    EXPECT_FALSE(IsShardFileName(other)) << other;
  }
}

TEST(CheckpointLayout, Latest) {
  const std::string dir = FreshDir("latest");
  EXPECT_EQ(ReadLatest(dir).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteLatest(dir, 7).ok());
  EXPECT_EQ(Slurp(dir + "/LATEST"), "ckpt-7\n");
  EXPECT_EQ(*ReadLatest(dir), 7);
  ASSERT_TRUE(WriteFileAtomic(dir + "/LATEST", "  ckpt-8 \n\n").ok());
  EXPECT_EQ(*ReadLatest(dir), 8);
  ASSERT_TRUE(WriteFileAtomic(dir + "/LATEST", "ckpt-08\n").ok());
  const absl::Status bad = ReadLatest(dir).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.message()), HasSubstr(dir + "/LATEST"));
  std::system(("rm -rf " + dir).c_str());
}

// A data file as a mode writes one: a block file listed in the manifest.
void WriteDataFile(const std::string& ckpt, const std::string& name, CheckpointManifest* m) {
  auto w = BlockWriter::Create(ckpt + "/" + name);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Add("NOTE", absl::StrCat("data of ", ckpt)).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto* f = m->add_file();
  f->set_name(name);
  f->set_bytes((*w)->bytes());
}

// A checkpoint of `step` as every mode writes one: prepare, data files, commit.
// `chain` (when not null) makes it a delta when the chain says so, and learns the commit.
std::string Save(const std::string& dir, int64_t step, int keep, DeltaChain* chain = nullptr,
                 Env* env = Env::Default()) {
  auto ckpt = PrepareCheckpointDir(dir, step);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  CheckpointManifest m;
  m.set_step(step);
  m.set_num_shards(1);
  if (chain != nullptr && chain->Next()) *m.mutable_delta() = *chain->Next();
  WriteDataFile(*ckpt, ShardFileName(0, 1), &m);
  WorkerState w0, w1;
  w0.set_step(step);
  w1.set_step(step);
  w1.set_examples(5);
  auto done = CommitCheckpoint(dir, m, {{0, w0}, {1, w1}}, keep, env);
  EXPECT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*done, *ckpt);
  if (chain != nullptr) chain->Committed(m);
  return *ckpt;
}

std::vector<int64_t> Steps(const std::string& dir) {
  std::vector<int64_t> out;
  for (const CheckpointEntry& e : ListCheckpoints(dir)) out.push_back(e.step);
  return out;
}

TEST(CheckpointLayout, CommitWritesWorkerStatesThenManifestThenLatest) {
  const std::string dir = FreshDir("commit");
  const std::string ckpt = Save(dir, 12, 3);
  EXPECT_EQ(ckpt, dir + "/ckpt-12");
  EXPECT_EQ(*ReadLatest(dir), 12);
  CheckpointManifest m;
  ASSERT_TRUE(VerifyCheckpoint(ckpt, &m).ok());
  EXPECT_EQ(m.step(), 12);
  EXPECT_EQ(m.num_workers(), 2);
  EXPECT_GT(m.wall_time(), 1.7e9);
  ASSERT_EQ(m.file_size(), 3);
  EXPECT_EQ(m.file(0).name(), "shard-0-of-1");
  EXPECT_EQ(m.file(1).name(), "worker-0.state");
  EXPECT_EQ(m.file(2).name(), "worker-1.state");
  for (const auto& f : m.file()) {
    EXPECT_EQ(f.bytes(), Slurp(ckpt + "/" + f.name()).size()) << f.name();
  }
  WorkerState w1;
  ASSERT_TRUE(ReadWorkerState(ckpt, 1, &w1).ok());
  EXPECT_EQ(w1.examples(), 5);
  EXPECT_EQ(ReadWorkerState(ckpt, 2, &w1).code(), absl::StatusCode::kNotFound);
  // Nothing but the checkpoint's files: no temporary file is left behind.
  ASSERT_EQ(std::system(("test $(ls " + ckpt + " | wc -l) = 4").c_str()), 0);
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->dir, ckpt);
  EXPECT_EQ((*choice)->manifest.SerializeAsString(), m.SerializeAsString());
  std::system(("rm -rf " + dir).c_str());
}

TEST(CheckpointLayout, ListingSeesOnlyCheckpointDirectories) {
  const std::string dir = FreshDir("list");
  EXPECT_TRUE(ListCheckpoints(dir + "/missing").empty());
  Save(dir, 3, 5);
  ASSERT_TRUE(MakeDirs(dir + "/ckpt-10").ok());  // incomplete: no MANIFEST
  ASSERT_TRUE(MakeDirs(dir + "/ckpt-07").ok());  // not a name pstrain writes
  ASSERT_TRUE(MakeDirs(dir + "/other").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/ckpt-5", "a file").ok());
  const std::vector<CheckpointEntry> list = ListCheckpoints(dir);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].step, 10);
  EXPECT_EQ(list[0].path, dir + "/ckpt-10");
  EXPECT_FALSE(list[0].complete);
  EXPECT_EQ(list[1].step, 3);
  EXPECT_TRUE(list[1].complete);
  std::system(("rm -rf " + dir).c_str());
}

TEST(CheckpointLayout, ChooseFallsBackPastACorruptCheckpoint) {
  const std::string dir = FreshDir("choose");
  auto none = ChooseCheckpoint(dir);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());  // no LATEST: a fresh start
  Save(dir, 10, 5);
  Save(dir, 20, 5);
  const std::string newest = Save(dir, 30, 5);
  ASSERT_TRUE(MakeDirs(dir + "/ckpt-40").ok());  // newer than LATEST: never committed
  // A flipped byte in the newest checkpoint's data file.
  std::string data = Slurp(newest + "/shard-0-of-1");
  data[data.size() - 30] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(newest + "/shard-0-of-1", data).ok());
  CheckpointManifest m;
  const absl::Status bad = VerifyCheckpoint(newest, &m);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.message()), HasSubstr(newest + "/shard-0-of-1: block 0"));
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->dir, dir + "/ckpt-20");
  // LATEST garbled: every checkpoint is a candidate, newest first.
  ASSERT_TRUE(WriteFileAtomic(dir + "/LATEST", "garbage").ok());
  choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->dir, dir + "/ckpt-20");
  // Nothing usable although LATEST exists: an error, not a fresh start.
  ASSERT_TRUE(WriteLatest(dir, 30).ok());
  for (const char* c : {"/ckpt-10", "/ckpt-20"}) {
    ASSERT_EQ(std::remove((dir + c + "/worker-0.state").c_str()), 0);
  }
  choice = ChooseCheckpoint(dir);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(choice.status().message()), HasSubstr("LATEST exists"));
  std::system(("rm -rf " + dir).c_str());
}

TEST(CheckpointLayout, VerifyRefusesSizesMissingFilesAndPathsOutsideTheDirectory) {
  const std::string dir = FreshDir("verify");
  const std::string ckpt = Save(dir, 1, 3);
  CheckpointManifest good, m;
  ASSERT_TRUE(VerifyCheckpoint(ckpt, &good).ok());
  CheckpointManifest bad = good;
  bad.mutable_file(0)->set_bytes(good.file(0).bytes() + 1);
  ASSERT_TRUE(WriteManifest(ckpt, bad).ok());
  EXPECT_THAT(std::string(VerifyCheckpoint(ckpt, &m).message()), HasSubstr("MANIFEST says"));
  bad = good;
  bad.mutable_file(0)->set_name("gone");
  ASSERT_TRUE(WriteManifest(ckpt, bad).ok());
  EXPECT_THAT(std::string(VerifyCheckpoint(ckpt, &m).message()), HasSubstr("gone: missing"));
  for (const char* name : {"../LATEST", "/etc/passwd", "", ".."}) {
    bad = good;
    bad.mutable_file(0)->set_name(name);
    ASSERT_TRUE(WriteManifest(ckpt, bad).ok());
    const absl::Status s = VerifyCheckpoint(ckpt, &m);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("not a file name")) << name;
  }
  std::system(("rm -rf " + dir).c_str());
}

TEST(CheckpointLayout, PrepareRemovesALeftoverManifest) {
  const std::string dir = FreshDir("prepare");
  const std::string ckpt = Save(dir, 4, 3);
  ASSERT_TRUE(WriteLatest(dir, 3).ok());  // as if ckpt-4 were an interrupted attempt
  ASSERT_TRUE(PathExists(ckpt + "/MANIFEST"));
  auto again = PrepareCheckpointDir(dir, 4);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, ckpt);
  EXPECT_FALSE(PathExists(ckpt + "/MANIFEST"));
  std::system(("rm -rf " + dir).c_str());
}

// A symlink planted where the next checkpoint goes (ckpt-<step> -> a directory elsewhere, with a
// MANIFEST of its own) is replaced by a real directory: nothing is written into the target or
// deleted from it (PrepareCheckpointDir removed the target's MANIFEST and the save wrote its
// files there, until 2026-11-29).
TEST(CheckpointLayout, PrepareReplacesASymlinkPlantedAtTheCheckpointsName) {
  const std::string dir = FreshDir("prepare_symlink");
  const std::string elsewhere = FreshDir("prepare_symlink_elsewhere");
  ASSERT_TRUE(WriteFileAtomic(elsewhere + "/MANIFEST", "precious").ok());
  ASSERT_EQ(::symlink(elsewhere.c_str(), CheckpointPath(dir, 5).c_str()), 0);
  const std::string ckpt = Save(dir, 5, 1);
  EXPECT_TRUE(Env::Default()->IsRealDirectory(ckpt));
  CheckpointManifest m;
  EXPECT_TRUE(VerifyCheckpoint(ckpt, &m).ok());
  EXPECT_EQ(Slurp(elsewhere + "/MANIFEST"), "precious");
  EXPECT_EQ(Slurp(elsewhere + "/" + ShardFileName(0, 1)).rfind("<", 0), 0u)
      << "a shard was written outside the directory";
  // A file there is replaced too.
  ASSERT_TRUE(WriteFileAtomic(CheckpointPath(dir, 6), "not a directory").ok());
  auto six = PrepareCheckpointDir(dir, 6);
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_TRUE(Env::Default()->IsRealDirectory(*six));
  std::system(("rm -rf " + dir + " " + elsewhere).c_str());
}

// PASS_END: written only when every worker finished a pass that trained, with the pass's
// examples; read back; a stale one is removed by PrepareCheckpointDir; a corrupt one is refused.
TEST(CheckpointLayout, PassEndMarksAFinishedPass) {
  const std::string dir = FreshDir("pass_end");
  const std::string ckpt = Save(dir, 7, 3);
  auto state = [](int64_t step, int64_t examples, bool finished, bool max_steps = false) {
    WorkerState w;
    w.set_step(step);
    w.set_examples(examples);
    w.set_finished(finished);
    w.set_pass_first_step(2);
    w.set_pass_first_examples(20);
    w.set_max_steps_reached(max_steps);
    return w;
  };
  // One worker still training: no mark.
  ASSERT_TRUE(MarkPassEnd(dir, 7, {{0, state(4, 40, true)}, {1, state(3, 30, false)}}).ok());
  EXPECT_FALSE(PathExists(ckpt + "/PASS_END"));
  // No worker trained in the pass (it began at this checkpoint): no mark.
  ASSERT_TRUE(MarkPassEnd(dir, 7, {{0, state(2, 20, true)}, {1, state(2, 20, true)}}).ok());
  EXPECT_FALSE(PathExists(ckpt + "/PASS_END"));
  auto none = ReadPassEnd(ckpt);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());

  ASSERT_TRUE(MarkPassEnd(dir, 7, {{0, state(4, 40, true)}, {1, state(3, 30, true, true)}}).ok());
  auto end = ReadPassEnd(ckpt);
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_TRUE(end->has_value());
  EXPECT_EQ((*end)->step(), 7);
  EXPECT_EQ((*end)->pass_examples(), (40 - 20) + (30 - 20));
  EXPECT_TRUE((*end)->max_steps_reached());

  // Copied into another step's checkpoint: refused, naming the file.
  ASSERT_EQ(std::system(("mkdir -p " + dir + "/ckpt-8 && cp " + ckpt + "/PASS_END " + dir +
                         "/ckpt-8/")
                            .c_str()),
            0);
  auto wrong = ReadPassEnd(dir + "/ckpt-8");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(wrong.status().message()), ::testing::HasSubstr("ckpt-8/PASS_END"));
  ASSERT_TRUE(WriteFileAtomic(ckpt + "/PASS_END", "garbage").ok());
  EXPECT_EQ(ReadPassEnd(ckpt).status().code(), absl::StatusCode::kDataLoss);

  // An attempt at step 7 again (LATEST moved back before it): the stale mark goes.
  ASSERT_TRUE(WriteLatest(dir, 3).ok());
  ASSERT_TRUE(PrepareCheckpointDir(dir, 7).ok());
  EXPECT_FALSE(PathExists(ckpt + "/PASS_END"));
  std::system(("rm -rf " + dir).c_str());
}

TEST(CheckpointLayout, IsCommittedCheckpoint) {
  const std::string dir = FreshDir("committed");
  EXPECT_FALSE(IsCommittedCheckpoint(dir, 5));
  const std::string ckpt = Save(dir, 5, 3);
  EXPECT_TRUE(IsCommittedCheckpoint(dir, 5));
  EXPECT_FALSE(IsCommittedCheckpoint(dir, 6));
  Save(dir, 6, 3);
  EXPECT_FALSE(IsCommittedCheckpoint(dir, 5));  // complete, but LATEST names another
  EXPECT_TRUE(IsCommittedCheckpoint(dir, 6));
  // Corrupt: LATEST names it, but it must be written again.
  ASSERT_TRUE(WriteFileAtomic(dir + "/ckpt-6/worker-0.state", "x").ok());
  EXPECT_FALSE(IsCommittedCheckpoint(dir, 6));
  std::system(("rm -rf " + dir).c_str());
}

TEST(CheckpointLayout, RetentionKeepsTheNewestCommitted) {
  const std::string dir = FreshDir("keep");
  for (int64_t step : {1, 2, 3, 4}) Save(dir, step, 2);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{4, 3}));
  Save(dir, 5, 0);  // keep < 1 keeps the one just committed
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{5}));
  std::system(("rm -rf " + dir).c_str());
}

// The entries of dir whose names start with ".removing-".
std::vector<std::string> Removing(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, ".removing-", 10) == 0) out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

// Retention does not delete inside the save that commits: the old directories leave the
// checkpoints' names at once (renamed) and are deleted by a background thread, which
// Env::Default()->WaitForScheduled() waits for. The data of a deleted checkpoint is gone then, not moved.
TEST(CheckpointLayout, RetentionDeletesInTheBackground) {
  const std::string dir = FreshDir("keep_background");
  for (int64_t step : {1, 2, 3, 4, 5}) Save(dir, step, 2);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{5, 4}));  // at once, whatever the thread has done
  Env::Default()->WaitForScheduled();
  EXPECT_THAT(Removing(dir), ::testing::IsEmpty());
  struct stat st;
  for (int64_t step : {1, 2, 3}) EXPECT_NE(::stat(CheckpointPath(dir, step).c_str(), &st), 0);
  ASSERT_EQ(::stat(CheckpointPath(dir, 4).c_str(), &st), 0);
  std::system(("rm -rf " + dir).c_str());
}

// A fake Env whose background work waits in a list until the test runs it.
class DeferringEnv : public FakeEnv {
 public:
  void Schedule(std::function<void()> work) override { work_.push_back(std::move(work)); }
  void WaitForScheduled() override { RunAll(); }
  void RunAll() {
    while (!work_.empty()) {
      std::function<void()> next = std::move(work_.front());
      work_.erase(work_.begin());
      next();
    }
  }
  std::vector<std::function<void()>> work_;
};

// The Env the committing code is given does the deletions and stamps the MANIFEST: until its
// background work runs, the old checkpoints are renamed out of the way but still on disk.
TEST(CheckpointLayout, RetentionAndTheWallTimeAreTheGivenEnvs) {
  const std::string dir = FreshDir("keep_env");
  DeferringEnv env;
  for (int64_t step : {1, 2, 3}) Save(dir, step, /*keep=*/1, nullptr, &env);
  EXPECT_EQ(Steps(dir), std::vector<int64_t>{3});
  EXPECT_EQ(Removing(dir).size(), 2u);  // renamed, not deleted yet
  EXPECT_FALSE(env.work_.empty());
  CheckpointManifest manifest;
  ASSERT_TRUE(VerifyCheckpoint(CheckpointPath(dir, 3), &manifest).ok());
  EXPECT_EQ(manifest.wall_time(), env.WallSeconds());  // the fake wall clock's
  env.RunAll();
  EXPECT_THAT(Removing(dir), ::testing::IsEmpty());
  std::system(("rm -rf " + dir).c_str());
}

// A process that ended before its deletions were done leaves .removing-* directories; the next
// retention or start of a committing process (RemoveIncompleteCheckpoints) deletes them, and
// nothing else.
TEST(CheckpointLayout, RemovalsLeftByAnEndedProcessAreDeletedLater) {
  const std::string dir = FreshDir("keep_leftover");
  Save(dir, 1, 3);
  for (const char* left : {"/.removing-ckpt-7-123-0", "/.removing-ckpt-8-123-1"}) {
    ASSERT_TRUE(MakeDirs(dir + left).ok());
    ASSERT_TRUE(WriteFileAtomic(dir + left + "/shard-0-of-1", "old rows").ok());
  }
  EXPECT_EQ(Removing(dir).size(), 2u);
  EXPECT_EQ(RemoveIncompleteCheckpoints(dir), 0);  // they were no checkpoints
  Env::Default()->WaitForScheduled();
  EXPECT_THAT(Removing(dir), ::testing::IsEmpty());
  ASSERT_TRUE(MakeDirs(dir + "/.removing-ckpt-9-123-2").ok());
  Save(dir, 2, 3);  // retention sweeps too
  Env::Default()->WaitForScheduled();
  EXPECT_THAT(Removing(dir), ::testing::IsEmpty());
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{2, 1}));
  std::system(("rm -rf " + dir).c_str());
}

// Issue 26: symlinks planted in a model dir never make pstrain delete or read outside it.
// `ckpt-1 -> elsewhere` and `.removing-ckpt-3-1-1 -> elsewhere2` survive retention with their
// targets' files intact (retention used to delete /elsewhere/precious.txt through them); a
// checkpoint whose shard file is a symlink, or whose MANIFEST names another step, is refused.
TEST(CheckpointLayout, SymlinksAreNeitherFollowedByRetentionNorRead) {
  const std::string dir = FreshDir("symlinks");
  const std::string elsewhere = FreshDir("symlinks_elsewhere");
  const std::string elsewhere2 = FreshDir("symlinks_elsewhere2");
  ASSERT_TRUE(WriteFileAtomic(elsewhere + "/precious.txt", "keep me").ok());
  ASSERT_TRUE(WriteFileAtomic(elsewhere2 + "/precious.txt", "keep me too").ok());
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_EQ(::symlink(elsewhere.c_str(), CheckpointPath(dir, 1).c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere2.c_str(), (dir + "/.removing-ckpt-3-1-1").c_str()), 0);
  EXPECT_EQ(RemoveIncompleteCheckpoints(dir), 0);  // the symlink is no checkpoint of ours
  for (int64_t step : {2, 3, 4}) Save(dir, step, 1);
  Env::Default()->WaitForScheduled();
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{4}));
  EXPECT_EQ(ReadFileToString(elsewhere + "/precious.txt").value_or(""), "keep me");
  EXPECT_EQ(ReadFileToString(elsewhere2 + "/precious.txt").value_or(""), "keep me too");

  // A checkpoint whose shard file was replaced by a symlink to a copy of itself: refused.
  const std::string ckpt = CheckpointPath(dir, 4);
  CheckpointManifest m;
  ASSERT_TRUE(VerifyCheckpoint(ckpt, &m).ok());
  const std::string shard = ckpt + "/" + ShardFileName(0, 1);
  ASSERT_EQ(std::rename(shard.c_str(), (elsewhere + "/shard").c_str()), 0);
  ASSERT_EQ(::symlink((elsewhere + "/shard").c_str(), shard.c_str()), 0);
  absl::Status s = VerifyCheckpoint(ckpt, &m);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(shard + ": a symlink"));
  ASSERT_EQ(::unlink(shard.c_str()), 0);
  ASSERT_EQ(std::rename((elsewhere + "/shard").c_str(), shard.c_str()), 0);
  ASSERT_TRUE(VerifyCheckpoint(ckpt, &m).ok());
  // The same checkpoint under another step's name: its MANIFEST says 4.
  ASSERT_EQ(std::rename(ckpt.c_str(), CheckpointPath(dir, 9).c_str()), 0);
  s = VerifyCheckpoint(CheckpointPath(dir, 9), &m);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("says step 4, but the directory is ckpt-9"));
  std::system(("rm -rf " + dir + " " + elsewhere + " " + elsewhere2).c_str());
}

// checkpoint.keep_best: the checkpoint BEST names is kept beside the newest `keep`, not counted
// among them; BEST is written atomically like LATEST, and only for a complete checkpoint.
TEST(CheckpointLayout, RetentionKeepsTheBestBesideTheNewest) {
  const std::string dir = FreshDir("best");
  EXPECT_TRUE(absl::IsNotFound(ReadBest(dir).status()));
  Save(dir, 1, 2);
  Save(dir, 2, 2);
  ASSERT_TRUE(WriteBest(dir, 2).ok());
  EXPECT_EQ(Slurp(dir + "/BEST"), "ckpt-2\n");
  ASSERT_TRUE(ReadBest(dir).ok());
  EXPECT_EQ(*ReadBest(dir), 2);
  for (int64_t step : {3, 4, 5}) Save(dir, step, 2);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{5, 4, 2}));
  // A newer best: the old one goes at the next commit; the best is not one of the `keep`.
  ASSERT_TRUE(WriteBest(dir, 5).ok());
  Save(dir, 6, 2);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{6, 5, 4}));
  Save(dir, 7, 1);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{7, 5}));
  // An incomplete or missing checkpoint is never named.
  ASSERT_TRUE(PrepareCheckpointDir(dir, 8).ok());
  EXPECT_FALSE(WriteBest(dir, 8).ok());
  EXPECT_FALSE(WriteBest(dir, 9).ok());
  EXPECT_EQ(*ReadBest(dir), 5);
  // A damaged BEST names nothing, and retention then keeps only the newest.
  ASSERT_TRUE(WriteFileAtomic(dir + "/BEST", "ckpt-05\n").ok());
  EXPECT_EQ(ReadBest(dir).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ReadBest(dir).status().message(), HasSubstr("expected 'ckpt-<step>'"));
  Save(dir, 10, 1);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{10}));
  std::system(("rm -rf " + dir).c_str());
}

// Regression: retention counted every ckpt-<step> directory, so a stale directory newer than the
// committed checkpoint (a crash while writing it, or a job that fell back past it) made it
// delete the checkpoint it had just committed: LATEST then named a deleted directory and the
// next start refused to run ("no usable checkpoint").
TEST(CheckpointLayout, RetentionNeverDeletesTheCommittedCheckpoint) {
  const std::string dir = FreshDir("stale_newer");
  Save(dir, 90, 3);
  const std::string stale = Save(dir, 100, 3);
  ASSERT_TRUE(WriteFileAtomic(stale + "/shard-0-of-1", "corrupt").ok());
  // The job resumes from 90 (falling back past 100) and commits 95 with keep = 1.
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value());
  ASSERT_EQ((*choice)->dir, dir + "/ckpt-90");
  const std::string ckpt = Save(dir, 95, 1);
  EXPECT_EQ(*ReadLatest(dir), 95);
  EXPECT_TRUE(PathExists(ckpt + "/MANIFEST"));
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{100, 95}));  // 90 deleted; 100 left alone
  choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->dir, ckpt);
  // Once the job commits past the stale directory, it goes.
  Save(dir, 105, 1);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{105}));
  std::system(("rm -rf " + dir).c_str());
}

// Incremental checkpoints: every K-th is full, the K - 1 between are deltas naming their base,
// parent and depth; a failed write changes nothing (the next delta builds on the last commit).
TEST(DeltaChain, EveryKthCheckpointIsFull) {
  DeltaChain off(1);
  CheckpointManifest m;
  m.set_step(5);
  off.Committed(m);
  EXPECT_FALSE(off.Next());

  DeltaChain chain(3);
  EXPECT_FALSE(chain.Next());  // nothing committed: full
  std::vector<std::string> kinds;
  for (int64_t step = 10; step <= 70; step += 10) {
    CheckpointManifest c;
    c.set_step(step);
    if (auto d = chain.Next()) *c.mutable_delta() = *d;
    kinds.push_back(c.has_delta() ? absl::StrCat("d", c.delta().depth(), "/", c.delta().base_step(),
                                                 "/", c.delta().parent_step())
                                  : "full");
    chain.Committed(c);
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"full", "d1/10/10", "d2/10/20", "full", "d1/40/40",
                                             "d2/40/50", "full"}));
  // A restored delta of depth 1 allows one more delta.
  DeltaChain resumed(3);
  CheckpointManifest d;
  d.set_step(50);
  d.mutable_delta()->set_base_step(40);
  d.mutable_delta()->set_parent_step(40);
  d.mutable_delta()->set_depth(1);
  resumed.Committed(d);
  ASSERT_TRUE(resumed.Next());
  EXPECT_EQ(resumed.Next()->depth(), 2);
  EXPECT_EQ(resumed.Next()->parent_step(), 50);
  EXPECT_EQ(resumed.Next()->base_step(), 40);
}

// The chain of a delta: base first, verified link by link; a chain that names a checkpoint that
// is not its base's delta, or a parent that is not older, is refused naming the link.
TEST(CheckpointLayout, VerifyCheckpointChainWalksToTheBase) {
  const std::string dir = FreshDir("chain");
  DeltaChain chain(4);
  for (int64_t step : {10, 20, 30}) Save(dir, step, 10, &chain);
  auto links = VerifyCheckpointChain(dir + "/ckpt-30");
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->size(), 3u);
  EXPECT_EQ((*links)[0].dir, dir + "/ckpt-10");
  EXPECT_EQ((*links)[1].dir, dir + "/ckpt-20");
  EXPECT_EQ((*links)[2].dir, dir + "/ckpt-30");
  EXPECT_EQ((*links)[2].manifest.version(), kDeltaManifestVersion);
  EXPECT_EQ(ChainSteps(dir, 30), (std::vector<int64_t>{20, 10}));
  EXPECT_TRUE(ChainSteps(dir, 10).empty());

  // A MANIFEST whose parent is not older than itself (hostile or corrupt): refused, no loop.
  CheckpointManifest m;
  ASSERT_TRUE(ReadManifest(dir + "/ckpt-30", &m).ok());
  m.mutable_delta()->set_parent_step(30);
  ASSERT_TRUE(WriteManifest(dir + "/ckpt-30", m).ok());
  links = VerifyCheckpointChain(dir + "/ckpt-30");
  ASSERT_FALSE(links.ok());
  EXPECT_THAT(links.status().message(),
              HasSubstr("ckpt-30 names the parent ckpt-30, not an older checkpoint of its chain"));
  // A base that is itself a delta.
  m.mutable_delta()->set_parent_step(20);
  m.mutable_delta()->set_base_step(20);
  ASSERT_TRUE(WriteManifest(dir + "/ckpt-30", m).ok());
  links = VerifyCheckpointChain(dir + "/ckpt-30");
  ASSERT_FALSE(links.ok());
  EXPECT_EQ(links.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(links.status().message(),
              HasSubstr("the link ckpt-20 is a delta of ckpt-10, not the full base"));
  std::system(("rm -rf " + dir).c_str());
}

// Retention keeps every link a kept delta restores from, however old, and deletes a chain once
// no kept checkpoint needs it.
TEST(CheckpointLayout, RetentionKeepsTheChainsOfKeptDeltas) {
  const std::string dir = FreshDir("keep_chain");
  DeltaChain chain(4);  // full 10, deltas 20 30 40, full 50, deltas 60 70 80, full 90
  for (int64_t step : {10, 20, 30, 40}) Save(dir, step, 2, &chain);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{40, 30, 20, 10}));  // 40 and 30 need 20 and 10
  Save(dir, 50, 2, &chain);  // full: keeps 50 and 40, and 40's chain
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{50, 40, 30, 20, 10}));
  Save(dir, 60, 2, &chain);  // 60 (a delta of 50) and 50: the old chain goes
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{60, 50}));
  Save(dir, 70, 1, &chain);  // keep 1: 70 and its chain
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{70, 60, 50}));
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->chain.size(), 3u);
  // The checkpoint BEST names (checkpoint.keep_best) keeps its chain too.
  ASSERT_TRUE(WriteBest(dir, 70).ok());
  Save(dir, 80, 1, &chain);  // a delta of 50 (depth 3)
  Save(dir, 90, 1, &chain);  // full
  Save(dir, 100, 1, &chain);  // a delta of 90: 100, 90; BEST 70 with 60 and 50; 80 goes
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{100, 90, 70, 60, 50}));
  std::system(("rm -rf " + dir).c_str());
}

// Regression: incomplete directories (no MANIFEST) counted towards checkpoint.keep, so fewer
// usable checkpoints were kept for a fallback than asked.
TEST(CheckpointLayout, RetentionCountsOnlyCompleteCheckpoints) {
  const std::string dir = FreshDir("incomplete");
  Save(dir, 10, 2);
  ASSERT_TRUE(MakeDirs(dir + "/ckpt-20").ok());  // an interrupted attempt
  ASSERT_TRUE(WriteFileAtomic(dir + "/ckpt-20/shard-0-of-1.tmp.1", "partial").ok());
  Save(dir, 30, 2);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{30, 10}));
  std::system(("rm -rf " + dir).c_str());
}

// What an interrupted or failed write leaves (directories without a MANIFEST, older or newer
// than LATEST) is removed; the committed checkpoints and LATEST are kept, and the job resumes
// from LATEST.
TEST(CheckpointLayout, IncompleteDirectoriesAreRemovedAndTheCommittedOnesKept) {
  const std::string dir = FreshDir("stale_incomplete");
  Save(dir, 10, 3);
  Save(dir, 20, 3);
  for (const char* stale : {"/ckpt-15", "/ckpt-25", "/ckpt-40"}) {
    ASSERT_TRUE(MakeDirs(dir + stale).ok());
    ASSERT_TRUE(WriteFileAtomic(dir + stale + "/shard-0-of-1", "partial").ok());
  }
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{40, 25, 20, 15, 10}));
  EXPECT_EQ(RemoveIncompleteCheckpoints(dir), 3);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{20, 10}));
  auto latest = ReadLatest(dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 20);
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value());
  EXPECT_EQ((*choice)->dir, CheckpointPath(dir, 20));
  EXPECT_EQ(RemoveIncompleteCheckpoints(dir), 0);
  // Retention then keeps the committed ones only.
  Save(dir, 30, 2);
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{30, 20}));
  std::system(("rm -rf " + dir).c_str());
}

// A commit whose MANIFEST cannot be written leaves no directory behind.
TEST(CheckpointLayout, AFailedCommitRemovesItsDirectory) {
  const std::string dir = FreshDir("failed_commit");
  Save(dir, 10, 3);
  auto ckpt = PrepareCheckpointDir(dir, 20);
  ASSERT_TRUE(ckpt.ok());
  // A directory where the MANIFEST should go makes its write fail.
  ASSERT_TRUE(MakeDirs(*ckpt + "/MANIFEST").ok());
  CheckpointManifest m;
  m.set_step(20);
  EXPECT_FALSE(CommitCheckpoint(dir, m, {{0, WorkerState()}}, 3).ok());
  EXPECT_FALSE(PathExists(*ckpt));
  EXPECT_EQ(Steps(dir), (std::vector<int64_t>{10}));
  EXPECT_EQ(*ReadLatest(dir), 10);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

ModelDescription Described(const std::string& text) {
  ModelDescription d;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &d)) << text;
  return d;
}

// The one comparison of model descriptions: the first difference in the feature layout or the
// model's shape is named with both values; what changes no saved value's meaning is not compared.
TEST(CheckpointLayout, CompareModelDescriptionsNamesTheFirstDifference) {
  const std::string base = R"pb(
    features {
      preset: NO_PRESET
      field { name: "a" kind: CATEGORICAL vocab_size: 10 }
      field { name: "n" kind: NUMERIC numeric_mode: DENSE numeric_transform: LOG1P vocab_size: 2 }
      hash_seed: 5
      label_name: "label"
    }
    model { type: DEEPFM embedding_dim: 4 hidden: [ 8, 2 ] precision: F32 embedding_l2: 0 }
    init_seed: 1
    sparse_optimizer { type: ADAGRAD }
  )pb";
  const ModelDescription saved = Described(base);
  EXPECT_TRUE(CompareModelDescriptions(saved, saved).ok());
  struct Case {
    const char* from;
    const char* to;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"hash_seed: 5", "hash_seed: 6", "features.hash_seed: 5 in the checkpoint, 6 in the config"},
      {"name: \"a\"", "name: \"b\"", "features.field[0].name: 'a' in the checkpoint, 'b' in the"},
      {"kind: CATEGORICAL", "kind: NUMERIC",
       "features.field[0] 'a'.kind: CATEGORICAL in the checkpoint, NUMERIC in the config"},
      {"numeric_transform: LOG1P", "numeric_transform: NO_TRANSFORM",
       "features.field[1] 'n'.numeric_transform: LOG1P in the checkpoint, NO_TRANSFORM"},
      {"vocab_size: 10", "vocab_size: 11", "features.field[0] 'a'.vocab_size: 10 in the"},
      {"type: DEEPFM", "type: WIDE_DEEP", "model.type: DEEPFM in the checkpoint, WIDE_DEEP"},
      {"embedding_dim: 4", "embedding_dim: 5", "model.embedding_dim: 4 in the checkpoint, 5"},
      {"hidden: [ 8, 2 ]", "hidden: [ 8 ]", "model.hidden: [8, 2] in the checkpoint, [8] in"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    std::string text = base;
    text.replace(text.find(c.from), strlen(c.from), c.to);
    absl::Status s = CompareModelDescriptions(saved, Described(text));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(c.says));
  }
  // A field more, named; and the sides' names as given.
  ModelDescription more = saved;
  more.mutable_features()->add_field()->set_name("x");
  absl::Status s = CompareModelDescriptions(saved, more, "the export", "the request");
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("features: 2 fields in the export, 3 in the request (field[2] "
                                   "'x' is only in the request)"));
  // Not compared: the label's name, precision, L2, the initializer, the optimizers.
  ModelDescription same = saved;
  same.mutable_features()->set_label_name("click");
  same.mutable_model()->set_precision(BF16);
  same.mutable_model()->set_embedding_l2(0.1f);
  same.mutable_model()->set_embedding_init_stddev(0.5f);
  same.set_init_seed(2);
  same.mutable_sparse_optimizer()->set_type(FTRL);
  EXPECT_TRUE(CompareModelDescriptions(saved, same).ok());
  // Tables (features.table): a description of before tables matches one with none; a field's
  // table and each table's name, dim and rows are compared, naming the table.
  ModelDescription tables = saved;
  tables.mutable_features()->mutable_field(0)->clear_vocab_size();
  tables.mutable_features()->mutable_field(0)->set_table("item");
  TableConfig* item = tables.mutable_features()->add_table();
  item->set_name("item");
  item->set_dim(4);
  item->set_rows(100);
  EXPECT_TRUE(CompareModelDescriptions(tables, tables).ok());
  EXPECT_THAT(std::string(CompareModelDescriptions(saved, tables).message()),
              ::testing::HasSubstr("features.field[0] 'a'.table: no table in the checkpoint, "
                                   "'item' in the config"));
  ModelDescription changed = tables;
  changed.mutable_features()->mutable_table(0)->set_dim(8);
  EXPECT_THAT(std::string(CompareModelDescriptions(tables, changed).message()),
              ::testing::HasSubstr("features.table[0] 'item'.dim: 4 in the checkpoint, 8 in the "
                                   "config"));
  changed = tables;
  changed.mutable_features()->mutable_table(0)->set_rows(99);
  EXPECT_THAT(std::string(CompareModelDescriptions(tables, changed).message()),
              ::testing::HasSubstr("features.table[0] 'item'.rows: 100 in the checkpoint, 99"));
  changed = tables;
  changed.mutable_features()->mutable_field(0)->set_table("user");
  EXPECT_THAT(std::string(CompareModelDescriptions(tables, changed).message()),
              ::testing::HasSubstr("features.field[0] 'a'.table: 'item' in the checkpoint, "
                                   "'user' in the config"));
  changed = tables;
  changed.mutable_features()->add_table()->set_name("more");
  EXPECT_THAT(std::string(CompareModelDescriptions(tables, changed).message()),
              ::testing::HasSubstr("1 tables in the checkpoint, 2 in the config (table[1] 'more'"));
  // A numeric mode matters only for numeric fields: a categorical field's is ignored.
  ModelDescription mode = saved;
  mode.mutable_features()->mutable_field(0)->set_numeric_mode(DENSE);
  EXPECT_TRUE(CompareModelDescriptions(saved, mode).ok());

  // A MANIFEST without a description (version 1) is accepted by CheckCheckpointModel; with one,
  // the message names the checkpoint and says what to do.
  CheckpointManifest v1;
  EXPECT_TRUE(CheckCheckpointModel("d/ckpt-1", v1, saved).ok());
  CheckpointManifest v2;
  *v2.mutable_model() = saved;
  ModelDescription other = saved;
  other.mutable_features()->set_hash_seed(9);
  s = CheckCheckpointModel("d/ckpt-1", v2, other);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("d/ckpt-1 was trained for another model: features.hash_seed"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("--model_dir"));
}

}  // namespace
}  // namespace pstrain
