#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace pstrain {
absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int e = errno;
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

namespace {

// FAILED_PRECONDITION "open PATH: not a regular file (a FIFO)".
absl::Status NotRegular(const std::string& path, mode_t mode) {
  const char* kind = S_ISFIFO(mode)   ? "a FIFO"
                     : S_ISDIR(mode)  ? "a directory"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISLNK(mode)  ? "a symlink"
                                      : "not a plain file";
  return absl::FailedPreconditionError(
      absl::StrCat("open ", path, ": not a regular file (", kind, ")"));
}

// `fd`, opened O_NONBLOCK from `path`, if it is a regular file, made blocking again (a regular
// file never blocks on open, but its reads and writes should not return EAGAIN on filesystems
// that honour the flag); otherwise closed, and NotRegular.
absl::StatusOr<int> KeepIfRegular(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError("stat", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return NotRegular(path, st.st_mode);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace

absl::StatusOr<int> OpenRegularFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return ErrnoError("open", path);
  return KeepIfRegular(fd, path);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<int> opened = OpenRegularFile(path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    if (static_cast<int64_t>(out.size()) + n > max_bytes) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(
          "read ", path, ": longer than ", max_bytes, " bytes, the most this file may hold"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::StatusOr<int> CreateFreshFile(const std::string& path, mode_t mode) {
  // A failed unlink (nothing there, or a directory) is for the open to report.
  (void)::unlink(path.c_str());
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, mode);
  if (fd >= 0) return fd;
  if (errno == EEXIST) {
    return absl::AlreadyExistsError(absl::StrCat(
        "create ", path, ": the name is taken again as soon as it is removed; not written"));
  }
  return ErrnoError("create", path);
}

absl::StatusOr<int> OpenForAppend(const std::string& path, mode_t mode) {
  const int fd =
      ::open(path.c_str(),
             O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, mode);
  if (fd < 0) {
    const int e = errno;
    struct stat st;
    // ELOOP: the name is a symlink (O_NOFOLLOW); ENXIO: a FIFO no one reads; EISDIR.
    if ((e == ELOOP || e == ENXIO || e == EISDIR) && ::lstat(path.c_str(), &st) == 0) {
      return NotRegular(path, st.st_mode);
    }
    errno = e;
    return ErrnoError("open", path);
  }
  return KeepIfRegular(fd, path);
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  ASSIGN_OR_RETURN(const int fd, CreateFreshFile(tmp));
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = ErrnoError("fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoError("rename to", path);
    ::unlink(tmp.c_str());
    return s;
  }
  const int dfd = ::open(DirName(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoError("mkdir", cur);
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status MakeOwnDir(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(DirName(path)));
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("unlink", path);
  }
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoError("mkdir", path);
  if (::lstat(path.c_str(), &st) != 0) return ErrnoError("stat", path);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": not a directory (something else was put there as it was made); not written"));
  }
  return absl::OkStatus();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace pstrain
