// Expands the data paths of a channel (config Channel.path) into the list of files to read.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// Expands one path into files, in the order they are read:
//   - an existing path ending in ".manifest" (a regular file): a SageMaker manifest, the JSON
//     array `[{"prefix": "dir/"}, "rel/key1", "rel/key2", ...]`. The first element must be the
//     prefix object; each key becomes prefix + key, in manifest order. A relative prefix is
//     relative to the manifest's directory. A key may repeat: the file is then listed (and read)
//     twice, which is how a file is boosted. Every listed file must exist. Remote prefixes
//     (s3://, or any "scheme://") are refused with INVALID_ARGUMENT.
//   - any other existing non-directory (a regular file, a FIFO): the path itself.
//   - a directory: its regular files (not recursive), sorted by name, except names starting with
//     '.' or '_' (Hadoop's hidden files: Spark's _SUCCESS, .crc files) and names ending in
//     ".json" (no data format is JSON; `pstrain datagen` keeps teacher.json beside its parts, so
//     its output directory is usable as `--train DIR`). Manifests inside a directory are listed
//     as plain files. A glob or an explicit file path is not filtered.
//   - otherwise, a path containing '*', '?' or '[': a glob(3) pattern; its non-directory matches,
//     sorted. No match is NOT_FOUND naming the pattern.
// A missing path is NOT_FOUND naming it. Malformed manifests are INVALID_ARGUMENT naming the
// manifest and the character offset of the problem.
absl::StatusOr<std::vector<std::string>> ExpandPath(const std::string& path);

// Whether a directory listing keeps the file `name` (see ExpandPath).
bool IsDataFileName(absl::string_view name);

// Expands each path in order and concatenates the results.
absl::StatusOr<std::vector<std::string>> ExpandPath(const std::vector<std::string>& paths);

// Parses the text of a manifest (see ExpandPath) into (prefix, keys). `name` is used in error
// messages only. Exposed for tests.
absl::Status ParseManifest(absl::string_view text, absl::string_view name, std::string* prefix,
                           std::vector<std::string>* keys);

}  // namespace pstrain
