// libFuzzer target: the serving export's MODEL reader (serving/export.h ReadExport), as `pstrain
// serve`, `predict --model` and `export --from` read it: the block framing, the MODL header (a
// pstrain.ExportHeader whose model description rebuilds the network: serving/serving_model.h
// ServingModel::Create), the XDNS dense block and the XROW row blocks in every encoding; then, when
// the file reads, a Gather of some stored and unstored rows. The input is the whole MODEL file of
// one version directory, and also the first version of a base directory (ReadNewestExport, which
// lists the versions). Seed corpus: fuzz/corpus/export_model/ (exports written by `pstrain
// export` in each row encoding).
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "serving/export.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  static const std::string base = fuzz::ScratchDir("export");
  static const std::string version = base + "/1";
  static const bool made = MakeDirs(version).ok();
  if (!made) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  if (!fuzz::WriteFile(version + "/" + kExportFileName, bytes)) return 0;
  auto model = ReadExport(version);
  if (model.ok()) {
    // Stored rows and never-trained ones (Model::InitRow), as a scorer gathers them.
    const ServingModel& m = **model;
    std::vector<int64_t> ids = {0, m.table_rows() - 1, m.table_rows() / 2};
    std::vector<float> rows(ids.size() * m.row_dim());
    (void)m.Gather(ids, rows.data());
  }
  // The same file as the only version of a base directory.
  (void)ReadNewestExport(base, -1);
  return 0;
}
