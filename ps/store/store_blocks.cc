#include "ps/store/store_blocks.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/record_frame.h"
#include "common/status.h"
#include "ps/store/table_rows.h"

namespace pstrain {
namespace {

template <typename T>
absl::string_view Bytes(const T* p, size_t n) {
  return absl::string_view(reinterpret_cast<const char*>(p), n * sizeof(T));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Embedding and dense stores
// ---------------------------------------------------------------------------------------------

namespace {

constexpr size_t kEmbeddingMetaSize = 48;
constexpr size_t kRowsHeaderSize = 8;
constexpr size_t kDenseHeaderSize = 40;
constexpr int64_t kRowsPerSnapshotRange = int64_t{1} << 20;

absl::Status WriteEmbeddingMeta(const EmbeddingMeta& m, BlockWriter* w) {
  char p[kEmbeddingMetaSize];
  EncodeFixed64(p, m.begin);
  EncodeFixed64(p + 8, m.end);
  EncodeFixed32(p + 16, m.dim);
  EncodeFixed32(p + 20, static_cast<uint32_t>(m.optimizer));
  EncodeFixed32(p + 24, m.state_floats);
  EncodeFixed32(p + 28, 0);  // reserved
  EncodeFixed64(p + 32, m.last_step);
  EncodeFixed64(p + 40, 0);  // reserved
  return w->Add(kEmbeddingMetaTag, absl::string_view(p, sizeof(p)));
}

// Writes rows [0, n) of the given arrays as EMBR blocks.
absl::Status WriteEmbeddingRows(int64_t n, const int64_t* ids, const float* weights,
                                const float* state, int dim, int state_floats, BlockWriter* w) {
  for (int64_t b = 0; b < n; b += kRowsPerBlock) {
    const int64_t k = std::min<int64_t>(kRowsPerBlock, n - b);
    char header[kRowsHeaderSize];
    EncodeFixed32(header, static_cast<uint32_t>(k));
    EncodeFixed32(header + 4, 0);  // reserved
    const absl::string_view pieces[] = {absl::string_view(header, sizeof(header)),
                                        Bytes(ids + b, k), Bytes(weights + b * dim, k * dim),
                                        Bytes(state + b * state_floats, k * state_floats)};
    RETURN_IF_ERROR(w->Add(kEmbeddingRowsTag, pieces));
  }
  return absl::OkStatus();
}

absl::Status WriteSnapshotRows(const EmbeddingSnapshot& s, BlockWriter* w) {
  return WriteEmbeddingRows(s.rows(), s.ids.data(), s.weights.data(), s.state.data(), s.dim,
                            s.state_floats, w);
}

EmbeddingMeta MetaOf(const EmbeddingSnapshot& s) {
  return EmbeddingMeta{s.begin, s.end, s.dim, s.optimizer, s.state_floats, s.last_step};
}

// OK if the block read by Next() (`more` = not at the end) has the expected tag.
absl::Status ExpectTag(BlockReader* r, const Block& block, bool more, absl::string_view tag) {
  if (!more) {
    return absl::DataLossError(
        absl::StrCat(r->name(), ": expected a '", tag, "' block, found the end of the file"));
  }
  if (block.tag != tag) {
    return r->Corrupt(block, absl::StrCat("expected a '", tag, "' block"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveEmbeddingStore(const EmbeddingSnapshot& s, BlockWriter* w) {
  RETURN_IF_ERROR(WriteEmbeddingMeta(MetaOf(s), w));
  return WriteSnapshotRows(s, w);
}

namespace {

// A streamed save of `store` (live, or as an Image of it holds it): rows_of(ids, changed_since)
// and range_of(from, to, changed_since) are the store's or the Image's SnapshotRows / Snapshot.
template <typename RowsOf, typename RangeOf>
absl::Status SaveStreamed(const EmbeddingStore& store, int64_t last_step, uint32_t changed_since,
                          const RowsOf& rows_of, const RangeOf& range_of, BlockWriter* w,
                          int64_t* rows_written) {
  int64_t rows = 0;
  auto write = [&](const EmbeddingSnapshot& snap) {
    rows += snap.rows();
    return WriteSnapshotRows(snap, w);
  };
  const EmbeddingMeta meta{store.begin(), store.end(),          store.dim(),
                           store.optimizer().type(), store.state_floats(), last_step};
  RETURN_IF_ERROR(WriteEmbeddingMeta(meta, w));
  // A delta from the change logs: one walk of the logs, then the rows in pieces.
  const std::optional<std::vector<int64_t>> changed =
      changed_since > 0 ? store.ChangedRows(store.begin(), store.end(), changed_since)
                        : std::nullopt;
  if (changed) {
    const absl::Span<const int64_t> ids(*changed);
    for (size_t at = 0; at < ids.size(); at += kRowsPerSnapshotRange) {
      RETURN_IF_ERROR(write(rows_of(ids.subspan(at, kRowsPerSnapshotRange), changed_since)));
    }
  } else {
    for (int64_t from = store.begin(); from < store.end(); from += kRowsPerSnapshotRange) {
      RETURN_IF_ERROR(write(range_of(from, from + kRowsPerSnapshotRange, changed_since)));
    }
  }
  if (rows_written != nullptr) *rows_written += rows;
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveEmbeddingStore(const EmbeddingStore& store, BlockWriter* w,
                                uint32_t changed_since) {
  return SaveStreamed(
      store, store.last_step(), changed_since,
      [&](absl::Span<const int64_t> ids, uint32_t c) { return store.SnapshotRows(ids, c); },
      [&](int64_t from, int64_t to, uint32_t c) { return store.Snapshot(from, to, c); }, w,
      /*rows_written=*/nullptr);
}

absl::Status SaveEmbeddingStore(const EmbeddingStore::Image& image, BlockWriter* w,
                                uint32_t changed_since, int64_t* rows_written) {
  return SaveStreamed(
      image.store(), image.last_step(), changed_since,
      [&](absl::Span<const int64_t> ids, uint32_t c) { return image.SnapshotRows(ids, c); },
      [&](int64_t from, int64_t to, uint32_t c) { return image.Snapshot(from, to, c); }, w,
      rows_written);
}

absl::StatusOr<EmbeddingMeta> LoadEmbeddingRows(BlockReader* r, const EmbeddingRowsFn& fn) {
  Block block;
  ASSIGN_OR_RETURN(bool more, r->Next(&block));
  RETURN_IF_ERROR(ExpectTag(r, block, more, kEmbeddingMetaTag));
  if (block.payload.size() != kEmbeddingMetaSize) {
    return r->Corrupt(block, absl::StrCat("payload is ", block.payload.size(), " bytes, expected ",
                                          kEmbeddingMetaSize));
  }
  const char* p = block.payload.data();
  EmbeddingMeta m;
  m.begin = static_cast<int64_t>(DecodeFixed64(p));
  m.end = static_cast<int64_t>(DecodeFixed64(p + 8));
  m.dim = static_cast<int>(DecodeFixed32(p + 16));
  const uint32_t type = DecodeFixed32(p + 20);
  m.state_floats = static_cast<int>(DecodeFixed32(p + 24));
  m.last_step = static_cast<int64_t>(DecodeFixed64(p + 32));
  if (m.begin < 0 || m.end <= m.begin || m.dim <= 0 || m.state_floats < 0 ||
      !OptimizerType_IsValid(static_cast<int>(type))) {
    return r->Corrupt(
        block, absl::StrCat("invalid embedding meta: range [", m.begin, ", ", m.end, "), dim ",
                            m.dim, ", optimizer ", type, ", state ", m.state_floats));
  }
  m.optimizer = static_cast<OptimizerType>(type);

  const uint64_t row_bytes =
      8 + 4 * (static_cast<uint64_t>(m.dim) + static_cast<uint64_t>(m.state_floats));
  int64_t prev = m.begin - 1;
  std::vector<int64_t> ids;
  std::vector<float> weights, state;
  while (true) {
    ASSIGN_OR_RETURN(const std::string tag, r->PeekTag());
    if (tag != kEmbeddingRowsTag) break;
    ASSIGN_OR_RETURN(more, r->Next(&block));
    const std::string& pl = block.payload;
    const uint64_t n = pl.size() >= kRowsHeaderSize ? DecodeFixed32(pl.data()) : 0;
    // Divide rather than multiply, so that a corrupt count cannot overflow the check.
    const uint64_t body = pl.size() >= kRowsHeaderSize ? pl.size() - kRowsHeaderSize : 1;
    if (body % row_bytes != 0 || body / row_bytes != n) {
      return r->Corrupt(block, absl::StrCat("payload of ", pl.size(), " bytes does not hold ", n,
                                            " rows of ", row_bytes, " bytes"));
    }
    // Copy out of the payload: its floats need not be aligned.
    ids.resize(n);
    weights.resize(n * m.dim);
    state.resize(n * m.state_floats);
    const char* q = pl.data() + kRowsHeaderSize;
    std::memcpy(ids.data(), q, n * 8);
    std::memcpy(weights.data(), q + n * 8, weights.size() * 4);
    std::memcpy(state.data(), q + n * 8 + weights.size() * 4, state.size() * 4);
    for (uint64_t i = 0; i < n; ++i) {
      if (ids[i] <= prev || ids[i] >= m.end) {
        return r->Corrupt(
            block, absl::StrCat("row ", i, " has id ", ids[i], ", not ascending inside [", m.begin,
                                ", ", m.end, ") after ", prev));
      }
      prev = ids[i];
    }
    RETURN_IF_ERROR(fn(m, ids, weights.data(), state.data()));
  }
  return m;
}

absl::Status LoadEmbeddingStores(BlockReader* reader, absl::Span<EmbeddingStore* const> stores,
                                 int64_t* rows_loaded, ParameterLoadMode mode) {
  std::vector<EmbeddingStore*> sorted(stores.begin(), stores.end());
  std::sort(sorted.begin(), sorted.end(),
            [](EmbeddingStore* a, EmbeddingStore* b) { return a->begin() < b->begin(); });
  EmbeddingSnapshot part;
  auto place = [&](const EmbeddingMeta& m, absl::Span<const int64_t> ids, const float* weights,
                   const float* state) -> absl::Status {
    // ids ascend, so each store's rows are one run: find the runs by binary search.
    for (EmbeddingStore* store : sorted) {
      const auto lo = std::lower_bound(ids.begin(), ids.end(), store->begin());
      const auto hi = std::lower_bound(lo, ids.end(), store->end());
      if (lo == hi) continue;
      const int64_t a = lo - ids.begin(), k = hi - lo;
      part.begin = m.begin;
      part.end = m.end;
      part.dim = m.dim;
      part.optimizer = m.optimizer;
      part.state_floats = m.state_floats;
      part.last_step = mode.keep_step ? m.last_step : 0;
      part.ids.assign(lo, hi);
      const Optimizer& opt = store->optimizer();
      if (m.dim != store->dim() &&
          (!mode.keep_optimizer_state || m.optimizer == opt.type())) {
        // Written at another width (a PS partition store keeps its table's, a stride-wide store
        // the model's, ps/store/table_rows.h): each row resized, its slots with it.
        const bool keep = mode.keep_optimizer_state;
        part.dim = store->dim();
        part.optimizer = opt.type();
        part.state_floats = store->state_floats();
        part.weights.resize(k * part.dim);
        part.state.resize(k * part.state_floats);
        for (int64_t i = 0; i < k; ++i) {
          RETURN_IF_ERROR(Annotate(
              ResizeRow(opt, m.dim, weights + (a + i) * m.dim, m.state_floats,
                        keep ? state + (a + i) * m.state_floats : nullptr, part.dim,
                        &part.weights[i * part.dim], &part.state[i * part.state_floats]),
              reader->name()));
        }
        RETURN_IF_ERROR(Annotate(store->Restore(part), reader->name()));
        if (rows_loaded != nullptr) *rows_loaded += k;
        continue;
      }
      part.weights.assign(weights + a * m.dim, weights + (a + k) * m.dim);
      if (mode.keep_optimizer_state) {
        part.state.assign(state + a * m.state_floats, state + (a + k) * m.state_floats);
      } else {  // every row's slots as the store's optimizer starts them
        part.optimizer = opt.type();
        part.state_floats = store->state_floats();
        part.state.resize(k * part.state_floats);
        for (int64_t i = 0; i < k; ++i) opt.InitState(&part.state[i * part.state_floats], m.dim);
      }
      RETURN_IF_ERROR(Annotate(store->Restore(part), reader->name()));
      if (rows_loaded != nullptr) *rows_loaded += k;
    }
    return absl::OkStatus();
  };
  std::vector<int64_t> moved;
  auto fn = [&](const EmbeddingMeta& m, absl::Span<const int64_t> ids, const float* weights,
                const float* state) -> absl::Status {
    if (mode.moves.empty()) return place(m, ids, weights, state);
    // Each move's rows are one run of the ascending ids; shifted, they stay ascending.
    for (const ParameterLoadMode::RowMove& mv : mode.moves) {
      const auto lo = std::lower_bound(ids.begin(), ids.end(), mv.from_begin);
      const auto hi = std::lower_bound(lo, ids.end(), mv.from_end);
      if (lo == hi) continue;
      const int64_t a = lo - ids.begin();
      moved.assign(lo, hi);
      for (int64_t& id : moved) id += mv.to_begin - mv.from_begin;
      RETURN_IF_ERROR(place(m, moved, weights + a * m.dim, state + a * m.state_floats));
    }
    return absl::OkStatus();
  };
  return LoadEmbeddingRows(reader, fn).status();
}

ParameterLoadMode WarmStartLoadMode(bool reset_optimizer,
                                    const std::optional<TableWarmStart>& tables) {
  ParameterLoadMode mode;
  mode.keep_step = false;
  mode.keep_optimizer_state = !reset_optimizer;
  mode.skip_unknown_dynamic = true;
  if (tables) {
    for (const TableWarmStart::Take& t : tables->taken) {
      if (t.dynamic) continue;  // loaded by name (LoadDynamicTables), not as a row range
      mode.moves.push_back({t.from_begin, t.from_end, t.to_begin});
    }
    // Nothing taken: no move would load every row; an empty range loads none.
    if (mode.moves.empty()) mode.moves.push_back({0, 0, 0});
    mode.dense = tables->dense;
  }
  return mode;
}

absl::Status SaveDenseStore(const DenseSnapshot& s, BlockWriter* w) {
  char header[kDenseHeaderSize];
  EncodeFixed64(header, s.begin);
  EncodeFixed64(header + 8, s.size);
  EncodeFixed32(header + 16, static_cast<uint32_t>(s.optimizer));
  EncodeFixed32(header + 20, 0);  // reserved
  EncodeFixed64(header + 24, s.state_floats);
  EncodeFixed64(header + 32, s.last_step);
  const absl::string_view pieces[] = {absl::string_view(header, sizeof(header)),
                                      Bytes(s.weights.data(), s.weights.size()),
                                      Bytes(s.state.data(), s.state.size())};
  return w->Add(kDenseTag, pieces);
}

DenseSnapshot DenseSnapshotForLoad(DenseSnapshot saved, const DenseStore& store,
                                   ParameterLoadMode mode) {
  if (!mode.keep_step) saved.last_step = 0;
  if (!mode.keep_optimizer_state) {
    const Optimizer& opt = store.optimizer();
    saved.optimizer = opt.type();
    saved.state_floats = opt.StateFloats(saved.size);
    saved.state.assign(saved.state_floats, 0.f);
    opt.InitState(saved.state.data(), saved.size);
  }
  return saved;
}

absl::StatusOr<DenseSnapshot> LoadDenseSnapshot(BlockReader* r) {
  Block block;
  ASSIGN_OR_RETURN(const bool more, r->Next(&block));
  RETURN_IF_ERROR(ExpectTag(r, block, more, kDenseTag));
  const std::string& pl = block.payload;
  if (pl.size() < kDenseHeaderSize) {
    return r->Corrupt(block, absl::StrCat("payload of ", pl.size(), " bytes is shorter than the ",
                                          kDenseHeaderSize, "-byte dense header"));
  }
  DenseSnapshot s;
  s.begin = static_cast<int64_t>(DecodeFixed64(pl.data()));
  s.size = static_cast<int64_t>(DecodeFixed64(pl.data() + 8));
  const uint32_t type = DecodeFixed32(pl.data() + 16);
  s.state_floats = static_cast<int64_t>(DecodeFixed64(pl.data() + 24));
  s.last_step = static_cast<int64_t>(DecodeFixed64(pl.data() + 32));
  // Compare in floats, not bytes, so that a corrupt huge size cannot overflow the check.
  const uint64_t floats = (pl.size() - kDenseHeaderSize) / 4;
  if (s.begin < 0 || s.size <= 0 || s.state_floats < 0 ||
      !OptimizerType_IsValid(static_cast<int>(type)) || (pl.size() - kDenseHeaderSize) % 4 != 0 ||
      static_cast<uint64_t>(s.size) > floats ||
      static_cast<uint64_t>(s.state_floats) != floats - s.size) {
    return r->Corrupt(block, absl::StrCat("invalid dense slice: begin ", s.begin, ", size ", s.size,
                                          ", optimizer ", type, ", state ", s.state_floats,
                                          " in a payload of ", pl.size(), " bytes"));
  }
  s.optimizer = static_cast<OptimizerType>(type);
  s.weights.resize(s.size);
  s.state.resize(s.state_floats);
  std::memcpy(s.weights.data(), pl.data() + kDenseHeaderSize, s.size * 4);
  std::memcpy(s.state.data(), pl.data() + kDenseHeaderSize + s.size * 4, s.state_floats * 4);
  return s;
}

}  // namespace pstrain
