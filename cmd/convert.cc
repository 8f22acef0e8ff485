// `pstrain convert`: data from one format to another, split into files, optionally shuffled.
#include <chrono>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "cmd/commands.h"
#include "common/config.h"
#include "common/flags.h"
#include "worker/data/record_io.h"
#include "worker/tools/convert.h"

namespace pstrain {

int RunConvert(int argc, char** argv) {
  ConvertOptions options;
  std::string from, to, config, shuffle_seed;
  double target_mb = 100;
  FlagSet flags("convert",
                "Reads every record of --input (files, directories, globs or .manifest files) in "
                "format --from and writes\nthem in format --to as DIR/part-NNNNN<ext> files of "
                "about --target_file_mb each. With --shuffle_seed the\nrows are shuffled "
                "uniformly (two passes through bucket files in DIR), like the ~100 MB shuffled\n"
                "TFRecord files of the usual Criteo preparation; without it their order is kept.");
  flags.List("input", &options.inputs, "input path (repeatable)");
  flags.String("from", &from, "input format: criteo_tsv|csv|libsvm|tfrecord|recordio");
  flags.String("to", &to, "output format: criteo_tsv|csv|libsvm|tfrecord|recordio");
  flags.String("out", &options.out_dir, "output directory");
  flags.Double("target_file_mb", &target_mb, "size of each output file in MB (10^6 bytes)");
  flags.String("shuffle_seed", &shuffle_seed,
               "shuffle the rows with this seed (unset: keep the order)");
  flags.String("config", &config,
               "config file whose `features` name the fields (default: the CRITEO preset)");
  flags.Double("max_bad_record_fraction", &options.max_bad_record_fraction,
               "bad records tolerated (skipped) as a fraction of those read; 0 = the first one "
               "fails with its file and line/record");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "pstrain convert: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  if (options.inputs.empty() || from.empty() || to.empty() || options.out_dir.empty()) {
    std::fprintf(stderr,
                 "pstrain convert: --input, --from, --to and --out are required (see --help)\n");
    return 2;
  }
  auto from_format = ParseDataFormat(from);
  auto to_format = ParseDataFormat(to);
  for (const auto* f : {&from_format, &to_format}) {
    if (!f->ok()) {
      std::fprintf(stderr, "pstrain convert: %s\n", std::string(f->status().message()).c_str());
      return 2;
    }
  }
  options.from = *from_format;
  options.to = *to_format;
  if (!(target_mb > 0)) {
    std::fprintf(stderr, "pstrain convert: --target_file_mb must be > 0\n");
    return 2;
  }
  options.target_file_bytes = static_cast<uint64_t>(std::max(1.0, target_mb * 1e6));
  options.shuffle = !shuffle_seed.empty();
  if (options.shuffle && !absl::SimpleAtoi(shuffle_seed, &options.shuffle_seed)) {
    std::fprintf(stderr, "pstrain convert: --shuffle_seed=%s: expected an unsigned integer\n",
                 shuffle_seed.c_str());
    return 2;
  }
  if (!config.empty()) {
    auto loaded = LoadConfigFile(config);
    if (!loaded.ok()) {
      std::fprintf(stderr, "pstrain convert: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    options.features = loaded->features();
  }
  const auto start = std::chrono::steady_clock::now();
  auto result = Convert(options);
  if (!result.ok()) {
    std::fprintf(stderr, "pstrain convert: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
