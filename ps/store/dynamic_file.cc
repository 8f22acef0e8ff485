#include "ps/store/dynamic_file.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/record_frame.h"
#include "common/status.h"

namespace pstrain {
namespace {

constexpr size_t kMetaSize = 112;
constexpr size_t kCountHeaderSize = 8;  // uint32 n | uint32 reserved
constexpr uint32_t kMaxNameBytes = 4096;

template <typename T>
absl::string_view Bytes(const T* p, size_t n) {
  return absl::string_view(reinterpret_cast<const char*>(p), n * sizeof(T));
}

// Bytes of one DYNR row.
size_t RowBytes(int dim, int state_floats) {
  return 8 + 4 + 4 + 8 + 4 * static_cast<size_t>(dim) + 4 * static_cast<size_t>(state_floats);
}

absl::Status AddCounted(absl::string_view tag, uint32_t n,
                        std::initializer_list<absl::string_view> data, BlockWriter* w) {
  char header[kCountHeaderSize];
  EncodeFixed32(header, n);
  EncodeFixed32(header + 4, 0);
  std::vector<absl::string_view> pieces = {absl::string_view(header, sizeof(header))};
  pieces.insert(pieces.end(), data.begin(), data.end());
  return w->Add(tag, pieces);
}

}  // namespace

absl::Status WriteDynamicSnapshot(const std::string& name, const DynamicSnapshot& s,
                                  BlockWriter* w) {
  const size_t n = s.keys.size();
  const size_t dim = static_cast<size_t>(s.dim);
  const size_t sf = static_cast<size_t>(s.state_floats);
  if (s.weights.size() != n * dim || s.state.size() != n * sf || s.counts.size() != n ||
      s.last_pass.size() != n || s.last_step_of.size() != n ||
      s.sketch.size() != static_cast<size_t>(s.sketch_width) * s.sketch_depth ||
      name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("dynamic table '", name, "': the snapshot's sizes do not match"));
  }
  char m[kMetaSize];
  EncodeFixed32(m, kDynamicLayoutVersion);
  EncodeFixed32(m + 4, static_cast<uint32_t>(s.dim));
  EncodeFixed32(m + 8, static_cast<uint32_t>(s.optimizer));
  EncodeFixed32(m + 12, static_cast<uint32_t>(s.state_floats));
  EncodeFixed32(m + 16, s.changed_since);
  EncodeFixed32(m + 20, static_cast<uint32_t>(s.pass));
  EncodeFixed64(m + 24, static_cast<uint64_t>(s.last_step));
  EncodeFixed64(m + 32, n);
  EncodeFixed64(m + 40, s.deleted.size());
  EncodeFixed64(m + 48, static_cast<uint64_t>(s.sketch_width));
  EncodeFixed32(m + 56, static_cast<uint32_t>(s.sketch_depth));
  EncodeFixed32(m + 60, 0);
  EncodeFixed64(m + 64, static_cast<uint64_t>(s.admitted));
  EncodeFixed64(m + 72, static_cast<uint64_t>(s.rejected));
  EncodeFixed64(m + 80, static_cast<uint64_t>(s.evicted_ttl));
  EncodeFixed64(m + 88, static_cast<uint64_t>(s.evicted_capacity));
  EncodeFixed64(m + 96, static_cast<uint64_t>(s.seen));
  EncodeFixed32(m + 104, static_cast<uint32_t>(name.size()));
  EncodeFixed32(m + 108, 0);
  const absl::string_view meta[] = {absl::string_view(m, sizeof(m)), name};
  RETURN_IF_ERROR(w->Add(kDynamicMetaTag, meta));
  for (size_t b = 0; b < n; b += kDynamicRowsPerBlock) {
    const size_t k = std::min<size_t>(kDynamicRowsPerBlock, n - b);
    RETURN_IF_ERROR(AddCounted(kDynamicRowsTag, static_cast<uint32_t>(k),
                               {Bytes(s.keys.data() + b, k), Bytes(s.counts.data() + b, k),
                                Bytes(s.last_pass.data() + b, k),
                                Bytes(s.last_step_of.data() + b, k),
                                Bytes(s.weights.data() + b * dim, k * dim),
                                Bytes(s.state.data() + b * sf, k * sf)},
                               w));
  }
  for (size_t b = 0; b < s.deleted.size(); b += kDynamicKeysPerBlock) {
    const size_t k = std::min<size_t>(kDynamicKeysPerBlock, s.deleted.size() - b);
    RETURN_IF_ERROR(AddCounted(kDynamicDeletedTag, static_cast<uint32_t>(k),
                               {Bytes(s.deleted.data() + b, k)}, w));
  }
  for (size_t b = 0; b < s.sketch.size(); b += kDynamicKeysPerBlock) {
    const size_t k = std::min<size_t>(kDynamicKeysPerBlock, s.sketch.size() - b);
    RETURN_IF_ERROR(AddCounted(kDynamicSketchTag, static_cast<uint32_t>(k),
                               {Bytes(s.sketch.data() + b, k)}, w));
  }
  return absl::OkStatus();
}

namespace {

// The count of a counted block whose items are `item_bytes` each: the payload must be exactly
// the header and n items.
absl::StatusOr<uint32_t> CountOf(BlockReader* r, const Block& block, size_t item_bytes) {
  if (block.payload.size() < kCountHeaderSize) {
    return r->Corrupt(block, absl::StrCat("a payload of ", block.payload.size(),
                                          " bytes, shorter than its 8-byte header"));
  }
  const uint32_t n = DecodeFixed32(block.payload.data());
  if (n == 0 || (block.payload.size() - kCountHeaderSize) != n * item_bytes) {
    return r->Corrupt(block, absl::StrCat("says ", n, " items of ", item_bytes,
                                          " bytes, but its payload has ", block.payload.size(),
                                          " bytes (expected 8 + n x ", item_bytes, ", n >= 1)"));
  }
  return n;
}

template <typename T>
void Append(const char* p, size_t n, std::vector<T>* out) {
  const size_t at = out->size();
  out->resize(at + n);
  std::memcpy(out->data() + at, p, n * sizeof(T));
}

// v ascending and unique from index `from` - 1 on (the previous block's last included).
template <typename T>
bool AscendingFrom(const std::vector<T>& v, size_t from) {
  for (size_t i = std::max<size_t>(from, 1); i < v.size(); ++i) {
    if (!(v[i - 1] < v[i])) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<NamedDynamicSnapshot> ReadDynamicSnapshot(BlockReader* r) {
  Block block;
  ASSIGN_OR_RETURN(bool more, r->Next(&block));
  if (!more) {
    return absl::DataLossError(
        absl::StrCat(r->name(), ": expected a '", kDynamicMetaTag, "' block, found the end"));
  }
  if (block.tag != kDynamicMetaTag) {
    return r->Corrupt(block, absl::StrCat("expected a '", kDynamicMetaTag, "' block"));
  }
  const std::string& p = block.payload;
  if (p.size() < kMetaSize) {
    return r->Corrupt(block, absl::StrCat("a meta of ", p.size(), " bytes, expected at least ",
                                          kMetaSize));
  }
  const char* m = p.data();
  const uint32_t version = DecodeFixed32(m);
  if (version > kDynamicLayoutVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        r->name(), ": a dynamic table of layout version ", version, "; this build reads up to ",
        kDynamicLayoutVersion, " (a newer pstrain wrote it)"));
  }
  if (version == 0) return r->Corrupt(block, "layout version 0");
  NamedDynamicSnapshot out;
  DynamicSnapshot& s = out.snapshot;
  s.dim = static_cast<int32_t>(DecodeFixed32(m + 4));
  const uint32_t optimizer = DecodeFixed32(m + 8);
  s.state_floats = static_cast<int32_t>(DecodeFixed32(m + 12));
  s.changed_since = DecodeFixed32(m + 16);
  s.pass = static_cast<int32_t>(DecodeFixed32(m + 20));
  s.last_step = static_cast<int64_t>(DecodeFixed64(m + 24));
  const uint64_t rows = DecodeFixed64(m + 32);
  const uint64_t deleted = DecodeFixed64(m + 40);
  const uint64_t sketch_width = DecodeFixed64(m + 48);
  const uint32_t sketch_depth = DecodeFixed32(m + 56);
  s.admitted = static_cast<int64_t>(DecodeFixed64(m + 64));
  s.rejected = static_cast<int64_t>(DecodeFixed64(m + 72));
  s.evicted_ttl = static_cast<int64_t>(DecodeFixed64(m + 80));
  s.evicted_capacity = static_cast<int64_t>(DecodeFixed64(m + 88));
  s.seen = static_cast<int64_t>(DecodeFixed64(m + 96));
  const uint32_t name_bytes = DecodeFixed32(m + 104);
  if (name_bytes > kMaxNameBytes || p.size() != kMetaSize + name_bytes) {
    return r->Corrupt(block, absl::StrCat("a name of ", name_bytes, " bytes in a meta of ",
                                          p.size(), " bytes (expected ", kMetaSize,
                                          " + the name, at most ", kMaxNameBytes, ")"));
  }
  out.name = p.substr(kMetaSize);
  // dim is 1 + a table's dim; an optimizer keeps at most a few floats per weight.
  if (s.dim < 1 || s.dim > kMaxTableDim + 1) {
    return r->Corrupt(block, absl::StrCat("dim ", s.dim, ", expected 1..", kMaxTableDim + 1));
  }
  if (!OptimizerType_IsValid(static_cast<int>(optimizer))) {
    return r->Corrupt(block, absl::StrCat("unknown optimizer ", optimizer));
  }
  s.optimizer = static_cast<OptimizerType>(optimizer);
  if (s.state_floats < 0 || s.state_floats > 4 * s.dim + 16) {
    return r->Corrupt(block, absl::StrCat("state_floats ", s.state_floats, " for dim ", s.dim));
  }
  if (s.last_step < 0 || s.admitted < 0 || s.rejected < 0 || s.evicted_ttl < 0 ||
      s.evicted_capacity < 0 || s.seen < 0) {
    return r->Corrupt(block, "a negative step or counter");
  }
  if ((sketch_width == 0) != (sketch_depth == 0) || sketch_depth > 16 ||
      sketch_width > (uint64_t{1} << 32)) {
    return r->Corrupt(block, absl::StrCat("a sketch of ", sketch_width, " x ", sketch_depth,
                                          " counters (expected both 0, or width <= 2^32 and "
                                          "depth 1..16)"));
  }
  // Every count against what the file can hold, before anything is allocated for it.
  const uint64_t size = r->size();
  const size_t row_bytes = RowBytes(s.dim, s.state_floats);
  if (rows > size / row_bytes || deleted > size / 8 ||
      sketch_width * sketch_depth > size / 4) {
    return r->Corrupt(block, absl::StrCat("claims ", rows, " rows, ", deleted, " tombstones and a ",
                                          sketch_width, " x ", sketch_depth,
                                          " sketch, more than its ", size, " bytes can hold"));
  }
  if (s.changed_since == 0 && deleted > 0) {
    return r->Corrupt(block, "a full snapshot (changed_since 0) with tombstones");
  }
  s.sketch_width = static_cast<int64_t>(sketch_width);
  s.sketch_depth = static_cast<int>(sketch_depth);
  s.keys.reserve(rows);
  s.counts.reserve(rows);
  s.last_pass.reserve(rows);
  s.last_step_of.reserve(rows);
  s.weights.reserve(rows * s.dim);
  s.state.reserve(rows * s.state_floats);
  s.deleted.reserve(deleted);
  s.sketch.reserve(sketch_width * sketch_depth);

  // The group's other blocks, in order: rows, tombstones, sketch.
  int stage = 0;
  while (true) {
    ASSIGN_OR_RETURN(std::string tag, r->PeekTag());
    int block_stage;
    if (tag == kDynamicRowsTag) {
      block_stage = 0;
    } else if (tag == kDynamicDeletedTag) {
      block_stage = 1;
    } else if (tag == kDynamicSketchTag) {
      block_stage = 2;
    } else {
      break;  // the end, or the next group
    }
    ASSIGN_OR_RETURN(more, r->Next(&block));
    if (block_stage < stage) {
      return r->Corrupt(block, "out of order (expected rows, then tombstones, then the sketch)");
    }
    stage = block_stage;
    const char* d = block.payload.data() + kCountHeaderSize;
    if (block_stage == 0) {
      ASSIGN_OR_RETURN(const uint32_t n, CountOf(r, block, row_bytes));
      if (s.keys.size() + n > rows) {
        return r->Corrupt(block, absl::StrCat("more rows than the meta's ", rows));
      }
      const size_t from = s.keys.size();
      Append(d, n, &s.keys);
      d += 8 * size_t{n};
      Append(d, n, &s.counts);
      d += 4 * size_t{n};
      Append(d, n, &s.last_pass);
      d += 4 * size_t{n};
      Append(d, n, &s.last_step_of);
      d += 8 * size_t{n};
      Append(d, size_t{n} * s.dim, &s.weights);
      d += 4 * size_t{n} * s.dim;
      Append(d, size_t{n} * s.state_floats, &s.state);
      if (!AscendingFrom(s.keys, from)) {
        return r->Corrupt(block, "keys not ascending and unique");
      }
    } else if (block_stage == 1) {
      ASSIGN_OR_RETURN(const uint32_t n, CountOf(r, block, 8));
      if (s.deleted.size() + n > deleted) {
        return r->Corrupt(block, absl::StrCat("more tombstones than the meta's ", deleted));
      }
      const size_t from = s.deleted.size();
      Append(d, n, &s.deleted);
      if (!AscendingFrom(s.deleted, from)) {
        return r->Corrupt(block, "tombstones not ascending and unique");
      }
    } else {
      ASSIGN_OR_RETURN(const uint32_t n, CountOf(r, block, 4));
      if (s.sketch.size() + n > sketch_width * sketch_depth) {
        return r->Corrupt(block, "more sketch counters than the meta's width x depth");
      }
      Append(d, n, &s.sketch);
    }
  }
  if (s.keys.size() != rows || s.deleted.size() != deleted ||
      s.sketch.size() != sketch_width * sketch_depth) {
    return absl::DataLossError(absl::StrCat(
        r->name(), ": dynamic table '", out.name, "' holds ", s.keys.size(), " rows, ",
        s.deleted.size(), " tombstones and ", s.sketch.size(), " sketch counters; its meta says ",
        rows, ", ", deleted, " and ", sketch_width * sketch_depth));
  }
  return out;
}

absl::Status WriteDynamicFile(const std::string& path, const std::string& name,
                              const DynamicSnapshot& snapshot) {
  ASSIGN_OR_RETURN(auto w, BlockWriter::Create(path));
  RETURN_IF_ERROR(WriteDynamicSnapshot(name, snapshot, w.get()));
  return w->Finish();
}

absl::StatusOr<NamedDynamicSnapshot> ReadDynamicFile(const std::string& path) {
  ASSIGN_OR_RETURN(auto r, BlockReader::Open(path));
  ASSIGN_OR_RETURN(NamedDynamicSnapshot s, ReadDynamicSnapshot(r.get()));
  Block block;
  ASSIGN_OR_RETURN(const bool more, r->Next(&block));
  if (more) return r->Corrupt(block, "expected the end of a dynamic table's file");
  return s;
}

}  // namespace pstrain
