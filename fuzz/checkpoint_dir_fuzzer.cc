// libFuzzer target: a crafted checkpoint directory (checkpoint/layout.h, docs/CHECKPOINT.md) as
// every reader and retention see it. The input builds the directory: LATEST and BEST texts,
// ckpt-<step> directories with MANIFEST, shard and worker-state files, entries of any name, and
// symlinks (named like checkpoints or like the remover's .removing-* directories) that point out
// of the directory, at a directory holding a file that must survive. Then: ReadLatest, ReadBest,
// ListCheckpoints, ChainSteps, ChooseCheckpoint (the verification of every file and every delta
// chain), the serving reader's choice (serving/serving_model.h ChooseCheckpointToRead: LATEST,
// "best" and a name), RemoveIncompleteCheckpoints and RemoveOldCheckpoints (with the background
// remover waited for). A file outside the directory that is gone afterwards is a finding (abort):
// issue 26 item 1, retention that followed a symlink out of the job.
//
// Input: [keep byte] then entries [kind byte][2-byte step][2-byte length][bytes]:
//   kind % 8: 0 LATEST, 1 BEST, 2 ckpt-<step>/MANIFEST, 3 ckpt-<step>/shard-0-of-1,
//   4 ckpt-<step>/worker-0.state, 5 a symlink ckpt-<step> -> outside, 6 a symlink
//   .removing-ckpt-<step>-1-1 -> outside (even step) or ckpt-<step>/shard-0-of-1 -> the file
//   outside (odd step), 7 a file of any name: the bytes are its path in the
//   directory, a newline, and its contents (a path ending in '/' is a directory; paths out of the
//   directory and empty ones are skipped).
// Seed corpus: fuzz/corpus/checkpoint_dir/ (directories `pstrain train` wrote, full and
// incremental, encoded so by scripts/make_fuzz_corpus.sh).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/env.h"
#include "fuzz/fuzz_util.h"
#include "serving/serving_model.h"

namespace {

namespace fs = std::filesystem;

// The directory the input is built in, and the one outside it that symlinks point at.
struct Dirs {
  std::string model, outside, precious;
};

const Dirs& TheDirs() {
  static const Dirs* d = [] {
    const std::string root = pstrain::fuzz::ScratchDir("ckpt_dir");
    auto* dirs = new Dirs{root + "/model", root + "/outside", root + "/outside/precious.txt"};
    std::error_code ec;
    fs::create_directories(dirs->outside, ec);
    pstrain::fuzz::WriteFile(dirs->precious, "must survive");
    return dirs;
  }();
  return *d;
}

// Whether `path` (under d.model) is reached without passing a symlink: the input's own writes
// never go through the links it made (only the code under test might follow them).
bool NoLinkOnTheWay(const Dirs& d, const fs::path& path) {
  std::error_code ec;
  fs::path at(d.model);
  for (const fs::path& part : fs::path(path).lexically_relative(d.model)) {
    at /= part;
    if (fs::is_symlink(at, ec)) return false;
  }
  return true;
}

void Build(pstrain::fuzz::InputReader* in, const Dirs& d) {
  using pstrain::CheckpointName;
  std::error_code ec;
  for (int entries = 0; entries < 32 && in->left() > 0; ++entries) {
    const int kind = in->Byte() % 8;
    const int step = in->U16() % 64;
    const std::string bytes = in->Piece(1 << 20);
    const std::string ckpt = d.model + "/" + CheckpointName(step);
    switch (kind) {
      case 0:
        pstrain::fuzz::WriteFile(d.model + "/LATEST", bytes);
        break;
      case 1:
        pstrain::fuzz::WriteFile(d.model + "/BEST", bytes);
        break;
      case 2:
      case 3:
      case 4: {
        if (!NoLinkOnTheWay(d, ckpt)) break;
        fs::create_directories(ckpt, ec);
        const char* name = kind == 2 ? "/MANIFEST" : kind == 3 ? "/shard-0-of-1" : "/worker-0.state";
        pstrain::fuzz::WriteFile(ckpt + name, bytes);
        break;
      }
      case 5:
        fs::create_symlink(d.outside, ckpt, ec);
        break;
      case 6:
        if (step % 2 == 0) {
          fs::create_symlink(d.outside, d.model + "/.removing-" + CheckpointName(step) + "-1-1",
                             ec);
        } else if (NoLinkOnTheWay(d, ckpt)) {
          fs::create_directories(ckpt, ec);
          fs::create_symlink(d.precious, ckpt + "/shard-0-of-1", ec);
        }
        break;
      default: {
        const size_t newline = bytes.find('\n');
        const std::string name = bytes.substr(0, newline);
        const std::string contents = newline == std::string::npos ? "" : bytes.substr(newline + 1);
        const fs::path rel = fs::path(name).lexically_normal().relative_path();
        if (rel.empty() || *rel.begin() == ".." || *rel.begin() == "." ||
            name.find('\0') != std::string::npos) {
          break;
        }
        const fs::path p = fs::path(d.model) / rel;
        if (!NoLinkOnTheWay(d, p)) break;
        if (name.back() == '/') {
          fs::create_directories(p, ec);
        } else {
          fs::create_directories(p.parent_path(), ec);
          pstrain::fuzz::WriteFile(p.string(), contents);
        }
        break;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  const Dirs& d = TheDirs();
  std::error_code ec;
  fs::remove_all(d.model, ec);  // removes symlinks, never what they point at
  fs::create_directories(d.model, ec);
  fuzz::InputReader in(data, size);
  const int keep = in.Byte() % 4;
  Build(&in, d);

  (void)ReadLatest(d.model);
  (void)ReadBest(d.model);
  (void)LatestPathOr(d.model, "none");
  for (const CheckpointEntry& e : ListCheckpoints(d.model)) (void)ChainSteps(d.model, e.step);
  auto chosen = ChooseCheckpoint(d.model);
  for (const char* which : {"", "best", "ckpt-1"}) {
    (void)ChooseCheckpointToRead(d.model, which, nullptr);
  }
  (void)RemoveIncompleteCheckpoints(d.model);
  if (chosen.ok() && chosen->has_value()) {
    RemoveOldCheckpoints(d.model, (*chosen)->manifest.step(), keep);
  } else if (auto latest = ReadLatest(d.model); latest.ok()) {
    RemoveOldCheckpoints(d.model, *latest, keep);
  }
  Env::Default()->WaitForScheduled();
  if (!PathExists(d.precious)) {
    std::fprintf(stderr, "checkpoint_dir: %s was deleted through the model directory\n",
                 d.precious.c_str());
    std::abort();
  }
  return 0;
}
