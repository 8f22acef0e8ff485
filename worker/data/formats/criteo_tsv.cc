#include "worker/data/formats/criteo_tsv.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/formats/util.h"

namespace pstrain {
namespace {

inline const char* FindTab(const char* p, const char* end) {
  const void* t = std::memchr(p, '\t', static_cast<size_t>(end - p));
  return t ? static_cast<const char*>(t) : end;
}

class CriteoTsvParser : public RowParser {
 public:
  explicit CriteoTsvParser(const FeatureSpec& spec) : RowParser(spec) {
    for (const auto& f : spec.fields()) categorical_.push_back(f.kind == CATEGORICAL);
  }

 private:
  absl::Status ParseOne(const RecordRef& rec, RawRows* rows) override {
    const char* p = rec.data.data();
    const char* const end = p + rec.data.size();
    const char* tab = FindTab(p, end);
    float label;
    if (!ParseLabel(p, tab, &label)) {
      return BadRecord(rec, CRITEO_TSV,
                       absl::StrCat("column 1: bad label ", Quote(absl::string_view(p, tab - p)),
                                    ": expected 0, 1 or a number in [0, 1]"));
    }
    const int nf = spec_.num_fields();
    const size_t base = static_cast<size_t>(rows->AddRow(label)) * nf;
    uint8_t* present = rows->present.data() + base;
    uint64_t* key = rows->key.data() + base;
    double* value = rows->value.data() + base;
    // Splitting and parsing are fused: each column is scanned once, and only text off the fast
    // paths (floats, bad values) goes through FindTab and the general parsers.
    for (int f = 0; tab != end; ++f) {
      if (f == nf) {
        rows->PopRow();
        size_t columns = 1;
        for (const char* q = rec.data.data(); q < end; ++q) columns += *q == '\t';
        return BadRecord(rec, CRITEO_TSV,
                         absl::StrCat("too many columns: found ", columns, ", expected at most ",
                                      nf + 1, " (the label and ", nf, " fields)"));
      }
      p = tab + 1;
      const char* q = p;
      if (categorical_[f]) {
        uint64_t k = 0;
        for (int d; q < end && (d = HexDigit(*q)) >= 0; ++q) k = (k << 4) | static_cast<uint64_t>(d);
        tab = q;
        if ((q < end && *q != '\t') || q - p > 16) {
          rows->PopRow();
          return BadRecord(rec, CRITEO_TSV,
                           absl::StrCat("column ", f + 2, " (", spec_.field(f).name, "): bad hex ",
                                        Quote(absl::string_view(p, FindTab(q, end) - p)),
                                        ": expected 1..16 hex digits or empty"));
        }
        if (q == p) continue;  // empty: missing
        key[f] = k;
        value[f] = 1.0;
      } else {
        // Fast path: a short decimal integer.
        const bool neg = q < end && *q == '-';
        q += neg;
        const char* const digits = q;
        uint64_t acc = 0;
        for (; q < end && static_cast<unsigned>(*q - '0') < 10; ++q) acc = acc * 10 + (*q - '0');
        if ((q == end || *q == '\t') && q > digits && q - digits <= 18) {
          value[f] = neg ? -static_cast<double>(acc) : static_cast<double>(acc);
          tab = q;
        } else {
          tab = FindTab(p, end);
          if (tab == p) continue;  // empty: missing
          if (!ParseNumber(p, tab, &value[f])) {
            rows->PopRow();
            return BadRecord(rec, CRITEO_TSV,
                             absl::StrCat("column ", f + 2, " (", spec_.field(f).name,
                                          "): bad number ", Quote(absl::string_view(p, tab - p)),
                                          ": expected an integer, a decimal number or empty"));
          }
        }
      }
      present[f] = 1;
    }
    return absl::OkStatus();
  }

  std::vector<bool> categorical_;
};

}  // namespace

std::unique_ptr<RecordParser> NewCriteoTsvParser(const FeatureSpec& spec) {
  return std::make_unique<CriteoTsvParser>(spec);
}

absl::StatusOr<std::unique_ptr<RecordWriter>> NewCriteoTsvWriter(const FeatureSpec& spec,
                                                                 const std::string& path) {
  ASSIGN_OR_RETURN(auto out, BufferedWriter::Create(path));
  return std::unique_ptr<RecordWriter>(
      new DelimitedTextWriter(CRITEO_TSV, spec, std::move(out), '\t', /*header=*/""));
}

}  // namespace pstrain
