// The binding of the pipeline's format seams to the format registry (record_io.h). It lives apart
// from pipeline.cc so that only callers of RegisteredFormats() (directly, or through
// OptionsFromConfig's default argument) link the formats; the pipeline's tests and bench inject
// their own.
#include "worker/data/pipeline.h"

namespace pstrain {

RecordFormats RegisteredFormats() {
  RecordFormats f;
  f.open_source = [](DataFormat format, const std::string& path, Channel::Compression c) {
    return OpenRecordSource(format, path, c);
  };
  f.make_parser = [](DataFormat format, const FeatureSpec& spec, absl::string_view header) {
    return CreateRecordParser(format, spec, header);
  };
  return f;
}

}  // namespace pstrain
