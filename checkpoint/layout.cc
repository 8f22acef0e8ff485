#include "checkpoint/layout.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/block_file.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {
namespace {

constexpr char kCheckpointPrefix[] = "ckpt-";

// A non-negative decimal number as CheckpointName and ShardFileName write it: digits only, no
// leading zero (but "0"), within int64.
std::optional<int64_t> ParseCanonicalInt(absl::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t v;
  if (!absl::SimpleAtoi(s, &v)) return std::nullopt;  // out of range
  return v;
}

// Deletes a checkpoint directory: its entries (a checkpoint has no subdirectories; an empty one
// is removed too), then itself.
// Never through a symlink: `path` is opened with O_NOFOLLOW (a symlink in its place is unlinked
// itself, its target untouched), and each entry is removed with unlinkat, which removes a
// symlink, not what it points to. Best effort: whatever remains is deleted by a later retention.
void RemoveTree(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) ::unlink(path.c_str());
    return;
  }
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  for (const std::string& name : names) {
    // An empty subdirectory (a failed write's leftover) goes too; a full one stays.
    if (::unlinkat(fd, name.c_str(), 0) != 0 && errno == EISDIR) {
      ::unlinkat(fd, name.c_str(), AT_REMOVEDIR);
    }
  }
  closedir(d);  // closes fd
  ::rmdir(path.c_str());
}

constexpr char kRemovingPrefix[] = ".removing-";

// Retention's deletions run off the committing thread, as env's background work (Env::Schedule:
// one at a time, in order), on directories renamed out of the checkpoints' names first.

// Renames the checkpoint directory `path` under `dir` out of the checkpoints' names and schedules
// its deletion; deletes it in place when the rename fails.
void RemoveInBackground(const std::string& dir, const std::string& path, Env* env) {
  static std::atomic<int64_t> renamed{0};
  const std::string name = path.substr(path.rfind('/') + 1);
  const std::string trash =
      absl::StrCat(dir, "/", kRemovingPrefix, name, "-", getpid(), "-", renamed++);
  if (::rename(path.c_str(), trash.c_str()) != 0) {
    RemoveTree(path);
    return;
  }
  env->Schedule([trash] { RemoveTree(trash); });
}

// Schedules the deletion of every .removing-* directory under `dir` now (one a process left
// behind, or one whose scheduled deletion has not run yet: the second deletion finds nothing).
void SweepRemovals(const std::string& dir, Env* env) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> found;
  while (dirent* e = readdir(d)) {
    if (absl::StartsWith(e->d_name, kRemovingPrefix)) found.push_back(dir + "/" + e->d_name);
  }
  closedir(d);
  std::vector<std::string> dirs;
  for (std::string& path : found) {
    if (env->IsRealDirectory(path)) dirs.push_back(std::move(path));
  }
  if (dirs.empty()) return;
  env->Schedule([dirs = std::move(dirs)] {
    for (const std::string& path : dirs) RemoveTree(path);
  });
}

// A block file holding one block: `tag` with msg's serialization. Small: built in memory, then
// written atomically.
absl::StatusOr<uint64_t> WriteProtoBlockFile(const std::string& path, absl::string_view tag,
                                             const google::protobuf::Message& msg) {
  std::string file;
  auto w = BlockWriter::ToString(&file);
  RETURN_IF_ERROR(w->Add(tag, msg.SerializeAsString()));
  RETURN_IF_ERROR(w->Finish());
  RETURN_IF_ERROR(WriteFileAtomic(path, file));
  return static_cast<uint64_t>(file.size());
}

absl::Status ReadProtoBlockFile(const std::string& path, absl::string_view tag,
                                google::protobuf::Message* msg) {
  ASSIGN_OR_RETURN(auto r, BlockReader::Open(path));
  Block b;
  ASSIGN_OR_RETURN(bool got, r->Next(&b));
  if (!got || b.tag != tag) {
    return absl::DataLossError(absl::StrCat(path, ": expected a '", tag, "' block"));
  }
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

// A name the MANIFEST may list: a file directly inside the checkpoint directory.
bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." && !absl::StrContains(name, '/');
}

}  // namespace

std::string JobCheckpointDir(const Config& config) {
  return config.checkpoint().dir().empty() ? config.train().model_dir()
                                           : config.checkpoint().dir();
}

std::string CheckpointName(int64_t step) { return absl::StrCat(kCheckpointPrefix, step); }

std::optional<int64_t> ParseCheckpointName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kCheckpointPrefix)) return std::nullopt;
  return ParseCanonicalInt(name);
}

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/", CheckpointName(step));
}

std::string ShardFileName(int shard, int num_shards) {
  return absl::StrCat("shard-", shard, "-of-", num_shards);
}

bool IsShardFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "shard-")) return false;
  const size_t of = name.find("-of-");
  if (of == absl::string_view::npos) return false;
  const std::optional<int64_t> shard = ParseCanonicalInt(name.substr(0, of));
  const std::optional<int64_t> shards = ParseCanonicalInt(name.substr(of + 4));
  return shard && shards && *shard < *shards;
}

std::string WorkerStateFileName(int worker) { return absl::StrCat("worker-", worker, ".state"); }

absl::StatusOr<uint64_t> WriteWorkerState(const std::string& ckpt, int worker,
                                          const WorkerState& state) {
  return WriteProtoBlockFile(ckpt + "/" + WorkerStateFileName(worker), kWorkerStateTag, state);
}

absl::Status ReadWorkerState(const std::string& ckpt, int worker, WorkerState* state) {
  return ReadProtoBlockFile(ckpt + "/" + WorkerStateFileName(worker), kWorkerStateTag, state);
}

absl::Status WriteManifest(const std::string& ckpt, const CheckpointManifest& manifest) {
  return WriteProtoBlockFile(ckpt + "/" + kManifestFileName, kManifestTag, manifest).status();
}

absl::Status ReadManifest(const std::string& ckpt, CheckpointManifest* manifest) {
  return ReadProtoBlockFile(ckpt + "/" + kManifestFileName, kManifestTag, manifest);
}

absl::Status VerifyCheckpoint(const std::string& ckpt, CheckpointManifest* manifest) {
  // pstrain writes every file of a checkpoint itself: a symlink among them points somewhere it
  // does not own (issue 26), and is refused like a missing file.
  // Its size when it is a regular file.
  auto plain = [](const std::string& path) -> absl::StatusOr<uint64_t> {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return absl::DataLossError(absl::StrCat(path, ": missing"));
    if (!S_ISREG(st.st_mode)) {
      return absl::DataLossError(absl::StrCat(
          path, ": ", S_ISLNK(st.st_mode) ? "a symlink" : "not a regular file",
          ", not a file pstrain wrote"));
    }
    return static_cast<uint64_t>(st.st_size);
  };
  RETURN_IF_ERROR(plain(absl::StrCat(ckpt, "/", kManifestFileName)).status());
  RETURN_IF_ERROR(ReadManifest(ckpt, manifest));
  // The directory's name and the MANIFEST agree on the step (a checkpoint copied or renamed
  // under another step's name would otherwise resume as that step).
  std::string base = ckpt;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = base.substr(base.rfind('/') + 1);
  if (const std::optional<int64_t> named = ParseCheckpointName(base);
      named && *named != manifest->step()) {
    return absl::DataLossError(absl::StrCat(ckpt, "/", kManifestFileName, ": says step ",
                                            manifest->step(), ", but the directory is ", base));
  }
  for (const auto& f : manifest->file()) {
    if (!IsPlainFileName(f.name())) {
      return absl::DataLossError(absl::StrCat(ckpt, "/", kManifestFileName, ": lists '",
                                              f.name(), "', not a file name in the directory"));
    }
    const std::string path = ckpt + "/" + f.name();
    ASSIGN_OR_RETURN(const uint64_t bytes, plain(path));
    if (bytes != f.bytes()) {
      return absl::DataLossError(absl::StrCat(path, ": ", bytes, " bytes, MANIFEST says ",
                                              f.bytes()));
    }
    RETURN_IF_ERROR(VerifyBlockFile(path));
  }
  return absl::OkStatus();
}

namespace {

// "a/b/ckpt-7/" -> "a/b"; "ckpt-7" -> ".".
std::string ParentDir(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// LATEST and BEST: "ckpt-<step>\n", replaced by atomic rename.
absl::Status WritePointer(const std::string& dir, const char* name, int64_t step) {
  return WriteFileAtomic(absl::StrCat(dir, "/", name), CheckpointName(step) + "\n");
}

absl::StatusOr<int64_t> ReadPointer(const std::string& dir, const char* name) {
  const std::string path = absl::StrCat(dir, "/", name);
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  const std::optional<int64_t> step = ParseCheckpointName(absl::StripAsciiWhitespace(text));
  if (!step) {
    return absl::DataLossError(
        absl::StrCat(path, ": expected 'ckpt-<step>', got '", absl::CHexEscape(text), "'"));
  }
  return *step;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointLink>> VerifyCheckpointChain(const std::string& ckpt) {
  std::vector<CheckpointLink> chain(1);
  chain[0].dir = ckpt;
  RETURN_IF_ERROR(VerifyCheckpoint(ckpt, &chain[0].manifest));
  const CheckpointManifest top = chain[0].manifest;  // a copy: chain grows below
  if (!top.has_delta()) return chain;
  const int64_t base = top.delta().base_step();
  auto refuse = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat(ckpt, " (a delta of ", CheckpointName(base), "): ", why));
  };
  const std::string dir = ParentDir(ckpt);
  int64_t child = top.step();
  int64_t parent = top.delta().parent_step();
  // Steps strictly decrease down to the base, so the walk ends.
  while (true) {
    if (parent >= child || parent < base) {
      return refuse(absl::StrCat(CheckpointName(child), " names the parent ",
                                 CheckpointName(parent), ", not an older checkpoint of its chain"));
    }
    CheckpointLink link;
    link.dir = CheckpointPath(dir, parent);
    if (absl::Status s = VerifyCheckpoint(link.dir, &link.manifest); !s.ok()) {
      return refuse(absl::StrCat("the link ", CheckpointName(parent), " of its chain: ",
                                 s.message()));
    }
    const CheckpointManifest& m = link.manifest;
    if (m.step() != parent || m.table_rows() != top.table_rows() ||
        m.row_dim() != top.row_dim() || m.dense_size() != top.dense_size()) {
      return refuse(absl::StrCat("the link ", CheckpointName(parent), " holds step ", m.step(),
                                 " of rows ", m.table_rows(), " x ", m.row_dim(), ", dense ",
                                 m.dense_size(), "; expected step ", parent, " of rows ",
                                 top.table_rows(), " x ", top.row_dim(), ", dense ",
                                 top.dense_size()));
    }
    const bool is_base = parent == base;
    if (is_base == m.has_delta() || (m.has_delta() && m.delta().base_step() != base)) {
      return refuse(absl::StrCat("the link ", CheckpointName(parent), " is ",
                                 m.has_delta() ? absl::StrCat("a delta of ",
                                                              CheckpointName(m.delta().base_step()))
                                               : "a full checkpoint",
                                 is_base ? ", not the full base" : ", not a delta of the base"));
    }
    child = parent;
    parent = m.has_delta() ? m.delta().parent_step() : -1;
    chain.push_back(std::move(link));
    if (is_base) break;
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

std::vector<int64_t> ChainSteps(const std::string& dir, int64_t step) {
  std::vector<int64_t> steps;
  CheckpointManifest m;
  while (ReadManifest(CheckpointPath(dir, step), &m).ok() && m.has_delta() &&
         m.delta().parent_step() < step && m.delta().parent_step() >= 0) {
    step = m.delta().parent_step();
    steps.push_back(step);
  }
  return steps;
}

absl::Status WriteLatest(const std::string& dir, int64_t step) {
  return WritePointer(dir, kLatestFileName, step);
}

absl::StatusOr<int64_t> ReadLatest(const std::string& dir) {
  return ReadPointer(dir, kLatestFileName);
}

absl::Status WriteBest(const std::string& dir, int64_t step) {
  CheckpointManifest manifest;
  RETURN_IF_ERROR(Annotate(ReadManifest(CheckpointPath(dir, step), &manifest),
                           "the best checkpoint must be complete"));
  return WritePointer(dir, kBestFileName, step);
}

absl::StatusOr<int64_t> ReadBest(const std::string& dir) {
  return ReadPointer(dir, kBestFileName);
}

std::string LatestPathOr(const std::string& dir, const std::string& none) {
  absl::StatusOr<int64_t> latest = ReadLatest(dir);
  return latest.ok() ? CheckpointPath(dir, *latest) : none;
}

std::vector<CheckpointEntry> ListCheckpoints(const std::string& dir, Env* env) {
  std::vector<CheckpointEntry> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::optional<int64_t> step = ParseCheckpointName(e->d_name);
    if (!step) continue;
    CheckpointEntry entry;
    entry.step = *step;
    entry.path = CheckpointPath(dir, *step);
    // A real directory, not a symlink to one: checkpoints are directories pstrain made. A symlink
    // named like a checkpoint points somewhere pstrain does not own; it is neither read as a
    // checkpoint nor deleted through.
    if (!env->IsRealDirectory(entry.path)) continue;
    entry.complete = PathExists(absl::StrCat(entry.path, "/", kManifestFileName));
    out.push_back(std::move(entry));
  }
  closedir(d);
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step > b.step; });
  return out;
}

absl::StatusOr<std::string> PrepareCheckpointDir(const std::string& dir, int64_t step) {
  const std::string ckpt = CheckpointPath(dir, step);
  // A symlink named like this checkpoint is replaced, never written or deleted through.
  RETURN_IF_ERROR(MakeOwnDir(ckpt));
  for (const char* name : {kManifestFileName, kPassEndFileName}) {
    const std::string path = absl::StrCat(ckpt, "/", name);
    if (std::remove(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("remove", path);
  }
  return ckpt;
}

bool IsCommittedCheckpoint(const std::string& dir, int64_t step) {
  absl::StatusOr<int64_t> latest = ReadLatest(dir);
  if (!latest.ok() || *latest != step) return false;
  CheckpointManifest manifest;
  return VerifyCheckpoint(CheckpointPath(dir, step), &manifest).ok() && manifest.step() == step;
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& dir, CheckpointManifest manifest,
                                             const std::map<int, WorkerState>& workers, int keep,
                                             Env* env) {
  const std::string ckpt = CheckpointPath(dir, manifest.step());
  // Until the MANIFEST is written the directory is incomplete: a failure removes it, so that no
  // half-written directory is left (it would never be chosen, but it takes disk).
  auto remove_on_error = [&ckpt](absl::Status s) {
    if (!s.ok()) RemoveTree(ckpt);
    return s;
  };
  for (const auto& [j, state] : workers) {
    absl::StatusOr<uint64_t> bytes = WriteWorkerState(ckpt, j, state);
    RETURN_IF_ERROR(remove_on_error(bytes.status()));
    auto* f = manifest.add_file();
    f->set_name(WorkerStateFileName(j));
    f->set_bytes(*bytes);
  }
  manifest.set_num_workers(static_cast<int>(workers.size()));
  if (manifest.has_model()) manifest.set_version(kManifestVersion);
  if (manifest.has_delta()) manifest.set_version(kDeltaManifestVersion);
  manifest.set_wall_time(env->WallSeconds());
  RETURN_IF_ERROR(remove_on_error(WriteManifest(ckpt, manifest)));
  RETURN_IF_ERROR(WriteLatest(dir, manifest.step()));
  RemoveOldCheckpoints(dir, manifest.step(), keep, env);
  return ckpt;
}

absl::Status MarkPassEnd(const std::string& dir, int64_t step,
                         const std::map<int, WorkerState>& workers) {
  if (workers.empty()) return absl::OkStatus();
  PassEnd end;
  end.set_step(step);
  bool trained = false;
  for (const auto& [j, state] : workers) {
    if (!state.finished()) return absl::OkStatus();
    end.set_pass_examples(end.pass_examples() + state.examples() - state.pass_first_examples());
    trained = trained || state.step() > state.pass_first_step();
    if (state.max_steps_reached()) end.set_max_steps_reached(true);
  }
  if (!trained) return absl::OkStatus();
  return WriteProtoBlockFile(absl::StrCat(CheckpointPath(dir, step), "/", kPassEndFileName),
                             kPassEndTag, end)
      .status();
}

absl::StatusOr<std::optional<PassEnd>> ReadPassEnd(const std::string& ckpt) {
  const std::string path = absl::StrCat(ckpt, "/", kPassEndFileName);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<PassEnd>();
    return ErrnoError("stat", path);
  }
  PassEnd end;
  RETURN_IF_ERROR(ReadProtoBlockFile(path, kPassEndTag, &end));
  const size_t slash = ckpt.rfind('/');
  const std::optional<int64_t> step =
      ParseCheckpointName(slash == std::string::npos ? ckpt : ckpt.substr(slash + 1));
  if (!step || end.step() != *step) {
    return absl::DataLossError(absl::StrCat(path, ": marks the end of a pass at step ", end.step(),
                                            ", not in a checkpoint of that step"));
  }
  return std::optional<PassEnd>(end);
}

void RemoveOldCheckpoints(const std::string& dir, int64_t committed_step, int keep, Env* env) {
  // checkpoint.keep_best's checkpoint is kept beside the newest `keep`, not counted among them.
  const absl::StatusOr<int64_t> best = ReadBest(dir);
  int kept = 1;  // the committed checkpoint
  // The links the kept deltas restore from (newest first, so a link is known before it is seen).
  std::set<int64_t> chains;
  auto keep_chain = [&](int64_t step) {
    for (int64_t s : ChainSteps(dir, step)) chains.insert(s);
  };
  keep_chain(committed_step);
  if (best.ok()) keep_chain(*best);  // a best that is a delta needs its chain too
  for (const CheckpointEntry& e : ListCheckpoints(dir, env)) {
    if (e.step >= committed_step || (best.ok() && e.step == *best)) continue;
    if (e.complete && kept < keep) {
      ++kept;
      keep_chain(e.step);
      continue;
    }
    if (e.complete && chains.count(e.step) > 0) continue;
    RemoveInBackground(dir, e.path, env);
  }
  SweepRemovals(dir, env);
}


namespace {

std::string FormatWidths(const google::protobuf::RepeatedField<int32_t>& widths) {
  return absl::StrCat("[", absl::StrJoin(widths, ", "), "]");
}

}  // namespace

absl::Status CompareModelDescriptions(const ModelDescription& saved, const ModelDescription& wanted,
                                      absl::string_view saved_name, absl::string_view wanted_name) {
  auto differ = [&](absl::string_view field, const auto& a, const auto& b) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": ", a, " in ", saved_name, ", ", b, " in ", wanted_name));
  };
  const FeatureConfig& fa = saved.features();
  const FeatureConfig& fb = wanted.features();
  if (fa.hash_seed() != fb.hash_seed()) {
    return differ("features.hash_seed", fa.hash_seed(), fb.hash_seed());
  }
  const int n = std::min(fa.field_size(), fb.field_size());
  for (int i = 0; i < n; ++i) {
    const FieldSpec& a = fa.field(i);
    const FieldSpec& b = fb.field(i);
    const std::string where = absl::StrCat("features.field[", i, "] '", a.name(), "'");
    if (a.name() != b.name()) {
      return differ(absl::StrCat("features.field[", i, "].name"), absl::StrCat("'", a.name(), "'"),
                    absl::StrCat("'", b.name(), "'"));
    }
    if (a.kind() != b.kind()) {
      return differ(where + ".kind", FieldKind_Name(a.kind()), FieldKind_Name(b.kind()));
    }
    if (a.kind() == NUMERIC && a.numeric_mode() != b.numeric_mode()) {
      return differ(where + ".numeric_mode", NumericMode_Name(a.numeric_mode()),
                    NumericMode_Name(b.numeric_mode()));
    }
    if (a.kind() == NUMERIC && a.numeric_mode() == DENSE &&
        a.numeric_transform() != b.numeric_transform()) {
      return differ(where + ".numeric_transform", NumericTransform_Name(a.numeric_transform()),
                    NumericTransform_Name(b.numeric_transform()));
    }
    if (a.table() != b.table()) {
      auto named = [](const FieldSpec& f) {
        return f.has_table() ? absl::StrCat("'", f.table(), "'") : std::string("no table");
      };
      return differ(where + ".table", named(a), named(b));
    }
    if (a.vocab_size() != b.vocab_size()) {
      return differ(where + ".vocab_size", a.vocab_size(), b.vocab_size());
    }
  }
  // The tables (FeatureConfig.table): rows are stored by global id, so each table must keep its
  // place, dim and rows. A checkpoint of before tables records none, and matches a config with
  // none.
  const int nt = std::min(fa.table_size(), fb.table_size());
  for (int t = 0; t < nt; ++t) {
    const TableConfig& a = fa.table(t);
    const TableConfig& b = fb.table(t);
    const std::string where = absl::StrCat("features.table[", t, "] '", a.name(), "'");
    if (a.name() != b.name()) {
      return differ(absl::StrCat("features.table[", t, "].name"), absl::StrCat("'", a.name(), "'"),
                    absl::StrCat("'", b.name(), "'"));
    }
    if (a.dim() != b.dim()) return differ(where + ".dim", a.dim(), b.dim());
    if (a.rows() != b.rows()) return differ(where + ".rows", a.rows(), b.rows());
  }
  if (fa.table_size() != fb.table_size()) {
    const bool more = fa.table_size() > fb.table_size();
    const TableConfig& extra = more ? fa.table(nt) : fb.table(nt);
    return absl::FailedPreconditionError(absl::StrCat(
        "features: ", fa.table_size(), " tables in ", saved_name, ", ", fb.table_size(), " in ",
        wanted_name, " (table[", nt, "] '", extra.name(), "' is only in ",
        more ? saved_name : wanted_name, ")"));
  }
  if (fa.field_size() != fb.field_size()) {
    const bool more = fa.field_size() > fb.field_size();
    const FieldSpec& extra = more ? fa.field(n) : fb.field(n);
    return absl::FailedPreconditionError(absl::StrCat(
        "features: ", fa.field_size(), " fields in ", saved_name, ", ", fb.field_size(), " in ",
        wanted_name, " (field[", n, "] '", extra.name(), "' is only in ",
        more ? saved_name : wanted_name, ")"));
  }
  const ModelConfig& ma = saved.model();
  const ModelConfig& mb = wanted.model();
  if (ma.type() != mb.type()) {
    return differ("model.type", ModelType_Name(ma.type()), ModelType_Name(mb.type()));
  }
  if (ma.embedding_dim() != mb.embedding_dim()) {
    return differ("model.embedding_dim", ma.embedding_dim(), mb.embedding_dim());
  }
  if (!std::equal(ma.hidden().begin(), ma.hidden().end(), mb.hidden().begin(),
                  mb.hidden().end())) {
    return differ("model.hidden", FormatWidths(ma.hidden()), FormatWidths(mb.hidden()));
  }
  return absl::OkStatus();
}

absl::Status CheckCheckpointModel(const std::string& ckpt, const CheckpointManifest& manifest,
                                  const ModelDescription& wanted) {
  if (!manifest.has_model()) return absl::OkStatus();
  absl::Status s = CompareModelDescriptions(manifest.model(), wanted);
  if (s.ok()) return s;
  return absl::FailedPreconditionError(absl::StrCat(
      ckpt, " was trained for another model: ", s.message(),
      ". Use the checkpoint's config (pstrain predict and export need none), or a new "
      "--model_dir to start over."));
}

int RemoveIncompleteCheckpoints(const std::string& dir, Env* env) {
  SweepRemovals(dir, env);
  int removed = 0;
  for (const CheckpointEntry& e : ListCheckpoints(dir, env)) {
    if (e.complete) continue;
    PSTRAIN_LOG(INFO) << "removing the incomplete checkpoint directory " << e.path;
    RemoveTree(e.path);
    ++removed;
  }
  return removed;
}

absl::StatusOr<std::optional<CheckpointChoice>> ChooseCheckpoint(const std::string& dir) {
  std::vector<int64_t> candidates;
  int64_t latest_step = -1;
  absl::StatusOr<int64_t> latest = ReadLatest(dir);
  if (latest.ok()) {
    latest_step = *latest;
    candidates.push_back(latest_step);
  } else if (absl::IsNotFound(latest.status())) {
    return std::optional<CheckpointChoice>();  // no LATEST: a fresh start
  } else {
    PSTRAIN_LOG(WARNING) << latest.status().message() << "; looking for older checkpoints";
  }
  // Fall back only to checkpoints older than LATEST: a newer directory without LATEST pointing
  // at it was never committed.
  for (const CheckpointEntry& e : ListCheckpoints(dir)) {
    if (latest_step < 0 || e.step < latest_step) candidates.push_back(e.step);
  }
  for (int64_t step : candidates) {
    CheckpointChoice c;
    c.dir = CheckpointPath(dir, step);
    absl::StatusOr<std::vector<CheckpointLink>> chain = VerifyCheckpointChain(c.dir);
    if (!chain.ok()) {
      PSTRAIN_LOG(ERROR) << "refusing checkpoint " << c.dir << ": " << chain.status().message()
                         << "; falling back to the previous checkpoint";
      continue;
    }
    c.chain = *std::move(chain);
    c.manifest = c.chain.back().manifest;
    return std::optional<CheckpointChoice>(std::move(c));
  }
  // LATEST exists but nothing under it is usable: starting over would silently discard the
  // job's progress, so stop and let the user decide.
  return absl::DataLossError(absl::StrCat(
      "no usable checkpoint in ", dir, " although LATEST exists (see the errors above); move the "
      "directory away to start from scratch"));
}

}  // namespace pstrain
