// DIN's target attention (Zhou et al., KDD 2018, "Deep Interest Network"): a list field f (the
// user's history) is pooled by weights that an attention MLP computes against a single-valued
// target field t of the same example (the candidate item), instead of by its combiner:
//
//   u_i = [e_i, c, e_i - c, e_i * c]                       (4k; * elementwise)
//   a_i = MLP_att(u_i) = h_L(u_i) . out/w + out/b          (h_l = ReLU(h_{l-1} W_l + b_l))
//   x_f = sum_i s_i a_i e_i                                (no softmax, as in DIN)
//
// e_i = v_{slot_i} is entry i's embedding (unscaled), s_i its scale (Batch::values: the list's
// weight times the combiner's normalization; SUM with unit weights is DIN's plain sum) and
// c = s_t v_t the target's x. x_f replaces the field's combiner-pooled vector in x0; the
// first-order term of f keeps the combiner's pooling (fm.h). The MLP's tensors "att<f>/mlp<l>/w"
// [in, out] row-major, "att<f>/mlp<l>/b", "att<f>/out/w" [H, 1], "att<f>/out/b" live in the
// dense vector.
//
// Compute: the entries of every example of the slice are stacked into one matrix per attended
// field, cut into chunks of whole examples of at most Options::chunk_rows rows (an example
// longer than that is a chunk alone), and each layer is one oneDNN matmul over a chunk (Matmuls,
// f32; every chunk of a slice of several padded to chunk_rows rows, a slice's only chunk to a
// few sizes per octave, so that the primitive cache stays small; the padded rows zero in the
// gradients). A chunk's v, h, dz and dv
// are written and read again while they are in L2: over the whole slice they were not (a
// 1,024-example tower batch of 50-long histories stacks ~26k rows, 3.4 MB of v and 3.8 MB of h),
// and the backward's row loops waited on memory. The weight gradients of a layer are the sum of
// the chunks' GEMMs, in chunk order (deterministic; other floats than one GEMM over the slice).
// The first layer is linear in u_i, so with its weight W_0 = [We; Wc; Wd; Wp] (k rows each, the
// parameters' layout) u_i W_0 = e_i (We + Wd) + (e_i * c) Wp + c (Wc - Wd): the stacked matrix
// is v_i = [e_i, e_i * c] ([R, 2k], against [We + Wd; Wp]) and c's term is one [n, k] x [k, out]
// GEMM per example, added with the bias; u is never built (half the per-entry K, and a
// [R, 4k] buffer larger than L2 neither written nor read). Bias, ReLU, the output unit and the
// pooling are row loops over ParallelFor, each output written by one thread in a fixed order.
//
// Backward, given dx0 = d loss / d x0 [n, F*k]:
//   da_i = s_i (dx_f . e_i);  d e_i = s_i a_i dx_f + du_i[0:k] + du_i[2k:3k] + du_i[3k:4k] * c
//   dc   = sum over i and attended fields of du_i[k:2k] - du_i[2k:3k] + du_i[3k:4k] * e_i
// computed through v as well: with dz_i the first layer's pre-activation gradient, S_b the sum
// of example b's dz_i and dv_i = dz_i [We + Wd; Wp]^T, d e_i's part is dv_i[0:k] + dv_i[k:2k] * c
// and dc = S_b (Wc - Wd)^T + sum_i dv_i[k:2k] * e_i; dWe = E^T dz, dWc = C^T S,
// dWd = E^T dz - C^T S, dWp = (E * C)^T dz (E^T dz and (E * C)^T dz are one GEMM, v^T dz).
// The rows' gradients: the tower's sparse backward takes dx0 adjusted in place (the attended
// fields' cells zeroed, so that it adds only their first-order and L2 terms, and dc added to the
// target's cell: d row_t = s_t (dx0_t + dc)), then AddRowGrads adds each attended entry's d e_i
// with the same owner partition (fm.h SelectOwnedEntries), walking entries in order: every row's
// gradient is summed in one order whatever the thread count.
//
// Thread-safety: none; one TargetAttention per tower.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/matmul.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"
#include "worker/model/simd.h"

namespace pstrain {

class TargetAttention {
 public:
  static constexpr int64_t kDefaultChunkRows = 1024;  // Options::chunk_rows
  struct Field {
    int field = 0;                   // f: the attended (list) field
    int target = 0;                  // t: its single-valued target field
    int dim = 0;                     // d: f's and t's dim (per-field dims); 0 = Options::dim
    std::vector<Mlp::Layer> hidden;  // at least one; hidden[0].in == 4d
    int64_t out_w = 0;               // [hidden.back().out]
    int64_t out_b = 0;               // [1]
  };
  struct Options {
    int num_fields = 0;  // F
    int dim = 0;         // k
    // Per-field dims (fm.h FieldLayout): the rows' stride, x0's width and each field's offset in
    // it; 0 / empty = the uniform layout (1 + k, F*k, f*k).
    int row_dim = 0;
    int64_t x0_width = 0;
    std::vector<int64_t> x0_offset;
    std::vector<Field> fields;
    bool fm = false;  // the model has the FM term (then the MLP too: dx0 carries d c; the uniform
                     // layout only)
    int threads = 1;
    // The stacked rows a chunk holds at most (see Compute above): ~600 bytes a row live in the
    // backward, so 1,024 rows fit a 1 MiB L2. Tests set it small to cross chunk boundaries.
    int64_t chunk_rows = kDefaultChunkRows;
  };

  static absl::StatusOr<std::unique_ptr<TargetAttention>> Create(const Options& options);
  TargetAttention(const TargetAttention&) = delete;
  TargetAttention& operator=(const TargetAttention&) = delete;

  // Overwrites the attended fields' cells of x0 [n, x0_width] (exactly one of x0_f32 / x0_bf16)
  // with x_f. Keeps what Backward needs. INVALID_ARGUMENT when a target cell holds other than one entry.
  // With fm, after SparseForwardLists: logits[b] += the FM term's change when x_f replaces the
  // combiner's pooled vector (pooled[(b*F+f)*k ...]), sum_v[b*k ...] becomes the attended sum,
  // and the attended cells of pooled are set to it, so that SparseBackwardLists adds no FM term
  // for their entries (Backward folds d FM / d x_f = g_b (sum_v - x_f) into dx_f instead).
  absl::Status Forward(const Tower::Input& in, float* x0_f32, uint16_t* x0_bf16, float* logits,
                       float* sum_v, float* pooled);

  // After Forward(in): ADDS the attention MLPs' gradients into dense_grad and adjusts dx0
  // [n, x0_width] IN PLACE for the sparse backward (see above): the MLP's input gradient, which
  // nothing else reads (a copy of it was ~1.5% of DIN's tower step).
  // With fm, g[n] and sum_v (Forward's) add the FM term's gradient.
  absl::Status Backward(const Tower::Input& in, float* dx0, const float* g, const float* sum_v,
                        float* dense_grad);

  // After Backward: adds d e_i into row_grads[slot_i * row_dim + 1 ...] for the attended entries
  // whose slot OwnerOfSlot(slot, owners) gives to `owner`, in entry order. Concurrent calls with
  // distinct owners of one partition are safe.
  void AddRowGrads(const Tower::Input& in, int owner, int owners, float* row_grads) const;

 private:
  // Examples [begin, end) of the slice: their stacked rows [row, row + rows) (compact), held
  // at [base, base + m) of the padded arrays (v, h), the GEMMs' M = m >= rows, the rest zero.
  struct Chunk {
    int64_t begin = 0, end = 0;
    int64_t row = 0, rows = 0;
    int64_t base = 0, m = 0;  // compact row r is the chunk's row r - row, padded row base + r - row
  };
  // One attended field's stacked rows and activations.
  struct State {
    std::vector<int64_t> entry;       // [R]: the slice entry of each stacked row
    std::vector<int64_t> cell_begin;  // [n + 1]: example b's rows [cell_begin[b], cell_begin[b+1])
    std::vector<Chunk> chunks;        // in example order
    int64_t rows = 0, padded = 0;     // R and the padded arrays' rows (the chunks' m summed)
    int64_t max_m = 0;                // the largest chunk's m
    AlignedArray<float> v;            // [padded, 2k]: [e_i, e_i * c], the padded rows zero
    AlignedArray<float> c;            // [n, k]: c per example
    AlignedArray<float> w1;           // [2k, out_0]: [We + Wd; Wp] (see Forward)
    AlignedArray<float> wq;           // [k, out_0]: Wc - Wd
    std::vector<AlignedArray<float>> h;  // [padded, out_l] after ReLU
    AlignedArray<float> a;            // [R]
    AlignedArray<float> de;           // [R, k]: d e_i after Backward
    AlignedArray<float> x;            // [n, k]: x_f (fm)
  };
  explicit TargetAttention(const Options& options) : opt_(options) {}
  int64_t RowDim() const { return opt_.row_dim > 0 ? opt_.row_dim : 1 + opt_.dim; }
  int64_t X0Width() const {
    return opt_.x0_width > 0 ? opt_.x0_width : int64_t{opt_.num_fields} * opt_.dim;
  }
  int64_t X0Offset(int f) const {
    return opt_.x0_offset.empty() ? int64_t{f} * opt_.dim : opt_.x0_offset[f];
  }
  int Dim(const Field& fd) const { return fd.dim > 0 ? fd.dim : opt_.dim; }
  int64_t CellBegin(const Tower::Input& in, int64_t cell) const;
  static void Reserve(AlignedArray<float>* a, int64_t size);
  // st->chunks, padded and max_m from st->cell_begin (n examples).
  void PlanChunks(int n, State* st) const;

  Options opt_;
  Matmuls gemm_;
  std::vector<State> state_;
  AlignedArray<float> dxf_;    // [fields][n, d]: the attended cells of dx0 before the adjustment
  AlignedArray<float> dz_[2];  // [max_m, out]: a chunk's d loss / d pre-activation, ping-pong
  AlignedArray<float> dv_;     // [max_m, 2k]: a chunk's d v_i
  AlignedArray<float> q_;      // [n, out_0]: c (Wc - Wd) + b_0 per example
  AlignedArray<float> s_;      // [n, out_0]: per-example sums of the first layer's dz
  AlignedArray<float> g1_;     // [3k, out_0]: v^T dz summed over the chunks, then C^T S
  AlignedArray<float> pw_;     // [n, H]: per-example sums of da_i h_i (out/w's gradient)
  AlignedArray<float> partial_;
};

}  // namespace pstrain
