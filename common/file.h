// Small file helpers shared by the data layer, checkpoints and metrics.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// The most ReadFileToString reads by default: every file it reads (configs, LATEST, MANIFEST,
// JSON specs, secrets, /proc and cgroup files) is small; a larger one is an error, not an
// allocation of whatever /dev/zero offers.
inline constexpr int64_t kMaxSmallFileBytes = int64_t{64} << 20;

// Opens `path` for reading if it is a regular file (or a symlink to one), with O_CLOEXEC, and
// returns the descriptor. Anything else is refused before a byte is read, so that a FIFO cannot
// block the caller (it is opened with O_NONBLOCK, which a regular file ignores) and a device
// cannot feed it without end: FAILED_PRECONDITION "open PATH: not a regular file (a FIFO)".
// Readers of data streams that may legitimately be FIFOs (pipe mode) open their own files.
absl::StatusOr<int> OpenRegularFile(const std::string& path);

// The whole of a regular file (OpenRegularFile), at most `max_bytes`: a longer file is
// INVALID_ARGUMENT naming the path and the limit.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             int64_t max_bytes = kMaxSmallFileBytes);

// Creates `path` as a new, empty regular file for writing (O_CLOEXEC) and returns the descriptor:
// for the files pstrain names itself (temporaries, logs). Whatever the name holds already (a
// temporary a crash left, or a symlink or FIFO planted at a predictable name) is unlinked first,
// never opened, and the open is O_CREAT | O_EXCL | O_NOFOLLOW: a write never goes through a
// symlink to a file outside the directory, and a name planted again between the unlink and the
// open is ALREADY_EXISTS, not a write elsewhere. (An output the user names, `--out`, is written
// where the user's path leads.)
absl::StatusOr<int> CreateFreshFile(const std::string& path, mode_t mode = 0644);

// Opens `path` for appending (O_CLOEXEC), creating it if missing, and returns the descriptor:
// for the logs pstrain keeps in a job's directory. What is not a regular file is refused without
// blocking, FAILED_PRECONDITION naming the path and what it is: a symlink (O_NOFOLLOW: a log is
// never appended to a file outside the directory), a FIFO (opened O_NONBLOCK: one without a
// reader fails at once, one with a reader is refused by fstat), a device, a directory.
absl::StatusOr<int> OpenForAppend(const std::string& path, mode_t mode = 0644);

// Writes `contents` to `path` atomically: a temporary file in the same directory
// (CreateFreshFile) is written, fsync'ed and renamed over `path`, then the directory is fsync'ed.
// A crash leaves either the old file or the new one, never a torn one.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents);

// mkdir -p.
absl::Status MakeDirs(const std::string& path);

// MakeDirs, for a directory pstrain names itself (a checkpoint's, an export's staging): the last
// component must end up a real directory, not a symlink to one. A symlink (or a file, a FIFO)
// planted at that name is unlinked first (what it points to is untouched) and a real directory
// made; a real directory already there (a crash's leftover) is kept. A name planted again in
// between is FAILED_PRECONDITION: nothing is written through it.
absl::Status MakeOwnDir(const std::string& path);

bool PathExists(const std::string& path);

// The Status for a failed system call on `path`, from errno: "what path: strerror". NOT_FOUND for
// ENOENT, PERMISSION_DENIED for EACCES/EPERM, else UNAVAILABLE (worth a retry).
absl::Status ErrnoError(absl::string_view what, const std::string& path);

// "a/b/c" -> "a/b"; "c" -> "."; "/c" -> "/".
std::string DirName(const std::string& path);

}  // namespace pstrain
