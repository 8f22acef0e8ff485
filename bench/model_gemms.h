// The GEMMs one training step of a model runs, read off its dense layout (Model::dense_layout()),
// so that a benchmark can measure the roof of the model's own shapes (bench/gemm_peak.h's
// GemmsRoofGflops) rather than DeepFM's.
//
// Every 2-D weight "<block>/w", "<block>/v" or "<block>/u" of shape [K, N] is a layer
// Y[M, N] = X[M, K] W at the tower's batch M, and a step runs three GEMMs for it:
//   forward          Y = X W                  (M, K, N)
//   backward-weights dW += X^T dY             (K, M, N), X read transposed
//   backward-data    dX = dY W^T              (M, N, K), W read transposed
// except the backward-data of DLRM's first bottom layer ("bottom0/w"), whose input is the data.
// This is how worker/model/mlp.cc, cross_network.cc (full rank: W; low rank: V then U; DCN-Mix:
// each expert's V_i, C_i, U_i and the gate, likewise) and bottom_mlp.cc run them. The MLP's
// ("mlp<l>/w", "out/w") and the cross network's
// ("cross<l>/...") and DLRM's bottom MLP's ("bottom<l>/w") run in bf16 under model.precision BF16.
// Layers with N = 1 (the output layer "out/w", DCN-v2's linear head "cross_out/w") are
// dot-product loops, not GEMMs, and are left out, as is the other non-GEMM work (the FM term,
// DLRM's dots, the cross network's elementwise passes, activations):
// ModelStepGemmFlopsPerExample says what share that leaves.
//
// DIN's target attention (worker/model/target_attention.h): its MLP's layers
// "att<f>/mlp<l>/w" [in, out] run over the stacked list entries of the tower's batch, not over
// its examples, so their M is `attention_rows` (the entries of the attended fields in one
// tower's batch: the caller knows its data) and all three GEMMs run (the first layer's
// backward-data feeds the embeddings' gradients); with attention_rows 0 they are left out. The
// first layer "att<f>/mlp0/w" [4k, N] runs as TargetAttention runs it: per entry over
// v_i = [e_i, e_i * c] (K 2k) and per example over c (K k, M the batch), three GEMMs each.
// TargetAttention runs the per-entry GEMMs in chunks of at most Options::chunk_rows (1,024)
// rows, each padded to it, and so does the roof: ceil(attention_rows / 1,024) times at M =
// 1,024 (one chunk of attention_rows when they fit it). On one Sapphire Rapids core these run at
// ~145 GFLOP/s against ~112 for the same GEMMs at M = 26,112 in one piece (bench/gemm_peak_bench
// BM_DinAttentionGemms): counting them in one piece would lower the roof. They
// stay f32 under BF16 (the attention has no bf16 path). The attention's FLOPs are per entry and
// per example, and Model::flops_per_example() leaves them out: AttentionFlopsPerEntry (times the
// entries per example) plus AttentionFlopsPerExample give them.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "bench/gemm_peak.h"
#include "worker/model/model.h"
#include "worker/model/target_attention.h"

namespace pstrain {

// The distinct GEMM shapes of one training step of `model` at `batch` examples a tower, each
// with how many times the step runs it.
inline std::vector<std::pair<GemmShape, int>> ModelStepGemms(const Model& model, int batch,
                                                             bool bf16,
                                                             int64_t attention_rows = 0) {
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool>;
  std::map<Key, int> counts;
  auto add = [&](int64_t m, int64_t k, int64_t n, bool ta, bool tb, bool low) {
    ++counts[Key{m, k, n, ta, tb, low}];
  };
  for (const DenseTensor& t : model.dense_layout()) {
    if (t.shape.size() != 2) continue;
    // DCN-Mix's experts "cross<l>/{v,c,u}<i>" and gate "cross<l>/gate" run the same three GEMMs
    // (worker/model/cross_network.h).
    const std::string leaf = t.name.substr(t.name.rfind('/') + 1);
    const bool mix = absl::StartsWith(t.name, "cross") && leaf.size() >= 2 &&
                     ((std::string("vcu").find(leaf[0]) != std::string::npos &&
                       leaf.find_first_not_of("0123456789", 1) == std::string::npos) ||
                      leaf == "gate");
    if (!mix && !absl::EndsWith(t.name, "/w") && !absl::EndsWith(t.name, "/v") &&
        !absl::EndsWith(t.name, "/u")) {
      continue;
    }
    const bool attention = absl::StartsWith(t.name, "att");
    if (attention && attention_rows <= 0) continue;
    // The per-entry GEMMs run chunk by chunk: ceil(rows / chunk) chunks of the chunk's M
    // (TargetAttention pads each to it), or one of the rows when they fit one chunk.
    const int64_t chunk = TargetAttention::kDefaultChunkRows;
    const int64_t entry_m = std::min(attention_rows, chunk);
    const int chunks = static_cast<int>((attention_rows + chunk - 1) / chunk);
    const int64_t K = t.shape[0], N = t.shape[1], M = attention ? entry_m : batch;
    if (K <= 1 || N <= 1) continue;
    const int times = attention ? chunks : 1;
    if (attention && absl::EndsWith(t.name, "/mlp0/w")) {
      const int64_t k = K / 4;
      for (const auto& [m, kk, reps] :
           {std::tuple{entry_m, 2 * k, chunks}, std::tuple{int64_t{batch}, k, 1}}) {
        for (int r = 0; r < reps; ++r) {
          add(m, kk, N, false, false, false);
          add(kk, m, N, true, false, false);
          add(m, N, kk, false, true, false);
        }
      }
      continue;
    }
    const bool low =
        bf16 && (absl::StartsWith(t.name, "mlp") || absl::StartsWith(t.name, "out/") ||
                 absl::StartsWith(t.name, "cross") || absl::StartsWith(t.name, "bottom"));
    for (int r = 0; r < times; ++r) {
      add(M, K, N, false, false, low);
      add(K, M, N, true, false, low);
      if (t.name != "bottom0/w") add(M, N, K, false, true, low);
    }
  }
  std::vector<std::pair<GemmShape, int>> gemms;
  for (const auto& [key, count] : counts) {
    GemmShape s;
    std::tie(s.m, s.k, s.n, s.trans_a, s.trans_b, s.bf16) = key;
    gemms.emplace_back(s, count);
  }
  return gemms;
}

// The FLOPs per example of ModelStepGemms (to set against Model::flops_per_example() plus, with
// target attention, the entries per example times AttentionFlopsPerEntry).
inline double ModelStepGemmFlopsPerExample(const Model& model, int batch, bool bf16,
                                           int64_t attention_rows = 0) {
  double flops = 0;
  for (const auto& [s, count] : ModelStepGemms(model, batch, bf16, attention_rows)) {
    flops += count * s.flops();
  }
  return flops / batch;
}

// The training FLOPs of target attention per attended list entry, counted as Model counts its
// MLP: 6 in*out for each layer "att<f>/mlp<l>/w" (forward, backward-data, backward-weights) but
// 6 (in/2) out for the first (its per-entry GEMMs have K 2k: ModelStepGemms), and 6 H for the
// output unit "att<f>/out/w" [H, 1]; summed over the attended fields (an entry of field f pays
// f's MLP only, so with several attended fields this is per entry of each). 0 for a model
// without target attention.
inline double AttentionFlopsPerEntry(const Model& model) {
  double flops = 0;
  for (const DenseTensor& t : model.dense_layout()) {
    if (t.shape.size() != 2 || !absl::StartsWith(t.name, "att")) continue;
    if (absl::EndsWith(t.name, "/mlp0/w")) {
      flops += 6.0 * (t.shape[0] / 2) * t.shape[1];
    } else if (absl::EndsWith(t.name, "/w")) {
      flops += 6.0 * t.shape[0] * t.shape[1];
    }
  }
  return flops;
}

// The training FLOPs of target attention per example: the first layer's term of the target c
// ([k, N] of "att<f>/mlp0/w" [4k, N]), 6 (in/4) out an attended field. 0 without attention.
inline double AttentionFlopsPerExample(const Model& model) {
  double flops = 0;
  for (const DenseTensor& t : model.dense_layout()) {
    if (t.shape.size() == 2 && absl::StartsWith(t.name, "att") &&
        absl::EndsWith(t.name, "/mlp0/w")) {
      flops += 6.0 * (t.shape[0] / 4) * t.shape[1];
    }
  }
  return flops;
}

}  // namespace pstrain
