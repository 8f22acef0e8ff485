// Model::Create and the one tower behind every model type: DeepFM, LR, FM and Wide&Deep are the
// same blocks (first order, FM term, MLP) switched on or off; DCN_V2, DLRM and BLOCKS add the
// cross network or the dot interaction through DenseBlocks (dense_blocks.h).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/random.h"
#include "common/status.h"
#include "worker/model/dense_blocks.h"
#include "worker/model/fm.h"
#include "worker/model/isa.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"
#include "worker/model/simd.h"
#include "worker/model/target_attention.h"

namespace pstrain {
namespace {

// Per call: the sparse forward (parallel by example), the MLP (oneDNN, then fused row loops), the
// loss (parallel by example), the MLP backward, and the sparse backward. The last runs with one
// worker per thread, each owning the slots that OwnerOfSlot gives it and walking all entries in
// order: duplicate slots never race, and each row's gradient is summed in the same order whatever
// the thread count.
class CtrTower : public Tower {
 public:
  CtrTower(const SparseShape& shape, float l2, int max_batch, int threads, std::unique_ptr<Mlp> mlp,
           std::unique_ptr<DenseBlocks> blocks, std::unique_ptr<TargetAttention> attention)
      : shape_(shape),
        l2_(l2),
        max_batch_(max_batch),
        threads_(threads),
        mlp_(std::move(mlp)),
        blocks_(std::move(blocks)),
        attention_(std::move(attention)),
        z_(max_batch),
        g_(max_batch),
        sum_v_(shape.fm ? static_cast<size_t>(max_batch) * shape.dim : 0),
        entries_(threads > 1 ? static_cast<size_t>(threads) * max_batch * shape.num_fields : 0),
        loss_part_(threads) {}

  absl::Status Forward(const Input& in, float* logits) override {
    RETURN_IF_ERROR(Validate(in, /*training=*/false));
    if (logits == nullptr) return absl::InvalidArgumentError("Tower::Forward: logits is null");
    return RunForward(WithOffsets(in), logits, nullptr);
  }

  absl::StatusOr<double> ForwardBackward(const Input& in_arg, float* row_grads,
                                         float* dense_grad, float* logits) override {
    RETURN_IF_ERROR(Validate(in_arg, /*training=*/true));
    const Input in = WithOffsets(in_arg);
    if (row_grads == nullptr || dense_grad == nullptr) {
      return absl::InvalidArgumentError("Tower::ForwardBackward: null gradient buffer");
    }
    const int n = in.n;
    if (n == 0) return 0.0;
    float* z = logits != nullptr ? logits : z_.data();
    float* sum_v = shape_.fm ? sum_v_.data() : nullptr;
    RETURN_IF_ERROR(RunForward(in, z, sum_v));

    float* g = g_.data();
    std::fill(loss_part_.begin(), loss_part_.end(), 0.0);
    ParallelFor(n, threads_, [&](int ithr, int, int64_t begin, int64_t end) {
      loss_part_[ithr] = SigmoidCrossEntropy(z, in.labels, begin, end, g);
    });
    double loss = 0.0;
    for (double part : loss_part_) loss += part;
    float gsum = 0.f;
    for (int b = 0; b < n; ++b) gsum += g[b];
    dense_grad[0] += gsum;

    const float* dx0 = nullptr;
    if (mlp_ != nullptr) {
      RETURN_IF_ERROR(mlp_->Backward(n, in.dense, g, dense_grad));
      dx0 = mlp_->input_grad();
    } else if (blocks_ != nullptr) {
      ASSIGN_OR_RETURN(dx0, blocks_->Backward(in, g, dense_grad));
    }
    if (attention_ != nullptr) {
      ASSIGN_OR_RETURN(dx0, attention_->Backward(in, dx0, g, sum_v, dense_grad));
    }
    const bool lists = in.offsets != nullptr;
    const int64_t num_entries = NumEntries(in);
    auto backward = [&](const int32_t* entries, int64_t count) {
      if (lists) {
        SparseBackwardLists(shape_, in, g, sum_v, pooled_.data(), dx0, l2_, entries, count,
                            row_grads);
      } else {
        SparseBackward(shape_, in, g, sum_v, dx0, l2_, entries, count, row_grads);
      }
    };
    if (threads_ == 1) {
      backward(nullptr, num_entries);
      if (attention_ != nullptr) attention_->AddRowGrads(in, 0, 1, row_grads);
    } else {
      // Each owner's entries (a list batch may hold more entries than max_batch * F).
      if (entries_.size() < static_cast<size_t>(threads_) * num_entries) {
        entries_ = AlignedArray<int32_t>(static_cast<size_t>(threads_) * num_entries);
      }
      ParallelFor(threads_, threads_, [&](int, int, int64_t first, int64_t last) {
        for (int64_t owner = first; owner < last; ++owner) {
          int32_t* mine = entries_.data() + owner * num_entries;
          const int64_t count =
              SelectOwnedEntries(in.slots, num_entries, static_cast<int>(owner), threads_, mine);
          backward(mine, count);
          // The attended entries' d e_i, after the sparse backward's terms: one order per row.
          if (attention_ != nullptr) {
            attention_->AddRowGrads(in, static_cast<int>(owner), threads_, row_grads);
          }
        }
      });
    }
    return loss;
  }

 private:
  absl::Status Validate(const Input& in, bool training) const {
    if (in.n < 0 || in.n > max_batch_) {
      return absl::InvalidArgumentError(
          absl::StrCat("Tower: slice of ", in.n, " examples, expected 0..", max_batch_));
    }
    if (in.n > 0 && (in.slots == nullptr || in.scales == nullptr || in.rows == nullptr ||
                     in.dense == nullptr || (training && in.labels == nullptr))) {
      return absl::InvalidArgumentError("Tower: null slots, scales, rows, dense or labels");
    }
    if (in.offsets != nullptr && in.n > 0) {
      const int64_t cells = static_cast<int64_t>(in.n) * shape_.num_fields;
      if (in.offsets[cells] - in.offsets[0] < cells) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Tower: offsets give ", in.offsets[cells] - in.offsets[0], " entries for ", cells,
            " (example, field) cells, expected at least one each"));
      }
    }
    return absl::OkStatus();
  }

  // Target attention with the FM term takes the list path (its pooled vectors): a batch without
  // offsets gets one entry per cell.
  Input WithOffsets(const Input& in) {
    if (attention_ == nullptr || !shape_.fm || in.offsets != nullptr || in.n == 0) return in;
    const int64_t cells = static_cast<int64_t>(in.n) * shape_.num_fields;
    if (static_cast<int64_t>(iota_.size()) < cells + 1) {
      iota_ = AlignedArray<int32_t>(static_cast<size_t>(max_batch_) * shape_.num_fields + 1);
      for (size_t i = 0; i < iota_.size(); ++i) iota_[i] = static_cast<int32_t>(i);
    }
    Input out = in;
    out.offsets = iota_.data();
    return out;
  }

  int64_t NumEntries(const Input& in) const {
    const int64_t cells = static_cast<int64_t>(in.n) * shape_.num_fields;
    return in.offsets != nullptr ? in.offsets[cells] - in.offsets[0] : cells;
  }

  // logits = the model's output; sum_v (when not null) keeps the FM sums for backward.
  absl::Status RunForward(const Input& in, float* logits, float* sum_v) {
    // Target attention with the FM term replaces pooled vectors in the FM sums (list path).
    if (attention_ != nullptr && shape_.fm && sum_v == nullptr) sum_v = sum_v_.data();
    // oneDNN's OpenMP runtime and ParallelFor take the team size from this thread's ICV; towers
    // run on threads the trainer creates, so set it on every call (cheap).
    omp_set_num_threads(threads_);
    float* x0_f32 = mlp_ != nullptr ? mlp_->input_f32() : nullptr;
    uint16_t* x0_bf16 = mlp_ != nullptr ? mlp_->input_bf16() : nullptr;
    if (blocks_ != nullptr) x0_f32 = blocks_->x0();
    if (in.offsets != nullptr) {
      // The pooled vectors, for the FM term's backward (allocated by the first list batch).
      float* pooled = nullptr;
      if (sum_v != nullptr) {
        if (pooled_.size() == 0) {
          pooled_ = AlignedArray<float>(static_cast<size_t>(max_batch_) * shape_.num_fields *
                                        shape_.dim);
        }
        pooled = pooled_.data();
      }
      ParallelFor(in.n, threads_, [&](int, int, int64_t begin, int64_t end) {
        SparseForwardLists(shape_, in, in.dense[0], begin, end, logits, sum_v, pooled, x0_f32,
                           x0_bf16);
      });
    } else {
      ParallelFor(in.n, threads_, [&](int, int, int64_t begin, int64_t end) {
        SparseForward(shape_, in, in.dense[0], begin, end, logits, sum_v, x0_f32, x0_bf16);
      });
    }
    if (attention_ != nullptr) {
      RETURN_IF_ERROR(attention_->Forward(in, x0_f32, x0_bf16, logits, sum_v, pooled_.data()));
    }
    if (mlp_ != nullptr) RETURN_IF_ERROR(mlp_->Forward(in.n, in.dense, logits));
    if (blocks_ != nullptr) RETURN_IF_ERROR(blocks_->Forward(in, logits));
    return absl::OkStatus();
  }

  const SparseShape shape_;
  const float l2_;
  const int max_batch_;
  const int threads_;
  std::unique_ptr<Mlp> mlp_;             // the MLP on x0: DEEPFM, WIDE_DEEP (and such BLOCKS)
  std::unique_ptr<DenseBlocks> blocks_;  // instead: CROSS_V2 or DOT models
  std::unique_ptr<TargetAttention> attention_;  // list fields pooled by target attention (DIN)
  AlignedArray<float> z_, g_, sum_v_;
  AlignedArray<int32_t> entries_;  // [threads][entries of the slice]: each owner's entries
  AlignedArray<float> pooled_;     // [max_batch * F * k]: the list path's pooled x_f (fm)
  AlignedArray<int32_t> iota_;     // 0, 1, 2, ...: offsets of one entry per cell (WithOffsets)
  std::vector<double> loss_part_;
};

class CtrModel : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Make(const ModelConfig& config,
                                                     const ModelInputs& inputs);

  int num_fields() const override { return shape_.num_fields; }
  int embedding_dim() const override { return shape_.dim; }
  const std::vector<int>& dense_fields() const override { return dense_fields_; }
  const std::vector<ModelInputs::Attention>& attention() const override {
    return attention_inputs_;
  }
  int64_t dense_size() const override { return dense_size_; }
  const std::vector<DenseTensor>& dense_layout() const override { return layout_; }
  double flops_per_example() const override { return flops_; }

  void InitDense(uint64_t seed, float* dense) const override {
    std::fill(dense, dense + dense_size_, 0.f);
    // Glorot-uniform weights (Keras' default), drawn in layout order from one stream.
    Rng rng(seed);
    for (const DenseTensor& t : layout_) {
      if (t.shape.size() != 2) continue;
      const double limit = std::sqrt(6.0 / static_cast<double>(t.shape[0] + t.shape[1]));
      const int64_t size = t.shape[0] * t.shape[1];
      for (int64_t i = 0; i < size; ++i) {
        dense[t.offset + i] = static_cast<float>((2.0 * rng.UniformDouble() - 1.0) * limit);
      }
    }
  }

  void InitRow(int64_t row_id, uint64_t seed, float* row) const override {
    row[0] = 0.f;
    Rng rng(HashKey(static_cast<uint64_t>(row_id), seed));
    const double stddev = config_.embedding_init_stddev();
    for (int j = 0; j < shape_.dim; ++j) row[1 + j] = static_cast<float>(stddev * rng.Normal());
  }

  absl::StatusOr<std::unique_ptr<Tower>> CreateTower(int max_batch,
                                                     int intra_op_threads) const override {
    if (max_batch <= 0 || intra_op_threads <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("CreateTower: max_batch ", max_batch,
                                                     " and intra_op_threads ", intra_op_threads,
                                                     " must be positive"));
    }
    if (int64_t{max_batch} * shape_.num_fields > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CreateTower: max_batch ", max_batch, " x ", shape_.num_fields, " fields exceeds 2^31"));
    }
    std::optional<Mlp::Options> mlp_options;
    if (!hidden_.empty()) {
      Mlp::Options opt;
      opt.hidden = hidden_;
      opt.out_w = out_w_;
      opt.out_b = out_w_ + hidden_.back().out;
      opt.bf16 = config_.precision() == BF16;
      opt.max_batch = max_batch;
      opt.threads = intra_op_threads;
      mlp_options = opt;
    }
    std::unique_ptr<Mlp> mlp;
    std::unique_ptr<DenseBlocks> blocks;
    if (blocks_.has_value()) {
      DenseBlocks::Options opt = *blocks_;
      opt.mlp = mlp_options;
      opt.max_batch = opt.cross.max_batch = opt.bottom.max_batch = max_batch;
      opt.threads = opt.cross.threads = opt.bottom.threads = intra_op_threads;
      opt.cross.bf16 = config_.precision() == BF16;
      ASSIGN_OR_RETURN(blocks, DenseBlocks::Create(opt));
    } else if (mlp_options.has_value()) {
      ASSIGN_OR_RETURN(mlp, Mlp::Create(*mlp_options));
    }
    std::unique_ptr<TargetAttention> attention;
    if (attention_.has_value()) {
      TargetAttention::Options opt = *attention_;
      opt.threads = intra_op_threads;
      ASSIGN_OR_RETURN(attention, TargetAttention::Create(opt));
    }
    return std::unique_ptr<Tower>(new CtrTower(shape_, config_.embedding_l2(), max_batch,
                                               intra_op_threads, std::move(mlp),
                                               std::move(blocks), std::move(attention)));
  }

 private:
  // Appends a tensor to the layout, bounded before anything is allocated (every tower holds a
  // gradient of the dense size).
  absl::Status Add(const std::string& name, std::vector<int64_t> shape) {
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    if (dense_size_ + size > kMaxDenseFloats) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: ", name, " would make the model hold more than ", kMaxDenseFloats,
                       " dense floats; expected a smaller model"));
    }
    layout_.push_back({name, dense_size_, std::move(shape)});
    dense_size_ += size;
    return absl::OkStatus();
  }
  absl::Status MakeBlocks(const ModelConfig& resolved);
  // DCN-Mix's tensors of cross layer `name` (cross_network.h), each 2-D so InitDense draws it.
  absl::Status AddCrossExperts(const std::string& name, int64_t D, int64_t r, int K,
                               CrossNetwork::Layer* layer) {
    for (int i = 0; i < K; ++i) RETURN_IF_ERROR(Add(absl::StrCat(name, "/v", i), {D, r}));
    layer->c = dense_size_;
    for (int i = 0; i < K; ++i) RETURN_IF_ERROR(Add(absl::StrCat(name, "/c", i), {r, r}));
    layer->u = dense_size_;
    for (int i = 0; i < K; ++i) RETURN_IF_ERROR(Add(absl::StrCat(name, "/u", i), {r, D}));
    layer->gate = dense_size_;
    return Add(name + "/gate", {D, K});
  }

  ModelConfig config_;
  SparseShape shape_;
  std::vector<int> dense_fields_;
  std::vector<DenseTensor> layout_;
  std::vector<Mlp::Layer> hidden_;
  int64_t out_w_ = 0;
  std::optional<DenseBlocks::Options> blocks_;  // CROSS_V2 and DOT models
  std::vector<ModelInputs::Attention> attention_inputs_;
  std::optional<TargetAttention::Options> attention_;  // list.attention_target fields
  int64_t dense_size_ = 0;
  double flops_ = 0;
};

bool IsBlockType(ModelType type) {
  return type == DCN_V2 || type == DLRM || type == BLOCKS || type == DIN;
}

absl::StatusOr<std::unique_ptr<Model>> CtrModel::Make(const ModelConfig& config,
                                                      const ModelInputs& inputs) {
  auto model = std::make_unique<CtrModel>();
  model->config_ = config;
  SparseShape& shape = model->shape_;
  const ModelType type = config.type();
  const int num_fields = inputs.num_fields;
  if (type != DEEPFM && type != LR && type != FM && type != WIDE_DEEP && !IsBlockType(type)) {
    return absl::InvalidArgumentError(absl::StrCat("model.type ", type, " is not supported"));
  }
  if (num_fields <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", num_fields, " fields"));
  }
  for (size_t i = 0; i < inputs.dense_fields.size(); ++i) {
    const int f = inputs.dense_fields[i];
    if (f < 0 || f >= num_fields || (i > 0 && f <= inputs.dense_fields[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: dense field ", f, " at ", i, ", expected increasing fields in [0, ", num_fields,
          ")"));
    }
  }
  model->dense_fields_ = inputs.dense_fields;
  for (size_t i = 0; i < inputs.attention.size(); ++i) {
    const ModelInputs::Attention& a = inputs.attention[i];
    if (a.field < 0 || a.field >= num_fields || a.target < 0 || a.target >= num_fields ||
        a.field == a.target || a.hidden.empty() ||
        (i > 0 && a.field <= inputs.attention[i - 1].field)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: attention ", i, " (field ", a.field, ", target ", a.target,
          "), expected increasing distinct fields in [0, ", num_fields, ") and hidden layers"));
    }
  }
  if (!inputs.attention.empty() && !IsBlockType(type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: field ", inputs.attention[0].field,
        " is pooled by target attention (list.attention_target), which model.type ",
        ModelType_Name(type),
        " cannot use; expected DIN, or DCN_V2, DLRM or BLOCKS without FM_TERM"));
  }
  model->attention_inputs_ = inputs.attention;
  shape.num_fields = num_fields;
  // LR has no embedding: its rows are just [w].
  shape.dim = type == LR ? 0 : config.embedding_dim();
  if (type != LR && (shape.dim <= 0 || shape.dim > kMaxEmbeddingDim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.embedding_dim is ", shape.dim, ", expected 1..", kMaxEmbeddingDim));
  }
  if (!(config.embedding_init_stddev() >= 0.f) || !(config.embedding_l2() >= 0.f)) {
    return absl::InvalidArgumentError(
        "model.embedding_init_stddev and model.embedding_l2 must be >= 0");
  }
  if (config.precision() != F32 && config.precision() != BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.precision ", config.precision(), " is not supported"));
  }
  RETURN_IF_ERROR(CheckPrecisionSupported(config.precision(), KernelIsa()));
  if (config.has_blocks() && !IsBlockType(type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.blocks is set but model.type is ", ModelType_Name(type),
        ", a fixed preset; expected type DCN_V2, DLRM or BLOCKS"));
  }
  if (IsBlockType(type)) {
    RETURN_IF_ERROR(model->MakeBlocks(ResolveModelConfig(config)));
    return std::unique_ptr<Model>(std::move(model));
  }

  shape.fm = type == DEEPFM || type == FM;
  shape.deep = type == DEEPFM || type == WIDE_DEEP;
  model->layout_.push_back({"bias", 0, {1}});
  int64_t offset = 1;
  // FLOPs: 2 per multiply-add, 3 GEMM passes (forward, backward-data, backward-weights) per layer;
  // the first-order and FM terms count their multiply-adds forward (2 F + 4 F k) and backward
  // (2 F + 4 F k) likewise.
  double flops = 4.0 * num_fields + (shape.fm ? 8.0 * num_fields * shape.dim : 0.0);
  if (shape.deep) {
    std::vector<int> widths(config.hidden().begin(), config.hidden().end());
    if (widths.empty()) widths = {400, 400, 400};
    int64_t in = int64_t{num_fields} * shape.dim;
    for (size_t l = 0; l < widths.size(); ++l) {
      const int out = widths[l];
      if (out <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.hidden[", l, "] is ", out, ", expected > 0"));
      }
      // Bounded before anything is allocated (every tower holds a gradient of this size).
      if (offset + in * out + out > kMaxDenseFloats) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.hidden: the MLP would hold more than ", kMaxDenseFloats, " dense floats (layer ",
            l, ": ", in, " x ", out, "); expected a smaller model"));
      }
      const std::string name = absl::StrCat("mlp", l);
      model->layout_.push_back({name + "/w", offset, {in, out}});
      model->layout_.push_back({name + "/b", offset + in * out, {out}});
      model->hidden_.push_back({static_cast<int>(in), out, offset, offset + in * out});
      offset += in * out + out;
      flops += 6.0 * in * out;
      in = out;
    }
    model->out_w_ = offset;
    model->layout_.push_back({"out/w", offset, {in, 1}});
    model->layout_.push_back({"out/b", offset + in, {1}});
    offset += in + 1;
    flops += 6.0 * in;
  }
  model->dense_size_ = offset;
  model->flops_ = flops;
  return std::unique_ptr<Model>(std::move(model));
}

// The grammar's models (DCN_V2, DLRM, BLOCKS) from their resolved config. The layout: "bias";
// the bottom MLP "bottom<l>/{w,b}" (DOT with dense fields); the cross layers "cross<l>/{w,b}" or
// "cross<l>/{v,u,b}"; the cross network's linear head "cross_out/w" (PARALLEL or no MLP) and
// "cross_out/b" (no MLP); then the MLP "mlp<l>/{w,b}", "out/{w,b}" as in DeepFM.
absl::Status CtrModel::MakeBlocks(const ModelConfig& resolved) {
  const ModelBlocks& blocks = resolved.blocks();
  SparseShape& shape = shape_;
  const int F = shape.num_fields, k = shape.dim;
  const int64_t D = int64_t{F} * k;
  const bool mlp = blocks.mlp();
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("model.blocks: ", what));
  };
  dense_size_ = 0;
  RETURN_IF_ERROR(Add("bias", {1}));
  double flops = 4.0 * F;
  if (resolved.type() == DIN && blocks.interaction() != ModelBlocks::NO_INTERACTION) {
    return bad(absl::StrCat("interaction ", ModelBlocks::Interaction_Name(blocks.interaction()),
                            " contradicts model.type DIN; use type BLOCKS to choose it"));
  }
  if (resolved.type() == DIN && attention_inputs_.empty()) {
    return absl::InvalidArgumentError(
        "model.type DIN: no list field has list.attention_target; expected the history field "
        "to name its candidate field (docs/CONFIG.md \"DIN\")");
  }
  if (!attention_inputs_.empty()) {
    // Target attention (target_attention.h): its tensors follow "bias". The FM term would need
    // the attended vectors in its sums' backward, which the list kernels do not take (yet).
    if (blocks.interaction() == ModelBlocks::FM_TERM && !mlp) {
      return bad("FM_TERM with target attention (list.attention_target) needs the MLP (mlp: true)");
    }
    TargetAttention::Options opt;
    opt.fm = blocks.interaction() == ModelBlocks::FM_TERM;
    opt.num_fields = F;
    opt.dim = k;
    for (const ModelInputs::Attention& a : attention_inputs_) {
      TargetAttention::Field fd;
      fd.field = a.field;
      fd.target = a.target;
      int64_t in = 4 * int64_t{k};
      for (size_t l = 0; l < a.hidden.size(); ++l) {
        const int out = a.hidden[l];
        if (out <= 0 || out > 65536) {
          return absl::InvalidArgumentError(absl::StrCat(
              "model: field ", a.field, " attention_hidden[", l, "] is ", out, ", expected 1..65536"));
        }
        const std::string name = absl::StrCat("att", a.field, "/mlp", l);
        const int64_t w = dense_size_;
        RETURN_IF_ERROR(Add(name + "/w", {in, out}));
        fd.hidden.push_back({static_cast<int>(in), out, w, dense_size_});
        RETURN_IF_ERROR(Add(name + "/b", {out}));
        in = out;
      }
      fd.out_w = dense_size_;
      RETURN_IF_ERROR(Add(absl::StrCat("att", a.field, "/out/w"), {in, 1}));
      fd.out_b = dense_size_;
      RETURN_IF_ERROR(Add(absl::StrCat("att", a.field, "/out/b"), {1}));
      opt.fields.push_back(std::move(fd));
    }
    attention_ = std::move(opt);
  }
  int64_t mlp_in = D;
  if ((resolved.type() == DCN_V2 && blocks.interaction() != ModelBlocks::CROSS_V2) ||
      (resolved.type() == DLRM && blocks.interaction() != ModelBlocks::DOT)) {
    return bad(absl::StrCat("interaction ", ModelBlocks::Interaction_Name(blocks.interaction()),
                            " contradicts model.type ", ModelType_Name(resolved.type()),
                            "; use type BLOCKS to choose the interaction"));
  }
  switch (blocks.interaction()) {
    case ModelBlocks::NO_INTERACTION:
    case ModelBlocks::FM_TERM:
      // DeepFM's blocks, under another name: the tower's plain path.
      shape.fm = blocks.interaction() == ModelBlocks::FM_TERM;
      shape.deep = mlp;
      if (!shape.fm && !mlp) return bad("no interaction and no MLP: use model.type LR");
      if (shape.fm) flops += 8.0 * F * k;
      break;
    case ModelBlocks::CROSS_V2: {
      shape.deep = true;
      const int layers = blocks.cross_layers(), rank = blocks.cross_rank();
      const int experts = blocks.cross_experts() == 1 ? 0 : blocks.cross_experts();
      if (layers < 1 || layers > 16) {
        return bad(absl::StrCat("cross_layers is ", layers, ", expected 1..16"));
      }
      if (rank < 0 || rank > D) {
        return bad(absl::StrCat("cross_rank is ", rank, ", expected 0 (full) .. F*k = ", D));
      }
      if (experts < 0 || experts > 64 || (experts > 0 && rank == 0)) {
        return bad(absl::StrCat("cross_experts is ", experts,
                                ", expected 0..64, and >= 2 only with cross_rank > 0"));
      }
      DenseBlocks::Options opt;
      opt.num_fields = F;
      opt.dim = k;
      opt.cross.dim = static_cast<int>(D);
      opt.cross.rank = rank;
      opt.cross.experts = experts;
      for (int l = 0; l < layers; ++l) {
        const std::string name = absl::StrCat("cross", l);
        CrossNetwork::Layer layer;
        layer.w = dense_size_;
        if (experts > 0) {
          RETURN_IF_ERROR(AddCrossExperts(name, D, rank, experts, &layer));
          flops += experts * (12.0 * D * rank + 6.0 * rank * rank) + 6.0 * D * experts;
        } else if (rank == 0) {
          RETURN_IF_ERROR(Add(name + "/w", {D, D}));
          flops += 6.0 * D * D;
        } else {
          RETURN_IF_ERROR(Add(name + "/v", {D, rank}));
          layer.u = dense_size_;
          RETURN_IF_ERROR(Add(name + "/u", {rank, D}));
          flops += 12.0 * D * rank;
        }
        layer.b = dense_size_;
        RETURN_IF_ERROR(Add(name + "/b", {D}));
        flops += 8.0 * D;  // the elementwise forward and backward
        opt.cross.layers.push_back(layer);
      }
      opt.parallel = mlp && blocks.join() == ModelBlocks::PARALLEL;
      if (opt.parallel || !mlp) {
        opt.cross_out_w = dense_size_;
        RETURN_IF_ERROR(Add("cross_out/w", {D, 1}));
        flops += 4.0 * D;
      }
      if (!mlp) {
        opt.cross_out_b = dense_size_;
        RETURN_IF_ERROR(Add("cross_out/b", {1}));
      }
      blocks_ = opt;
      break;
    }
    case ModelBlocks::DOT: {
      shape.deep = true;
      if (!mlp) return bad("DOT needs the top MLP (blocks.mlp: true)");
      DenseBlocks::Options opt;
      opt.num_fields = F;
      opt.dim = k;
      opt.dot = true;
      opt.dense_fields = dense_fields_;
      const bool bottom = !dense_fields_.empty();
      if (bottom) {
        std::vector<int> widths(blocks.bottom_hidden().begin(), blocks.bottom_hidden().end());
        widths.push_back(k);
        int64_t in = static_cast<int64_t>(dense_fields_.size());
        for (size_t l = 0; l < widths.size(); ++l) {
          const int out = widths[l];
          if (out <= 0 || out > 65536) {
            return bad(absl::StrCat("bottom_hidden[", l, "] is ", out, ", expected 1..65536"));
          }
          const std::string name = absl::StrCat("bottom", l);
          const int64_t w = dense_size_;
          RETURN_IF_ERROR(Add(name + "/w", {in, out}));
          opt.bottom.layers.push_back({static_cast<int>(in), out, w, dense_size_});
          RETURN_IF_ERROR(Add(name + "/b", {out}));
          flops += 4.0 * in * out;  // no backward-data into the data
          in = out;
        }
      }
      const int64_t m = F + (bottom ? 1 : 0);
      const int64_t pairs = m * (m - 1) / 2;
      mlp_in = (bottom ? k : 0) + pairs;
      if (mlp_in <= 0) return bad("DOT over a single vector has no pairs");
      flops += 6.0 * k * pairs;
      blocks_ = opt;
      break;
    }
    default:
      return bad(absl::StrCat("interaction ", blocks.interaction(), " is not supported"));
  }
  if (mlp) {
    int64_t in = mlp_in;
    for (int l = 0; l < resolved.hidden_size(); ++l) {
      const int out = resolved.hidden(l);
      if (out <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.hidden[", l, "] is ", out, ", expected > 0"));
      }
      if (in > std::numeric_limits<int>::max()) return bad("the MLP's input is too wide");
      const std::string name = absl::StrCat("mlp", l);
      const int64_t w = dense_size_;
      RETURN_IF_ERROR(Add(name + "/w", {in, out}));
      hidden_.push_back({static_cast<int>(in), out, w, dense_size_});
      RETURN_IF_ERROR(Add(name + "/b", {out}));
      flops += 6.0 * in * out;
      in = out;
    }
    out_w_ = dense_size_;
    RETURN_IF_ERROR(Add("out/w", {in, 1}));
    RETURN_IF_ERROR(Add("out/b", {1}));
    flops += 6.0 * in;
  }
  flops_ = flops;
  return absl::OkStatus();
}

}  // namespace

ModelConfig ResolveModelConfig(const ModelConfig& config) {
  ModelConfig c;
  c.set_type(config.type());
  if (IsBlockType(config.type())) {
    // The presets fill the blocks the config leaves unset; BLOCKS takes them as they are.
    ModelBlocks& b = *c.mutable_blocks();
    const ModelBlocks& in = config.blocks();
    switch (config.type()) {
      case DCN_V2:
        b.set_interaction(ModelBlocks::CROSS_V2);
        break;
      case DLRM:
        b.set_interaction(ModelBlocks::DOT);
        break;
      case DIN:
        b.set_interaction(ModelBlocks::NO_INTERACTION);
        break;
      default:
        b.set_interaction(in.interaction());
    }
    // A preset's interaction is its own: a contradicting one is kept so that Create refuses it.
    if (in.has_interaction()) b.set_interaction(in.interaction());
    b.set_mlp(in.has_mlp() ? in.mlp() : true);
    if (b.interaction() == ModelBlocks::CROSS_V2) {
      b.set_cross_layers(in.has_cross_layers() ? in.cross_layers() : 3);
      b.set_cross_rank(in.cross_rank());
      if (in.cross_experts() != 0) b.set_cross_experts(in.cross_experts());
      b.set_join(in.join());
    }
    if (b.interaction() == ModelBlocks::DOT) {
      if (in.bottom_hidden_size() > 0 || config.type() != DLRM) {
        *b.mutable_bottom_hidden() = in.bottom_hidden();
      } else {
        for (int w : {256, 64}) b.add_bottom_hidden(w);
      }
    }
  }
  const bool deep = config.type() == DEEPFM || config.type() == WIDE_DEEP ||
                    (IsBlockType(config.type()) && c.blocks().mlp());
  c.set_embedding_dim(config.type() == LR ? 0 : config.embedding_dim());
  if (deep) {
    if (config.hidden().empty()) {
      for (int w : {400, 400, 400}) c.add_hidden(w);
    } else {
      *c.mutable_hidden() = config.hidden();
    }
  }
  c.set_precision(config.precision());
  c.set_embedding_init_stddev(config.embedding_init_stddev());
  c.set_embedding_l2(config.embedding_l2());
  return c;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config,
                                                     const ModelInputs& inputs) {
  return CtrModel::Make(config, inputs);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, int num_fields) {
  ModelInputs inputs;
  inputs.num_fields = num_fields;
  return CtrModel::Make(config, inputs);
}

}  // namespace pstrain
