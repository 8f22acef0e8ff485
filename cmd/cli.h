// Shared command-line handling of the subcommands: the error style of every command
// (CommandError), and for the training subcommands (train, host, local, allreduce, tune) the flag
// contract users and scripts rely on.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/flags.h"
#include "pstrain/config.pb.h"

namespace pstrain {

// How every command reports an error that ends it: "pstrain <command>: <message>" on stderr
// (cmd/sagemaker.h's FailureCapture takes that line as the job's failure reason); returns `code`,
// the exit code (2: the command line or config is wrong, 1: the work failed, others as the
// command documents).
int CommandError(const char* command, absl::string_view message, int code);

// Parses argv[2..) into `flags`; returns the exit code when the command stops here: 0 after
// printing the usage for --help, 2 after CommandError for a bad command line.
std::optional<int> ParseCommandFlags(const char* command, FlagSet& flags, int argc, char** argv);

struct TrainingFlags {
  // --config FILE (text proto; repeatable: each later file merges over the earlier ones with
  // protobuf MergeFrom semantics: set scalars replace, repeated fields append).
  std::vector<std::string> config;
  std::vector<std::string> set;     // --set a.b=value (repeatable)
  std::vector<std::string> train;   // --train PATH (repeatable): first train channel's paths
  std::vector<std::string> eval;    // --eval PATH (repeatable): first eval channel's paths
  std::string format;               // --format: format of the --train/--eval channels
  std::string model_dir;            // --model_dir DIR
  int epochs = 0;                   // --epochs N (0 = from the config)
  // --on_new_data auto|continue|new_pass: train.on_new_data ("" = from the config).
  std::string on_new_data;
  // --warm_start_from DIR[/ckpt-N], --reset_optimizer: train.warm_start (a fresh model dir starts
  // from another model dir's checkpoint; "" / false = from the config).
  std::string warm_start_from;
  bool reset_optimizer = false;
  // --metrics_port P: serve Prometheus metrics on http://<metrics_bind>:P/metrics (0 = off);
  // --metrics_bind: loopback unless told otherwise.
  int metrics_port = 0;
  std::string metrics_bind = "127.0.0.1";
  // Set by commands that never evaluate (`tune`): BuildConfig drops the eval channels before
  // validating, so a config whose eval channel has no path yet is accepted.
  bool train_only = false;

  // Defaults of the platform the command runs on (SageMaker's contract, cmd/sagemaker.h), filled
  // by ParseTrainingCommand; each applies only where the config files and flags leave the value
  // unset. Tests set them directly.
  std::string default_model_dir;       // train.model_dir when the config has none
  std::string default_checkpoint_dir;  // checkpoint.dir when the config has none
  struct ChannelDefault {
    std::string dir;       // the channel's data directory
    std::string pipe_dir;  // pipe mode: the FIFOs <pipe_dir>/<name>_<epoch> (dir then unused)
    bool sharded = false;  // the platform gave this host its own files: read them all
    bool gzip = false;
  };
  // By channel name: a train or eval channel of that name without paths reads it; with no train
  // channel configured, a "train" entry makes one, and with no eval channel, an "eval",
  // "validation" or "test" entry makes one.
  std::map<std::string, ChannelDefault> default_channels;
  std::vector<std::string> platform_sets;  // --set values applied before the command line's
};

void AddTrainingFlags(FlagSet* flags, TrainingFlags* out);

// Builds the effective config: the --config files merged in order (or the schema defaults), then
// ApplyConfigDefaults (common/config.h: Adam for an absent dense_optimizer), then the platform's
// defaults (model dir, checkpoint dir, channels), then --train/--eval/--format/--model_dir/
// --epochs, then platform_sets (SageMaker's hyperparameters), then each --set in order; then
// validates it.
absl::StatusOr<Config> BuildConfig(const TrainingFlags& flags);

// The common front of a training command: parses argv (from argv[2]) into `flags` (which holds
// AddTrainingFlags' targets and the command's own), prints --help, applies SageMaker's contract
// when the process runs in a SageMaker container (cmd/sagemaker.h: model dir, checkpoint dir,
// channels, hyperparameters; `train` refuses a multi-host job), builds *config. Returns the
// exit code when the command should stop here (0 after --help, 2 after an error printed as
// "pstrain <command>: <message>"), nullopt to go on.
// A command's arguments argv[2..] for a child process it starts (`local` its hosts, `host` its
// supervised worker), without the flags named in `own` ("--name value" or "--name=value": each
// must take a value).
std::vector<std::string> ForwardedArgs(int argc, char** argv, const std::vector<std::string>& own);

std::optional<int> ParseTrainingCommand(const char* command, int argc, char** argv,
                                        FlagSet* flags, const TrainingFlags& training,
                                        Config* config);

// Horovod users expect one file to just work: every SHARD_BY_FILE train channel (not in pipe mode)
// whose paths expand to fewer files than `readers` is switched to SHARD_BY_RECORD (every reader
// reads all files and keeps every readers-th record). Returns one notice line per channel changed
// (for the log), or the error of expanding a path. `readers` is the job's reader count (ranks,
// hosts x workers).
absl::StatusOr<std::vector<std::string>> ShardByRecordWhenTooFewFiles(Config* config, int readers);

// Starts the process's Prometheus endpoint (common/metrics/metrics.h) on bind:port, up until the
// process exits; port 0 = off, and a second call does nothing. INVALID_ARGUMENT for a port
// outside [0, 65535], UNAVAILABLE when it cannot listen.
absl::Status StartMetricsEndpoint(const std::string& bind, int port);

}  // namespace pstrain
