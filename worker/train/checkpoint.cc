#include "worker/train/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/status.h"
#include "ps/store/store_blocks.h"

namespace pstrain {
namespace {

constexpr char kShardFile[] = "shard-0-of-1";
constexpr char kManifestFile[] = "MANIFEST";
constexpr char kWorkerStateTag[] = "WSTA";
constexpr char kManifestTag[] = "MANI";

// Steps of the complete-looking ckpt-<step> directories under dir, newest first.
std::vector<int64_t> ListCheckpoints(const std::string& dir) {
  std::vector<int64_t> steps;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return steps;
  while (dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    int64_t step;
    if (absl::ConsumePrefix(&name, "ckpt-") && absl::SimpleAtoi(name, &step)) steps.push_back(step);
  }
  closedir(d);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::string CkptName(int64_t step) { return absl::StrCat("ckpt-", step); }

void RemoveTree(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d != nullptr) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") std::remove((path + "/" + name).c_str());
    }
    closedir(d);
  }
  ::rmdir(path.c_str());
}

absl::Status WriteProtoBlockFile(const std::string& path, absl::string_view tag,
                                 const google::protobuf::Message& msg) {
  std::string file;
  auto w = BlockWriter::ToString(&file);
  RETURN_IF_ERROR(w->Add(tag, msg.SerializeAsString()));
  RETURN_IF_ERROR(w->Finish());
  return WriteFileAtomic(path, file);
}

absl::Status ReadProtoBlockFile(const std::string& path, absl::string_view tag,
                                google::protobuf::Message* msg) {
  ASSIGN_OR_RETURN(auto r, BlockReader::Open(path));
  Block b;
  ASSIGN_OR_RETURN(bool got, r->Next(&b));
  if (!got || b.tag != tag) return absl::DataLossError(absl::StrCat(path, ": expected a '", tag, "' block"));
  if (!msg->ParseFromString(b.payload)) {
    return r->Corrupt(b, absl::StrCat("payload is not a valid ", msg->GetTypeName()));
  }
  ASSIGN_OR_RETURN(bool more, r->Next(&b));
  if (more) return r->Corrupt(b, "unexpected extra block");
  return absl::OkStatus();
}

// Reads every block of a block file, verifying all checksums and the framing.
absl::Status VerifyBlockFile(const std::string& path) {
  ASSIGN_OR_RETURN(auto r, BlockReader::Open(path));
  Block b;
  while (true) {
    ASSIGN_OR_RETURN(bool more, r->Next(&b));
    if (!more) return absl::OkStatus();
  }
}

absl::Status VerifyCheckpoint(const std::string& ckpt, CheckpointManifest* manifest) {
  RETURN_IF_ERROR(ReadProtoBlockFile(ckpt + "/" + kManifestFile, kManifestTag, manifest));
  for (const auto& f : manifest->file()) {
    const std::string path = ckpt + "/" + f.name();
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return absl::DataLossError(absl::StrCat(path, ": missing"));
    if (static_cast<uint64_t>(st.st_size) != f.bytes()) {
      return absl::DataLossError(absl::StrCat(path, ": ", st.st_size, " bytes, MANIFEST says ",
                                              f.bytes()));
    }
    RETURN_IF_ERROR(VerifyBlockFile(path));
  }
  return absl::OkStatus();
}

}  // namespace

std::string WorkerStateFileName(int worker) { return absl::StrCat("worker-", worker, ".state"); }

absl::StatusOr<std::string> CommitCheckpoint(const std::string& dir, CheckpointManifest manifest,
                                             const std::map<int, WorkerState>& workers, int keep) {
  const std::string name = CkptName(manifest.step());
  const std::string ckpt = dir + "/" + name;
  for (const auto& [j, state] : workers) {
    const std::string file = WorkerStateFileName(j);
    RETURN_IF_ERROR(WriteProtoBlockFile(ckpt + "/" + file, kWorkerStateTag, state));
    struct stat st;
    if (::stat((ckpt + "/" + file).c_str(), &st) != 0) {
      return ErrnoError("stat", ckpt + "/" + file);
    }
    auto* f = manifest.add_file();
    f->set_name(file);
    f->set_bytes(st.st_size);
  }
  manifest.set_num_workers(static_cast<int>(workers.size()));
  manifest.set_wall_time(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  RETURN_IF_ERROR(WriteProtoBlockFile(ckpt + "/" + kManifestFile, kManifestTag, manifest));
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/LATEST", name + "\n"));

  const std::vector<int64_t> steps = ListCheckpoints(dir);
  for (size_t i = std::max(keep, 1); i < steps.size(); ++i) RemoveTree(dir + "/" + CkptName(steps[i]));
  return ckpt;
}

absl::StatusOr<std::string> PrepareCheckpointDir(const std::string& dir, int64_t step) {
  const std::string ckpt = dir + "/" + CkptName(step);
  RETURN_IF_ERROR(MakeDirs(ckpt));
  // A leftover MANIFEST from an interrupted earlier attempt at the same step must not vouch for
  // the new files before they are complete.
  if (std::remove((ckpt + "/" + kManifestFile).c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("remove", ckpt + "/" + kManifestFile);
  }
  return ckpt;
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const WorkerState& state,
                                           LocalParams& params, int keep) {
  return SaveCheckpoint(dir, state.step(), {{0, state}}, params, keep, "pstrain train");
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, int64_t step,
                                           const std::map<int, WorkerState>& workers,
                                           LocalParams& params, int keep,
                                           absl::string_view created_by) {
  ASSIGN_OR_RETURN(const std::string ckpt, PrepareCheckpointDir(dir, step));
  CheckpointManifest manifest;
  {
    ASSIGN_OR_RETURN(auto w, BlockWriter::Create(ckpt + "/" + kShardFile));
    RETURN_IF_ERROR(SaveEmbeddingStore(*params.embedding(), w.get()));
    RETURN_IF_ERROR(SaveDenseStore(params.dense()->Snapshot(), w.get()));
    RETURN_IF_ERROR(w->Finish());
    auto* f = manifest.add_file();
    f->set_name(kShardFile);
    f->set_bytes(w->bytes());
  }
  manifest.set_step(step);
  manifest.set_num_shards(1);
  manifest.set_table_rows(params.embedding()->end());
  manifest.set_partitions(1);
  manifest.set_row_dim(params.row_dim());
  manifest.set_dense_size(params.dense_size());
  manifest.set_created_by(std::string(created_by));
  return CommitCheckpoint(dir, std::move(manifest), workers, keep);
}

absl::StatusOr<std::optional<CheckpointChoice>> ChooseCheckpoint(const std::string& dir) {
  std::vector<int64_t> candidates;
  auto latest = ReadFileToString(dir + "/LATEST");
  int64_t latest_step = -1;
  if (latest.ok()) {
    absl::string_view name = absl::StripAsciiWhitespace(*latest);
    if (!absl::ConsumePrefix(&name, "ckpt-") || !absl::SimpleAtoi(name, &latest_step)) {
      PSTRAIN_LOG(WARNING) << dir << "/LATEST: expected 'ckpt-<step>', got '" << *latest
                           << "'; looking for older checkpoints";
    } else {
      candidates.push_back(latest_step);
    }
  } else if (!absl::IsNotFound(latest.status())) {
    PSTRAIN_LOG(WARNING) << latest.status();
  } else {
    return std::optional<CheckpointChoice>();  // no LATEST: a fresh start
  }
  // Fall back only to checkpoints older than LATEST: a newer directory without LATEST pointing
  // at it was never completed.
  for (int64_t s : ListCheckpoints(dir)) {
    if (latest_step < 0 || s < latest_step) candidates.push_back(s);
  }
  for (int64_t step : candidates) {
    CheckpointChoice c;
    c.dir = dir + "/" + CkptName(step);
    if (absl::Status s = VerifyCheckpoint(c.dir, &c.manifest); !s.ok()) {
      PSTRAIN_LOG(ERROR) << "refusing checkpoint " << c.dir << ": " << s.message()
                         << "; falling back to the previous checkpoint";
      continue;
    }
    return std::optional<CheckpointChoice>(std::move(c));
  }
  // LATEST exists but nothing under it is usable: starting over would silently discard the
  // job's progress, so stop and let the user decide.
  return absl::DataLossError(absl::StrCat(
      "no usable checkpoint in ", dir, " although LATEST exists (see the errors above); move the "
      "directory away to start from scratch"));
}

absl::Status ReadWorkerState(const std::string& ckpt, int worker, WorkerState* state) {
  return ReadProtoBlockFile(ckpt + "/" + WorkerStateFileName(worker), kWorkerStateTag, state);
}

absl::StatusOr<std::optional<std::string>> RestoreLatestCheckpoint(const std::string& dir,
                                                                   LocalParams* params,
                                                                   WorkerState* state) {
  return RestoreLatestCheckpoint(dir, params, state, 0, 1);
}

absl::StatusOr<std::optional<std::string>> RestoreLatestCheckpoint(const std::string& dir,
                                                                   LocalParams* params,
                                                                   WorkerState* state, int worker,
                                                                   int num_workers) {
  ASSIGN_OR_RETURN(std::optional<CheckpointChoice> choice, ChooseCheckpoint(dir));
  if (!choice) return std::optional<std::string>();
  const std::string& ckpt = choice->dir;
  const CheckpointManifest& manifest = choice->manifest;
  if (manifest.row_dim() != params->row_dim() || manifest.dense_size() != params->dense_size() ||
      manifest.table_rows() != params->embedding()->end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt, " was written for another model: rows ", manifest.table_rows(), " x ",
        manifest.row_dim(), ", dense ", manifest.dense_size(), "; this config has rows ",
        params->embedding()->end(), " x ", params->row_dim(), ", dense ", params->dense_size(),
        ". Use a new --model_dir or the same config."));
  }
  if (manifest.num_shards() != 1 || manifest.num_workers() != num_workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt, " was written by a job of ", manifest.num_shards(), " PS shards and ",
        manifest.num_workers(), " workers (", manifest.created_by(), "); this job resumes only "
        "checkpoints of one in-process replica and ", num_workers, " worker(s): use the same "
        "command and number of ranks, or a new --model_dir"));
  }
  RETURN_IF_ERROR(ReadWorkerState(ckpt, worker, state));
  ASSIGN_OR_RETURN(auto r, BlockReader::Open(ckpt + "/" + kShardFile));
  EmbeddingStore* stores[] = {params->embedding()};
  RETURN_IF_ERROR(LoadEmbeddingStores(r.get(), stores, nullptr));
  ASSIGN_OR_RETURN(DenseSnapshot dense, LoadDenseSnapshot(r.get()));
  RETURN_IF_ERROR(params->dense()->Restore(dense));
  return std::optional<std::string>(ckpt);
}

}  // namespace pstrain
