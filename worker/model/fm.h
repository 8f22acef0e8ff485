// The sparse half of the CTR models: the embedding gather, the first-order and FM terms, the
// scatter of gradients into the rows, and the loss. Plain loops that the compiler vectorizes
// (k = 4, 8, 16, 32, 64 are compiled with a fixed k; other k take a generic path). Each function
// works on one range of examples or entries; the tower splits the ranges over its threads.
//
// Notation (see worker/model/model.h): an "entry" e = b*F + f is one (example, field) pair; its row is
// rows[slots[e] * row_dim ...] = [w, v_0 .. v_{k-1}] and its scale s = scales[e]; x_fj = s v_fj.
//
// Thread-safety: the functions are pure apart from their output arguments. Concurrent
// SparseForward calls on disjoint example ranges are safe; concurrent SparseBackward calls are
// safe when no row is touched by two of them (see SelectOwnedEntries).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/model/model.h"

namespace pstrain {

// Largest embedding dimension the kernels accept (Model::Create enforces it).
inline constexpr int kMaxEmbeddingDim = 1024;

// Per-field embedding dims (ModelInputs::field_dims) when some field's dim is not k or some field
// is out of the FM term. Then x0 [n, width] holds field f's d_f floats at [offset[f], offset[f] +
// d_f) of each example, rows have the stride 1 + max_dim, and the FM term sums the fields with
// fm[f] (each of dim k). The kernels take a general path for it (plain loops, not the fixed-k
// vector kernels).
struct FieldLayout {
  std::vector<int> dim;         // [F]: d_f
  std::vector<int64_t> offset;  // [F]: sum of d_g for g < f
  std::vector<char> fm;         // [F]: 1 = in the FM term (only read when SparseShape::fm)
  int64_t width = 0;            // D = sum_f d_f
  int max_dim = 0;              // max(k, max_f d_f)
};

struct SparseShape {
  int num_fields = 0;  // F
  int dim = 0;         // k; 0 exactly when neither fm nor deep (LR: a row is just [w])
  bool fm = false;     // the FM second-order term is part of the logit
  bool deep = false;   // x0 = concat_f x_f ([n, F*k]) feeds an MLP
  // Null: every field has dim k and is in the FM term (the fixed-k kernels). Shared by the model
  // and its towers; immutable.
  std::shared_ptr<const FieldLayout> layout;
  int row_dim() const { return 1 + (layout != nullptr ? layout->max_dim : dim); }
  // x0's floats per example.
  int64_t x0_width() const {
    return layout != nullptr ? layout->width : int64_t{num_fields} * dim;
  }
  // Where field f's x_f starts in example b's x0.
  int64_t x0_offset(int f) const {
    return layout != nullptr ? layout->offset[f] : int64_t{f} * dim;
  }
};

// With shape.layout set, every kernel below takes the general path: field f's row is [w, v_0 ..
// v_{d_f-1}] in a slot of row_dim() floats, x0 is [n, layout->width] with f at layout->offset[f]
// (dx0 likewise), only the fields with layout->fm[f] enter the FM sums (sum_v stays [n, k],
// pooled [n*F, k] with only those fields' cells written), and the gradients touch only [0, 1 +
// d_f) of a row's slot. The formulas below read k as d_f and e*k as b*width + offset[f].
//
// Forward over examples [begin, end):
//   logits[b] = bias + sum_f s_f w_f + (fm ? 0.5 sum_j [(sum_f x_fj)^2 - sum_f x_fj^2] : 0)
//   sum_v[b*k + j] = sum_f x_fj                 (when fm and sum_v != nullptr; for backward)
//   x0[b*F*k + f*k + j] = x_fj                  (when deep: exactly one of x0_f32 / x0_bf16)
void SparseForward(const SparseShape& shape, const Tower::Input& in, float bias, int64_t begin,
                   int64_t end, float* logits, float* sum_v, float* x0_f32, uint16_t* x0_bf16);

// Adds, for each listed entry e = b*F + f with slot u = slots[e], the entry's share of
// d(sum_b loss_b)/d(row u) plus the lazy L2 term into row_grads[u * row_dim ...]:
//   [0]   += g_b s + l2 w
//   [1+j] += s (g_b (sum_v[b*k + j] - x_fj) [fm] + dx0[e*k + j] [deep]) + l2 v_j
// g[n] = d loss_b / d logit_b; sum_v from SparseForward (fm); dx0[n*F*k] = d loss / d x0 (deep).
// The l2 term is the gradient of (l2/2) * sum over entries of (w^2 + |v|^2): the penalty is
// applied once per occurrence of a row in the slice, unscaled by s (TF's l2 on looked-up rows).
// entries: increasing entry indices (nullptr: all of [0, num_entries)).
void SparseBackward(const SparseShape& shape, const Tower::Input& in, const float* g,
                    const float* sum_v, const float* dx0, float l2, const int32_t* entries,
                    int64_t num_entries, float* row_grads);

// The list path (Tower::Input::offsets set): each (b, f) is pooled over its entries i,
//   x_f = sum_i s_i v_{slot_i},  first-order term sum_i s_i w_{slot_i},
// and the terms above take the pooled x_f. Forward also writes pooled[(b*F + f)*k + j] = x_fj
// (when fm; backward needs it) besides logits, sum_v and x0.
void SparseForwardLists(const SparseShape& shape, const Tower::Input& in, float bias,
                        int64_t begin, int64_t end, float* logits, float* sum_v, float* pooled,
                        float* x0_f32, uint16_t* x0_bf16);

// Backward of the list path over increasing entry indices i (in [0, num entries of the slice),
// entries == nullptr: all of [0, num_entries)), entry i of (b, f) with slot u and scale s:
//   [0]   += g_b s + l2 w
//   [1+j] += s (g_b (sum_v[b*k + j] - pooled[(b*F+f)*k + j]) [fm] + dx0[(b*F+f)*k + j] [deep])
//            + l2 v_j
void SparseBackwardLists(const SparseShape& shape, const Tower::Input& in, const float* g,
                         const float* sum_v, const float* pooled, const float* dx0, float l2,
                         const int32_t* entries, int64_t num_entries, float* row_grads);

// Sigmoid cross-entropy over examples [begin, end): writes g[b] = sigmoid(z_b) - y_b and returns
// sum_b loss_b, loss = max(z, 0) - z y + log1p(exp(-|z|)) (no overflow for any finite z).
double SigmoidCrossEntropy(const float* z, const float* y, int64_t begin, int64_t end, float* g);

// Which of `owners` workers accumulates the gradient of a slot: a multiplicative hash, so that no
// slot count is needed and the owners get similar shares.
inline int OwnerOfSlot(int32_t slot, int owners) {
  const uint32_t h = static_cast<uint32_t>(slot) * 0x9E3779B1u;
  return static_cast<int>((static_cast<uint64_t>(h) * static_cast<uint64_t>(owners)) >> 32);
}

// Writes to out (room for num) the increasing entries e < num with OwnerOfSlot(slots[e]) ==
// owner; returns their count. Branch-free.
int64_t SelectOwnedEntries(const int32_t* slots, int64_t num, int owner, int owners, int32_t* out);

}  // namespace pstrain
