// Compact table widths (docs/ARCHITECTURE.md "Tables"): a PS shard keeps each table's partition
// stores at the table's width 1 + dim, while its gather and apply stay stride-wide (the narrow
// rows expanded with zeros, the gradients cut); and a checkpoint group written at one width loads
// into a store of another (compact PS files into a stride-wide store, stride files of before
// compact widths into a compact store), with the optimizer slots resized alongside.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "gtest/gtest.h"
#include "ps/server/shard.h"
#include "ps/store/embedding_store.h"
#include "ps/store/store_blocks.h"
#include "ps/store/table_rows.h"

namespace pstrain {
namespace {

constexpr int kStride = 17;  // 1 + max dim: a dim-16 table beside a dim-4 one (width 5)

// Every one of the stride's floats set, so that a width's cut shows.
void Init(int64_t row, float* out) {
  for (int j = 0; j < kStride; ++j) out[j] = 0.5f + 0.01f * static_cast<float>(row) + 0.001f * j;
}

Shard::Options Options(bool widths) {
  Shard::Options o;
  o.rows = 70;
  o.partitions = 3;
  o.table_splits = {{40, 2, widths ? 5 : 0}, {30, 1, widths ? kStride : 0}};
  o.row_dim = kStride;
  o.sparse_optimizer.set_type(SGD);
  o.sparse_optimizer.set_learning_rate(0.1f);
  o.dense_optimizer.set_type(SGD);
  o.dense_optimizer.set_learning_rate(0.1f);
  o.row_init = Init;
  return o;
}

TEST(ShardWidths, EachTablesStoresKeepItsWidthAndTheStrideIsExpanded) {
  auto shard = Shard::Create(Options(true));
  ASSERT_TRUE(shard.ok()) << shard.status();
  const auto& stores = (*shard)->stores();
  ASSERT_EQ(stores.size(), 3u);
  EXPECT_EQ(stores[0]->dim(), 5);
  EXPECT_EQ(stores[1]->dim(), 5);
  EXPECT_EQ(stores[2]->dim(), kStride);

  const std::vector<int64_t> ids = {3, 45, 39};
  std::vector<float> rows(ids.size() * kStride, -1.f);
  ASSERT_TRUE((*shard)->GatherInto(ids, rows.data(), nullptr).ok());
  std::vector<float> want(kStride);
  for (size_t i = 0; i < ids.size(); ++i) {
    Init(ids[i], want.data());
    const int width = ids[i] < 40 ? 5 : kStride;
    for (int j = 0; j < kStride; ++j) {
      EXPECT_EQ(rows[i * kStride + j], j < width ? want[j] : 0.f) << "row " << ids[i] << " " << j;
    }
  }

  // A stride-wide gradient: the narrow rows take its first 5 floats (the tail, which the model
  // never produces, is dropped, not applied to the next row).
  std::vector<float> grads(ids.size() * kStride, 1.f);
  ASSERT_TRUE((*shard)->Apply(ids, grads.data(), nullptr, /*step=*/1).ok());
  ASSERT_TRUE((*shard)->GatherInto(ids, rows.data(), nullptr).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    Init(ids[i], want.data());
    const int width = ids[i] < 40 ? 5 : kStride;
    for (int j = 0; j < kStride; ++j) {
      EXPECT_FLOAT_EQ(rows[i * kStride + j], j < width ? want[j] - 0.1f : 0.f)
          << "row " << ids[i] << " " << j;
    }
  }

  // A narrow table's trained row costs its width, not the stride.
  auto wide = Shard::Create(Options(false));
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ((*wide)->stores()[0]->dim(), kStride);
  EXPECT_LT(stores[0]->stats().chunk_bytes, (*wide)->stores()[0]->stats().chunk_bytes);
}

// A map without widths is the one-table map of before: every store at the stride.
TEST(ShardWidths, NoWidthsKeepTheStride) {
  Shard::Options o = Options(false);
  o.table_splits.clear();
  auto shard = Shard::Create(o);
  ASSERT_TRUE(shard.ok());
  for (const auto& s : (*shard)->stores()) EXPECT_EQ(s->dim(), kStride);
  // A width above the stride (a model whose rows are narrower than 1 + dim) keeps the stride.
  o = Options(true);
  o.table_splits[0].row_dim = kStride + 4;
  shard = Shard::Create(o);
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ((*shard)->stores()[0]->dim(), kStride);
}

std::unique_ptr<EmbeddingStore> Store(int dim, OptimizerType type) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(0.1f);
  c.set_initial_accumulator(0.25f);
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = 100;
  o.dim = dim;
  o.optimizer = *Optimizer::Create(c);
  o.row_init = NarrowRowInit(Init, kStride, dim);
  return *EmbeddingStore::Create(std::move(o));
}

// Writes `from`'s rows to a block file and loads them into `to`.
void SaveAndLoad(const EmbeddingStore& from, EmbeddingStore* to, ParameterLoadMode mode = {}) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/widths_", getpid());
  auto w = BlockWriter::Create(path);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(SaveEmbeddingStore(from, w->get()).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto r = BlockReader::Open(path);
  ASSERT_TRUE(r.ok());
  int64_t loaded = 0;
  EmbeddingStore* stores[] = {to};
  const absl::Status s = LoadEmbeddingStores(r->get(), stores, &loaded, mode);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(loaded, from.Snapshot().rows());
  unlink(path.c_str());
}

TEST(ShardWidths, CheckpointRowsLoadAtAnotherWidth) {
  for (OptimizerType type : {SGD, ADAGRAD, ADAM, FTRL}) {
    SCOPED_TRACE(OptimizerType_Name(type));
    auto narrow = Store(5, type);
    const std::vector<int64_t> ids = {2, 7};
    std::vector<float> g(ids.size() * 5, 0.5f);
    ASSERT_TRUE(narrow->Apply(ids, g.data(), 1).ok());
    const EmbeddingSnapshot n = narrow->Snapshot();

    // Compact into the stride (predict, serve or `train` from a PS job's checkpoint).
    auto wide = Store(kStride, type);
    SaveAndLoad(*narrow, wide.get());
    const EmbeddingSnapshot w = wide->Snapshot();
    ASSERT_EQ(w.ids, n.ids);
    const Optimizer& opt = wide->optimizer();
    std::vector<float> init_state(opt.StateFloats(kStride));
    opt.InitState(init_state.data(), kStride);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < kStride; ++j) {
        EXPECT_EQ(w.weights[i * kStride + j], j < 5 ? n.weights[i * 5 + j] : 0.f);
      }
      for (int s = 0; s < opt.state_slots(); ++s) {
        for (int j = 0; j < kStride; ++j) {
          EXPECT_EQ(w.state[i * w.state_floats + s * kStride + j],
                    j < 5 ? n.state[i * n.state_floats + s * 5 + j] : init_state[s * kStride + j]);
        }
      }
      for (int e = 0; e < opt.state_extras(); ++e) {
        EXPECT_EQ(w.state[(i + 1) * w.state_floats - 1 - e],
                  n.state[(i + 1) * n.state_floats - 1 - e]);
      }
    }

    // And back (a stride file, as every checkpoint before compact widths, into a compact store):
    // the same rows as the narrow store had.
    auto again = Store(5, type);
    SaveAndLoad(*wide, again.get());
    const EmbeddingSnapshot a = again->Snapshot();
    EXPECT_EQ(a.ids, n.ids);
    EXPECT_EQ(a.weights, n.weights);
    EXPECT_EQ(a.state, n.state);

    // A warm start that resets the slots: InitState's at the store's width.
    auto reset = Store(kStride, type);
    SaveAndLoad(*narrow, reset.get(), ParameterLoadMode{false, false});
    const EmbeddingSnapshot r = reset->Snapshot();
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(std::vector<float>(r.state.begin() + i * r.state_floats,
                                   r.state.begin() + (i + 1) * r.state_floats),
                init_state);
    }
  }
}

}  // namespace
}  // namespace pstrain
