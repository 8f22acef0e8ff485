// The CTR models (DeepFM, LR, FM, Wide&Deep) as one set of blocks over a sparse table and a flat
// dense parameter vector.
//
// Parameters:
//   sparse rows: each global row id (FeatureSpec) has row_dim() = 1 + k floats, laid out as
//                [w, v_0 .. v_{k-1}]: the first-order weight, then the k-dim embedding. With
//                per-field dims (ModelInputs::field_dims, one per table) a row of a field of dim
//                d is [w, v_0 .. v_{d-1}] in a slot of the common stride row_dim() = 1 + max dim,
//                and x0 = concat_f s_f v_f has sum_f d_f floats.
//   dense:       one flat float vector of dense_size() floats: the global bias, then each MLP
//                layer's weights and biases (see DenseLayout). Flat so that the PS can split it
//                by size and allreduce can fuse it into one buffer.
//
// logit = bias + sum_f s_f w_f
//       + 0.5 * sum_k [(sum_f s_f v_fk)^2 - sum_f (s_f v_fk)^2]          (FM, DEEPFM)
//       + MLP(concat_f s_f v_f)                                           (DEEPFM, WIDE_DEEP)
// where s_f is the example's scale for field f (Batch::values). Loss: sigmoid cross-entropy.
//
// Model types are the same blocks switched on or off: LR = bias + first order (its rows are just
// [w]: embedding_dim() is 0), FM = LR + the FM term, WIDE_DEEP = LR + MLP, DEEPFM = all three.
// The block grammar (ModelConfig.blocks, docs/CONFIG.md "Model blocks") adds DCN-v2's cross
// network (cross_network.h) and DLRM's bottom MLP and dot interaction (bottom_mlp.h,
// dot_interaction.h), composed by dense_blocks.h; DCN_V2 and DLRM are presets of it, BLOCKS takes
// the blocks as given. Their tensors ("cross<l>/w", "bottom<l>/w", ...) join the dense vector
// before the MLP's.
// A list field may be pooled by DIN's target attention against another field instead of by its
// combiner (ModelInputs::attention, target_attention.h); DIN is the preset NO_INTERACTION + MLP
// with such fields, whose "att<f>/..." tensors follow "bias".
// The MLP is ReLU hidden layers (ModelConfig.hidden, empty = 400,400,400) and a 1-unit linear
// output; its weights "mlpI/w" are [in, out] row-major (element (i, o) at offset + i*out + o),
// "out/w" is [in, 1]. Precision BF16 runs the MLP's matmuls in bf16 (AMX / AVX512-BF16 through
// oneDNN) on per-step bf16 copies; parameters, gradients and optimizer state stay f32.
// Implementation: worker/model/ (deepfm.cc, mlp.h, fm.h, dense_blocks.h; reference.h is the
// double twin).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"

namespace pstrain {

// Where each dense tensor lives in the flat dense vector.
struct DenseTensor {
  std::string name;  // "bias", "mlp0/w", "mlp0/b", ..., "out/w", "out/b"
  int64_t offset = 0;
  std::vector<int64_t> shape;
};

// One tower's compute state: cached oneDNN primitives and scratch for up to max_batch examples.
// Not thread-safe: each tower thread owns one. Every call first sets the calling thread's OpenMP
// thread count to intra_op_threads (oneDNN's OpenMP runtime and ParallelFor read it from there),
// so a tower may be driven from any one thread at a time, typically the trainer's tower thread.
class Tower {
 public:
  virtual ~Tower() = default;

  // A slice of a batch, after deduplication of its row ids.
  //   n examples; F fields; U unique rows.
  //   slots[n*F]:  index into `rows` of each (example, field)
  //   scales[n*F]: Batch::values
  //   labels[n]:   may be null for Forward
  //   rows[U*row_dim]: the unique rows' current values
  //   dense[dense_size]: the dense parameters
  //   offsets[n*F+1]: null for one entry per (example, field) as above. Otherwise the batch has
  //                list fields (Batch::offsets): the entries of (b, f) are slots / scales
  //                [offsets[b*F+f] - offsets[0], offsets[b*F+f+1] - offsets[0]) (offsets[0] need
  //                not be 0: a slice of a batch points into the batch's offsets), and each
  //                (b, f) is pooled, x_f = sum_i s_i v_{slot_i}, w_f = sum_i s_i w_{slot_i}, before
  //                the FM term and the MLP see it.
  struct Input {
    int n = 0;
    const int32_t* slots = nullptr;
    const float* scales = nullptr;
    const float* labels = nullptr;
    const float* rows = nullptr;
    const float* dense = nullptr;
    const int32_t* offsets = nullptr;
  };

  // logits[n] = model output before the sigmoid.
  virtual absl::Status Forward(const Input& in, float* logits) = 0;

  // Forward and backward. ADDS d(sum of the n losses)/d(param) into row_grads (U x row_dim,
  // indexed like `rows`) and dense_grad (dense_size). Callers scale by 1/global_batch.
  // Writes logits[n] when logits is not null. Returns the summed loss.
  // With ModelConfig.embedding_l2 = l2, each (example, field) occurrence of a row also adds
  // l2 * row (both w and v, unscaled by s) to that row's gradient: the gradient of
  // (l2/2) * sum over occurrences of |row|^2, a lazy L2 on the looked-up rows as TF's l2 on
  // embedding lookups. The returned loss does not include that penalty.
  virtual absl::StatusOr<double> ForwardBackward(const Input& in, float* row_grads,
                                                 float* dense_grad, float* logits) = 0;
};

// `config` with every field that shapes the parameters or their initial values set to the value
// Model::Create uses: type, embedding_dim (0 for LR, whose rows are [w]), hidden (400,400,400 when
// empty for DEEPFM and WIDE_DEEP; cleared for LR and FM, which have no MLP), precision,
// embedding_init_stddev, embedding_l2; for DCN_V2, DLRM and BLOCKS also every field of blocks
// that applies (the presets' defaults filled in; hidden as above when blocks.mlp). DEEPFM, LR, FM
// and WIDE_DEEP resolve exactly as before the grammar (no blocks). Idempotent. Checkpoints record
// it (pstrain.ModelDescription.model).
ModelConfig ResolveModelConfig(const ModelConfig& config);

// What a model needs to know about its input fields (FeatureSpec, which worker/model does not
// depend on, supplies it: FeatureSpec::DenseNumericFields()).
struct ModelInputs {
  int num_fields = 0;
  // The NUMERIC fields with numeric_mode DENSE, increasing: their values (Tower::Input scales)
  // feed DLRM's bottom MLP. Other models ignore them.
  std::vector<int> dense_fields;
  // The list fields pooled by target attention (ListSpec.attention_target; target_attention.h):
  // field f attends against the single-valued field target through ReLU layers `hidden`.
  struct Attention {
    int field = 0;
    int target = 0;
    std::vector<int> hidden;
  };
  std::vector<Attention> attention;
  // The stacked rows one chunk of the attention holds (TargetAttention::Options::chunk_rows);
  // 0 = its default. Not a model parameter: the floats of a chunk size differ only by rounding.
  // Tests set it small to cross chunk boundaries.
  int64_t attention_chunk_rows = 0;
  // Per field, its embedding dim d_f (its table's dim); empty = every field has model.embedding_dim
  // (k). A row of field f uses floats [0, 1 + d_f) of its slot of Model::row_dim() floats (the
  // rest is 0 on pull and ignored on push), and f contributes d_f floats to x0. LR ignores it.
  std::vector<int> field_dims;
  // Per field, 1 = the field is not in the FM term (its table's fm_join: EXCLUDE); empty = none
  // excluded. Every field in the FM term must have d_f == k (Model::Create refuses otherwise).
  std::vector<char> fm_excluded;
};

// Immutable after Create; safe to share across towers.
class Model {
 public:
  virtual ~Model() = default;

  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config,
                                                       const ModelInputs& inputs);
  // Create(config, {num_fields}): no field is a DENSE numeric one.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config, int num_fields);

  virtual int num_fields() const = 0;
  virtual int embedding_dim() const = 0;
  // ModelInputs::dense_fields as Create got them.
  virtual const std::vector<int>& dense_fields() const = 0;
  // ModelInputs::attention as Create got them (empty for the model types that cannot use it).
  virtual const std::vector<ModelInputs::Attention>& attention() const = 0;
  // ModelInputs::field_dims resolved: [num_fields], each field's dim (every entry k when the
  // inputs left it empty; 0 for LR).
  virtual const std::vector<int>& field_dims() const = 0;
  // ModelInputs::fm_excluded resolved: [num_fields], 1 = not in the FM term (all 0 for the models
  // without one).
  virtual const std::vector<char>& fm_excluded() const = 0;
  // The stride of a pulled row: 1 + max(k, max field_dims) (1 for LR). Row u lives at
  // rows[u * row_dim()]; a row of a field of dim d uses its first 1 + d floats.
  virtual int row_dim() const = 0;
  virtual int64_t dense_size() const = 0;
  virtual const std::vector<DenseTensor>& dense_layout() const = 0;
  // Forward+backward FLOPs per example (for throughput reports against the GEMM peak).
  virtual double flops_per_example() const = 0;

  // Deterministic initial values: the dense vector from `seed`; a sparse row as a function of
  // (row_id, seed) only, so that every PS shard and the single-process trainer agree. InitRow
  // writes row_dim() floats: a row of dim k (the default table's: [0, 1 + k) as without per-field
  // dims, to the bit) and zeros in the rest of the stride. Rows of tables of another dim get
  // their table's initializer, not this one.
  virtual void InitDense(uint64_t seed, float* dense) const = 0;
  virtual void InitRow(int64_t row_id, uint64_t seed, float* row) const = 0;

  // Creates a tower for slices of up to max_batch examples, running `intra_op_threads` OpenMP
  // threads through ParallelFor.
  virtual absl::StatusOr<std::unique_ptr<Tower>> CreateTower(int max_batch,
                                                             int intra_op_threads) const = 0;
};

}  // namespace pstrain
