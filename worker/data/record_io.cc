#include "worker/data/record_io.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

std::string DescribeRecord(const RecordRef& rec, DataFormat format) {
  const std::string& file = rec.file ? *rec.file : std::string("<unknown>");
  const bool text = format == CRITEO_TSV || format == CSV || format == LIBSVM;
  return absl::StrCat(file, text ? ":line " : ": record ", rec.number);
}

absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "criteo_tsv" || n == "tsv" || n == "criteo") return CRITEO_TSV;
  if (n == "csv") return CSV;
  if (n == "libsvm") return LIBSVM;
  if (n == "tfrecord" || n == "tfrecords") return TFRECORD;
  if (n == "recordio" || n == "recordio-protobuf" || n == "recordio_protobuf") return RECORDIO;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown data format '", name, "': expected criteo_tsv, csv, libsvm, tfrecord or recordio"));
}

std::string DataFormatName(DataFormat format) {
  switch (format) {
    case CRITEO_TSV: return "criteo_tsv";
    case CSV: return "csv";
    case LIBSVM: return "libsvm";
    case TFRECORD: return "tfrecord";
    case RECORDIO: return "recordio";
    default: return "unspecified";
  }
}

std::string DataFormatExtension(DataFormat format) {
  switch (format) {
    case CRITEO_TSV: return ".tsv";
    case CSV: return ".csv";
    case LIBSVM: return ".libsvm";
    case TFRECORD: return ".tfrecords";
    case RECORDIO: return ".rec";
    default: return ".dat";
  }
}

}  // namespace pstrain
