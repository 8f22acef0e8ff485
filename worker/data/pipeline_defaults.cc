// The binding of the pipeline's format seams to the format registry (record_io.h). It lives apart
// from pipeline.cc so that only callers of RegisteredFormats() (directly, or through
// OptionsFromConfig's default argument) link the formats; the pipeline's tests and bench inject
// their own.
#include "worker/data/pipeline.h"

#include "worker/data/formats/registry.h"

namespace pstrain {

RecordFormats RegisteredFormats(size_t max_record_bytes) {
  RecordFormats f;
  f.open_source = [max_record_bytes](DataFormat format, const std::string& path,
                                     Channel::Compression c) {
    RecordSourceOptions o;
    o.compression = c;
    o.max_record_bytes = max_record_bytes;
    return OpenRecordSource(format, path, o);
  };
  f.make_parser = [](DataFormat format, const FeatureSpec& spec, absl::string_view header) {
    return CreateRecordParser(format, spec, header);
  };
  return f;
}

}  // namespace pstrain
