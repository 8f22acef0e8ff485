// TensorBoard scalar summaries: events.out.tfevents.<unix_seconds>.<hostname> files holding
// TFRecord-framed tensorboard.Event protos (first record: file_version "brain.Event:2"), so a
// user's TensorBoard shows pstrain's loss and AUC curves.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"

namespace pstrain {

// Not thread-safe; the trainer serializes calls.
class EventWriter {
 public:
  // Creates the event file in `dir` (created if missing) and writes the file_version record.
  // `env`'s wall clock names the file and stamps the events; it must outlive the writer.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(const std::string& dir,
                                                             Env* env = Env::Default());
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  absl::Status AddScalar(absl::string_view tag, int64_t step, double value);
  // Makes everything written so far visible to readers.
  absl::Status Flush();
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, std::FILE* f, Env* env)
      : path_(std::move(path)), file_(f), env_(env) {}
  absl::Status WriteRecord(const std::string& data);
  std::string path_;
  std::FILE* file_;
  Env* const env_;
};

}  // namespace pstrain
