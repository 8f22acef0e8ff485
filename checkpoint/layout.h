// The checkpoint directory's layout and commit rules, which every mode's checkpointer builds on
// (`pstrain train` and `pstrain allreduce`: worker/train/checkpoint.h; the PS mode:
// worker/ps_client/ps_job.h and ps/server/shard_checkpoint.cc). docs/CHECKPOINT.md is the
// specification; in short:
//
//   <dir>/ckpt-<step>/shard-<i>-of-<S>   the parameters shard i of S holds (a block file whose
//                                        blocks are the mode's business)
//   <dir>/ckpt-<step>/worker-<j>.state   block file: one WSTA block, a pstrain.WorkerState
//   <dir>/ckpt-<step>/MANIFEST           block file: one MANI block, a pstrain.CheckpointManifest
//                                        listing every other file with its size; written LAST
//   <dir>/LATEST                         "ckpt-<step>\n", replaced by atomic rename
//
// Commit order: the data files (each written to a temporary name, fsync'ed and renamed), then
// the worker states, then the MANIFEST, then LATEST; then retention. A directory with a MANIFEST
// is *complete*; the job's checkpoint is the one LATEST names, and a crash at any point leaves
// LATEST naming a complete checkpoint (or no LATEST at all).
//
// Choosing a checkpoint to resume from: the one LATEST names, else (missing or corrupt: every
// file is read and verified) the next older complete one. A directory newer than LATEST was never
// committed and is never chosen.
//
// Incremental checkpoints (checkpoint.incremental_every): a delta's MANIFEST (version 3) names its
// base (the full checkpoint its chain starts from) and its parent (the checkpoint before it).
// Restoring a delta reads the chain: the base, then every delta up to it. A checkpoint whose chain
// has a broken link is refused like a corrupt one, and retention keeps every link a kept
// checkpoint needs.
//
// Thread-safety: the functions are thread-compatible; one process (the single trainer, the
// allreduce rank 0, the PS chief) commits a job's checkpoints, while any number may read them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "pstrain/config.pb.h"
#include "pstrain/state.pb.h"

namespace pstrain {

// ---- Where a job's checkpoints live ----

// checkpoint.dir, or else train.model_dir (for a PS job, the chief's: call it before a worker
// derives its own log dir). Every mode's command uses this one rule.
std::string JobCheckpointDir(const Config& config);

// ---- Names ----

constexpr char kLatestFileName[] = "LATEST";
constexpr char kManifestFileName[] = "MANIFEST";
constexpr char kManifestTag[] = "MANI";     // the MANIFEST's one block
constexpr char kWorkerStateTag[] = "WSTA";  // a worker-<j>.state file's one block
constexpr char kPassEndFileName[] = "PASS_END";
constexpr char kPassEndTag[] = "PEND";  // the PASS_END file's one block
constexpr char kBestFileName[] = "BEST";  // checkpoint.keep_best's checkpoint

// "ckpt-<step>".
std::string CheckpointName(int64_t step);
// The step of a name CheckpointName produces, else nullopt: "ckpt-" and the decimal step >= 0
// with no sign, spaces or leading zeros (so that CheckpointName(*Parse(name)) == name).
std::optional<int64_t> ParseCheckpointName(absl::string_view name);
// "<dir>/ckpt-<step>".
std::string CheckpointPath(const std::string& dir, int64_t step);
// "shard-<i>-of-<S>": the parameters of shard i of S (`pstrain train` and allreduce: shard-0-of-1).
std::string ShardFileName(int shard, int num_shards);
// Whether `name` is a ShardFileName (with 0 <= i < S).
bool IsShardFileName(absl::string_view name);
// "worker-<j>.state".
std::string WorkerStateFileName(int worker);

// ---- The files of one checkpoint (`ckpt` is its directory) ----

// Writes <ckpt>/worker-<worker>.state atomically; returns its size in bytes.
absl::StatusOr<uint64_t> WriteWorkerState(const std::string& ckpt, int worker,
                                          const WorkerState& state);
// Reads it back: errors name the file (DATA_LOSS for a corrupt one).
absl::Status ReadWorkerState(const std::string& ckpt, int worker, WorkerState* state);
// Writes <ckpt>/MANIFEST atomically, exactly as given (CommitCheckpoint fills num_workers and
// wall_time first).
absl::Status WriteManifest(const std::string& ckpt, const CheckpointManifest& manifest);
absl::Status ReadManifest(const std::string& ckpt, CheckpointManifest* manifest);
// Reads the MANIFEST, then every file it lists: each must be a plain file name in `ckpt`, have
// the listed size, and read as a block file with every checksum and the framing intact. DATA_LOSS
// naming the file (and block and offset) otherwise.
absl::Status VerifyCheckpoint(const std::string& ckpt, CheckpointManifest* manifest);

// ---- Incremental checkpoints: delta chains ----

// The MANIFEST version of a delta checkpoint (its `delta` field set). A full checkpoint keeps
// kManifestVersion, so that its files stay those of version 2.
constexpr int kDeltaManifestVersion = 3;

// One checkpoint of a restore chain: its directory (.../ckpt-<step>) and verified MANIFEST.
struct CheckpointLink {
  std::string dir;
  CheckpointManifest manifest;
};
// VerifyCheckpoint of `ckpt` and, when it is a delta, of every checkpoint its restore needs: its
// parent, the parent's parent, ... down to its base, each in the same directory as `ckpt`. Each
// link must be verified completely, be older than the one that names it, and be a delta of the
// same base (or the base itself, a full checkpoint). Returns the chain, the base first and `ckpt`
// last (a full checkpoint is a chain of one). DATA_LOSS naming the checkpoint refused, the link
// that is broken and why ("<dir>/ckpt-30 (a delta of ckpt-10): the link ckpt-20 of its chain: ..")
absl::StatusOr<std::vector<CheckpointLink>> VerifyCheckpointChain(const std::string& ckpt);

// ---- LATEST ----

// Replaces <dir>/LATEST with "ckpt-<step>\n" (temporary file, fsync, rename, fsync of dir).
absl::Status WriteLatest(const std::string& dir, int64_t step);
// The step <dir>/LATEST names. NOT_FOUND when there is none; DATA_LOSS naming the file when it
// holds anything else than a checkpoint name (surrounding whitespace aside).
absl::StatusOr<int64_t> ReadLatest(const std::string& dir);
// The path LATEST names (what a restart resumes from), or `none` when LATEST is missing or bad:
// for messages.
std::string LatestPathOr(const std::string& dir, const std::string& none);

// ---- BEST (checkpoint.keep_best; docs/CHECKPOINT.md "The best checkpoint") ----

// Replaces <dir>/BEST with "ckpt-<step>\n" as WriteLatest does, once ckpt-<step> is complete
// (its MANIFEST reads; FAILED_PRECONDITION / NOT_FOUND otherwise, naming it). Retention never
// deletes the checkpoint BEST names (RemoveOldCheckpoints).
absl::Status WriteBest(const std::string& dir, int64_t step);
// The step <dir>/BEST names; NOT_FOUND when there is none, DATA_LOSS as ReadLatest.
absl::StatusOr<int64_t> ReadBest(const std::string& dir);

// ---- Listing ----

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;       // <dir>/ckpt-<step>
  bool complete = false;  // its MANIFEST exists (it may still fail verification)
};
// Every ckpt-<step> directory under `dir`, newest first, complete or not (real directories only,
// by env->IsRealDirectory: a symlink named like a checkpoint is none). Empty when `dir` does not
// exist.
std::vector<CheckpointEntry> ListCheckpoints(const std::string& dir, Env* env = Env::Default());

// ---- Writing a checkpoint ----

// Creates <dir>/ckpt-<step> (common/file.h MakeOwnDir: a symlink planted at that name is replaced
// by a real directory, never written or deleted through) and removes a leftover MANIFEST and
// PASS_END in it (from an earlier attempt at the same step that LATEST no longer names: they must
// not vouch for the new files before they are complete); returns its path.
// A mode that writes a checkpoint first asks IsCommittedCheckpoint (below).
absl::StatusOr<std::string> PrepareCheckpointDir(const std::string& dir, int64_t step);
// Whether LATEST names ckpt-<step> and that checkpoint verifies. A checkpoint of the same step
// must then not be written again: nothing trains between two checkpoints of one step, so the
// committed one already holds the state, and rewriting it in place would leave LATEST naming an
// incomplete checkpoint until the new MANIFEST is written. (A step equal to a committed one
// happens when a scheduled checkpoint falls on the last step, or a finished job is resumed.)
bool IsCommittedCheckpoint(const std::string& dir, int64_t step);
// Completes ckpt-<manifest.step()> under `dir`, whose data files are written and listed in
// `manifest` (with the model description the caller sets: every mode does): writes
// worker-<j>.state for each of `workers` (and lists them), sets num_workers, wall_time (now, by
// env->Now()) and, when the manifest has a model description, version (kManifestVersion; a
// delta's: 3); writes the MANIFEST, then LATEST; then RemoveOldCheckpoints (with `env`). Returns
// the checkpoint directory.
absl::StatusOr<std::string> CommitCheckpoint(const std::string& dir, CheckpointManifest manifest,
                                             const std::map<int, WorkerState>& workers, int keep,
                                             Env* env = Env::Default());
// The end of a training pass (worker/train/data_pass.h). After <dir>/ckpt-<step> is committed
// (or found committed by IsCommittedCheckpoint), its writer calls MarkPassEnd with every worker's
// state: when each of them says `finished`, it writes ckpt-<step>/PASS_END atomically (a block
// file with one PEND block, a pstrain.PassEnd: the step and the examples the workers trained in
// the pass); otherwise it writes nothing. It is a file beside the committed ones, not listed in
// the MANIFEST, because a pass can end at a step that is committed already (a scheduled
// checkpoint on the last step), whose files are never written over. A crash before it is written
// leaves the pass unfinished: the next run with the same data resumes it, trains nothing more
// and marks it.
absl::Status MarkPassEnd(const std::string& dir, int64_t step,
                         const std::map<int, WorkerState>& workers);
// A pass that trained no step (every worker's step is its pass_first_step) ends at the
// checkpoint its predecessor committed: it marks nothing.
// The PassEnd of checkpoint directory `ckpt` (.../ckpt-<step>), or nullopt when the pass did not
// end there. DATA_LOSS naming the file when it is corrupt or names another step.
absl::StatusOr<std::optional<PassEnd>> ReadPassEnd(const std::string& ckpt);

// Retention (checkpoint.keep), after LATEST moved to ckpt-<committed_step>: keeps it and the
// newest keep - 1 complete checkpoints older than it, and deletes every other directory older
// than it (complete or not), except the one <dir>/BEST names, which is kept beside them.
// Directories newer than it are left alone: LATEST never named them
// (a crash while writing, or a job that resumed from an older checkpoint), they are never chosen,
// and they are deleted once the job commits a newer step. keep < 1 counts as 1.
// A kept delta also keeps every checkpoint of its chain (ChainSteps), whatever its age.
// The deletions do not hold up the save that commits: each directory is renamed to
// <dir>/.removing-<name>-<pid>-<n> (one metadata operation, so it is no checkpoint from then on:
// ListCheckpoints ignores it) and env's background work (Env::Schedule) deletes it. A rename that
// fails is a deletion in place. A .removing-* directory a process left behind (it ended before
// its background work was done) is deleted by the background work that the next
// RemoveOldCheckpoints or RemoveIncompleteCheckpoints of `dir` schedules. pstrain's main waits
// for Env::Default()->WaitForScheduled() before it exits, so that a finished job leaves none.
void RemoveOldCheckpoints(const std::string& dir, int64_t committed_step, int keep,
                          Env* env = Env::Default());
// The steps of the checkpoints the restore of <dir>/ckpt-<step> reads besides itself (its parent,
// the parent's parent, ..., its base), by their MANIFESTs without verifying the files; empty for a
// full checkpoint or one without a readable MANIFEST. Stops at a missing link.
std::vector<int64_t> ChainSteps(const std::string& dir, int64_t step);

// ---- What the parameters belong to (the MANIFEST's model description) ----

// The MANIFEST version CommitCheckpoint writes when the manifest carries a model description (2);
// a MANIFEST without `version` is version 1, written before descriptions existed.
constexpr int kManifestVersion = 2;

// The one comparison of two model descriptions: OK when parameters saved for `saved` mean the same
// to a model built from `wanted`, else FAILED_PRECONDITION naming the first field that differs
// and both values, e.g. "features.hash_seed: 24301 in the checkpoint, 7 in the config" or
// "features.field[13] 'C1'.vocab_size: 1000000 in the checkpoint, 250000 in the config".
// Compared: the feature layout (hash_seed; the fields' count, names, kinds, numeric modes and
// transforms, vocabulary sizes) and the model's shape (type, embedding_dim, hidden). Not compared,
// as they change no saved value's meaning: label_name, precision, embedding_l2, the initializer
// (init_seed, embedding_init_stddev: rows never trained come from the checkpoint's own rule) and
// the optimizers. `saved_name` / `wanted_name` name the two sides in the message ("the
// checkpoint", "the config").
absl::Status CompareModelDescriptions(const ModelDescription& saved, const ModelDescription& wanted,
                                      absl::string_view saved_name = "the checkpoint",
                                      absl::string_view wanted_name = "the config");

// For a restore or a reader given a config: CompareModelDescriptions of the MANIFEST's description
// with `wanted`, the message prefixed with the checkpoint's directory and followed by what to do.
// A MANIFEST without a description (version 1) is accepted: nothing to compare it with.
absl::Status CheckCheckpointModel(const std::string& ckpt, const CheckpointManifest& manifest,
                                  const ModelDescription& wanted);

// Removes every ckpt-<step> directory under `dir` that is incomplete (no MANIFEST), newer or
// older than LATEST: what an interrupted or failed write left. Call only where no checkpoint of
// the job is being written: at the start of the process that commits the job's checkpoints
// (before it writes any), and after one of its writes failed. Returns how many it removed. Also
// schedules on `env` the deletion of the .removing-* directories a process left behind.
int RemoveIncompleteCheckpoints(const std::string& dir, Env* env = Env::Default());

// ---- Choosing the checkpoint to resume from ----

struct CheckpointChoice {
  std::string dir;  // <dir>/ckpt-<step>
  CheckpointManifest manifest;
  // What restores it (VerifyCheckpointChain): the full checkpoint, then every delta up to this
  // one, which is last. Every reader of parameters loads the whole chain
  // (ps/store/parameter_files.h).
  std::vector<CheckpointLink> chain;
};
// The checkpoint LATEST names, or, when it is missing or corrupt (said on stderr, naming the file,
// block and offset), or a delta whose chain is broken, the next older complete one whose chain is
// whole, every file of every link verified completely (all checksums and sizes). nullopt when
// there is no LATEST (a fresh start). DATA_LOSS when LATEST exists but no checkpoint is usable.
absl::StatusOr<std::optional<CheckpointChoice>> ChooseCheckpoint(const std::string& dir);

}  // namespace pstrain
