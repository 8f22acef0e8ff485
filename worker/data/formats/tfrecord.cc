#include "worker/data/formats/tfrecord.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/record_frame.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "tensorflow/example.pb.h"
#include "worker/data/formats/buffered_io.h"
#include "worker/data/formats/util.h"

namespace pstrain {
namespace {

class TFRecordSource : public RecordSource {
 public:
  // A length beyond max_record_bytes is refused rather than allocated.
  TFRecordSource(std::unique_ptr<BufferedReader> reader, uint64_t max_record_bytes)
      : reader_(std::move(reader)), max_record_bytes_(max_record_bytes) {}

  absl::Status Next(RecordRef* rec, bool* eof) override {
    *eof = false;
    if (!fatal_.ok()) return fatal_;
    const uint64_t start = reader_->offset();
    bool complete = false;
    RETURN_IF_ERROR(reader_->Ensure(kTFRecordHeaderSize, &complete));
    if (!complete) {
      if (reader_->available() == 0) {
        *eof = true;
        return absl::OkStatus();
      }
      return Fatal(start, absl::StrCat("truncated: expected a ", kTFRecordHeaderSize,
                                       "-byte record header, file ends after ",
                                       reader_->available(), " bytes"));
    }
    uint64_t length = 0;
    if (!DecodeTFRecordHeader(reader_->data(), &length)) {
      return Fatal(start, "corrupt record header: the CRC of the length field does not match "
                          "(not a TFRecord file, or damaged)");
    }
    if (length > max_record_bytes_) {
      return Fatal(start, absl::StrCat("record length ", length, " exceeds the limit of ",
                                       max_record_bytes_, " bytes (data.max_record_bytes)"));
    }
    const uint64_t frame = kTFRecordHeaderSize + length + kTFRecordFooterSize;
    // For files, check the size first so a truncated huge record is not buffered in vain.
    if (reader_->size_known() && reader_->file_size() - start < frame) {
      return Truncated(start, length, reader_->file_size() - start - kTFRecordHeaderSize);
    }
    RETURN_IF_ERROR(reader_->Ensure(frame, &complete));
    if (!complete) {
      return Truncated(start, length, reader_->available() - kTFRecordHeaderSize);
    }
    const char* p = reader_->data();
    const absl::string_view data(p + kTFRecordHeaderSize, length);
    reader_->Consume(frame);
    ++records_;
    if (!CheckTFRecordData(data, p + kTFRecordHeaderSize + length)) {
      return absl::DataLossError(absl::StrCat(Where(records_, start), ": data CRC mismatch over ",
                                              length, " bytes: the record is corrupt (skipped)"));
    }
    rec->data = data;
    rec->file = &reader_->path();
    rec->number = records_;
    return absl::OkStatus();
  }

  uint64_t offset() const override { return reader_->offset(); }
  uint64_t records() const override { return records_; }
  absl::Status Seek(uint64_t offset, uint64_t records) override {
    RETURN_IF_ERROR(reader_->Seek(offset));
    records_ = records;
    fatal_ = absl::OkStatus();
    return absl::OkStatus();
  }
  const std::string& path() const override { return reader_->path(); }

 private:
  std::string Where(uint64_t number, uint64_t offset) const {
    return absl::StrCat(reader_->path(), ": record ", number, " at offset ", offset);
  }
  // The rest of the file is unreadable; every later Next returns the same error.
  absl::Status Fatal(uint64_t offset, absl::string_view what) {
    fatal_ = absl::InvalidArgumentError(absl::StrCat(Where(records_ + 1, offset), ": ", what));
    return fatal_;
  }
  absl::Status Truncated(uint64_t offset, uint64_t length, uint64_t have) {
    return Fatal(offset, absl::StrCat("truncated: expected ", length, " bytes of data and a ",
                                      kTFRecordFooterSize, "-byte CRC, file ends after ", have));
  }

  std::unique_ptr<BufferedReader> reader_;
  const uint64_t max_record_bytes_;
  uint64_t records_ = 0;
  absl::Status fatal_;
};

// Calls fn(field_number, bytes) for each length-delimited field of a serialized message, in wire
// order, skipping fields of other wire types. Returns false if the bytes are malformed or fn
// returns false.
template <class Fn>
bool ForEachLengthDelimited(absl::string_view msg, Fn&& fn) {
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(msg.data()),
                                            static_cast<int>(msg.size()));
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return in.ConsumedEntireMessage();
    if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag)) return false;
      continue;
    }
    uint32_t len = 0;
    if (!in.ReadVarint32(&len)) return false;
    const void* p = nullptr;
    int avail = 0;
    in.GetDirectBufferPointer(&p, &avail);  // false (and avail 0) at the very end
    if (static_cast<uint32_t>(avail) < len) return false;
    if (!fn(WireFormatLite::GetTagFieldNumber(tag),
            absl::string_view(static_cast<const char*>(p), len))) {
      return false;
    }
    in.Skip(static_cast<int>(len));
  }
}

class TFRecordParser : public RowParser {
 public:
  explicit TFRecordParser(const FeatureSpec& spec) : RowParser(spec) {
    for (int f = 0; f < spec.num_fields(); ++f) {
      index_[spec.field(f).name] = f;
      if (!spec.field(f).weights_key.empty()) weights_index_[spec.field(f).weights_key] = f;
    }
    list_length_.assign(spec.num_fields(), -1);
    weights_.resize(spec.num_fields());
    has_weights_.assign(spec.num_fields(), 0);
  }

 private:
  // Parsing a whole tensorflow::Example builds a protobuf Map (a hash table) per record, which
  // dominated the profile. Instead the Example -> Features -> map entry envelope is walked in
  // place (keys stay views into the record) and only the Feature values of fields this spec uses
  // are parsed, by the generated class on a reused arena. The tests check this against the
  // generated full parse.
  absl::Status ParseOne(const RecordRef& rec, RawRows* rows) override {
    arena_.Reset();
    const int row = rows->AddRow(0.0f);
    bool has_label = false;
    absl::Status error;
    const bool ok = ForEachLengthDelimited(rec.data, [&](int field, absl::string_view features) {
      if (field != 1) return true;  // Example.features = 1
      return ForEachLengthDelimited(features, [&](int field, absl::string_view entry) {
        if (field != 1) return true;  // Features.feature = 1 (map entries)
        absl::string_view key, value;
        if (!ForEachLengthDelimited(entry, [&](int field, absl::string_view b) {
              if (field == 1) key = b;
              if (field == 2) value = b;
              return true;
            })) {
          return false;
        }
        error = OnFeature(rec, key, value, row, rows, &has_label);
        return error.ok();
      });
    });
    if (ok && error.ok() && !weights_index_.empty()) error = ApplyWeights(rec, row, rows);
    if (ok && error.ok() && !has_label) {
      error = BadRecord(rec, TFRECORD, absl::StrCat("no label feature '", spec_.label_name(), "'"));
    }
    for (int f : touched_) {
      list_length_[f] = -1;
      has_weights_[f] = 0;
    }
    touched_.clear();
    if (!ok && error.ok()) {
      error = absl::DataLossError(absl::StrCat(DescribeRecord(rec, TFRECORD), ": ",
                                               rec.data.size(),
                                               " bytes are not a valid tf.train.Example"));
    }
    if (!error.ok()) rows->PopRow();
    return error;
  }

  absl::Status OnFeature(const RecordRef& rec, absl::string_view name, absl::string_view bytes,
                         int row, RawRows* rows, bool* has_label) {
    const bool is_label = name == spec_.label_name();
    int f = -1;
    int weights_of = -1;
    if (!is_label) {
      const auto it = index_.find(name);
      if (it != index_.end()) {
        f = it->second;
      } else if (const auto w = weights_index_.find(name); w != weights_index_.end()) {
        weights_of = w->second;
      } else {
        return absl::OkStatus();  // a feature this model does not use
      }
    }
    auto* feature = arena_.Create<tensorflow::Feature>();
    if (!feature->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return absl::DataLossError(absl::StrCat(DescribeRecord(rec, TFRECORD), ": feature '", name,
                                              "' is not a valid tf.train.Feature"));
    }
    int n = 0;
    switch (feature->kind_case()) {
      case tensorflow::Feature::kInt64List: n = feature->int64_list().value_size(); break;
      case tensorflow::Feature::kFloatList: n = feature->float_list().value_size(); break;
      case tensorflow::Feature::kBytesList: n = feature->bytes_list().value_size(); break;
      default: break;
    }
    if (weights_of >= 0) {
      const FeatureSpec::Field& field = spec_.field(weights_of);
      if (n > 0 && !feature->has_float_list()) {
        return BadRecord(rec, TFRECORD, absl::StrCat("list weights '", name, "' of field '",
                                                     field.name, "' are not a float_list"));
      }
      std::vector<double>& w = weights_[weights_of];
      w.clear();
      for (int j = 0; j < n; ++j) {
        const double v = feature->float_list().value(j);
        if (!std::isfinite(v)) {
          return BadRecord(rec, TFRECORD, absl::StrCat("list weights '", name, "' of field '",
                                                       field.name, "': weight ", j + 1,
                                                       " is not finite: ", v));
        }
        w.push_back(v);
      }
      has_weights_[weights_of] = 1;
      touched_.push_back(weights_of);
      return absl::OkStatus();
    }
    if (f >= 0 && spec_.field(f).list) return OnList(rec, name, *feature, n, f, row, rows);
    if (n > 1) {
      return BadRecord(rec, TFRECORD, absl::StrCat("feature '", name, "' has ", n,
                                                   " values, expected 1 (multi-valued "
                                                   "features are not supported)"));
    }
    if (is_label) {
      double v = 0;
      if (n == 1 && feature->has_float_list()) v = feature->float_list().value(0);
      if (n == 1 && feature->has_int64_list()) v = static_cast<double>(feature->int64_list().value(0));
      if (n != 1 || feature->has_bytes_list() || !(v >= 0.0 && v <= 1.0)) {
        return BadRecord(rec, TFRECORD, absl::StrCat("label feature '", name,
                                                     "': expected one float or int64 value "
                                                     "in [0, 1]"));
      }
      rows->labels[row] = static_cast<float>(v);
      *has_label = true;
      return absl::OkStatus();
    }
    const size_t i = static_cast<size_t>(row) * spec_.num_fields() + f;
    // A repeated key replaces the earlier value, as merging into a protobuf map does.
    rows->present[i] = 0;
    rows->key[i] = 0;
    rows->value[i] = 0.0;
    if (n == 0) return absl::OkStatus();  // empty list: missing
    const bool categorical = spec_.field(f).kind == CATEGORICAL;
    if (feature->has_int64_list()) {
      const int64_t v = feature->int64_list().value(0);
      if (categorical) {
        rows->key[i] = static_cast<uint64_t>(v);
        rows->value[i] = 1.0;
      } else {
        rows->value[i] = static_cast<double>(v);
      }
    } else if (feature->has_float_list() && !categorical) {
      const double v = feature->float_list().value(0);
      if (!std::isfinite(v)) {
        return BadRecord(rec, TFRECORD, absl::StrCat("numeric feature '", name,
                                                     "' is not finite: ", v));
      }
      rows->value[i] = v;
    } else if (feature->has_bytes_list() && categorical) {
      const std::string& b = feature->bytes_list().value(0);
      if (!ParseHexKey(b.data(), b.data() + b.size(), &rows->key[i])) rows->key[i] = HashBytes(b);
      rows->value[i] = 1.0;
    } else {
      return BadRecord(rec, TFRECORD,
                       absl::StrCat(categorical ? "categorical" : "numeric", " feature '", name,
                                    "' is a ", feature->has_float_list() ? "float_list" : "bytes_list",
                                    ", expected ",
                                    categorical ? "int64_list or bytes_list"
                                                : "float_list or int64_list"));
    }
    rows->present[i] = 1;
    return absl::OkStatus();
  }

  // A list field's feature: int64_list or bytes_list ids (any number, zero included).
  absl::Status OnList(const RecordRef& rec, absl::string_view name,
                      const tensorflow::Feature& feature, int n, int f, int row, RawRows* rows) {
    const FeatureSpec::Field& field = spec_.field(f);
    if (n > 0 && !feature.has_int64_list() && !feature.has_bytes_list()) {
      return BadRecord(rec, TFRECORD, absl::StrCat("list feature '", name,
                                                   "' is a float_list, expected int64_list or "
                                                   "bytes_list"));
    }
    rows->StartList(row, f);  // a repeated key replaces the earlier list
    list_length_[f] = n;
    touched_.push_back(f);
    ASSIGN_OR_RETURN(const size_t keep,
                     ListLengthToKeep(rec, TFRECORD, field, static_cast<size_t>(n), rows));
    for (size_t j = 0; j < keep; ++j) {
      uint64_t key;
      if (feature.has_int64_list()) {
        key = static_cast<uint64_t>(feature.int64_list().value(static_cast<int>(j)));
      } else {
        const std::string& b = feature.bytes_list().value(static_cast<int>(j));
        if (!ParseHexKey(b.data(), b.data() + b.size(), &key)) key = HashBytes(b);
      }
      rows->AddToList(row, f, key);
    }
    return absl::OkStatus();
  }

  // Gives each list the weights of its weights_key feature, once the whole record is read (the
  // two features come in any order).
  absl::Status ApplyWeights(const RecordRef& rec, int row, RawRows* rows) {
    for (int f : touched_) {
      if (!has_weights_[f]) continue;
      const FeatureSpec::Field& field = spec_.field(f);
      const std::vector<double>& w = weights_[f];
      if (list_length_[f] < 0) {
        if (w.empty()) continue;
        return BadRecord(rec, TFRECORD, absl::StrCat("list field '", field.name, "': ", w.size(),
                                                     " weights ('", field.weights_key,
                                                     "') without ids"));
      }
      if (static_cast<int>(w.size()) != list_length_[f]) {
        return BadRecord(rec, TFRECORD, absl::StrCat("list field '", field.name, "': ", w.size(),
                                                     " weights ('", field.weights_key, "') for ",
                                                     list_length_[f], " ids, expected one per id"));
      }
      const size_t i = rows->Cell(row, f);
      for (uint32_t j = 0; j < rows->list_size[i]; ++j) {
        rows->list_weight[rows->list_begin[i] + j] = w[j];
      }
    }
    return absl::OkStatus();
  }

  absl::flat_hash_map<std::string, int> index_;  // field name -> index (string_view lookups)
  absl::flat_hash_map<std::string, int> weights_index_;  // list.weights_key -> its field
  // Per field, for the record being parsed: the list's length as given (-1: no list), and the
  // weights of its weights_key feature; touched_ lists the fields to reset.
  std::vector<int> list_length_;
  std::vector<std::vector<double>> weights_;
  std::vector<uint8_t> has_weights_;
  std::vector<int> touched_;
  ScratchArena arena_;
};

// Encodes each tf.train.Example directly in the protobuf wire format: building the generated
// message costs a protobuf map per row. The features go in sorted key order, as protobuf's
// deterministic serialization writes a map, so the bytes equal that serialization of the
// generated message (the tests compare both the bytes and the parsed messages). Per feature, a
// Features.feature map entry:
//   0x0a len(entry) | 0x0a len(key) key | 0x12 len(Feature) Feature
// with Feature = 0x12 0x06 0x0a 0x04 float32 (float_list, packed)
//             or 0x1a (n + 2) 0x0a n varint[n] (int64_list, packed).
class TFRecordWriter : public BufferedRecordWriter {
 public:
  TFRecordWriter(const FeatureSpec& spec, std::unique_ptr<BufferedWriter> out)
      : BufferedRecordWriter(TFRECORD, spec, std::move(out), WritableRows{}) {
    std::vector<std::pair<std::string, int>> names = {{spec.label_name(), kLabel}};
    for (int f = 0; f < spec.num_fields(); ++f) names.emplace_back(spec.field(f).name, f);
    std::sort(names.begin(), names.end());
    size_t bound = kHead;
    for (const auto& [name, f] : names) {
      Entry e;
      e.field = f;
      e.floats = f == kLabel || !categorical_[f];
      e.head = heads_.size();
      // The key field, and for a float entry everything but the value: it is all constant.
      uint8_t b[2 * (1 + kMaxVarintBytes)];
      uint8_t* p = b;
      const size_t key_size = FieldSize(name.size());
      if (e.floats) p = WriteFieldHead(0x0a, key_size + 10, p);
      p = WriteFieldHead(0x0a, name.size(), p);
      heads_.insert(heads_.end(), b, p);
      heads_.insert(heads_.end(), name.begin(), name.end());
      if (e.floats) heads_.insert(heads_.end(), {0x12, 0x08, 0x12, 0x06, 0x0a, 0x04});
      e.head_size = heads_.size() - e.head;
      entries_.push_back(e);
      bound += 1 + kMaxVarintBytes + e.head_size + kCopyBlock + 8 + kMaxVarintBytes;
    }
    heads_.resize(heads_.size() + kCopyBlock);  // CopyHead reads whole blocks
    buf_.reset(new uint8_t[bound]);
  }

 private:
  static constexpr int kLabel = -1;
  static constexpr size_t kHead = 1 + 5;  // Example.features tag and length
  static constexpr size_t kCopyBlock = 16;

  struct Entry {
    int field;       // kLabel or a field index
    bool floats;     // float_list (the label, numeric fields), else int64_list
    size_t head;     // offset in heads_
    size_t head_size;
  };

  // Copies an entry's head in whole blocks (writing up to kCopyBlock - 1 bytes of slack).
  uint8_t* CopyHead(const Entry& e, uint8_t* p) const {
    for (size_t c = 0; c < e.head_size; c += kCopyBlock) {
      std::memcpy(p + c, heads_.data() + e.head + c, kCopyBlock);
    }
    return p + e.head_size;
  }

  absl::Status AppendRow(const RawRows& rows, int r, std::string* out) override {
    const size_t base = static_cast<size_t>(r) * spec_.num_fields();
    uint8_t* const features = buf_.get() + kHead;
    uint8_t* p = features;
    // Each entry is written, but p moves past it only if the field is present: whether it is
    // missing is a coin flip that a branch would mispredict.
    for (const Entry& e : entries_) {
      const size_t i = base + e.field;
      const bool present = e.field == kLabel || rows.present[i];
      uint8_t* end;
      if (e.floats) {
        const float v = e.field == kLabel ? rows.labels[r] : static_cast<float>(rows.value[i]);
        if (!std::isfinite(v) && present) {
          return RowError(r, absl::StrCat("numeric field '", spec_.field(e.field).name,
                                          "' value ", rows.value[i], " overflows float32"));
        }
        end = CopyHead(e, p);
        std::memcpy(end, &v, 4);  // x86: little-endian, as the wire format
        end += 4;
      } else {
        const uint64_t n = VarintSize(rows.key[i]);
        end = WriteFieldHead(0x0a, e.head_size + 6 + n, p);
        end = CopyHead(e, end);
        // 0x12 (n + 4) 0x1a (n + 2) 0x0a n, as the bytes of a little-endian word.
        const uint64_t feature = 0x0a021a0412ull + n * 0x010001000100ull;
        std::memcpy(end, &feature, 8);
        end = WriteVarint(rows.key[i], end + 6);
      }
      p = present ? end : p;
    }
    // Example { features = 1 }: the tag and length go right before the entries.
    const uint64_t length = static_cast<uint64_t>(p - features);
    uint8_t* start = features - (FieldSize(length) - length);
    WriteFieldHead(0x0a, length, start);
    AppendTFRecordFrame(absl::string_view(reinterpret_cast<char*>(start), p - start), out);
    return absl::OkStatus();
  }

  std::vector<Entry> entries_;   // the label and every field, sorted by name
  std::vector<uint8_t> heads_;   // the entries' constant bytes
  std::unique_ptr<uint8_t[]> buf_;  // one serialized Example
};

// The TFRecord writer of a spec with list fields: the generated tf.train.Example, serialized
// deterministically (keys sorted, as TFRecordWriter writes them). A list is an int64_list of its
// keys (empty for an empty or absent list), and, when the field has a weights_key and some
// weight is not 1, the float_list of its weights under that key. Slower than TFRecordWriter,
// and only used for such specs.
class TFRecordListWriter : public BufferedRecordWriter {
 public:
  TFRecordListWriter(const FeatureSpec& spec, std::unique_ptr<BufferedWriter> out)
      : BufferedRecordWriter(TFRECORD, spec, std::move(out), WritableRows{}) {}

 private:
  absl::Status AppendRow(const RawRows& rows, int r, std::string* out) override {
    tensorflow::Example ex;
    auto& features = *ex.mutable_features()->mutable_feature();
    features[spec_.label_name()].mutable_float_list()->add_value(rows.labels[r]);
    for (int f = 0; f < spec_.num_fields(); ++f) {
      const FeatureSpec::Field& field = spec_.field(f);
      const size_t i = rows.Cell(r, f);
      if (field.list) {
        auto* ids = features[field.name].mutable_int64_list();
        bool weighted = false;
        for (uint32_t j = 0; j < rows.ListSize(i); ++j) {
          ids->add_value(static_cast<int64_t>(rows.list_key[rows.list_begin[i] + j]));
          weighted |= rows.list_weight[rows.list_begin[i] + j] != 1.0;
        }
        if (!weighted) continue;
        if (field.weights_key.empty()) {
          return RowError(r, absl::StrCat("list field '", field.name,
                                          "' has weights other than 1 and no list.weights_key "
                                          "to write them under"));
        }
        auto* w = features[field.weights_key].mutable_float_list();
        for (uint32_t j = 0; j < rows.ListSize(i); ++j) {
          const double v = rows.list_weight[rows.list_begin[i] + j];
          if (static_cast<double>(static_cast<float>(v)) != v) {
            return RowError(r, absl::StrCat("list field '", field.name, "' weight ", v,
                                            " has no exact float32 (a float_list)"));
          }
          w->add_value(static_cast<float>(v));
        }
        continue;
      }
      if (!rows.present[i]) continue;
      if (categorical_[f]) {
        features[field.name].mutable_int64_list()->add_value(static_cast<int64_t>(rows.key[i]));
      } else {
        const float v = static_cast<float>(rows.value[i]);
        if (!std::isfinite(v)) {
          return RowError(r, absl::StrCat("numeric field '", field.name, "' value ",
                                          rows.value[i], " overflows float32"));
        }
        features[field.name].mutable_float_list()->add_value(v);
      }
    }
    std::string bytes;
    {
      google::protobuf::io::StringOutputStream stream(&bytes);
      google::protobuf::io::CodedOutputStream coded(&stream);
      coded.SetSerializationDeterministic(true);
      ex.SerializeToCodedStream(&coded);
    }
    AppendTFRecordFrame(bytes, out);
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<RecordSource>> OpenTFRecordSource(
    const std::string& path, size_t chunk_size, Channel::Compression compression,
    size_t max_record_bytes) {
  ASSIGN_OR_RETURN(auto reader, BufferedReader::Open(path, chunk_size, compression));
  return std::unique_ptr<RecordSource>(new TFRecordSource(std::move(reader), max_record_bytes));
}

std::unique_ptr<RecordParser> NewTFRecordParser(const FeatureSpec& spec) {
  return std::make_unique<TFRecordParser>(spec);
}

absl::StatusOr<std::unique_ptr<RecordWriter>> NewTFRecordWriter(const FeatureSpec& spec,
                                                                const std::string& path) {
  if (spec.FieldIndex(spec.label_name()) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": field '", spec.label_name(), "' has the label's name; a tf.train.Example keys "
        "its features by name, so the two would collide (rename the field or the label)"));
  }
  ASSIGN_OR_RETURN(auto out, BufferedWriter::Create(path));
  if (spec.has_lists()) {
    return std::unique_ptr<RecordWriter>(new TFRecordListWriter(spec, std::move(out)));
  }
  return std::unique_ptr<RecordWriter>(new TFRecordWriter(spec, std::move(out)));
}

}  // namespace pstrain
