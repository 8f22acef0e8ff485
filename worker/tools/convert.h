// `pstrain convert`: reads every record of some inputs in one format and writes them in another,
// split into files of about a target size, optionally shuffled the way the seeds' data
// preparation does it (about 100 MB shuffled TFRecord files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"

namespace pstrain {

struct ConvertOptions {
  std::vector<std::string> inputs;  // files, directories, globs or manifests (ExpandPath)
  DataFormat from = CRITEO_TSV;
  DataFormat to = TFRECORD;
  std::string out_dir;  // created if missing; gets part-00000<ext>, part-00001<ext>, ...
  // A part file is closed once it reaches this size (so parts are this size plus at most a few
  // rows, except the last one).
  uint64_t target_file_bytes = uint64_t{100} << 20;
  // Shuffle the rows (two passes, below); otherwise the input order is kept.
  bool shuffle = false;
  uint64_t shuffle_seed = 1;
  // The fields (the CRITEO preset by default): the CSV columns, Example keys, RecordIO keys.
  FeatureConfig features;
  // As in training (DataConfig.max_bad_record_fraction): with 0 the first bad record fails the
  // conversion with its file, line or record number and what was expected; otherwise bad records
  // are skipped and counted, and the conversion fails once they exceed this fraction of the
  // records read (checked after every batch once 1000 records were read, and at the end).
  double max_bad_record_fraction = 0.0;
};

struct ConvertResult {
  int64_t rows = 0;         // rows written
  int64_t bad_records = 0;  // skipped (only with max_bad_record_fraction > 0)
  std::vector<std::string> files;
  uint64_t bytes = 0;
  int buckets = 0;  // shuffle buckets used (0 without shuffle)
};

// The shuffle is a scalable two-pass shuffle, exact and deterministic for (inputs, seed):
//   pass 1 streams the rows and appends each to one of K bucket files (out_dir/.shuffle-NNNNN.tmp:
//          CRC-framed blocks of raw RawRows, lossless and cheap) chosen uniformly at random;
//          K = ceil(input bytes / target) (at most 512), so a bucket is about one part file's
//          rows and fits in memory;
//   pass 2 loads the buckets in order, shuffles each in memory (Fisher-Yates) and streams them
//          into the part files, deleting each bucket once read.
// Assigning rows to buckets uniformly and shuffling each bucket uniformly gives a uniformly
// random permutation of all rows. Memory: one bucket's RawRows (~670 bytes per Criteo row) twice,
// plus ~340 KB per bucket in pass 1 (a block of staged rows and its encoding). Rows the output
// format cannot represent fail in pass 2.
absl::StatusOr<ConvertResult> Convert(const ConvertOptions& options);

}  // namespace pstrain
