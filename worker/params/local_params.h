// ParameterAccess over in-process stores: the single-process trainer's "parameter server". The
// same EmbeddingStore / DenseStore classes sit behind gRPC on PS shards.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ps/store/dense_store.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/embedding_store.h"
#include "ps/store/store_memory.h"
#include "ps/store/table_rows.h"
#include "pstrain/config.pb.h"
#include "worker/model/model.h"
#include "worker/params/params.h"

namespace pstrain {

// Thread-safe (the stores are).
//
// Background pushes (train.async_local_updates): StartPush copies the gradients and returns; a
// background thread applies them while the caller computes the next step. One push at a time:
// StartPush first waits for the previous one. Push and Pull stay synchronous.
class LocalParams : public ParameterAccess, private InProcessParams {
 public:
  // One embedding store for rows [0, total_rows) initialized lazily by model.InitRow(row, seed),
  // and one dense store initialized by model.InitDense(seed). `threads` splits each Pull/Push.
  // `model` must outlive the parameters: a row's first pull or push calls its InitRow.
  // `tables` (worker/eval/model_inputs.h StoreTablesOf) gives the named tables' initializer and
  // optimizers; its null row_init is model.InitRow. With tables.widths (named tables), one store
  // per table at the table's width 1 + dim instead (compact widths, docs/ARCHITECTURE.md
  // "Tables"): Pull / Push and the in-process calls still see rows at the stride row_dim(), the
  // narrow rows expanded with zeros and the gradients cut to the width (ps/store/table_rows.h).
  static absl::StatusOr<std::unique_ptr<LocalParams>> Create(const Model& model,
                                                             int64_t total_rows,
                                                             const Config& config, int threads,
                                                             StoreTables tables = {});

  // Tables (stores) one LocalParams holds at most.
  static constexpr size_t kMaxTables = 65536;

  int row_dim() const override { return row_dim_; }
  int64_t dense_size() const override { return dense_->size(); }
  absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) override;
  absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads,
                    const float* dense_grad, int64_t step) override;
  // Synchronous (ParameterAccess's default) until EnableBackgroundPush; then see above. The op's
  // Wait must come before the next StartPush (TrainStep does so).
  ParamsOp StartPush(absl::Span<const int64_t> ids, const float* row_grads,
                     const float* dense_grad, int64_t step) override;
  // Starts the background thread; call once, before training.
  void EnableBackgroundPush();
  // This object, until EnableBackgroundPush (background pushes stay with StartPush).
  InProcessParams* in_process() override {
    return background_.joinable() ? nullptr : static_cast<InProcessParams*>(this);
  }
  ~LocalParams() override;

  // What the stores hold now: the touched rows, the dense vector and their optimizer slots.
  StoreMemory memory() const {
    StoreMemory m;
    for (const auto& s : stores_) m += MemoryOf(*s);
    m += MemoryOf(*dense_);
    for (const DynamicTable& t : dynamic_) {
      // A live row's weights and slots; total: what the store measures it holds.
      const DynamicEmbeddingStore::Metrics dm = t.store->metrics();
      m.parameter_bytes += dm.rows_live * t.store->dim() * 4;
      m.optimizer_bytes += dm.rows_live * t.store->state_floats() * 4;
      m.total_bytes += dm.bytes;
    }
    return m;
  }

  // The embedding stores, ascending by row range: one of [0, total_rows) at the stride without
  // named tables, one per table at its width with them.
  const std::vector<EmbeddingStore*>& embeddings() const { return store_ptrs_; }
  // The one store of a config without named tables (a programmer's error with several: use
  // embeddings()).
  EmbeddingStore* embedding() const;
  int64_t total_rows() const { return stores_.back()->end(); }
  DenseStore* dense() { return dense_.get(); }

  // Dynamic tables (issue 28, docs/ARCHITECTURE.md "Dynamic tables"): one DynamicEmbeddingStore
  // per dynamic table, in dynamic-index order (FeatureSpec::dynamic_table). Every call above
  // routes the negative ids (common/dynamic_rows.h) to the store of their table by key: a
  // gathered row is the store's 1 + dim floats and zeros to row_dim(); an update reads the first
  // 1 + dim floats of its gradient. Without dynamic stores the calls are the fixed store's
  // alone, as before. Call once, before training (not thread-safe against the calls above).
  struct DynamicTable {
    std::string name;
    std::unique_ptr<DynamicEmbeddingStore> store;
  };
  absl::Status AddDynamicTables(std::vector<DynamicTable> tables);
  int num_dynamic() const { return static_cast<int>(dynamic_.size()); }
  DynamicEmbeddingStore* dynamic_store(int d) { return dynamic_[d].store.get(); }
  const std::string& dynamic_name(int d) const { return dynamic_[d].name; }
  // The pass ("day") every dynamic store records in the rows it updates (TTL in passes).
  void SetPass(int32_t pass) {
    for (DynamicTable& t : dynamic_) t.store->SetPass(pass);
  }

 private:
  std::vector<DynamicTable> dynamic_;
  std::vector<std::unique_ptr<EmbeddingStore>> stores_;
  std::vector<EmbeddingStore*> store_ptrs_;
  int row_dim_ = 0;
  std::unique_ptr<DenseStore> dense_;

  // The stores' Gather / Apply at the stride, ids routed to their tables' stores (a negative id
  // to its dynamic table's); `threads` as EmbeddingStore's.
  absl::Status GatherAt(absl::Span<const int64_t> ids, float* rows, int threads) const;
  absl::Status ApplyAt(absl::Span<const int64_t> ids, const float* grads, int64_t step,
                       int threads);

  // InProcessParams: the stores' calls on the calling thread.
  void BeginStep(int64_t step) override { dense_->BeginStep(step); }
  absl::Status GatherRows(absl::Span<const int64_t> ids, float* rows) override {
    return GatherAt(ids, rows, /*threads=*/1);
  }
  void CopyDense(int64_t begin, int64_t end, float* out) override {
    dense_->CopyRange(begin, end, out);
  }
  absl::Status ApplyRows(absl::Span<const int64_t> ids, const float* grads,
                         int64_t step) override {
    return ApplyAt(ids, grads, step, /*threads=*/1);
  }
  void ApplyDense(int64_t begin, int64_t end, const float* grad) override {
    dense_->UpdateRange(begin, end, grad);
  }
  int64_t dense_chunk() const override { return Optimizer::kDenseChunk; }
  void EndStep(bool applied) override { dense_->EndStep(applied); }

  // Background pushes: the one queued or running push and its result.
  void BackgroundLoop();
  absl::Mutex mu_;
  bool queued_ ABSL_GUARDED_BY(mu_) = false;  // a push waits for or is in the background thread
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t bg_step_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status bg_status_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> bg_ids_;  // owned by the background thread while queued_
  std::vector<float> bg_rows_, bg_dense_;
  std::thread background_;
};

}  // namespace pstrain
