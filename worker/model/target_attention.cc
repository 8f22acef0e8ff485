#include "worker/model/target_attention.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/status.h"
#include "worker/model/fm.h"

namespace pstrain {
namespace {

// The GEMMs' M for R stacked rows: R rounded up to a multiple of max(32, 2^floor(log2 R) / 8),
// so at most ~8 shapes per octave reach the primitive cache and at most 1/8 of the rows is padding.
int64_t PaddedRows(int64_t r) {
  int64_t q = 32;
  while (q * 16 <= r) q *= 2;
  return (r + q - 1) / q * q;
}

// sum[j] += sum over r < rows of scale(r) x[r * ld + j], for j in [begin, end), each column summed
// in row order (the same floats as the plain loop over r then j), 64 columns at a time in a
// local block: the loop over j with sum[] in memory reloaded and stored it for every row, and
// did not vectorize (sum may alias x).
template <typename Scale>
void ColumnSums(const float* __restrict x, int64_t rows, int64_t ld, int64_t begin, int64_t end,
                Scale scale, float* __restrict sum) {
  constexpr int64_t kBlock = 64;
  for (int64_t j0 = begin; j0 < end; j0 += kBlock) {
    const int64_t w = std::min(kBlock, end - j0);
    float acc[kBlock];
    std::copy(sum + j0, sum + j0 + w, acc);
    for (int64_t r = 0; r < rows; ++r) {
      const float s = scale(r);
      const float* __restrict xr = x + r * ld + j0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) acc[j] += s * xr[j];
    }
    std::copy(acc, acc + w, sum + j0);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TargetAttention>> TargetAttention::Create(const Options& options) {
  const int F = options.num_fields, k = options.dim;
  if (F <= 0 || k <= 0 || options.threads <= 0 || options.fields.empty()) {
    return absl::InvalidArgumentError(
        "TargetAttention needs fields > 0, dim > 0, threads > 0 and an attended field");
  }
  if (!options.x0_offset.empty() && static_cast<int>(options.x0_offset.size()) != F) {
    return absl::InvalidArgumentError("TargetAttention: x0_offset needs one offset per field");
  }
  for (size_t a = 0; a < options.fields.size(); ++a) {
    const Field& fd = options.fields[a];
    const int d = fd.dim > 0 ? fd.dim : k;
    if (fd.field < 0 || fd.field >= F || fd.target < 0 || fd.target >= F ||
        fd.field == fd.target || fd.hidden.empty() || fd.hidden[0].in != 4 * d ||
        d > kMaxEmbeddingDim || (options.fm && d != k)) {
      return absl::InvalidArgumentError(
          absl::StrCat("TargetAttention field ", a, ": bad field, target or layer sizes"));
    }
    for (size_t l = 0; l < fd.hidden.size(); ++l) {
      const Mlp::Layer& layer = fd.hidden[l];
      if (layer.out <= 0 || (l > 0 && layer.in != fd.hidden[l - 1].out)) {
        return absl::InvalidArgumentError(
            absl::StrCat("TargetAttention field ", a, " layer ", l, " has bad sizes"));
      }
    }
  }
  std::unique_ptr<TargetAttention> att(new TargetAttention(options));
  att->state_.resize(options.fields.size());
  for (size_t a = 0; a < options.fields.size(); ++a) {
    att->state_[a].h.resize(options.fields[a].hidden.size());
  }
  return att;
}

void TargetAttention::Reserve(AlignedArray<float>* a, int64_t size) {
  if (static_cast<int64_t>(a->size()) < size) *a = AlignedArray<float>(static_cast<size_t>(size));
}

int64_t TargetAttention::CellBegin(const Tower::Input& in, int64_t cell) const {
  return in.offsets != nullptr ? in.offsets[cell] - in.offsets[0] : cell;
}

void TargetAttention::PlanChunks(int n, State* st) const {
  const int64_t cap = std::max<int64_t>(1, opt_.chunk_rows);
  st->chunks.clear();
  st->padded = 0;
  st->max_m = 0;
  for (int64_t b = 0; b < n;) {
    Chunk ch;
    ch.begin = b;
    ch.row = st->cell_begin[b];
    // Whole examples while they fit; an example longer than the cap is a chunk alone.
    while (b < n && (b == ch.begin || st->cell_begin[b + 1] - ch.row <= cap)) ++b;
    ch.end = b;
    ch.rows = st->cell_begin[b] - ch.row;
    // Every chunk of a slice of several is padded to the cap, the last one too: one GEMM shape,
    // and on oneDNN's avx2 path (gemm:jit) a small M's sums depend on the thread count where
    // the cap's do not (target_attention_test RowGradientsAreBitIdenticalOverThreadCounts). A
    // slice's only chunk, and an example longer than the cap, to PaddedRows.
    if (ch.rows > cap) {
      ch.m = PaddedRows(ch.rows);
    } else if (b < n || !st->chunks.empty()) {
      ch.m = cap;
    } else {
      ch.m = std::min(cap, PaddedRows(ch.rows));
    }
    ch.base = st->padded;
    st->padded += ch.m;
    st->max_m = std::max(st->max_m, ch.m);
    st->chunks.push_back(ch);
  }
}

absl::Status TargetAttention::Forward(const Tower::Input& in, float* x0_f32, uint16_t* x0_bf16,
                                      float* logits, float* sum_v, float* pooled) {
  const int n = in.n, F = opt_.num_fields;
  const int64_t rd = RowDim(), D = X0Width();
  if (n <= 0) return absl::OkStatus();
  for (size_t a = 0; a < opt_.fields.size(); ++a) {
    const Field& fd = opt_.fields[a];
    const int k = Dim(fd);  // the field's dim (== opt_.dim with fm)
    State& st = state_[a];
    // The stacked rows: example b's entries of field f.
    st.cell_begin.assign(static_cast<size_t>(n) + 1, 0);
    st.entry.clear();
    for (int b = 0; b < n; ++b) {
      const int64_t t = int64_t{b} * F + fd.target;
      if (CellBegin(in, t + 1) - CellBegin(in, t) != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TargetAttention: example ", b, " holds ", CellBegin(in, t + 1) - CellBegin(in, t),
            " entries of the attention target field ", fd.target, ", expected exactly 1"));
      }
      const int64_t cell = int64_t{b} * F + fd.field;
      for (int64_t i = CellBegin(in, cell); i < CellBegin(in, cell + 1); ++i) {
        st.entry.push_back(i);
      }
      st.cell_begin[b + 1] = static_cast<int64_t>(st.entry.size());
    }
    const int64_t R = static_cast<int64_t>(st.entry.size());
    st.rows = R;
    PlanChunks(n, &st);
    const int64_t P = st.padded;
    const int64_t w2 = 2 * int64_t{k};
    Reserve(&st.v, P * w2);
    Reserve(&st.c, int64_t{n} * k);
    Reserve(&st.a, R);
    if (opt_.fm) Reserve(&st.x, int64_t{n} * k);
    // The first layer is linear in u = [e, c, e - c, e * c]: with W = [We; Wc; Wd; Wp],
    // u W = e (We + Wd) + (e * c) Wp + c (Wc - Wd). So the per-entry GEMM runs over
    // v = [e, e * c] (K 2k, not 4k) against W' = [We + Wd; Wp], and c's part is one row an
    // example, q = c (Wc - Wd), added with the bias.
    const Mlp::Layer& first = fd.hidden[0];
    const int64_t N0 = first.out, kn = int64_t{k} * N0;
    Reserve(&st.w1, 2 * kn);
    Reserve(&st.wq, kn);
    {
      const float* w = in.dense + first.w;
      for (int64_t j = 0; j < kn; ++j) {
        st.w1[j] = w[j] + w[2 * kn + j];
        st.w1[kn + j] = w[3 * kn + j];
        st.wq[j] = w[kn + j] - w[2 * kn + j];
      }
    }
    // c per example, and q_b = c_b (Wc - Wd) + b: the first layer's per-example row.
    ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t t = CellBegin(in, b * F + fd.target);
        const float st_scale = in.scales[t];
        const float* vt = in.rows + int64_t{in.slots[t]} * rd + 1;
        float* c = st.c.data() + b * k;
        for (int j = 0; j < k; ++j) c[j] = st_scale * vt[j];
      }
    });
    Reserve(&q_, int64_t{n} * N0);
    RETURN_IF_ERROR(gemm_.Run({n, k, N0}, st.c.data(), st.wq.data(), q_.data()));
    const int L = static_cast<int>(fd.hidden.size());
    const int64_t H = fd.hidden.back().out;
    for (int l = 0; l < L; ++l) Reserve(&st.h[l], P * fd.hidden[l].out);
    const float* ow = in.dense + fd.out_w;
    const float ob = in.dense[fd.out_b];
    // Chunk by chunk: v_i = [e, e * c] (the padded rows zero); the hidden layers, each a GEMM,
    // then bias (and q_b for the first) and ReLU per example; the last one's loop also runs the
    // output unit and x_f = sum_i s_i a_i e_i while the row is in cache (e_i read from v, in row
    // order, not gathered from the rows again).
    for (const Chunk& ch : st.chunks) {
      float* vc = st.v.data() + ch.base * w2;
      ParallelFor(ch.end - ch.begin, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
        for (int64_t b = ch.begin + begin; b < ch.begin + end; ++b) {
          const float* c = st.c.data() + b * k;
          for (int64_t r = st.cell_begin[b]; r < st.cell_begin[b + 1]; ++r) {
            const float* e = in.rows + int64_t{in.slots[st.entry[r]]} * rd + 1;
            float* v = vc + (r - ch.row) * w2;
            for (int j = 0; j < k; ++j) {
              v[j] = e[j];
              v[k + j] = e[j] * c[j];
            }
          }
        }
      });
      std::memset(vc + ch.rows * w2, 0, sizeof(float) * (ch.m - ch.rows) * w2);
      const float* src = vc;
      for (int l = 0; l < L; ++l) {
        const Mlp::Layer& layer = fd.hidden[l];
        const int64_t N = layer.out;
        float* h = st.h[l].data() + ch.base * N;  // the chunk's rows
        const float* bias = in.dense + layer.b;
        const bool last = l + 1 == L;
        if (ch.m > 0) {
          RETURN_IF_ERROR(gemm_.Run({ch.m, l == 0 ? w2 : layer.in, N}, src,
                                    l == 0 ? st.w1.data() : in.dense + layer.w, h));
        }
        ParallelFor(ch.end - ch.begin, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
          float x[kMaxEmbeddingDim];
          const float* __restrict owr = ow;
          for (int64_t b = ch.begin + begin; b < ch.begin + end; ++b) {
            const float* add = bias;
            if (l == 0) {
              float* __restrict qb = q_.data() + b * N;
#pragma omp simd
              for (int64_t j = 0; j < N; ++j) qb[j] += bias[j];
              add = qb;
            }
            std::fill(x, x + k, 0.f);
            for (int64_t r = st.cell_begin[b]; r < st.cell_begin[b + 1]; ++r) {
              const int64_t p = r - ch.row;
              float* __restrict row = h + p * N;
#pragma omp simd
              for (int64_t j = 0; j < N; ++j) row[j] = std::max(row[j] + add[j], 0.f);
              if (!last) continue;
              // One vector chain of partial sums, not H dependent adds.
              float dot = 0.f;
#pragma omp simd reduction(+ : dot)
              for (int64_t j = 0; j < H; ++j) dot += row[j] * owr[j];
              const float ar = dot + ob;
              st.a[r] = ar;
              const float w = in.scales[st.entry[r]] * ar;
              const float* e = vc + p * w2;
              for (int j = 0; j < k; ++j) x[j] += w * e[j];
            }
            if (!last) continue;
            const int64_t off = b * D + X0Offset(fd.field);
            if (opt_.fm) {
              // Replacing old by x in the FM sum S changes the term by
              // sum_j (x - old)_j (S - old)_j.
              float* S = sum_v + b * k;
              const float* old = pooled + (b * F + fd.field) * k;
              float delta = 0.f;
              for (int j = 0; j < k; ++j) {
                const float d = x[j] - old[j];
                delta += d * (S[j] - old[j]);
                S[j] += d;
              }
              logits[b] += delta;
              std::copy(x, x + k, st.x.data() + b * k);
            }
            if (x0_f32 != nullptr) {
              std::copy(x, x + k, x0_f32 + off);
            } else {
              for (int j = 0; j < k; ++j) x0_bf16[off + j] = FloatToBf16(x[j]);
            }
          }
        });
        // The padded rows (zero input): the bias alone, so that the next GEMM reads finite rows.
        for (int64_t p = ch.rows; p < ch.m; ++p) {
          for (int64_t j = 0; j < N; ++j) h[p * N + j] = std::max(h[p * N + j] + bias[j], 0.f);
        }
        src = h;
      }
    }
  }
  if (opt_.fm) {
    // The attended cells' "pooled" is the final sum: SparseBackwardLists' FM term for their
    // entries, g_b (sum_v - pooled), is then zero.
    const int k = opt_.dim;
    for (const Field& fd : opt_.fields) {
      for (int64_t b = 0; b < n; ++b) {
        std::copy(sum_v + b * k, sum_v + (b + 1) * k, pooled + (b * F + fd.field) * k);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TargetAttention::Backward(const Tower::Input& in, float* dx0, const float* g,
                                       const float* sum_v, float* dense_grad) {
  const int n = in.n;
  const int64_t D = X0Width();
  if (n <= 0) return absl::OkStatus();
  if (dx0 == nullptr) return absl::InternalError("TargetAttention::Backward: no input gradient");
  // The attended cells' d loss / d x_f, kept aside (every field's before any is adjusted: a
  // target may itself be attended), then zeroed in dx0: the sparse backward adds only their
  // first-order and L2 terms.
  int64_t cells = 0;
  for (const Field& fd : opt_.fields) cells += int64_t{n} * Dim(fd);
  Reserve(&dxf_, cells);
  {
    float* kept = dxf_.data();
    for (const Field& fd : opt_.fields) {
      const int k = Dim(fd);
      for (int64_t b = 0; b < n; ++b) {
        float* cell = dx0 + b * D + X0Offset(fd.field);
        std::copy(cell, cell + k, kept + b * k);
        std::fill_n(cell, k, 0.f);
      }
      kept += int64_t{n} * k;
    }
  }
  const float* kept_field = dxf_.data();
  for (size_t a = 0; a < opt_.fields.size(); ++a) {
    const Field& fd = opt_.fields[a];
    const int k = Dim(fd);
    State& st = state_[a];
    const float* dxf = kept_field;  // [n, k]: this field's cells of dx0 before the adjustment
    kept_field += int64_t{n} * k;
    const int64_t R = st.rows;
    const int64_t H = fd.hidden.back().out;
    int64_t width = 0;
    for (const Mlp::Layer& layer : fd.hidden) width = std::max<int64_t>(width, layer.out);
    const int64_t w2 = 2 * int64_t{k};
    Reserve(&dz_[0], st.max_m * width);
    Reserve(&dz_[1], st.max_m * width);
    Reserve(&dv_, st.max_m * w2);
    Reserve(&st.de, R * k);
    const float* ow = in.dense + fd.out_w;
    const int L = static_cast<int>(fd.hidden.size());
    const int64_t N0 = fd.hidden[0].out, kn = int64_t{k} * N0;
    Reserve(&s_, int64_t{n} * N0);
    Reserve(&pw_, int64_t{n} * H);
    // G = v^T dz = [E^T dz; (E * C)^T dz], summed over the chunks; then T = C^T S after it.
    Reserve(&g1_, 3 * kn);
    float* G = g1_.data();
    float* T = G + 2 * kn;
    std::fill_n(G, 2 * kn, 0.f);
    for (const Chunk& ch : st.chunks) {
      const float* vc = st.v.data() + ch.base * w2;
      const float* hl = st.h.back().data() + ch.base * H;
      // da_i = s_i (dx_f . e_i), the direct d e_i = s_i a_i dx_f, and the last layer's dz =
      // da_i out/w masked by its ReLU, in one pass per example (e_i read from v); with it the
      // per-example partial sums of out/w's gradient (da_i h_i) and, with one hidden layer, of
      // dz (S_b, the first layer's). Padded rows get dz = 0. da is kept in the a buffer's place:
      // a is not needed after this.
      float* dh = dz_[0].data();
      ParallelFor(ch.end - ch.begin, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
        float dx_fm[kMaxEmbeddingDim];
        // Locals, so that the stores below cannot alias the captured pointers (the loop over H
        // did not vectorize through them).
        const float* __restrict owr = ow;
        for (int64_t b = ch.begin + begin; b < ch.begin + end; ++b) {
          const float* dx = dxf + b * k;
          if (opt_.fm) {
            // d loss / d x_f = the MLP's + the FM term's g_b (sum_v - x_f).
            const float* x = st.x.data() + b * k;
            for (int j = 0; j < k; ++j) dx_fm[j] = dx[j] + g[b] * (sum_v[b * k + j] - x[j]);
            dx = dx_fm;
          }
          float* __restrict pb = pw_.data() + b * H;
          float* __restrict sb = s_.data() + b * N0;
          std::fill_n(pb, H, 0.f);
          if (L == 1) std::fill_n(sb, N0, 0.f);
          for (int64_t r = st.cell_begin[b]; r < st.cell_begin[b + 1]; ++r) {
            const int64_t p = r - ch.row;
            const float s = in.scales[st.entry[r]];
            const float* e = vc + p * w2;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j < k; ++j) dot += dx[j] * e[j];
            const float da = s * dot;
            float* de = st.de.data() + r * k;
            for (int j = 0; j < k; ++j) de[j] = s * st.a[r] * dx[j];
            st.a[r] = da;
            const float* __restrict hr = hl + p * H;
            float* __restrict dzr = dh + p * H;
#pragma omp simd
            for (int64_t j = 0; j < H; ++j) {
              // A select of da, not of the product: the conditional product did not vectorize.
              const float hj = hr[j], m = hj > 0.f ? da : 0.f;
              pb[j] += da * hj;
              dzr[j] = m * owr[j];
            }
            if (L == 1) {
#pragma omp simd
              for (int64_t j = 0; j < H; ++j) sb[j] += dzr[j];
            }
          }
        }
      });
      std::memset(dh + ch.rows * H, 0, sizeof(float) * (ch.m - ch.rows) * H);
      // The hidden layers, last to first: dz = dh masked by ReLU (the last one's already is);
      // db (the chunks' rows summed in row order: the same floats as over the whole slice), dW,
      // then dh of the layer below.
      int cur = 0;
      for (int l = L - 1; l >= 0; --l) {
        const Mlp::Layer& layer = fd.hidden[l];
        const int64_t N = layer.out;
        const float* h = st.h[l].data() + ch.base * N;
        float* dz = dz_[cur].data();
        if (l > 0) {
          if (l + 1 < L) {
            ParallelFor(ch.rows, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
              for (int64_t p = begin; p < end; ++p) {
#pragma omp simd
                for (int64_t j = 0; j < N; ++j) {
                  dz[p * N + j] = h[p * N + j] > 0.f ? dz[p * N + j] : 0.f;
                }
              }
            });
          }
          float* gb = dense_grad + layer.b;
          ParallelFor(N, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
            ColumnSums(dz, ch.rows, N, begin, end, [](int64_t) { return 1.f; }, gb);
          });
          if (ch.m > 0) {
            const float* below = st.h[l - 1].data() + ch.base * layer.in;
            RETURN_IF_ERROR(gemm_.Run(
                {layer.in, ch.m, N, /*trans_a=*/true, false, /*accumulate=*/true}, below, dz,
                dense_grad + layer.w));
            RETURN_IF_ERROR(gemm_.Run({ch.m, N, layer.in, false, /*trans_b=*/true, false}, dz,
                                      in.dense + layer.w, dz_[1 - cur].data()));
          }
          cur = 1 - cur;
          continue;
        }
        // The first layer through v = [e, e * c] and c (Forward): with S_b = sum of example b's
        // dz rows, G = v^T dz and T = C^T S:
        //   dWe = E^T dz, dWc = T, dWd = E^T dz - T, dWp = (E * C)^T dz;
        //   dv = dz W'^T = [dz (We + Wd)^T, dz Wp^T], and c's part of dc is S_b (Wc - Wd)^T;
        //   db = sum of the S_b.
        if (L > 1) {
          // The ReLU mask and S_b in one pass (one hidden layer: both done above).
          ParallelFor(ch.end - ch.begin, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
            for (int64_t b = ch.begin + begin; b < ch.begin + end; ++b) {
              float* __restrict sb = s_.data() + b * N;
              std::fill_n(sb, N, 0.f);
              for (int64_t r = st.cell_begin[b]; r < st.cell_begin[b + 1]; ++r) {
                const int64_t p = r - ch.row;
                float* __restrict dzr = dz + p * N;
                const float* __restrict hr = h + p * N;
#pragma omp simd
                for (int64_t j = 0; j < N; ++j) {
                  dzr[j] = hr[j] > 0.f ? dzr[j] : 0.f;
                  sb[j] += dzr[j];
                }
              }
            }
          });
        }
        if (ch.m > 0) {
          RETURN_IF_ERROR(gemm_.Run({w2, ch.m, N, /*trans_a=*/true, false, /*accumulate=*/true},
                                    vc, dz, G));
          RETURN_IF_ERROR(gemm_.Run({ch.m, N, w2, false, /*trans_b=*/true, false}, dz,
                                    st.w1.data(), dv_.data()));
        }
      }
      // d e_i += dv[0:k] + dv[k:2k] * c; the target's cell gets dc = S_b (Wc - Wd)^T plus the
      // sum over i of dv[k:2k] * e_i (in row order).
      const float* dvc = dv_.data();
      ParallelFor(ch.end - ch.begin, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
        for (int64_t b = ch.begin + begin; b < ch.begin + end; ++b) {
          const float* c = st.c.data() + b * k;
          float* dc = dx0 + b * D + X0Offset(fd.target);
          const float* __restrict sb = s_.data() + b * N0;
          for (int j = 0; j < k; ++j) {
            const float* __restrict wqj = st.wq.data() + j * N0;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < N0; ++i) dot += sb[i] * wqj[i];
            dc[j] += dot;
          }
          for (int64_t r = st.cell_begin[b]; r < st.cell_begin[b + 1]; ++r) {
            const int64_t p = r - ch.row;
            const float* e = vc + p * w2;  // e_i, in row order
            const float* dv = dvc + p * w2;
            float* de = st.de.data() + r * k;
            for (int j = 0; j < k; ++j) {
              de[j] += dv[j] + dv[k + j] * c[j];
              dc[j] += dv[k + j] * e[j];
            }
          }
        }
      });
    }
    // out/w and out/b: columns over the threads, each summed in example order.
    float* gow = dense_grad + fd.out_w;
    ParallelFor(H, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      ColumnSums(pw_.data(), n, H, begin, end, [](int64_t) { return 1.f; }, gow);
    });
    float gob = 0.f;
    for (int64_t r = 0; r < R; ++r) gob += st.a[r];
    dense_grad[fd.out_b] += gob;
    // The first layer's bias and weights.
    float* gb0 = dense_grad + fd.hidden[0].b;
    ParallelFor(N0, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      ColumnSums(s_.data(), n, N0, begin, end, [](int64_t) { return 1.f; }, gb0);
    });
    RETURN_IF_ERROR(gemm_.Run({k, n, N0, /*trans_a=*/true, false, false}, st.c.data(),
                              s_.data(), T));
    float* gw = dense_grad + fd.hidden[0].w;
    for (int64_t j = 0; j < kn; ++j) {
      gw[j] += G[j];
      gw[kn + j] += T[j];
      gw[2 * kn + j] += G[j] - T[j];
      gw[3 * kn + j] += G[kn + j];
    }
  }
  return absl::OkStatus();
}

void TargetAttention::AddRowGrads(const Tower::Input& in, int owner, int owners,
                                  float* row_grads) const {
  const int64_t rd = RowDim();
  for (size_t a = 0; a < opt_.fields.size(); ++a) {
    const State& st = state_[a];
    const int k = Dim(opt_.fields[a]);
    for (int64_t r = 0; r < st.rows; ++r) {
      const int32_t slot = in.slots[st.entry[r]];
      if (owners > 1 && OwnerOfSlot(slot, owners) != owner) continue;
      float* g = row_grads + int64_t{slot} * rd + 1;
      const float* de = st.de.data() + r * k;
      for (int j = 0; j < k; ++j) g[j] += de[j];
    }
  }
}

}  // namespace pstrain
