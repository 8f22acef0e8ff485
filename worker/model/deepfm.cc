// Model::Create: the shapes, the dense layout and the per-field layout of every model type.
// DeepFM, LR, FM and Wide&Deep are the same blocks (first order, FM term, MLP) switched on or off;
// DCN_V2, DLRM and BLOCKS add the cross network or the dot interaction through DenseBlocks
// (dense_blocks.h). The tower that runs them is ctr_tower.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/random.h"
#include "common/status.h"
#include "worker/model/ctr_tower.h"
#include "worker/model/dense_blocks.h"
#include "worker/model/fm.h"
#include "worker/model/isa.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"
#include "worker/model/target_attention.h"

namespace pstrain {
namespace {

class CtrModel : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Make(const ModelConfig& config,
                                                     const ModelInputs& inputs);

  int num_fields() const override { return shape_.num_fields; }
  int embedding_dim() const override { return shape_.dim; }
  const std::vector<int>& field_dims() const override { return field_dims_; }
  const std::vector<char>& fm_excluded() const override { return fm_excluded_; }
  int row_dim() const override { return shape_.row_dim(); }
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
    // A stride wider than the default table's rows (per-field dims): the slot's tail is 0.
    std::fill(row + 1 + shape_.dim, row + shape_.row_dim(), 0.f);
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
      opt.cross.bf16 = opt.bottom.bf16 = config_.precision() == BF16;
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
    return NewCtrTower(shape_, config_.embedding_l2(), max_batch, intra_op_threads,
                       std::move(mlp), std::move(blocks), std::move(attention));
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
  // MakeBlocks' parts, each appending its tensors to the layout (and its FLOPs to *flops).
  absl::Status MakeAttention(const ModelBlocks& blocks);
  absl::Status MakeCross(const ModelBlocks& blocks, double* flops);
  absl::StatusOr<int64_t> MakeDot(const ModelBlocks& blocks, double* flops);
  absl::Status MakeTopMlp(const ModelConfig& resolved, int64_t in, double* flops);
  // Sets shape_.layout from field_dims_ and fm_excluded_ once shape_.fm is known: null when
  // every field has dim k and is in the FM term; refuses a field of another dim in the FM term.
  absl::Status SetLayout();
  int NumFmFields() const {
    return static_cast<int>(std::count(fm_excluded_.begin(), fm_excluded_.end(), 0));
  }

  ModelConfig config_;
  SparseShape shape_;
  std::vector<int> dense_fields_;
  std::vector<int> field_dims_;    // [F]: d_f (0 for LR)
  std::vector<char> fm_excluded_;  // [F]: 1 = out of the FM term (all 0 without one)
  std::vector<DenseTensor> layout_;
  std::vector<Mlp::Layer> hidden_;
  int64_t out_w_ = 0;
  std::optional<DenseBlocks::Options> blocks_;  // CROSS_V2 and DOT models
  std::vector<ModelInputs::Attention> attention_inputs_;
  int64_t attention_chunk_rows_ = 0;  // ModelInputs::attention_chunk_rows
  std::optional<TargetAttention::Options> attention_;  // list.attention_target fields
  int64_t dense_size_ = 0;
  double flops_ = 0;
};

absl::Status BlocksError(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("model.blocks: ", what));
}

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
  if (inputs.attention_chunk_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("model: attention_chunk_rows is ",
                                                   inputs.attention_chunk_rows,
                                                   ", expected 0 (the default) or more"));
  }
  model->attention_chunk_rows_ = inputs.attention_chunk_rows;
  shape.num_fields = num_fields;
  // LR has no embedding: its rows are just [w].
  shape.dim = type == LR ? 0 : config.embedding_dim();
  if (type != LR && (shape.dim <= 0 || shape.dim > kMaxEmbeddingDim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.embedding_dim is ", shape.dim, ", expected 1..", kMaxEmbeddingDim));
  }
  const auto& dims = inputs.field_dims;
  const auto& excluded = inputs.fm_excluded;
  if (type != LR && !dims.empty() && static_cast<int>(dims.size()) != num_fields) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", dims.size(),
                                                   " field dims for ", num_fields, " fields"));
  }
  if (type != LR && !excluded.empty() && static_cast<int>(excluded.size()) != num_fields) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: ", excluded.size(), " fm_excluded flags for ", num_fields, " fields"));
  }
  model->field_dims_.assign(num_fields, shape.dim);
  model->fm_excluded_.assign(num_fields, 0);
  for (int f = 0; type != LR && f < static_cast<int>(dims.size()); ++f) {
    if (dims[f] <= 0 || dims[f] > kMaxEmbeddingDim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: field ", f, " has embedding dim ", dims[f], ", expected 1..", kMaxEmbeddingDim));
    }
    model->field_dims_[f] = dims[f];
  }
  for (int f = 0; type != LR && f < static_cast<int>(excluded.size()); ++f) {
    model->fm_excluded_[f] = excluded[f] != 0;  // kept by SetLayout only with an FM term
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
  RETURN_IF_ERROR(model->SetLayout());
  model->layout_.push_back({"bias", 0, {1}});
  int64_t offset = 1;
  // FLOPs: 2 per multiply-add, 3 GEMM passes (forward, backward-data, backward-weights) per layer;
  // the first-order and FM terms count their multiply-adds forward (2 F + 4 F k) and backward
  // (2 F + 4 F k) likewise.
  double flops = 4.0 * num_fields + (shape.fm ? 8.0 * model->NumFmFields() * shape.dim : 0.0);
  if (shape.deep) {
    std::vector<int> widths(config.hidden().begin(), config.hidden().end());
    if (widths.empty()) widths = {400, 400, 400};
    int64_t in = shape.x0_width();
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

absl::Status CtrModel::SetLayout() {
  SparseShape& shape = shape_;
  const int F = shape.num_fields, k = shape.dim;
  if (!shape.fm) std::fill(fm_excluded_.begin(), fm_excluded_.end(), 0);
  bool uniform = true;
  for (int f = 0; f < F; ++f) {
    if (field_dims_[f] != k) {
      if (shape.fm && !fm_excluded_[f]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model: field ", f, " has dim ", field_dims_[f], " but the FM term crosses dim ", k,
            " (model.embedding_dim); set its table's fm_join: EXCLUDE"));
      }
      uniform = false;
    }
    if (fm_excluded_[f]) uniform = false;
  }
  if (uniform) {
    shape.layout = nullptr;  // the fixed-k kernels, bit-identical to a model without tables
    return absl::OkStatus();
  }
  auto layout = std::make_shared<FieldLayout>();
  layout->max_dim = k;
  for (int f = 0; f < F; ++f) {
    layout->dim.push_back(field_dims_[f]);
    layout->offset.push_back(layout->width);
    layout->fm.push_back(shape.fm && !fm_excluded_[f] ? 1 : 0);
    layout->width += field_dims_[f];
    layout->max_dim = std::max(layout->max_dim, field_dims_[f]);
  }
  shape.layout = std::move(layout);
  return absl::OkStatus();
}

// The grammar's models (DCN_V2, DLRM, BLOCKS) from their resolved config. The layout: "bias";
// the bottom MLP "bottom<l>/{w,b}" (DOT with dense fields); the cross layers "cross<l>/{w,b}" or
// "cross<l>/{v,u,b}"; the cross network's linear head "cross_out/w" (PARALLEL or no MLP) and
// "cross_out/b" (no MLP); then the MLP "mlp<l>/{w,b}", "out/{w,b}" as in DeepFM.
absl::Status CtrModel::MakeBlocks(const ModelConfig& resolved) {
  const ModelBlocks& blocks = resolved.blocks();
  SparseShape& shape = shape_;
  const bool mlp = blocks.mlp();
  // The FM term's fields and the per-field layout first: every block below reads x0's width.
  shape.fm = blocks.interaction() == ModelBlocks::FM_TERM;
  RETURN_IF_ERROR(SetLayout());
  dense_size_ = 0;
  RETURN_IF_ERROR(Add("bias", {1}));
  double flops = 4.0 * shape.num_fields;
  if (resolved.type() == DIN && blocks.interaction() != ModelBlocks::NO_INTERACTION) {
    return BlocksError(absl::StrCat("interaction ",
                                    ModelBlocks::Interaction_Name(blocks.interaction()),
                                    " contradicts model.type DIN; use type BLOCKS to choose it"));
  }
  if (resolved.type() == DIN && attention_inputs_.empty()) {
    return absl::InvalidArgumentError(
        "model.type DIN: no list field has list.attention_target; expected the history field "
        "to name its candidate field (docs/CONFIG.md \"DIN\")");
  }
  if (!attention_inputs_.empty()) RETURN_IF_ERROR(MakeAttention(blocks));
  int64_t mlp_in = shape.x0_width();
  if ((resolved.type() == DCN_V2 && blocks.interaction() != ModelBlocks::CROSS_V2) ||
      (resolved.type() == DLRM && blocks.interaction() != ModelBlocks::DOT)) {
    return BlocksError(absl::StrCat("interaction ",
                                    ModelBlocks::Interaction_Name(blocks.interaction()),
                                    " contradicts model.type ", ModelType_Name(resolved.type()),
                                    "; use type BLOCKS to choose the interaction"));
  }
  switch (blocks.interaction()) {
    case ModelBlocks::NO_INTERACTION:
    case ModelBlocks::FM_TERM:
      // DeepFM's blocks, under another name: the tower's plain path.
      shape.deep = mlp;
      if (!shape.fm && !mlp) return BlocksError("no interaction and no MLP: use model.type LR");
      if (shape.fm) flops += 8.0 * NumFmFields() * shape.dim;
      break;
    case ModelBlocks::CROSS_V2:
      shape.deep = true;
      RETURN_IF_ERROR(MakeCross(blocks, &flops));
      break;
    case ModelBlocks::DOT: {
      shape.deep = true;
      if (!mlp) return BlocksError("DOT needs the top MLP (blocks.mlp: true)");
      ASSIGN_OR_RETURN(mlp_in, MakeDot(blocks, &flops));
      break;
    }
    default:
      return BlocksError(
          absl::StrCat("interaction ", blocks.interaction(), " is not supported"));
  }
  if (mlp) RETURN_IF_ERROR(MakeTopMlp(resolved, mlp_in, &flops));
  flops_ = flops;
  return absl::OkStatus();
}

// Target attention (target_attention.h): its tensors follow "bias". The FM term would need the
// attended vectors in its sums' backward, which the list kernels do not take (yet).
absl::Status CtrModel::MakeAttention(const ModelBlocks& blocks) {
  const SparseShape& shape = shape_;
  const int F = shape.num_fields, k = shape.dim;
  const int64_t D = shape.x0_width();
  const bool mlp = blocks.mlp();
  if (blocks.interaction() == ModelBlocks::FM_TERM && !mlp) {
    return BlocksError(
        "FM_TERM with target attention (list.attention_target) needs the MLP (mlp: true)");
  }
  if (shape.fm && shape.layout != nullptr) {
    return BlocksError(
        "FM_TERM with target attention (list.attention_target) needs every field of dim "
        "model.embedding_dim and in the FM term (per-field dims or fm_join: EXCLUDE with "
        "attention and the FM term are not supported yet)");
  }
  TargetAttention::Options opt;
  opt.fm = shape.fm;
  opt.num_fields = F;
  opt.dim = k;
  opt.row_dim = shape.row_dim();
  opt.x0_width = D;
  for (int f = 0; f < F; ++f) opt.x0_offset.push_back(shape.x0_offset(f));
  for (const ModelInputs::Attention& a : attention_inputs_) {
    TargetAttention::Field fd;
    fd.field = a.field;
    fd.target = a.target;
    fd.dim = field_dims_[a.field];
    if (field_dims_[a.target] != fd.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: field ", a.field, " (dim ", fd.dim, ") attends against field ", a.target,
          " (dim ", field_dims_[a.target], "); target attention needs the same dim for both: "
          "expected their tables to have one dim"));
    }
    int64_t in = 4 * int64_t{fd.dim};
    for (size_t l = 0; l < a.hidden.size(); ++l) {
      const int out = a.hidden[l];
      if (out <= 0 || out > 65536) {
        return absl::InvalidArgumentError(absl::StrCat("model: field ", a.field,
                                                       " attention_hidden[", l, "] is ", out,
                                                       ", expected 1..65536"));
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
  if (attention_chunk_rows_ > 0) opt.chunk_rows = attention_chunk_rows_;
  attention_ = std::move(opt);
  return absl::OkStatus();
}

// DCN-v2's cross network on x0 (cross_network.h): "cross<l>/..." and its linear head.
absl::Status CtrModel::MakeCross(const ModelBlocks& blocks, double* flops) {
  const SparseShape& shape = shape_;
  const int F = shape.num_fields, k = shape.dim;
  const int64_t D = shape.x0_width();
  const bool mlp = blocks.mlp();
  const int layers = blocks.cross_layers(), rank = blocks.cross_rank();
  if (layers < 1 || layers > 16) {
    return BlocksError(absl::StrCat("cross_layers is ", layers, ", expected 1..16"));
  }
  if (rank < 0 || rank > D) {
    return BlocksError(
        absl::StrCat("cross_rank is ", rank, ", expected 0 (full) .. x0's width ", D));
  }
  const int experts = blocks.cross_experts() == 1 ? 0 : blocks.cross_experts();
  if (experts < 0 || experts > 64 || (experts > 0 && rank == 0)) {
    return BlocksError(absl::StrCat("cross_experts is ", experts,
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
      *flops += experts * (12.0 * D * rank + 6.0 * rank * rank) + 6.0 * D * experts;
    } else if (rank == 0) {
      RETURN_IF_ERROR(Add(name + "/w", {D, D}));
      *flops += 6.0 * D * D;
    } else {
      RETURN_IF_ERROR(Add(name + "/v", {D, rank}));
      layer.u = dense_size_;
      RETURN_IF_ERROR(Add(name + "/u", {rank, D}));
      *flops += 12.0 * D * rank;
    }
    layer.b = dense_size_;
    RETURN_IF_ERROR(Add(name + "/b", {D}));
    *flops += 8.0 * D;  // the elementwise forward and backward
    opt.cross.layers.push_back(layer);
  }
  opt.parallel = mlp && blocks.join() == ModelBlocks::PARALLEL;
  if (opt.parallel || !mlp) {
    opt.cross_out_w = dense_size_;
    RETURN_IF_ERROR(Add("cross_out/w", {D, 1}));
    *flops += 4.0 * D;
  }
  if (!mlp) {
    opt.cross_out_b = dense_size_;
    RETURN_IF_ERROR(Add("cross_out/b", {1}));
  }
  blocks_ = opt;
  return absl::OkStatus();
}

// DLRM's dot interaction (dot_interaction.h) and its bottom MLP over the dense fields. Returns
// the top MLP's input width.
absl::StatusOr<int64_t> CtrModel::MakeDot(const ModelBlocks& blocks, double* flops) {
  const SparseShape& shape = shape_;
  const int F = shape.num_fields, k = shape.dim;
  for (int f = 0; f < F; ++f) {
    if (field_dims_[f] != k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: field ", f, " has dim ", field_dims_[f], " but DOT takes the dot products "
          "of vectors of one dim, model.embedding_dim = ", k, "; expected every field's table "
          "to have dim ", k));
    }
  }
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
        return BlocksError(absl::StrCat("bottom_hidden[", l, "] is ", out, ", expected 1..65536"));
      }
      const std::string name = absl::StrCat("bottom", l);
      const int64_t w = dense_size_;
      RETURN_IF_ERROR(Add(name + "/w", {in, out}));
      opt.bottom.layers.push_back({static_cast<int>(in), out, w, dense_size_});
      RETURN_IF_ERROR(Add(name + "/b", {out}));
      // Forward, backward-weights and backward-data (bottom_mlp.cc), except the first layer's
      // backward-data: its input is the data.
      *flops += (l == 0 ? 4.0 : 6.0) * in * out;
      in = out;
    }
  }
  const int64_t m = F + (bottom ? 1 : 0);
  const int64_t pairs = m * (m - 1) / 2;
  const int64_t mlp_in = (bottom ? k : 0) + pairs;
  if (mlp_in <= 0) return BlocksError("DOT over a single vector has no pairs");
  *flops += 6.0 * k * pairs;
  blocks_ = opt;
  return mlp_in;
}

// The (top) MLP "mlp<l>/{w,b}", "out/{w,b}" on `in` inputs, as in DeepFM.
absl::Status CtrModel::MakeTopMlp(const ModelConfig& resolved, int64_t in, double* flops) {
  for (int l = 0; l < resolved.hidden_size(); ++l) {
    const int out = resolved.hidden(l);
    if (out <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.hidden[", l, "] is ", out, ", expected > 0"));
    }
    if (in > std::numeric_limits<int>::max()) return BlocksError("the MLP's input is too wide");
    const std::string name = absl::StrCat("mlp", l);
    const int64_t w = dense_size_;
    RETURN_IF_ERROR(Add(name + "/w", {in, out}));
    hidden_.push_back({static_cast<int>(in), out, w, dense_size_});
    RETURN_IF_ERROR(Add(name + "/b", {out}));
    *flops += 6.0 * in * out;
    in = out;
  }
  out_w_ = dense_size_;
  RETURN_IF_ERROR(Add("out/w", {in, 1}));
  RETURN_IF_ERROR(Add("out/b", {1}));
  *flops += 6.0 * in;
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
