#include "worker/train/event_writer.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/record_frame.h"
#include "common/status.h"
#include "tensorboard/event.pb.h"

namespace pstrain {
absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& dir,
                                                                 Env* env) {
  RETURN_IF_ERROR(MakeDirs(dir));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const int64_t now = static_cast<int64_t>(env->WallSeconds());
  const std::string path = absl::StrCat(dir, "/events.out.tfevents.", now, ".", host);
  // A regular file of the job's own (common/file.h OpenForAppend): not a planted FIFO or symlink.
  ASSIGN_OR_RETURN(const int fd, OpenForAppend(path));
  std::FILE* f = ::fdopen(fd, "ab");
  if (f == nullptr) {
    absl::Status s = ErrnoError("fdopen", path);
    ::close(fd);
    return s;
  }
  std::unique_ptr<EventWriter> w(new EventWriter(path, f, env));
  tensorboard::Event e;
  e.set_wall_time(env->WallSeconds());
  e.set_file_version("brain.Event:2");
  RETURN_IF_ERROR(w->WriteRecord(e.SerializeAsString()));
  RETURN_IF_ERROR(w->Flush());
  return w;
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

absl::Status EventWriter::WriteRecord(const std::string& data) {
  std::string framed;
  AppendTFRecordFrame(data, &framed);
  if (std::fwrite(framed.data(), 1, framed.size(), file_) != framed.size()) {
    return absl::UnavailableError(absl::StrCat("write ", path_, " failed"));
  }
  return absl::OkStatus();
}

absl::Status EventWriter::AddScalar(absl::string_view tag, int64_t step, double value) {
  tensorboard::Event e;
  e.set_wall_time(env_->WallSeconds());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  return WriteRecord(e.SerializeAsString());
}

absl::Status EventWriter::Flush() {
  if (std::fflush(file_) != 0) return absl::UnavailableError(absl::StrCat("flush ", path_, " failed"));
  return absl::OkStatus();
}

}  // namespace pstrain
