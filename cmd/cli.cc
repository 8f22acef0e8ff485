#include "cmd/cli.h"

#include "cmd/launcher.h"
#include "cmd/sagemaker.h"
#include "common/logging.h"
#include "common/metrics/metrics.h"
#include "worker/model/isa.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/status.h"
#include "worker/data/file_list.h"
#include "worker/data/record_io.h"

namespace pstrain {

int CommandError(const char* command, absl::string_view message, int code) {
  std::fprintf(stderr, "pstrain %s: %.*s\n", command, static_cast<int>(message.size()),
               message.data());
  return code;
}

std::optional<int> ParseCommandFlags(const char* command, FlagSet& flags, int argc, char** argv) {
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    return CommandError(command, s.message(), 2);
  }
  if (!flags.help_requested()) return std::nullopt;
  std::printf("%s", flags.Usage().c_str());
  return 0;
}

void AddTrainingFlags(FlagSet* f, TrainingFlags* o) {
  f->List("config", &o->config,
          "config file (text proto of pstrain.Config; see configs/); repeatable: later files "
          "merge over earlier ones (e.g. a `pstrain tune` fragment)");
  f->List("set", &o->set, "override one config field: --set train.batch_size=512");
  f->List("train", &o->train, "training data: a file, directory, glob or .manifest");
  f->List("eval", &o->eval, "evaluation data: a file, directory, glob or .manifest");
  f->String("format", &o->format, "format of --train/--eval: criteo_tsv|csv|libsvm|tfrecord|recordio");
  f->String("model_dir", &o->model_dir, "where metrics, summary.json and checkpoints go");
  f->Int("epochs", &o->epochs, "epochs to train (0 = from the config)");
  f->String("on_new_data", &o->on_new_data,
            "a model dir that has a checkpoint: auto (resume the same data, start a new pass "
            "over new data after a finished job, refuse new data under an unfinished one), "
            "continue (resume the saved pass on its own files) or new_pass (a new pass over "
            "this run's data from the saved parameters); default: train.on_new_data (auto)");
  f->String("warm_start_from", &o->warm_start_from,
            "DIR or DIR/ckpt-N: a FRESH model dir starts from that checkpoint's parameters and "
            "optimizer slots (any mode, any shard count; the model must match); ignored, with a "
            "log line, when the model dir has a checkpoint of its own");
  f->Bool("reset_optimizer", &o->reset_optimizer,
          "with a warm start: copy the parameters only; the optimizer slots start fresh");
  f->Int("metrics_port", &o->metrics_port,
         "serve Prometheus metrics on http://<metrics_bind>:PORT/metrics (0 = off; `local` gives "
         "host i PORT + i)");
  f->String("metrics_bind", &o->metrics_bind,
            "address of the metrics endpoint (0.0.0.0 to let a Prometheus on another host scrape)");
  f->AddEpilogue(
      "environment:\n"
      "  OMP_NUM_THREADS=N  bounds threads.intra_op_threads (automatic or configured)\n"
      "  PSTRAIN_ISA=P      forces a lower ISA path for pstrain's kernels and oneDNN: avx2,\n"
      "                     avx512_core, avx512_core_bf16 (default: the best this CPU has;\n"
      "                     ONEDNN_MAX_CPU_ISA is honoured when PSTRAIN_ISA is unset)\n"
      "  OMP_WAIT_POLICY    PASSIVE unless set (pstrain re-executes itself to set it)\n"
      "threads.* = 0 divide the CPUs this process may use: its affinity mask (taskset, numactl,\n"
      "Kubernetes CPU pinning) capped by its cgroup CPU quota.");
}

namespace {

// The platform's defaults (TrainingFlags::default_*), where the config leaves the value unset.
void ApplyPlatformDefaults(const TrainingFlags& flags, Config* config) {
  if (!flags.default_model_dir.empty() && !config->train().has_model_dir()) {
    config->mutable_train()->set_model_dir(flags.default_model_dir);
  }
  if (!flags.default_checkpoint_dir.empty() && !config->checkpoint().has_dir()) {
    config->mutable_checkpoint()->set_dir(flags.default_checkpoint_dir);
  }
  if (flags.default_channels.empty()) return;
  auto fill = [&flags](Channel* c) {
    auto it = flags.default_channels.find(c->name());
    if (it == flags.default_channels.end() || c->path_size() > 0 || !c->pipe_dir().empty()) return;
    if (!it->second.pipe_dir.empty()) {
      c->set_pipe_dir(it->second.pipe_dir);
    } else {
      c->add_path(it->second.dir);
    }
    if (it->second.sharded && !c->has_shard_policy()) c->set_shard_policy(REPLICATED);
    if (it->second.gzip && !c->has_compression()) c->set_compression(Channel::GZIP);
  };
  auto* data = config->mutable_data();
  if (data->train_size() == 0 && flags.default_channels.count("train")) {
    data->add_train()->set_name("train");
  }
  if (data->eval_size() == 0) {
    for (const char* name : {"eval", "validation", "test"}) {
      if (flags.default_channels.count(name)) {
        data->add_eval()->set_name(name);
        break;
      }
    }
  }
  for (Channel& c : *data->mutable_train()) fill(&c);
  for (Channel& c : *data->mutable_eval()) fill(&c);
}

// --train / --eval paths replace the first channel's (made when there is none); --format applies
// to the channels given paths, or to every channel of the kind when none is.
void ApplyChannelFlags(const std::vector<std::string>& paths, DataFormat format,
                       google::protobuf::RepeatedPtrField<Channel>* chans, const char* name) {
  if (paths.empty()) {
    if (format != FORMAT_UNSPECIFIED) {
      for (auto& c : *chans) c.set_format(format);
    }
    return;
  }
  Channel* c = chans->empty() ? chans->Add() : chans->Mutable(0);
  if (!c->has_name()) c->set_name(name);
  c->clear_path();
  for (const auto& p : paths) c->add_path(p);
  if (format != FORMAT_UNSPECIFIED) c->set_format(format);
}

absl::StatusOr<TrainConfig::OnNewData> ParseOnNewData(const std::string& value) {
  static const std::pair<const char*, TrainConfig::OnNewData> kModes[] = {
      {"auto", TrainConfig::AUTO},
      {"continue", TrainConfig::CONTINUE},
      {"new_pass", TrainConfig::NEW_PASS}};
  const auto* mode = std::find_if(std::begin(kModes), std::end(kModes),
                                  [&](const auto& m) { return value == m.first; });
  if (mode == std::end(kModes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--on_new_data: expected auto, continue or new_pass, got '", value, "'"));
  }
  return mode->second;
}

}  // namespace

absl::StatusOr<Config> BuildConfig(const TrainingFlags& flags) {
  Config config;
  for (const std::string& path : flags.config) {
    ASSIGN_OR_RETURN(Config part, LoadConfigFile(path));
    config.MergeFrom(part);
  }
  ApplyConfigDefaults(&config);
  DataFormat format = FORMAT_UNSPECIFIED;
  if (!flags.format.empty()) {
    ASSIGN_OR_RETURN(format, ParseDataFormat(flags.format));
  }
  ApplyPlatformDefaults(flags, &config);
  ApplyChannelFlags(flags.train, format, config.mutable_data()->mutable_train(), "train");
  ApplyChannelFlags(flags.eval, format, config.mutable_data()->mutable_eval(), "eval");
  if (flags.train_only) config.mutable_data()->clear_eval();
  if (!flags.model_dir.empty()) config.mutable_train()->set_model_dir(flags.model_dir);
  if (flags.epochs > 0) config.mutable_train()->set_epochs(flags.epochs);
  if (!flags.on_new_data.empty()) {
    ASSIGN_OR_RETURN(TrainConfig::OnNewData mode, ParseOnNewData(flags.on_new_data));
    config.mutable_train()->set_on_new_data(mode);
  }
  if (!flags.warm_start_from.empty()) {
    config.mutable_train()->mutable_warm_start()->set_from(flags.warm_start_from);
  }
  if (flags.reset_optimizer) {
    config.mutable_train()->mutable_warm_start()->set_reset_optimizer(true);
  }
  for (const auto& s : flags.platform_sets) RETURN_IF_ERROR(ApplyOverride(s, &config));
  for (const auto& s : flags.set) RETURN_IF_ERROR(ApplyOverride(s, &config));
  RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

namespace {

// SageMaker's contract (cmd/sagemaker.h) as defaults of the training flags. Flags given on the
// command line keep precedence: hyperparameters fill --config/--format/--epochs only when the
// command line left them unset, and their --set values come before the command line's.
absl::Status ApplyPlatformContract(const char* command, const FlagSet* flags,
                                   TrainingFlags* tf) {
  ASSIGN_OR_RETURN(SageMakerContract sm, ReadSageMakerContract());
  if (!sm.active) return absl::OkStatus();
  if (std::string(command) == "train" && sm.hosts.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this SageMaker job has ", sm.hosts.size(), " hosts, and `pstrain train` trains on one: "
        "run `pstrain host` on every host (container entry point [\"pstrain\", \"host\", ...]; "
        "docs/DEPLOY.md)"));
  }
  tf->default_model_dir = sm.model_dir;
  if (sm.hosts.size() <= 1) tf->default_checkpoint_dir = sm.checkpoint_dir;
  for (const auto& [name, in] : sm.channels) {
    TrainingFlags::ChannelDefault d;
    d.dir = in.dir;
    if (in.pipe) d.pipe_dir = sm.data_dir;
    d.sharded = in.sharded;
    d.gzip = in.gzip;
    tf->default_channels[name] = d;
  }
  if (!flags->WasSet("config")) tf->config = sm.config_files;
  if (!flags->WasSet("format") && !sm.format.empty()) tf->format = sm.format;
  if (!flags->WasSet("epochs") && sm.epochs > 0) tf->epochs = sm.epochs;
  tf->platform_sets = sm.sets;
  PSTRAIN_LOG(INFO) << "SageMaker: model dir " << sm.model_dir
                    << (tf->default_checkpoint_dir.empty()
                            ? ""
                            : ", checkpoints " + tf->default_checkpoint_dir)
                    << ", " << sm.channels.size() << " channel(s), " << sm.sets.size()
                    << " hyperparameter override(s)";
  return absl::OkStatus();
}

}  // namespace

absl::Status StartMetricsEndpoint(const std::string& bind, int port) {
  static MetricsEndpoint* endpoint = nullptr;
  if (endpoint != nullptr || port == 0) return absl::OkStatus();
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port: expected a port in [1, 65535] (0 = off), got ", port));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<MetricsEndpoint> e,
                   MetricsEndpoint::Start(absl::StrCat(bind, ":", port)));
  endpoint = e.release();
  PSTRAIN_LOG(INFO) << "metrics on http://" << bind << ":" << endpoint->port() << "/metrics";
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ShardByRecordWhenTooFewFiles(Config* config,
                                                                       int readers) {
  std::vector<std::string> notes;
  if (readers <= 1) return notes;
  auto* chans = config->mutable_data()->mutable_train();
  for (int i = 0; i < chans->size(); ++i) {
    Channel* c = chans->Mutable(i);
    if (c->shard_policy() != SHARD_BY_FILE || !c->pipe_dir().empty()) continue;
    ASSIGN_OR_RETURN(std::vector<std::string> files,
                     ExpandPath(std::vector<std::string>(c->path().begin(), c->path().end())));
    if (static_cast<int>(files.size()) >= readers) continue;
    c->set_shard_policy(SHARD_BY_RECORD);
    notes.push_back(absl::StrCat(
        "train channel '", c->name(), "' has ", files.size(), " file", files.size() == 1 ? "" : "s",
        " for ", readers, " readers: sharding it by record instead of by file (each reader reads "
        "every file and keeps every ", readers, "th record; set data.train[", i,
        "].shard_policy to choose)"));
  }
  return notes;
}

std::vector<std::string> ForwardedArgs(int argc, char** argv, const std::vector<std::string>& own) {
  std::vector<std::string> out;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    bool skip = false;
    for (const std::string& name : own) {
      if (a == "--" + name) {
        skip = true;
        ++i;  // its value
      } else if (absl::StartsWith(a, "--" + name + "=")) {
        skip = true;
      }
    }
    if (!skip) out.push_back(a);
  }
  return out;
}

std::optional<int> ParseTrainingCommand(const char* command, int argc, char** argv,
                                        FlagSet* flags, const TrainingFlags& training,
                                        Config* config) {
  absl::Status s = flags->Parse(argc, argv, 2);
  if (s.ok() && flags->help_requested()) {
    std::printf("%s", flags->Usage().c_str());
    return 0;
  }
  TrainingFlags effective = training;
  if (s.ok()) s = ApplyPlatformContract(command, flags, &effective);
  if (s.ok()) {
    absl::StatusOr<Config> c = BuildConfig(effective);
    // Before any data is read: a precision this CPU (or the forced ISA path) cannot run.
    if (c.ok()) s = CheckPrecisionSupported(c->model().precision(), Launch().isa);
    // `local` hands each of its hosts a port of its own instead.
    if (c.ok() && s.ok() && training.metrics_port != 0 && std::string(command) != "local") {
      s = StartMetricsEndpoint(training.metrics_bind, training.metrics_port);
    }
    if (c.ok() && s.ok()) {
      *config = *std::move(c);
      return std::nullopt;
    }
    if (!c.ok()) s = c.status();
  }
  return CommandError(command, s.message(), 2);
}

}  // namespace pstrain
