// The three factories of worker/data/record_io.h: one switch per seam over the five formats.
#include "worker/data/formats/registry.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/formats/criteo_tsv.h"
#include "worker/data/formats/csv.h"
#include "worker/data/formats/libsvm.h"
#include "worker/data/formats/line_source.h"
#include "worker/data/formats/recordio.h"
#include "worker/data/formats/tfrecord.h"

namespace pstrain {
namespace {

absl::Status UnknownFormat(DataFormat format) {
  return absl::InvalidArgumentError(
      absl::StrCat("data format ", static_cast<int>(format),
                   " is not set or unknown: expected criteo_tsv, csv, libsvm, tfrecord or recordio"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RecordSource>> OpenRecordSource(DataFormat format,
                                                               const std::string& path,
                                                               const RecordSourceOptions& options) {
  switch (format) {
    case CRITEO_TSV:
    case CSV:
    case LIBSVM:
      return LineSource::Open(format, path, options.read_chunk, options.compression,
                              options.max_record_bytes);
    case TFRECORD:
      return OpenTFRecordSource(path, options.read_chunk, options.compression,
                                options.max_record_bytes);
    case RECORDIO:
      return OpenRecordIOSource(path, options.read_chunk, options.compression,
                                options.max_record_bytes);
    default: return UnknownFormat(format);
  }
}

absl::StatusOr<std::unique_ptr<RecordSource>> OpenRecordSource(DataFormat format,
                                                               const std::string& path,
                                                               Channel::Compression compression) {
  RecordSourceOptions options;
  options.compression = compression;
  return OpenRecordSource(format, path, options);
}

absl::StatusOr<std::unique_ptr<RecordParser>> CreateRecordParser(DataFormat format,
                                                                 const FeatureSpec& spec,
                                                                 absl::string_view csv_header) {
  // Lists: CSV, LibSVM, TFRecord and RecordIO read them; Criteo TSV (the CRITEO preset's
  // columns) refuses a spec with list fields rather than read one id of each (docs/FORMATS.md
  // "Lists").
  if (format == CRITEO_TSV) {
    RETURN_IF_ERROR(spec.RefuseLists(absl::StrCat(DataFormat_Name(format), " readers")));
  }
  switch (format) {
    case CRITEO_TSV: return NewCriteoTsvParser(spec);
    case CSV: return NewCsvParser(spec, csv_header);
    case LIBSVM: return NewLibSvmParser(spec);
    case TFRECORD: return NewTFRecordParser(spec);
    case RECORDIO: return NewRecordIOParser(spec);
    default: return UnknownFormat(format);
  }
}

absl::StatusOr<std::unique_ptr<RecordWriter>> CreateRecordWriter(DataFormat format,
                                                                 const FeatureSpec& spec,
                                                                 const std::string& path) {
  // Every writer but Criteo TSV's writes lists.
  if (format == CRITEO_TSV) {
    RETURN_IF_ERROR(spec.RefuseLists(absl::StrCat(DataFormat_Name(format), " writers")));
  }
  switch (format) {
    case CRITEO_TSV: return NewCriteoTsvWriter(spec, path);
    case CSV: return NewCsvWriter(spec, path);
    case LIBSVM: return NewLibSvmWriter(spec, path);
    case TFRECORD: return NewTFRecordWriter(spec, path);
    case RECORDIO: return NewRecordIOWriter(spec, path);
    default: return UnknownFormat(format);
  }
}

}  // namespace pstrain
