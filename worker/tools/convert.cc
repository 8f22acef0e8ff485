#include "worker/tools/convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/random.h"
#include "common/record_frame.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/data/file_list.h"
#include "worker/data/formats/buffered_io.h"
#include "worker/data/record_io.h"

namespace pstrain {
namespace {

constexpr size_t kBatchRecords = 4096;
// Pass 1 keeps every bucket file open, each with a block of staged rows (~170 KB for Criteo).
constexpr int kMaxBuckets = 512;

// The training pipeline's bad-record policy (worker/data/pipeline.h), over the whole conversion.
class BadRecords {
 public:
  explicit BadRecords(double fraction) : fraction_(fraction) {}
  void Read(int64_t n) { read_ += n; }
  // One bad record: its error with fraction 0, else counted (the first 10 are logged).
  absl::Status Add(const absl::Status& error) {
    ++bad_;
    if (fraction_ <= 0) return error;
    if (bad_ <= 10) PSTRAIN_LOG(WARNING) << "skipping bad record: " << error.message();
    return absl::OkStatus();
  }
  absl::Status Check(bool at_end) const {
    if (fraction_ > 0 && (at_end || read_ >= 1000) && bad_ > fraction_ * read_) {
      return absl::FailedPreconditionError(absl::StrCat(
          bad_, " bad records of ", read_, " read: more than max_bad_record_fraction ", fraction_));
    }
    return absl::OkStatus();
  }
  int64_t bad() const { return bad_; }

 private:
  double fraction_;
  int64_t read_ = 0, bad_ = 0;
};

using RowSink = std::function<absl::Status(const RawRows& rows)>;

// Reads every record of `files` in order and hands the parsed rows to `sink`, a batch at a time.
// Records are copied out of the source (its views die at the next Next) and parsed together.
absl::Status ReadRows(const std::vector<std::string>& files, DataFormat format,
                      const FeatureSpec& spec, BadRecords* bad, const RowSink& sink) {
  RawRows rows;
  std::string arena;
  std::vector<std::pair<size_t, size_t>> spans;
  std::vector<uint64_t> numbers;
  std::vector<RecordRef> refs;
  std::vector<absl::Status> errors;
  for (const std::string& path : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<RecordSource> source, OpenRecordSource(format, path));
    ASSIGN_OR_RETURN(std::unique_ptr<RecordParser> parser,
                     CreateRecordParser(format, spec, source->header()));
    for (bool eof = false; !eof;) {
      arena.clear();
      spans.clear();
      numbers.clear();
      while (spans.size() < kBatchRecords) {
        RecordRef rec;
        const absl::Status s = source->Next(&rec, &eof);
        if (!s.ok()) {
          bad->Read(1);
          RETURN_IF_ERROR(bad->Add(s));
          if (s.code() == absl::StatusCode::kDataLoss) continue;
          eof = true;  // the rest of this file cannot be framed
          break;
        }
        if (eof) break;
        spans.emplace_back(arena.size(), rec.data.size());
        numbers.push_back(rec.number);
        arena.append(rec.data.data(), rec.data.size());
      }
      refs.clear();
      for (size_t i = 0; i < spans.size(); ++i) {
        refs.push_back({absl::string_view(arena.data() + spans[i].first, spans[i].second),
                        &source->path(), numbers[i]});
      }
      rows.Clear(spec.num_fields());
      errors.clear();
      parser->Parse(refs, &rows, &errors);
      bad->Read(static_cast<int64_t>(refs.size()));
      for (const absl::Status& e : errors) RETURN_IF_ERROR(bad->Add(e));
      RETURN_IF_ERROR(bad->Check(/*at_end=*/false));
      if (rows.size() > 0) RETURN_IF_ERROR(sink(rows));
    }
  }
  return bad->Check(/*at_end=*/true);
}

// Writes a stream of rows into dir/part-NNNNN<ext>, closing a part once it reaches the target.
class PartWriter {
 public:
  PartWriter(DataFormat format, const FeatureSpec& spec, std::string dir, uint64_t target,
             ConvertResult* result)
      : format_(format), spec_(spec), dir_(std::move(dir)), target_(target), result_(result) {}

  absl::Status Write(const RawRows& rows) {
    for (int begin = 0; begin < rows.size();) {
      if (writer_ == nullptr) {
        result_->files.push_back(absl::StrFormat("%s/part-%05d%s", dir_, result_->files.size(),
                                                 DataFormatExtension(format_)));
        ASSIGN_OR_RETURN(writer_, CreateRecordWriter(format_, spec_, result_->files.back()));
      }
      // Half of the rows that should still fit at the mean row size so far, so the part ends
      // within about a row of the target after a few Write calls.
      const uint64_t written = writer_->bytes_written();
      int64_t step = 1;
      if (rows_written_ > 0 && written < target_) {
        const double mean = static_cast<double>(bytes_written_ + written) / rows_written_;
        step = std::max<int64_t>(1, static_cast<int64_t>((target_ - written) / (2 * mean)));
      }
      step = std::min<int64_t>(step, rows.size() - begin);
      RETURN_IF_ERROR(writer_->Write(rows, begin, begin + static_cast<int>(step)));
      begin += static_cast<int>(step);
      rows_written_ += step;
      result_->rows += step;
      if (writer_->bytes_written() >= target_) RETURN_IF_ERROR(CloseFile());
    }
    return absl::OkStatus();
  }

  absl::Status Close() { return writer_ == nullptr ? absl::OkStatus() : CloseFile(); }

 private:
  absl::Status CloseFile() {
    RETURN_IF_ERROR(writer_->Close());
    bytes_written_ += writer_->bytes_written();
    result_->bytes += writer_->bytes_written();
    writer_.reset();
    return absl::OkStatus();
  }

  DataFormat format_;
  const FeatureSpec& spec_;
  std::string dir_;
  uint64_t target_;
  ConvertResult* result_;
  std::unique_ptr<RecordWriter> writer_;
  int64_t rows_written_ = 0;    // over every part
  uint64_t bytes_written_ = 0;  // of the closed parts
};

// Row `from` of `src` appended to *dst (same num_fields).
void AppendRow(const RawRows& src, int from, RawRows* dst) {
  const size_t f = static_cast<size_t>(src.num_fields), i = static_cast<size_t>(from) * f;
  dst->labels.push_back(src.labels[from]);
  dst->present.insert(dst->present.end(), src.present.begin() + i, src.present.begin() + i + f);
  dst->key.insert(dst->key.end(), src.key.begin() + i, src.key.begin() + i + f);
  dst->value.insert(dst->value.end(), src.value.begin() + i, src.value.begin() + i + f);
  if (!dst->list_begin.empty()) {
    dst->list_begin.resize(dst->present.size(), 0);
    dst->list_size.resize(dst->present.size(), 0);
  }
  // List cells: their ids and weights (an empty list is present with no ids, copied above).
  const int row = dst->size() - 1;
  for (size_t c = 0; c < f; ++c) {
    const uint32_t n = src.ListSize(i + c);
    if (n == 0) continue;
    dst->StartList(row, static_cast<int>(c));
    for (uint32_t j = 0; j < n; ++j) {
      const size_t at = src.list_begin[i + c] + j;
      dst->AddToList(row, static_cast<int>(c), src.list_key[at], src.list_weight[at]);
    }
  }
}

// Shuffle buckets are private temporary files: TFRecord-framed (so CRC-checked) blocks of raw
// RawRows arrays. Lossless for any row and far cheaper than writing and parsing a data format.
// Block payload: uint32 rows, uint32 fields, then labels, present, key and value, native order,
// then uint32 entries (the list ids of the block, 0 without lists) and, when not 0, list_size
// (uint32 per cell), list_key and list_weight (the ids in cell order).
constexpr int kBucketBlockRows = 256;
constexpr char kBucketMagic[] = "pstrain shuffle bucket v2";

template <typename T>
void AppendArray(const std::vector<T>& v, std::string* out) {
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
void ReadArray(const char** p, size_t n, std::vector<T>* v) {
  const size_t old = v->size();
  v->resize(old + n);
  std::memcpy(v->data() + old, *p, n * sizeof(T));
  *p += n * sizeof(T);
}

class BucketWriter {
 public:
  static absl::StatusOr<std::unique_ptr<BucketWriter>> Create(const std::string& path, int fields) {
    ASSIGN_OR_RETURN(std::unique_ptr<BufferedWriter> out, BufferedWriter::Create(path));
    AppendTFRecordFrame(kBucketMagic, out->buffer());
    return std::unique_ptr<BucketWriter>(new BucketWriter(std::move(out), fields));
  }
  absl::Status Add(const RawRows& rows, int r) {
    AppendRow(rows, r, &block_);
    return block_.size() >= kBucketBlockRows ? Flush() : absl::OkStatus();
  }
  absl::Status Close() {
    RETURN_IF_ERROR(Flush());
    return out_->Close();
  }

 private:
  BucketWriter(std::unique_ptr<BufferedWriter> out, int fields) : out_(std::move(out)) {
    block_.Clear(fields);
  }
  absl::Status Flush() {
    if (block_.size() == 0) return absl::OkStatus();
    std::string payload(8, '\0');
    EncodeFixed32(&payload[0], static_cast<uint32_t>(block_.size()));
    EncodeFixed32(&payload[4], static_cast<uint32_t>(block_.num_fields));
    AppendArray(block_.labels, &payload);
    AppendArray(block_.present, &payload);
    AppendArray(block_.key, &payload);
    AppendArray(block_.value, &payload);
    const uint32_t entries = static_cast<uint32_t>(block_.list_key.size());
    payload.append(4, '\0');
    EncodeFixed32(&payload[payload.size() - 4], entries);
    if (entries > 0) {
      block_.list_size.resize(block_.present.size(), 0);
      AppendArray(block_.list_size, &payload);
      AppendArray(block_.list_key, &payload);
      AppendArray(block_.list_weight, &payload);
    }
    AppendTFRecordFrame(payload, out_->buffer());
    block_.Clear(block_.num_fields);
    return out_->Flush();  // one block at a time: K buckets' buffers stay small
  }

  std::unique_ptr<BufferedWriter> out_;
  RawRows block_;
};

// Appends every row of a bucket file to *rows.
absl::Status ReadBucket(const std::string& path, RawRows* rows) {
  ASSIGN_OR_RETURN(std::unique_ptr<RecordSource> source, OpenRecordSource(TFRECORD, path));
  const size_t fields = static_cast<size_t>(rows->num_fields);
  for (bool eof = false, first = true;; first = false) {
    RecordRef rec;
    RETURN_IF_ERROR(source->Next(&rec, &eof));
    if (eof) return absl::OkStatus();
    if (first) {
      if (rec.data != kBucketMagic) {
        return absl::DataLossError(absl::StrCat(path, ": not a shuffle bucket file"));
      }
      continue;
    }
    const uint32_t n = rec.data.size() >= 8 ? DecodeFixed32(rec.data.data()) : 0;
    const uint32_t f = rec.data.size() >= 8 ? DecodeFixed32(rec.data.data() + 4) : 0;
    const size_t fixed = 8 + size_t{n} * (4 + fields * (1 + 8 + 8)) + 4;
    const uint32_t entries =
        f == fields && rec.data.size() >= fixed ? DecodeFixed32(rec.data.data() + fixed - 4) : 0;
    const size_t lists = entries == 0 ? 0 : size_t{n} * fields * 4 + size_t{entries} * (8 + 8);
    if (f != fields || rec.data.size() != fixed + lists) {
      return absl::DataLossError(
          absl::StrCat(DescribeRecord(rec, TFRECORD), ": bad shuffle bucket block"));
    }
    const int first_row = rows->size();
    const char* p = rec.data.data() + 8;
    ReadArray(&p, n, &rows->labels);
    ReadArray(&p, n * fields, &rows->present);
    ReadArray(&p, n * fields, &rows->key);
    ReadArray(&p, n * fields, &rows->value);
    if (!rows->list_begin.empty()) {
      rows->list_begin.resize(rows->present.size(), 0);
      rows->list_size.resize(rows->present.size(), 0);
    }
    if (entries == 0) continue;
    p += 4;
    std::vector<uint32_t> sizes;
    ReadArray(&p, size_t{n} * fields, &sizes);
    const char* keys = p;
    const char* weights = p + size_t{entries} * 8;
    uint64_t used = 0;
    for (size_t c = 0; c < sizes.size(); ++c) {
      if (sizes[c] == 0) continue;
      used += sizes[c];
      if (used > entries) {
        return absl::DataLossError(
            absl::StrCat(DescribeRecord(rec, TFRECORD), ": bad shuffle bucket block"));
      }
      const int row = first_row + static_cast<int>(c / fields);
      const int field = static_cast<int>(c % fields);
      rows->StartList(row, field);
      for (uint32_t j = 0; j < sizes[c]; ++j, keys += 8, weights += 8) {
        uint64_t k;
        double w;
        std::memcpy(&k, keys, 8);
        std::memcpy(&w, weights, 8);
        rows->AddToList(row, field, k, w);
      }
    }
  }
}

uint64_t InputBytes(const std::vector<std::string>& files) {
  uint64_t total = 0;
  for (const std::string& f : files) {
    struct stat st;
    if (::stat(f.c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += st.st_size;
  }
  return total;
}

absl::Status Shuffle(const std::vector<std::string>& files, const ConvertOptions& o,
                     const FeatureSpec& spec, BadRecords* bad, PartWriter* parts,
                     ConvertResult* result) {
  const uint64_t input = InputBytes(files);
  const int k = static_cast<int>(std::clamp<uint64_t>(
      (input + o.target_file_bytes - 1) / o.target_file_bytes, 1, kMaxBuckets));
  result->buckets = k;
  std::vector<std::string> names;
  for (int b = 0; b < k; ++b) {
    names.push_back(absl::StrFormat("%s/.shuffle-%05d.tmp", o.out_dir, b));
  }
  // Removes whatever bucket files remain, on success and on failure.
  struct Cleanup {
    const std::vector<std::string>& names;
    ~Cleanup() {
      for (const auto& n : names) ::unlink(n.c_str());
    }
  } cleanup{names};

  // Pass 1: scatter.
  std::vector<std::unique_ptr<BucketWriter>> buckets;
  for (const std::string& n : names) {
    ASSIGN_OR_RETURN(std::unique_ptr<BucketWriter> w, BucketWriter::Create(n, spec.num_fields()));
    buckets.push_back(std::move(w));
  }
  Rng scatter(SplitMix64(o.shuffle_seed));
  RETURN_IF_ERROR(ReadRows(files, o.from, spec, bad, [&](const RawRows& rows) {
    for (int r = 0; r < rows.size(); ++r)
      RETURN_IF_ERROR(buckets[scatter.Uniform(k)]->Add(rows, r));
    return absl::OkStatus();
  }));
  for (auto& w : buckets) RETURN_IF_ERROR(w->Close());
  buckets.clear();

  // Pass 2: shuffle each bucket in memory and stream it out.
  RawRows bucket, shuffled;
  for (int b = 0; b < k; ++b) {
    bucket.Clear(spec.num_fields());
    RETURN_IF_ERROR(ReadBucket(names[b], &bucket));
    ::unlink(names[b].c_str());
    std::vector<int> order(bucket.size());
    for (int i = 0; i < bucket.size(); ++i) order[i] = i;
    Rng rng(SplitMix64(o.shuffle_seed ^ SplitMix64(0x5f0ff1e000000000ull + b)));
    for (int i = bucket.size() - 1; i > 0; --i) {
      std::swap(order[i], order[rng.Uniform(static_cast<uint64_t>(i) + 1)]);
    }
    shuffled.Clear(spec.num_fields());
    for (int i : order) AppendRow(bucket, i, &shuffled);
    RETURN_IF_ERROR(parts->Write(shuffled));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConvertResult> Convert(const ConvertOptions& o) {
  if (o.inputs.empty()) return absl::InvalidArgumentError("convert: no input given");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("convert: no output directory given");
  if (o.target_file_bytes < 1)
    return absl::InvalidArgumentError("convert: target file size must be > 0");
  if (!(o.max_bad_record_fraction >= 0 && o.max_bad_record_fraction <= 1)) {
    return absl::InvalidArgumentError("convert: max_bad_record_fraction must be in [0, 1]");
  }
  ASSIGN_OR_RETURN(const FeatureSpec spec, FeatureSpec::Create(o.features));
  ASSIGN_OR_RETURN(const std::vector<std::string> files, ExpandPath(o.inputs));
  RETURN_IF_ERROR(MakeDirs(o.out_dir));
  ConvertResult result;
  BadRecords bad(o.max_bad_record_fraction);
  PartWriter parts(o.to, spec, o.out_dir, o.target_file_bytes, &result);
  if (o.shuffle) {
    RETURN_IF_ERROR(Shuffle(files, o, spec, &bad, &parts, &result));
  } else {
    RETURN_IF_ERROR(ReadRows(files, o.from, spec, &bad,
                             [&](const RawRows& rows) { return parts.Write(rows); }));
  }
  RETURN_IF_ERROR(parts.Close());
  result.bad_records = bad.bad();
  return result;
}

}  // namespace pstrain
