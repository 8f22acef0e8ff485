// The serving export (`pstrain export`, read by `pstrain serve` and python/pstrain_checkpoint.py):
// the trained rows only, as an id -> row map, the dense vector and the model description, in one
// block file (checkpoint/block_file.h: magic, version, a masked CRC32C per block, an end block).
// docs/SERVING.md is the specification; in short:
//
//   <base>/<version>/MODEL    block file:
//     MODL  a serialized pstrain.ExportHeader (format_version 1, or 2 when the config names
//           tables, or 3 when it has dynamic tables; the ModelDescription, the row encoding,
//           table_rows, row_dim, rows, dense_size, the dense tensors, the source checkpoint and
//           step, created_by, wall_time, dynamic_rows)
//     XDNS  the dense vector: dense_size float32
//     XROW  the rows, in blocks of at most 65536, ids ascending across blocks, a block's rows all
//           of one table (version 2; version 1 has one table):
//           uint32 n | uint32 encoding | int64 ids[n] | the n rows in the encoding, each of
//           W = its table's width floats (1 + the table's dim; row_dim without named tables):
//             0 float32:  float32[n][W]
//             1 bfloat16: uint16[n][W] (the float's upper half, rounded to nearest even)
//             2 int8:     per row: float32 w | float32 scale | int8 q[W - 1], with the
//                         embedding v_j = q_j * scale (scale = max |v_j| / 127; w kept exact)
//     XDYN  (version 3) a dynamic table's live rows, in blocks of at most 65536, (table, key)
//           ascending across blocks: uint32 n | uint32 encoding | uint32 table (its dynamic
//           index) | uint32 reserved (0) | uint64 keys[n] | the n rows in the encoding, each of
//           1 + the table's dim floats. A key not exported reads as training reads a key
//           without a row (ServingModel).
//
// Versions, as TensorFlow Serving lays them out: <base> holds one directory per version (a
// decimal number: the checkpoint's step unless given), and a server serves the newest one. A
// version is staged in <base>/.tmp-<version>.<pid>/ and renamed into place whole, so a reader (or
// a watching server) never sees a partial one; an existing version is never overwritten.
//
// Rows that are not stored read as their initial value, the rule the description records (the
// ServingModel does it: Model::InitRow(row, init_seed), a named table's initializer). Quantized
// rows are decoded to float32 when read: the encoding shrinks the file, not the server's memory.
//
// Thread-safety: the functions are thread-compatible (they share nothing).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "common/env.h"
#include "serving/serving_model.h"

namespace pstrain {

constexpr char kExportFileName[] = "MODEL";
constexpr char kExportHeaderTag[] = "MODL";
constexpr char kExportDenseTag[] = "XDNS";
constexpr char kExportRowsTag[] = "XROW";
constexpr char kExportDynamicTag[] = "XDYN";
// The newest format this pstrain reads and writes (3: dynamic tables); an export without them is
// written as before: version 2 with named tables, version 1 without.
constexpr int kExportFormatVersion = 3;
constexpr int kExportRowsPerBlock = 65536;

enum class RowEncoding : int { kFloat32 = 0, kBfloat16 = 1, kInt8 = 2 };

// "f32", "bf16", "int8" (as --rows spells them); INVALID_ARGUMENT otherwise.
absl::StatusOr<RowEncoding> ParseRowEncoding(absl::string_view name);
const char* RowEncodingName(RowEncoding encoding);
// Bytes one row takes in an XROW block (its id excluded).
int64_t EncodedRowBytes(RowEncoding encoding, int row_dim);

// Encodes / decodes `n` rows of row_dim floats (the XROW row bytes; docs/SERVING.md). Decode
// reads exactly EncodedRowBytes(encoding, row_dim) * n bytes.
void EncodeRows(RowEncoding encoding, int row_dim, int64_t n, const float* rows, std::string* out);
void DecodeRows(RowEncoding encoding, int row_dim, int64_t n, const char* data, float* rows);

struct ExportOptions {
  RowEncoding encoding = RowEncoding::kFloat32;
  int64_t version = -1;  // < 0: the model's training step
  std::string created_by = "pstrain export";
  Env* env = Env::Default();  // the clock of the header's wall_time
};

struct ExportInfo {
  std::string dir;       // <base>/<version>
  int64_t version = 0;
  int64_t rows = 0;      // rows stored
  uint64_t bytes = 0;    // size of MODEL
};

// Writes `model` as <base>/<version>/MODEL (staged, then renamed into place). ALREADY_EXISTS when
// that version exists. Memory: one block of rows at a time besides the model.
absl::StatusOr<ExportInfo> WriteExport(const ServingModel& model, const std::string& base,
                                       const ExportOptions& options);

struct ReadExportOptions {
  // Checked before every block: once it is notified, the read stops with CANCELLED (a server
  // that stops while it loads a version). May be null.
  const absl::Notification* cancel = nullptr;
};

// Reads the export in the version directory `dir` (<dir>/MODEL), verifying every checksum, the
// format version, the header against the blocks (row and dense counts, encodings, ids ascending
// and inside the table). MODEL must be a regular file (or a symlink to one: the export directory
// is trusted, docs/SERVING.md "Security"); a FIFO, a device or a directory is refused before a
// byte is read (common/file.h OpenRegularFile: FAILED_PRECONDITION naming it), so that no reader
// blocks on it. DATA_LOSS naming the file, block and offset for a damaged file;
// FAILED_PRECONDITION for a newer format version.
absl::StatusOr<std::unique_ptr<ServingModel>> ReadExport(const std::string& dir,
                                                         const ReadExportOptions& options = {});

// The versions under `base`: subdirectories named by a decimal number (no sign, no leading zero)
// that hold a MODEL file; newest (largest) first. Empty when there is none or base is missing.
std::vector<int64_t> ListExportVersions(const std::string& base);

// The version directory a reader of `path` should use: `path` itself when it holds MODEL, else its
// newest version. NOT_FOUND naming path when there is neither (`env` tells a missing path from a
// directory without an export in the message).
absl::StatusOr<std::string> ResolveExportDir(const std::string& path, Env* env = Env::Default());

// How a reader of a base directory reads one version (ReadExport, or a test's fake).
using ExportReader = std::function<absl::StatusOr<std::unique_ptr<ServingModel>>(
    const std::string& dir, const ReadExportOptions& options)>;

// The newest version under `base` newer than `newer_than` that reads: the versions
// (ListExportVersions) are tried newest first with `read` (empty: ReadExport), and one that does
// not read (damaged, of a newer format, a MODEL that is a FIFO or a device) is skipped with an
// ERROR log line naming its directory and why. Null when `base` holds no version newer than
// `newer_than`. When every such version fails: the newest one's error, its message naming each
// version tried and why it failed. CANCELLED at once when options.cancel is notified.
absl::StatusOr<std::unique_ptr<ServingModel>> ReadNewestExport(
    const std::string& base, int64_t newer_than, const ReadExportOptions& options = {},
    const ExportReader& read = nullptr);

// What a reader of `path` serves: the export in `path` itself when it holds MODEL (ReadExport);
// else the newest version of the base directory `path` that reads (ReadNewestExport, skipping
// the versions that do not). NOT_FOUND as ResolveExportDir when there is no export at all.
absl::StatusOr<std::unique_ptr<ServingModel>> ReadExportAt(const std::string& path,
                                                           const ReadExportOptions& options = {},
                                                           Env* env = Env::Default());

}  // namespace pstrain
