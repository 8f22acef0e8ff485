#include "worker/data/formats/recordio.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "aialgs/record.pb.h"
#include "common/logging.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "common/record_frame.h"
#include "common/status.h"
#include "worker/data/formats/buffered_io.h"
#include "worker/data/formats/util.h"

namespace pstrain {
namespace {

constexpr size_t kPartHeader = 8;
inline uint32_t Padded(uint32_t len) { return (len + 3u) & ~3u; }

void AppendPart(uint32_t cflag, absl::string_view data, std::string* out) {
  char header[kPartHeader];
  EncodeFixed32(header, kRecordIOMagic);
  EncodeFixed32(header + 4, (cflag << 29) | static_cast<uint32_t>(data.size()));
  out->append(header, kPartHeader);
  out->append(data.data(), data.size());
}

class RecordIOSource : public RecordSource {
 public:
  RecordIOSource(std::unique_ptr<BufferedReader> reader, uint64_t max_record_bytes)
      : reader_(std::move(reader)), max_record_bytes_(max_record_bytes) {}

  absl::Status Next(RecordRef* rec, bool* eof) override {
    *eof = false;
    if (!fatal_.ok()) return fatal_;
    const uint64_t start = reader_->offset();
    joined_.clear();
    for (int part = 0;; ++part) {
      const uint64_t at = reader_->offset();
      bool complete = false;
      RETURN_IF_ERROR(reader_->Ensure(kPartHeader, &complete));
      if (!complete) {
        if (part == 0 && reader_->available() == 0) {
          *eof = true;
          return absl::OkStatus();
        }
        return Fatal(start, absl::StrCat("truncated at offset ", at, ": expected an ", kPartHeader,
                                         "-byte part header", part > 0 ? " (the record is split "
                                                                         "and not finished)" : "",
                                         ", file ends after ", reader_->available(), " bytes"));
      }
      const uint32_t magic = DecodeFixed32(reader_->data());
      if (magic != kRecordIOMagic) {
        return Fatal(start, absl::StrFormat("bad magic 0x%08x at offset %d, expected 0x%08x "
                                            "(not a RecordIO file, or damaged)",
                                            magic, at, kRecordIOMagic));
      }
      const uint32_t lrec = DecodeFixed32(reader_->data() + 4);
      const uint32_t cflag = lrec >> 29;
      const uint32_t len = lrec & kRecordIOMaxPart;
      const bool ok_flag = part == 0 ? (cflag == 0 || cflag == 1) : (cflag == 2 || cflag == 3);
      if (!ok_flag) {
        return Fatal(start, absl::StrCat("part ", part + 1, " at offset ", at,
                                         " has continuation flag ", cflag, ", expected ",
                                         part == 0 ? "0 (whole) or 1 (start)"
                                                   : "2 (middle) or 3 (end)"));
      }
      // Reassembly is bounded: the parts so far plus this one (plus the magic put back between
      // parts) must fit the limit, checked before the part is read.
      if (joined_.size() + len + (part > 0 ? 4 : 0) > max_record_bytes_) {
        return Fatal(start, absl::StrCat("the record", part > 0 ? " reassembled from its parts" : "",
                                         " exceeds the limit of ", max_record_bytes_,
                                         " bytes (data.max_record_bytes) at part ", part + 1,
                                         " (offset ", at, ", ", len, " bytes)"));
      }
      const uint64_t frame = kPartHeader + Padded(len);
      if (reader_->size_known() && reader_->file_size() - at < frame) {
        return Truncated(start, at, len, reader_->file_size() - at - kPartHeader);
      }
      RETURN_IF_ERROR(reader_->Ensure(frame, &complete));
      if (!complete) return Truncated(start, at, len, reader_->available() - kPartHeader);
      const absl::string_view data(reader_->data() + kPartHeader, len);
      reader_->Consume(frame);
      if (cflag == 0) {
        rec->data = data;
        break;
      }
      joined_.append(data.data(), data.size());
      if (cflag == 3) {
        rec->data = joined_;
        break;
      }
      // The writer cut the payload at a magic number and dropped it: put it back.
      char m[4];
      EncodeFixed32(m, kRecordIOMagic);
      joined_.append(m, 4);
    }
    rec->file = &reader_->path();
    rec->number = ++records_;
    return absl::OkStatus();
  }

  uint64_t offset() const override { return reader_->offset(); }
  uint64_t records() const override { return records_; }
  absl::Status Seek(uint64_t offset, uint64_t records) override {
    if (offset % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path(), ": cannot seek to offset ", offset, ": RecordIO records start at multiples of 4"));
    }
    RETURN_IF_ERROR(reader_->Seek(offset));
    records_ = records;
    fatal_ = absl::OkStatus();
    return absl::OkStatus();
  }
  const std::string& path() const override { return reader_->path(); }

 private:
  absl::Status Fatal(uint64_t start, absl::string_view what) {
    fatal_ = absl::InvalidArgumentError(
        absl::StrCat(reader_->path(), ": record ", records_ + 1, " at offset ", start, ": ", what));
    return fatal_;
  }
  absl::Status Truncated(uint64_t start, uint64_t at, uint32_t len, uint64_t have) {
    return Fatal(start, absl::StrCat("truncated: the part at offset ", at, " expects ", len,
                                     " bytes of data (", Padded(len), " with padding), file ends "
                                     "after ", have));
  }

  std::unique_ptr<BufferedReader> reader_;
  const uint64_t max_record_bytes_;
  uint64_t records_ = 0;
  std::string joined_;  // a split record, reassembled (at most max_record_bytes_)
  absl::Status fatal_;
};

class RecordIOParser : public RowParser {
 public:
  explicit RecordIOParser(const FeatureSpec& spec)
      : RowParser(spec), values_is_field_(spec.FieldIndex("values") >= 0) {
    for (int f = 0; f < spec.num_fields(); ++f) index_[spec.field(f).name] = f;
  }

 private:
  using Value = aialgs::data::Value;

  absl::Status ParseOne(const RecordRef& rec, RawRows* rows) override {
    auto* record = arena_.Fresh<aialgs::data::Record>();
    if (!record->ParseFromArray(rec.data.data(), static_cast<int>(rec.data.size()))) {
      return absl::DataLossError(absl::StrCat(DescribeRecord(rec, RECORDIO), ": ",
                                              rec.data.size(),
                                              " bytes are not a valid aialgs.data.Record"));
    }
    const int row = rows->AddRow(0.0f);
    absl::Status s = Fill(rec, *record, row, rows);
    if (!s.ok()) rows->PopRow();
    return s;
  }

  absl::Status Fill(const RecordRef& rec, const aialgs::data::Record& record, int row,
                    RawRows* rows) const {
    const size_t base = static_cast<size_t>(row) * spec_.num_fields();
    // Label.
    auto label_it = record.label().find("values");
    if (label_it == record.label().end()) label_it = record.label().find(spec_.label_name());
    if (label_it == record.label().end()) {
      return BadRecord(rec, RECORDIO, absl::StrCat("no label: expected label[\"values\"] or label[\"",
                                                   spec_.label_name(), "\"]"));
    }
    double label = 0;
    int n = 0;
    RETURN_IF_ERROR(Visit(rec, "label", label_it->second, [&](const auto& t) {
      n = t.values_size();
      if (n == 1) label = static_cast<double>(t.values(0));
      return absl::OkStatus();
    }));
    if (n != 1 || !(label >= 0.0 && label <= 1.0)) {
      return BadRecord(rec, RECORDIO, absl::StrCat("label: expected one value in [0, 1], found ",
                                                   n == 1 ? absl::StrCat(label)
                                                          : absl::StrCat(n, " values")));
    }
    rows->labels[row] = static_cast<float>(label);

    // Features: one "values" tensor, or one tensor per field name. A list field is always its
    // own tensor, in SageMaker's sparse form: keys = its ids, values = their weights.
    const auto& features = record.features();
    const auto values_it = values_is_field_ ? features.end() : features.find("values");
    if (values_it != features.end()) {
      RETURN_IF_ERROR(Visit(rec, "features[\"values\"]", values_it->second,
                            [&](const auto& t) { return FillRow(rec, t, base, rows); }));
    }
    for (const auto& entry : features) {
      // Not a structured binding: C++17 lambdas cannot capture one (clang refuses it).
      const std::string& name = entry.first;
      const auto& value = entry.second;
      const auto it = index_.find(name);
      if (it == index_.end()) continue;
      const int f = it->second;
      if (spec_.field(f).list) {
        RETURN_IF_ERROR(Visit(rec, name, value, [&](const auto& t) {
          return FillList(rec, name, t, f, row, rows);
        }));
        continue;
      }
      if (values_it != features.end()) continue;  // the "values" tensor holds the others
      RETURN_IF_ERROR(Visit(rec, name, value, [&](const auto& t) {
        if (t.values_size() > 1) {
          return BadRecord(rec, RECORDIO, absl::StrCat("features[\"", name, "\"] has ",
                                                       t.values_size(), " values, expected 1"));
        }
        if (t.values_size() == 0) return absl::OkStatus();  // missing
        return SetField(rec, f, static_cast<double>(t.values(0)), base, rows);
      }));
    }
    return absl::OkStatus();
  }

  // Calls fn with the tensor inside `value`, whichever of the three numeric types it is.
  template <class Fn>
  static absl::Status Visit(const RecordRef& rec, absl::string_view what, const Value& value,
                            Fn&& fn) {
    switch (value.value_case()) {
      case Value::kFloat32Tensor: return fn(value.float32_tensor());
      case Value::kFloat64Tensor: return fn(value.float64_tensor());
      case Value::kInt32Tensor: return fn(value.int32_tensor());
      default:
        return BadRecord(rec, RECORDIO, absl::StrCat(what, ": expected a Float32Tensor, "
                                                     "Float64Tensor or Int32Tensor"));
    }
  }

  template <class Tensor>
  absl::Status FillRow(const RecordRef& rec, const Tensor& t, size_t base, RawRows* rows) const {
    const int nf = spec_.num_fields();
    if (t.keys_size() == 0 && t.values_size() > 0) {  // dense
      if (t.values_size() != nf) {
        return BadRecord(rec, RECORDIO, absl::StrCat("features[\"values\"] is dense with ",
                                                     t.values_size(), " values, expected ", nf,
                                                     " (one per field)"));
      }
      for (int f = 0; f < nf; ++f) {
        const double v = static_cast<double>(t.values(f));
        if (std::isnan(v)) continue;  // missing
        RETURN_IF_ERROR(SetField(rec, f, v, base, rows));
      }
      return absl::OkStatus();
    }
    if (t.keys_size() != t.values_size()) {
      return BadRecord(rec, RECORDIO, absl::StrCat("features[\"values\"] has ", t.keys_size(),
                                                   " keys and ", t.values_size(), " values"));
    }
    if (t.shape_size() > 0 && !(t.shape_size() == 1 && t.shape(0) == static_cast<uint64_t>(nf))) {
      return BadRecord(rec, RECORDIO, absl::StrCat("features[\"values\"] has shape [",
                                                   absl::StrJoin(t.shape(), ","),
                                                   "], expected [", nf, "]"));
    }
    for (int j = 0; j < t.keys_size(); ++j) {
      const uint64_t k = t.keys(j);
      if (k >= static_cast<uint64_t>(nf) || rows->present[base + k]) {
        return BadRecord(rec, RECORDIO, absl::StrCat("features[\"values\"] key ", k,
                                                     k >= static_cast<uint64_t>(nf)
                                                         ? absl::StrCat(" is not a field index "
                                                                        "(expected < ", nf, ")")
                                                         : " appears twice"));
      }
      RETURN_IF_ERROR(SetField(rec, static_cast<int>(k), static_cast<double>(t.values(j)), base,
                               rows));
    }
    return absl::OkStatus();
  }

  // A list field's tensor: keys = the ids, values = one weight per id (or none: every weight is
  // 1). Other lengths, or a list longer than max_length under REFUSE, make the record bad.
  template <class Tensor>
  absl::Status FillList(const RecordRef& rec, const std::string& name, const Tensor& t, int f,
                        int row, RawRows* rows) const {
    const FeatureSpec::Field& field = spec_.field(f);
    if (t.values_size() != 0 && t.values_size() != t.keys_size()) {
      return BadRecord(rec, RECORDIO, absl::StrCat("list field '", name, "': ", t.values_size(),
                                                   " weights (values) for ", t.keys_size(),
                                                   " ids (keys), expected one per id or none"));
    }
    rows->StartList(row, f);
    ASSIGN_OR_RETURN(const size_t keep, ListLengthToKeep(rec, RECORDIO, field,
                                                         static_cast<size_t>(t.keys_size()), rows));
    for (size_t j = 0; j < keep; ++j) {
      const double w = t.values_size() == 0 ? 1.0 : static_cast<double>(t.values(static_cast<int>(j)));
      if (!std::isfinite(w)) {
        return BadRecord(rec, RECORDIO, absl::StrCat("list field '", name, "': weight ", j + 1,
                                                     " is not finite: ", w));
      }
      rows->AddToList(row, f, t.keys(static_cast<int>(j)), w);
    }
    return absl::OkStatus();
  }

  absl::Status SetField(const RecordRef& rec, int f, double v, size_t base, RawRows* rows) const {
    const size_t i = base + f;
    if (spec_.field(f).list) {
      return BadRecord(rec, RECORDIO, absl::StrCat("features[\"values\"] sets list field '",
                                                   spec_.field(f).name,
                                                   "'; a list is a tensor of its own (keys = ids)"));
    }
    if (spec_.field(f).kind == CATEGORICAL) {
      // 2^64 as a double: every smaller non-negative integral double converts exactly.
      if (!(v >= 0.0 && v < 18446744073709551616.0 && v == std::floor(v))) {
        return BadRecord(rec, RECORDIO, absl::StrCat("categorical field '", spec_.field(f).name,
                                                     "' has value ", v,
                                                     ", expected a non-negative integer key"));
      }
      rows->key[i] = static_cast<uint64_t>(v);
      rows->value[i] = 1.0;
    } else {
      if (!std::isfinite(v)) {
        return BadRecord(rec, RECORDIO, absl::StrCat("numeric field '", spec_.field(f).name,
                                                     "' is not finite: ", v));
      }
      rows->value[i] = v;
    }
    rows->present[i] = 1;
    return absl::OkStatus();
  }

  const bool values_is_field_;  // a field named "values" forces the per-name form
  absl::flat_hash_map<std::string, int> index_;
  ScratchArena arena_;
};

// Encodes each aialgs.data.Record directly in the protobuf wire format, as the generated class
// serializes it (the tests compare the bytes and the parsed messages): building the message
// costs two protobuf maps per row.
//   Record.features (1) = {"values": Value{float64_tensor (3) = {values (1): the present fields'
//                          values, keys (2): their field indices, shape (3): [num_fields]}}}
//   Record.label (2)    = {"values": Value{float32_tensor (2) = {values (1): [label]}}}
class RecordIOWriter : public BufferedRecordWriter {
 public:
  RecordIOWriter(const FeatureSpec& spec, std::unique_ptr<BufferedWriter> out)
      : BufferedRecordWriter(RECORDIO, spec, std::move(out), WritableRows{}),
        buf_(new uint8_t[96 + size_t{18} * spec.num_fields()]) {}

 private:
  absl::Status AppendRow(const RawRows& rows, int r, std::string* out) override {
    constexpr uint64_t kMaxExact = uint64_t{1} << 53;
    const int nf = spec_.num_fields();
    const size_t base = static_cast<size_t>(r) * nf;
    const uint8_t* present = rows.present.data() + base;
    const uint64_t* key = rows.key.data() + base;
    const double* value = rows.value.data() + base;
    const uint8_t* categorical = categorical_.data();
    // The lengths come first in the wire format, so size everything before writing. The loops
    // have no branch on whether a field is present: that is a coin flip a branch would
    // mispredict.
    size_t count = 0, key_bytes = 0;
    bool too_big = false;
    for (int f = 0; f < nf; ++f) {
      const size_t is_present = present[f] != 0;
      count += is_present;
      key_bytes += is_present * VarintSize(static_cast<uint64_t>(f));
      too_big |= is_present & categorical[f] & (key[f] >= kMaxExact);
    }
    for (int f = 0; too_big && f < nf; ++f) {
      if (present[f] && categorical[f] && key[f] >= kMaxExact) {
        return RowError(r, absl::StrCat("categorical field '", spec_.field(f).name, "' key ",
                                        key[f], " is >= 2^53: RecordIO stores keys as doubles, "
                                        "which cannot hold it exactly"));
      }
    }
    const size_t shape_bytes = VarintSize(static_cast<uint64_t>(nf));
    size_t tensor = FieldSize(shape_bytes);
    if (count > 0) tensor += FieldSize(8 * count) + FieldSize(key_bytes);
    const size_t value_size = FieldSize(tensor);
    static constexpr uint8_t kKey[] = {0x0a, 0x06, 'v', 'a', 'l', 'u', 'e', 's'};

    uint8_t* p = WriteFieldHead(0x0a, sizeof(kKey) + FieldSize(value_size), buf_.get());
    p = std::copy(kKey, kKey + sizeof(kKey), p);
    p = WriteFieldHead(0x12, value_size, p);  // the features entry's Value
    p = WriteFieldHead(0x1a, tensor, p);      // Value.float64_tensor
    if (count > 0) {
      p = WriteFieldHead(0x0a, 8 * count, p);
      for (int f = 0; f < nf; ++f) {
        const double v = categorical[f] ? static_cast<double>(key[f]) : value[f];
        std::memcpy(p, &v, 8);  // x86: little-endian, as the wire format
        p += present[f] ? 8 : 0;
      }
      p = WriteFieldHead(0x12, key_bytes, p);
      for (int f = 0; f < nf; ++f) {
        uint8_t* end = WriteVarint(static_cast<uint64_t>(f), p);
        p = present[f] ? end : p;
      }
    }
    p = WriteFieldHead(0x1a, shape_bytes, p);
    p = WriteVarint(static_cast<uint64_t>(nf), p);
    // label entry: key "values", Value{float32_tensor{values: [label]}}.
    static constexpr uint8_t kLabel[] = {0x12, 0x12, 0x0a, 0x06, 'v',  'a',  'l', 'u',
                                         'e',  's',  0x12, 0x08, 0x12, 0x06, 0x0a, 0x04};
    p = std::copy(kLabel, kLabel + sizeof(kLabel), p);
    std::memcpy(p, &rows.labels[r], 4);
    p += 4;
    const absl::string_view payload(reinterpret_cast<const char*>(buf_.get()), p - buf_.get());
    if (payload.size() > kRecordIOMaxPart) {
      return RowError(r, absl::StrCat("serialized record of ", payload.size(),
                                      " bytes exceeds RecordIO's 2^29-byte limit"));
    }
    AppendRecordIOFrame(payload, out);
    return absl::OkStatus();
  }

  std::unique_ptr<uint8_t[]> buf_;  // one serialized Record
};

// The writer of a spec with list fields: the generated aialgs.data.Record, serialized
// deterministically. features["values"] holds the other fields as RecordIOWriter writes them
// (sparse Float64Tensor, shape [F]); each list field is features[name], a Float64Tensor with
// keys = its ids and values = their weights (SageMaker's sparse form); the label as always.
class RecordIOListWriter : public BufferedRecordWriter {
 public:
  RecordIOListWriter(const FeatureSpec& spec, std::unique_ptr<BufferedWriter> out)
      : BufferedRecordWriter(RECORDIO, spec, std::move(out), WritableRows{}) {}

 private:
  absl::Status AppendRow(const RawRows& rows, int r, std::string* out) override {
    constexpr uint64_t kMaxExact = uint64_t{1} << 53;
    aialgs::data::Record record;
    auto& features = *record.mutable_features();
    auto* row = features["values"].mutable_float64_tensor();
    for (int f = 0; f < spec_.num_fields(); ++f) {
      const FeatureSpec::Field& field = spec_.field(f);
      const size_t i = rows.Cell(r, f);
      if (field.list) {
        auto* t = features[field.name].mutable_float64_tensor();
        for (uint32_t j = 0; j < rows.ListSize(i); ++j) {
          t->add_keys(rows.list_key[rows.list_begin[i] + j]);
          t->add_values(rows.list_weight[rows.list_begin[i] + j]);
        }
        continue;
      }
      if (!rows.present[i]) continue;
      if (categorical_[f] && rows.key[i] >= kMaxExact) {
        return RowError(r, absl::StrCat("categorical field '", field.name, "' key ", rows.key[i],
                                        " is >= 2^53: RecordIO stores keys as doubles, which "
                                        "cannot hold it exactly"));
      }
      row->add_keys(static_cast<uint64_t>(f));
      row->add_values(categorical_[f] ? static_cast<double>(rows.key[i]) : rows.value[i]);
    }
    row->add_shape(static_cast<uint64_t>(spec_.num_fields()));
    (*record.mutable_label())["values"].mutable_float32_tensor()->add_values(rows.labels[r]);
    std::string payload;
    {
      google::protobuf::io::StringOutputStream stream(&payload);
      google::protobuf::io::CodedOutputStream coded(&stream);
      coded.SetSerializationDeterministic(true);
      record.SerializeToCodedStream(&coded);
    }
    if (payload.size() > kRecordIOMaxPart) {
      return RowError(r, absl::StrCat("serialized record of ", payload.size(),
                                      " bytes exceeds RecordIO's 2^29-byte limit"));
    }
    AppendRecordIOFrame(payload, out);
    return absl::OkStatus();
  }
};

}  // namespace

void AppendRecordIOFrame(absl::string_view payload, std::string* out) {
  PSTRAIN_CHECK(payload.size() <= kRecordIOMaxPart) << "RecordIO payload too large";
  char magic[4];
  EncodeFixed32(magic, kRecordIOMagic);
  const size_t aligned_end = payload.size() & ~size_t{3};
  size_t begin = 0;  // start of the part being built
  for (size_t i = 0; i < aligned_end; i += 4) {
    if (std::memcmp(payload.data() + i, magic, 4) == 0) {
      AppendPart(begin == 0 ? 1 : 2, payload.substr(begin, i - begin), out);
      begin = i + 4;
    }
  }
  AppendPart(begin == 0 ? 0 : 3, payload.substr(begin), out);
  out->append(Padded(static_cast<uint32_t>(payload.size())) - payload.size(), '\0');
}

absl::StatusOr<std::unique_ptr<RecordSource>> OpenRecordIOSource(
    const std::string& path, size_t chunk_size, Channel::Compression compression,
    size_t max_record_bytes) {
  ASSIGN_OR_RETURN(auto reader, BufferedReader::Open(path, chunk_size, compression));
  return std::unique_ptr<RecordSource>(new RecordIOSource(std::move(reader), max_record_bytes));
}

std::unique_ptr<RecordParser> NewRecordIOParser(const FeatureSpec& spec) {
  return std::make_unique<RecordIOParser>(spec);
}

absl::StatusOr<std::unique_ptr<RecordWriter>> NewRecordIOWriter(const FeatureSpec& spec,
                                                                const std::string& path) {
  ASSIGN_OR_RETURN(auto out, BufferedWriter::Create(path));
  if (spec.has_lists()) {
    if (spec.FieldIndex("values") >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": a spec with list fields and a field named 'values' has no RecordIO form (the "
          "row tensor is features[\"values\"])"));
    }
    return std::unique_ptr<RecordWriter>(new RecordIOListWriter(spec, std::move(out)));
  }
  return std::unique_ptr<RecordWriter>(new RecordIOWriter(spec, std::move(out)));
}

}  // namespace pstrain
