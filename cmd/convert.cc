// `pstrain convert`: data from one format to another, split into files, optionally shuffled.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "common/config.h"
#include "common/flags.h"
#include "common/status.h"
#include "worker/data/record_io.h"
#include "worker/tools/convert.h"

namespace pstrain {
namespace {

struct ConvertFlags {
  std::string from, to, config, shuffle_seed;
  double target_mb = 100;
};

void AddConvertFlags(FlagSet* flags, ConvertFlags* f, ConvertOptions* options) {
  flags->List("input", &options->inputs, "input path (repeatable)");
  flags->String("from", &f->from, "input format: criteo_tsv|csv|libsvm|tfrecord|recordio");
  flags->String("to", &f->to, "output format: criteo_tsv|csv|libsvm|tfrecord|recordio");
  flags->String("out", &options->out_dir, "output directory");
  flags->Double("target_file_mb", &f->target_mb, "size of each output file in MB (10^6 bytes)");
  flags->String("shuffle_seed", &f->shuffle_seed,
                "shuffle the rows with this seed (unset: keep the order)");
  flags->String("config", &f->config,
                "config file whose `features` name the fields (default: the CRITEO preset)");
  flags->Double("max_bad_record_fraction", &options->max_bad_record_fraction,
                "bad records tolerated (skipped) as a fraction of those read; 0 = the first one "
                "fails with its file and line/record");
}

// Completes `options` from the flags; INVALID_ARGUMENT names what is wrong.
absl::Status ConvertOptionsFromFlags(const ConvertFlags& f, ConvertOptions* options) {
  if (options->inputs.empty() || f.from.empty() || f.to.empty() || options->out_dir.empty()) {
    return absl::InvalidArgumentError("--input, --from, --to and --out are required (see --help)");
  }
  ASSIGN_OR_RETURN(options->from, ParseDataFormat(f.from));
  ASSIGN_OR_RETURN(options->to, ParseDataFormat(f.to));
  if (!(f.target_mb > 0)) return absl::InvalidArgumentError("--target_file_mb must be > 0");
  options->target_file_bytes = static_cast<uint64_t>(std::max(1.0, f.target_mb * 1e6));
  options->shuffle = !f.shuffle_seed.empty();
  if (options->shuffle && !absl::SimpleAtoi(f.shuffle_seed, &options->shuffle_seed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shuffle_seed=", f.shuffle_seed, ": expected an unsigned integer"));
  }
  if (!f.config.empty()) {
    ASSIGN_OR_RETURN(Config loaded, LoadConfigFile(f.config));
    options->features = loaded.features();
  }
  return absl::OkStatus();
}

}  // namespace

int RunConvert(int argc, char** argv) {
  ConvertOptions options;
  ConvertFlags f;
  FlagSet flags("convert",
                "Reads every record of --input (files, directories, globs or .manifest files) in "
                "format --from and writes\nthem in format --to as DIR/part-NNNNN<ext> files of "
                "about --target_file_mb each. With --shuffle_seed the\nrows are shuffled "
                "uniformly (two passes through bucket files in DIR), like the ~100 MB shuffled\n"
                "TFRecord files of the usual Criteo preparation; without it their order is kept.");
  AddConvertFlags(&flags, &f, &options);
  if (std::optional<int> code = ParseCommandFlags("convert", flags, argc, argv)) return *code;
  if (absl::Status s = ConvertOptionsFromFlags(f, &options); !s.ok()) {
    return CommandError("convert", s.message(), 2);
  }
  Env* const env = Env::Default();
  const double start = env->MonotonicSeconds();
  auto result = Convert(options);
  if (!result.ok()) return CommandError("convert", result.status().ToString(), 1);
  const double secs =
      env->MonotonicSeconds() - start;
  std::printf("converted %lld rows (%s -> %s) into %zu file%s (%.1f MB) in %s in %.1f s",
              static_cast<long long>(result->rows), DataFormatName(options.from).c_str(),
              DataFormatName(options.to).c_str(), result->files.size(),
              result->files.size() == 1 ? "" : "s", result->bytes / 1e6, options.out_dir.c_str(),
              secs);
  if (options.shuffle) {
    std::printf("; shuffled with seed %llu through %d bucket%s",
                static_cast<unsigned long long>(options.shuffle_seed), result->buckets,
                result->buckets == 1 ? "" : "s");
  }
  if (result->bad_records > 0)
    std::printf("; %lld bad records skipped", static_cast<long long>(result->bad_records));
  std::printf("\n");
  return 0;
}

}  // namespace pstrain
