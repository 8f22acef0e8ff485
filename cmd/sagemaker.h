// SageMaker's training-container contract (docs/DEPLOY.md "SageMaker"), kept by the launcher
// layer: where the model, the checkpoints, the channels and the hyperparameters are, and where a
// failure's reason goes. Read from the environment (SM_*, set by SageMaker's training toolkit in
// framework containers) and from the /opt/ml tree (which every container gets, also
// bring-your-own ones without the toolkit).
//
// /opt/ml is looked up under a root: PSTRAIN_SAGEMAKER_ROOT when set (tests run a fake tree in a
// temporary directory), else "/". Only cmd/ reads the environment; the result is plain data
// that cmd/cli.cc applies to the training flags.
//
// Thread-safety: ReadSageMakerContract reads the process environment and files, call it from the
// launcher's thread. FailureCapture is used by main only.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// PSTRAIN_SAGEMAKER_ROOT + path ("/opt/ml/...").
std::string SageMakerPath(absl::string_view path);

struct SageMakerContract {
  // In a SageMaker training container: SM_HOSTS, SM_MODEL_DIR or SM_TRAINING_ENV is set, or
  // /opt/ml/input/config/resourceconfig.json exists. Nothing below applies otherwise.
  bool active = false;
  std::vector<std::string> hosts;  // SM_HOSTS, else resourceconfig.json's "hosts"
  std::string model_dir;           // SM_MODEL_DIR, else /opt/ml/model
  // /opt/ml/checkpoints when that directory exists (SageMaker creates and syncs it when the job
  // has a checkpoint S3 URI: spot training); "" otherwise.
  std::string checkpoint_dir;
  std::string failure_file;        // /opt/ml/output/failure
  std::string data_dir;            // /opt/ml/input/data: pipe mode's FIFOs <name>_<epoch>
  struct ChannelInput {
    std::string dir;          // SM_CHANNEL_<NAME>, else /opt/ml/input/data/<name>
    bool pipe = false;        // inputdataconfig.json "TrainingInputMode": "Pipe"
    bool sharded = false;     // "S3DistributionType": "ShardedByS3Key": this host's files only
    bool gzip = false;        // "CompressionType": "Gzip"
  };
  std::map<std::string, ChannelInput> channels;  // by channel name, as SageMaker spells it
  // From hyperparameters.json (all values are strings): "config" -> --config, "format" ->
  // --format, "epochs" -> --epochs, any key with a '.' or '[' -> --set key=value. Keys starting
  // with "sagemaker_" or "_" (SageMaker's own) are ignored; any other key is an error naming it.
  std::vector<std::string> config_files;
  std::string format;
  int epochs = 0;
  std::vector<std::string> sets;
};

// Parses hyperparameters.json's text (`what` names it in errors) into `out`'s config_files,
// format, epochs and sets. INVALID_ARGUMENT naming the file and the key for a non-object, a
// non-string value or an unknown key.
absl::Status ParseHyperparameters(const std::string& text, const std::string& what,
                                  SageMakerContract* out);

// /opt/ml/output/failure when the process runs in a SageMaker container (as `active` above), else
// "". Cheap: reads the environment and one stat.
std::string SageMakerFailureFile();

// Reads the contract from the process environment and the /opt/ml tree. Errors name the variable
// or the file and what was expected (hyperparameters, inputdataconfig.json, SM_HOSTS).
absl::StatusOr<SageMakerContract> ReadSageMakerContract();

// SageMaker shows the contents of /opt/ml/output/failure as the job's FailureReason. While active,
// this copies everything the process writes to stderr through to the real stderr and keeps the
// tail; Finish(code) with a non-zero code writes the last "pstrain ..." error line (else the last
// line) and the exit code to the failure file. Forked children inherit the pipe (their lines are
// captured too). Returns null when `failure_file` is empty or the pipe cannot be made.
class FailureCapture {
 public:
  static std::unique_ptr<FailureCapture> Start(const std::string& failure_file);
  ~FailureCapture();
  FailureCapture(const FailureCapture&) = delete;
  FailureCapture& operator=(const FailureCapture&) = delete;
  // Restores stderr, drains the pipe (bounded: 2 s after the last writer is gone or silent) and
  // writes the failure file when `exit_code` != 0.
  void Finish(int exit_code);

 private:
  FailureCapture(std::string path, int original_stderr, int read_fd, int wake_read,
                 int wake_write);
  void Pump();

  const std::string path_;
  const int original_stderr_;
  const int read_fd_;
  const int wake_read_, wake_write_;  // Finish wakes the pump's poll through this pipe
  std::atomic<bool> stop_{false};
  std::string tail_;  // written by the pump thread only, read after it is joined
  std::thread pump_;
  bool finished_ = false;
};

}  // namespace pstrain
