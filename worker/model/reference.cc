#include "worker/model/reference.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/model/simd.h"

namespace pstrain {
namespace {

const DenseTensor& Find(const Model& model, const std::string& name) {
  for (const DenseTensor& t : model.dense_layout()) {
    if (t.name == name) return t;
  }
  PSTRAIN_CHECK(false) << "no dense tensor " << name;
  return model.dense_layout().front();
}

}  // namespace

namespace {

bool Has(const Model& model, const std::string& name) {
  for (const DenseTensor& t : model.dense_layout()) {
    if (t.name == name) return true;
  }
  return false;
}

// y = x W + b (W "<name>/w" [in, out], b "<name>/b"), ReLU when relu.
std::vector<double> Dense(const Model& model, const double* dense, const std::string& name,
                          const std::vector<double>& x, bool relu) {
  const DenseTensor& w = Find(model, name + "/w");
  const DenseTensor& bias = Find(model, name + "/b");
  const int64_t rows = w.shape[0], cols = w.shape[1];
  PSTRAIN_CHECK(static_cast<int64_t>(x.size()) == rows) << name;
  std::vector<double> y(cols);
  for (int64_t o = 0; o < cols; ++o) {
    double s = dense[bias.offset + o];
    for (int64_t i = 0; i < rows; ++i) s += x[i] * dense[w.offset + i * cols + o];
    y[o] = relu ? std::max(s, 0.0) : s;
  }
  return y;
}

// The MLP "mlp<l>" (ReLU) then "out": one logit.
// DCN-Mix (cross_network.h): for one example, y += sum_i p_i tanh(tanh(x V_i) C_i) U_i with
// p = softmax(x gate); V_i at v + i D r, C_i at c + i r r, U_i at u + i r D, gate [D, K]. Keeps
// p [K] and the two tanh layers a1, a2 ([K][r]) for the backward.
struct MixTrace {
  std::vector<double> p, a1, a2;
};
template <typename T>
MixTrace MixForwardOne(const std::vector<double>& x, const T* dense, int64_t D, int64_t r,
                       int64_t K, int64_t v, int64_t c, int64_t u, int64_t gate,
                       std::vector<double>& y) {
  MixTrace tr{std::vector<double>(K, 0.0), std::vector<double>(K * r, 0.0),
              std::vector<double>(K * r, 0.0)};
  double top = -1e300, sum = 0;
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t j = 0; j < D; ++j) tr.p[i] += x[j] * dense[gate + j * K + i];
    top = std::max(top, tr.p[i]);
  }
  for (int64_t i = 0; i < K; ++i) sum += tr.p[i] = std::exp(tr.p[i] - top);
  for (int64_t i = 0; i < K; ++i) tr.p[i] /= sum;
  for (int64_t i = 0; i < K; ++i) {
    double* a1 = &tr.a1[i * r];
    double* a2 = &tr.a2[i * r];
    for (int64_t q = 0; q < r; ++q) {
      double s = 0;
      for (int64_t j = 0; j < D; ++j) s += x[j] * dense[v + i * D * r + j * r + q];
      a1[q] = std::tanh(s);
    }
    for (int64_t q = 0; q < r; ++q) {
      double s = 0;
      for (int64_t j = 0; j < r; ++j) s += a1[j] * dense[c + i * r * r + j * r + q];
      a2[q] = std::tanh(s);
    }
    for (int64_t o = 0; o < D; ++o) {
      double s = 0;
      for (int64_t q = 0; q < r; ++q) s += a2[q] * dense[u + i * r * D + q * D + o];
      y[o] += tr.p[i] * s;
    }
  }
  return tr;
}

double ReferenceMlpLogit(const Model& model, const double* dense, std::vector<double> a) {
  for (int l = 0; Has(model, absl::StrCat("mlp", l, "/w")); ++l) {
    a = Dense(model, dense, absl::StrCat("mlp", l), a, /*relu=*/true);
  }
  return Dense(model, dense, "out", a, /*relu=*/false)[0];
}

double DotProduct(const std::vector<double>& a, const double* w) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * w[i];
  return s;
}

}  // namespace

std::vector<double> ReferenceLogits(const ModelConfig& config, const Model& model,
                                    const ReferenceInput& in) {
  const int F = model.num_fields(), k = model.embedding_dim(), rd = model.row_dim();
  // Per-field dims: field f's d_f floats start at off[f] of x (f*k when every field has dim k).
  const std::vector<int>& dims = model.field_dims();
  const std::vector<char>& excluded = model.fm_excluded();
  std::vector<int64_t> off(F + 1, 0);
  for (int f = 0; f < F; ++f) off[f + 1] = off[f] + dims[f];
  const ModelConfig resolved = ResolveModelConfig(config);
  const ModelType type = resolved.type();
  const bool grammar = type == DCN_V2 || type == DLRM || type == BLOCKS || type == DIN;
  const ModelBlocks::Interaction interaction = resolved.blocks().interaction();
  const bool fm = type == DEEPFM || type == FM ||
                  (grammar && interaction == ModelBlocks::FM_TERM);
  const bool deep = type == DEEPFM || type == WIDE_DEEP || (grammar && resolved.blocks().mlp());
  const bool cross = grammar && interaction == ModelBlocks::CROSS_V2;
  const bool dot = grammar && interaction == ModelBlocks::DOT;
  const bool parallel = resolved.blocks().join() == ModelBlocks::PARALLEL;
  const double* dense = in.dense;
  std::vector<double> logits(in.n);
  for (int b = 0; b < in.n; ++b) {
    // x = concat_f s_f v_f, and the first-order term.
    std::vector<double> x(static_cast<size_t>(off[F]));
    double z = dense[0];
    for (int f = 0; f < F; ++f) {
      // The entries of (b, f): one, or a list pooled as sum_i s_i row_i.
      const int64_t e = static_cast<int64_t>(b) * F + f;
      const int64_t lo = in.offsets != nullptr ? in.offsets[e] - in.offsets[0] : e;
      const int64_t hi = in.offsets != nullptr ? in.offsets[e + 1] - in.offsets[0] : e + 1;
      for (int64_t i = lo; i < hi; ++i) {
        const double s = in.scales[i];
        const double* row = in.rows + static_cast<int64_t>(in.slots[i]) * rd;
        z += s * row[0];
        for (int j = 0; j < dims[f]; ++j) x[off[f] + j] += s * row[1 + j];
      }
    }
    // Target attention (target_attention.h): x_f = sum_i s_i a_i e_i, a_i = MLP_att([e, c, e - c,
    // e * c]), c = x_t (the target holds one entry). The first-order term keeps the sum above.
    for (const ModelInputs::Attention& att : model.attention()) {
      const int f = att.field, t = att.target;
      const int64_t e = static_cast<int64_t>(b) * F + f;
      const int64_t lo = in.offsets != nullptr ? in.offsets[e] - in.offsets[0] : e;
      const int64_t hi = in.offsets != nullptr ? in.offsets[e + 1] - in.offsets[0] : e + 1;
      const int d = dims[f];  // == dims[t] (Model::Create)
      std::vector<double> pooled(d, 0.0);
      for (int64_t i = lo; i < hi; ++i) {
        const double* v = in.rows + static_cast<int64_t>(in.slots[i]) * rd + 1;
        std::vector<double> u(4 * static_cast<size_t>(d));
        for (int j = 0; j < d; ++j) {
          const double c = x[off[t] + j];
          u[j] = v[j];
          u[d + j] = c;
          u[2 * d + j] = v[j] - c;
          u[3 * d + j] = v[j] * c;
        }
        for (int l = 0; Has(model, absl::StrCat("att", f, "/mlp", l, "/w")); ++l) {
          u = Dense(model, dense, absl::StrCat("att", f, "/mlp", l), u, /*relu=*/true);
        }
        const double a = Dense(model, dense, absl::StrCat("att", f, "/out"), u, /*relu=*/false)[0];
        for (int j = 0; j < d; ++j) pooled[j] += in.scales[i] * a * v[j];
      }
      for (int j = 0; j < d; ++j) x[off[f] + j] = pooled[j];
    }
    if (fm) {
      for (int j = 0; j < k; ++j) {
        double sum = 0, sq = 0;
        for (int f = 0; f < F; ++f) {
          if (excluded[f]) continue;  // the fields in the FM term have d_f == k
          sum += x[off[f] + j];
          sq += x[off[f] + j] * x[off[f] + j];
        }
        z += 0.5 * (sum * sum - sq);
      }
    }
    std::vector<double> mlp_in = x;
    if (cross) {
      // x_{l+1} = x0 * (x_l W_l + b_l) + x_l, W_l = V_l U_l when low rank.
      const int64_t D = static_cast<int64_t>(x.size());
      std::vector<double> xl = x;
      for (int l = 0; Has(model, absl::StrCat("cross", l, "/b")); ++l) {
        const std::string name = absl::StrCat("cross", l);
        std::vector<double> y(D);
        const double* bias = dense + Find(model, name + "/b").offset;
        if (Has(model, name + "/gate")) {
          const DenseTensor& gate = Find(model, name + "/gate");
          const int64_t K = gate.shape[1], r = Find(model, name + "/v0").shape[1];
          for (int64_t o = 0; o < D; ++o) y[o] = bias[o];
          MixForwardOne(xl, dense, D, r, K, Find(model, name + "/v0").offset,
                        Find(model, name + "/c0").offset, Find(model, name + "/u0").offset,
                        gate.offset, y);
        } else if (Has(model, name + "/w")) {
          const double* w = dense + Find(model, name + "/w").offset;
          for (int64_t o = 0; o < D; ++o) {
            double s = bias[o];
            for (int64_t i = 0; i < D; ++i) s += xl[i] * w[i * D + o];
            y[o] = s;
          }
        } else {
          const DenseTensor& v = Find(model, name + "/v");
          const int64_t r = v.shape[1];
          const double* u = dense + Find(model, name + "/u").offset;
          std::vector<double> t(r, 0.0);
          for (int64_t q = 0; q < r; ++q) {
            for (int64_t i = 0; i < D; ++i) t[q] += xl[i] * dense[v.offset + i * r + q];
          }
          for (int64_t o = 0; o < D; ++o) {
            double s = bias[o];
            for (int64_t q = 0; q < r; ++q) s += t[q] * u[q * D + o];
            y[o] = s;
          }
        }
        for (int64_t j = 0; j < D; ++j) xl[j] = x[j] * y[j] + xl[j];
      }
      if (!deep || parallel) z += DotProduct(xl, dense + Find(model, "cross_out/w").offset);
      if (!deep) z += dense[Find(model, "cross_out/b").offset];
      if (deep && !parallel) mlp_in = xl;
    }
    if (dot) {
      // e_0 = the bottom MLP over the dense fields' values (when there are any), then x_1..x_F.
      std::vector<std::vector<double>> e;
      mlp_in.clear();
      if (!model.dense_fields().empty()) {
        std::vector<double> a;
        for (int f : model.dense_fields()) a.push_back(in.scales[b * F + f]);
        for (int l = 0; Has(model, absl::StrCat("bottom", l, "/w")); ++l) {
          a = Dense(model, dense, absl::StrCat("bottom", l), a, /*relu=*/true);
        }
        e.push_back(a);
        mlp_in = a;
      }
      for (int f = 0; f < F; ++f) e.emplace_back(x.begin() + off[f], x.begin() + off[f + 1]);
      for (size_t i = 0; i < e.size(); ++i) {
        for (size_t j = i + 1; j < e.size(); ++j) mlp_in.push_back(DotProduct(e[i], e[j].data()));
      }
    }
    if (deep) z += ReferenceMlpLogit(model, dense, mlp_in);
    logits[b] = z;
  }
  return logits;
}

double ReferenceLoss(const ModelConfig& config, const Model& model, const ReferenceInput& in) {
  const std::vector<double> z = ReferenceLogits(config, model, in);
  double loss = 0;
  for (int b = 0; b < in.n; ++b) {
    loss += std::max(z[b], 0.0) - z[b] * in.labels[b] + std::log1p(std::exp(-std::fabs(z[b])));
  }
  return loss;
}

double ReferenceObjective(const ModelConfig& config, const Model& model, const ReferenceInput& in) {
  double penalty = 0;
  const int F = model.num_fields(), rd = model.row_dim();
  // Each entry's field, for its row's width 1 + d_f (the stride's tail is not a parameter).
  const int64_t cells = int64_t{in.n} * F;
  for (int64_t c = 0; c < cells; ++c) {
    const int64_t lo = in.offsets != nullptr ? in.offsets[c] - in.offsets[0] : c;
    const int64_t hi = in.offsets != nullptr ? in.offsets[c + 1] - in.offsets[0] : c + 1;
    const int width = 1 + model.field_dims()[c % F];
    for (int64_t e = lo; e < hi; ++e) {
      const double* row = in.rows + static_cast<int64_t>(in.slots[e]) * rd;
      for (int j = 0; j < width; ++j) penalty += row[j] * row[j];
    }
  }
  return ReferenceLoss(config, model, in) + 0.5 * config.embedding_l2() * penalty;
}

ReferenceMlpResult ReferenceMlp(const Mlp::Options& options, int n, const float* x0,
                                const float* dense, int64_t dense_size, const float* g,
                                bool bf16_rounding) {
  auto round = [&](double v) {
    return bf16_rounding ? double{Bf16ToFloat(FloatToBf16(static_cast<float>(v)))} : v;
  };
  const int L = static_cast<int>(options.hidden.size());
  auto weight = [&](int l, int64_t i, int64_t o) {
    return round(dense[options.hidden[l].w + i * options.hidden[l].out + o]);
  };
  ReferenceMlpResult r;
  r.logits.assign(n, 0.0);
  r.dense_grad.assign(dense_size, 0.0);
  r.input_grad.assign(static_cast<size_t>(n) * options.hidden[0].in, 0.0);
  for (int b = 0; b < n; ++b) {
    // Forward, keeping each layer's (stored) activation.
    std::vector<std::vector<double>> a(L + 1);
    for (int i = 0; i < options.hidden[0].in; ++i) {
      a[0].push_back(round(x0[static_cast<int64_t>(b) * options.hidden[0].in + i]));
    }
    for (int l = 0; l < L; ++l) {
      const Mlp::Layer& layer = options.hidden[l];
      for (int o = 0; o < layer.out; ++o) {
        double s = dense[layer.b + o];
        for (int i = 0; i < layer.in; ++i) s += a[l][i] * weight(l, i, o);
        a[l + 1].push_back(round(std::max(s, 0.0)));
      }
    }
    double out = dense[options.out_b];
    for (int i = 0; i < options.hidden[L - 1].out; ++i) out += a[L][i] * dense[options.out_w + i];
    r.logits[b] = out;
    // Backward.
    r.dense_grad[options.out_b] += g[b];
    std::vector<double> da(options.hidden[L - 1].out);
    for (size_t i = 0; i < da.size(); ++i) {
      r.dense_grad[options.out_w + i] += g[b] * a[L][i];
      da[i] = g[b] * dense[options.out_w + i];
    }
    for (int l = L - 1; l >= 0; --l) {
      const Mlp::Layer& layer = options.hidden[l];
      std::vector<double> dz(layer.out), dx(layer.in, 0.0);
      for (int o = 0; o < layer.out; ++o) {
        const double d = a[l + 1][o] > 0 ? da[o] : 0.0;
        r.dense_grad[layer.b + o] += d;
        dz[o] = round(d);
      }
      for (int i = 0; i < layer.in; ++i) {
        for (int o = 0; o < layer.out; ++o) {
          r.dense_grad[layer.w + static_cast<int64_t>(i) * layer.out + o] += a[l][i] * dz[o];
          dx[i] += dz[o] * weight(l, i, o);
        }
      }
      da.swap(dx);
    }
    for (size_t i = 0; i < da.size(); ++i) r.input_grad[b * da.size() + i] = da[i];
  }
  return r;
}

ReferenceCrossResult ReferenceCross(const CrossNetwork::Options& options, int n, const float* x0,
                                    const float* dense, int64_t dense_size,
                                    const float* output_grad) {
  const int64_t D = options.dim, r = options.rank;
  const int64_t K = options.experts >= 2 ? options.experts : 1;
  const int L = static_cast<int>(options.layers.size());
  ReferenceCrossResult res;
  res.output.resize(n * D);
  res.dense_grad.assign(dense_size, 0.0);
  res.input_grad.assign(n * D, 0.0);
  for (int b = 0; b < n; ++b) {
    const std::vector<double> x(x0 + b * D, x0 + (b + 1) * D);
    std::vector<std::vector<double>> xs{x}, ys, ts;
    std::vector<MixTrace> mix;
    for (int l = 0; l < L; ++l) {
      const CrossNetwork::Layer& layer = options.layers[l];
      const std::vector<double>& xl = xs.back();
      std::vector<double> y(D), t(r, 0.0);
      if (K > 1) {
        for (int64_t o = 0; o < D; ++o) y[o] = dense[layer.b + o];
        mix.push_back(
            MixForwardOne(xl, dense, D, r, K, layer.w, layer.c, layer.u, layer.gate, y));
      } else if (r == 0) {
        for (int64_t o = 0; o < D; ++o) {
          double s = dense[layer.b + o];
          for (int64_t i = 0; i < D; ++i) s += xl[i] * dense[layer.w + i * D + o];
          y[o] = s;
        }
      } else {
        for (int64_t q = 0; q < r; ++q) {
          for (int64_t i = 0; i < D; ++i) t[q] += xl[i] * dense[layer.w + i * r + q];
        }
        for (int64_t o = 0; o < D; ++o) {
          double s = dense[layer.b + o];
          for (int64_t q = 0; q < r; ++q) s += t[q] * dense[layer.u + q * D + o];
          y[o] = s;
        }
      }
      std::vector<double> next(D);
      for (int64_t j = 0; j < D; ++j) next[j] = x[j] * y[j] + xl[j];
      ys.push_back(y);
      ts.push_back(t);
      xs.push_back(next);
    }
    for (int64_t j = 0; j < D; ++j) res.output[b * D + j] = xs.back()[j];
    std::vector<double> g(output_grad + b * D, output_grad + (b + 1) * D), dx0(D, 0.0);
    for (int l = L - 1; l >= 0; --l) {
      const CrossNetwork::Layer& layer = options.layers[l];
      std::vector<double> dy(D), gx = g;  // gx: the skip connection's share of d x_l
      for (int64_t j = 0; j < D; ++j) {
        dy[j] = g[j] * x[j];
        dx0[j] += g[j] * ys[l][j];
        res.dense_grad[layer.b + j] += dy[j];
      }
      if (K > 1) {
        // y = sum_i p_i a2_i U_i + b, a2_i = tanh(a1_i C_i), a1_i = tanh(x V_i),
        // p = softmax(x gate).
        const MixTrace& tr = mix[l];
        std::vector<double> dp(K, 0.0);
        for (int64_t i = 0; i < K; ++i) {
          const double pi = tr.p[i];
          const double* a1 = &tr.a1[i * r];
          const double* a2 = &tr.a2[i * r];
          std::vector<double> da2(r, 0.0), dz2(r), da1(r, 0.0);
          for (int64_t q = 0; q < r; ++q) {
            for (int64_t o = 0; o < D; ++o) {
              const int64_t w = layer.u + i * r * D + q * D + o;
              res.dense_grad[w] += pi * a2[q] * dy[o];
              da2[q] += dy[o] * dense[w];
            }
            dp[i] += da2[q] * a2[q];
            dz2[q] = pi * da2[q] * (1 - a2[q] * a2[q]);
          }
          for (int64_t j = 0; j < r; ++j) {
            for (int64_t q = 0; q < r; ++q) {
              const int64_t w = layer.c + i * r * r + j * r + q;
              res.dense_grad[w] += a1[j] * dz2[q];
              da1[j] += dz2[q] * dense[w];
            }
          }
          for (int64_t q = 0; q < r; ++q) {
            const double dz1 = da1[q] * (1 - a1[q] * a1[q]);
            for (int64_t j = 0; j < D; ++j) {
              const int64_t w = layer.w + i * D * r + j * r + q;
              res.dense_grad[w] += xs[l][j] * dz1;
              gx[j] += dz1 * dense[w];
            }
          }
        }
        double mean = 0;
        for (int64_t i = 0; i < K; ++i) mean += tr.p[i] * dp[i];
        for (int64_t i = 0; i < K; ++i) {
          const double ds = tr.p[i] * (dp[i] - mean);
          for (int64_t j = 0; j < D; ++j) {
            res.dense_grad[layer.gate + j * K + i] += xs[l][j] * ds;
            gx[j] += ds * dense[layer.gate + j * K + i];
          }
        }
      } else if (r == 0) {
        for (int64_t i = 0; i < D; ++i) {
          for (int64_t o = 0; o < D; ++o) {
            res.dense_grad[layer.w + i * D + o] += xs[l][i] * dy[o];
            gx[i] += dy[o] * dense[layer.w + i * D + o];
          }
        }
      } else {
        std::vector<double> dt(r, 0.0);
        for (int64_t q = 0; q < r; ++q) {
          for (int64_t o = 0; o < D; ++o) {
            res.dense_grad[layer.u + q * D + o] += ts[l][q] * dy[o];
            dt[q] += dy[o] * dense[layer.u + q * D + o];
          }
        }
        for (int64_t i = 0; i < D; ++i) {
          for (int64_t q = 0; q < r; ++q) {
            res.dense_grad[layer.w + i * r + q] += xs[l][i] * dt[q];
            gx[i] += dt[q] * dense[layer.w + i * r + q];
          }
        }
      }
      g.swap(gx);
    }
    for (int64_t j = 0; j < D; ++j) res.input_grad[b * D + j] = dx0[j] + g[j];
  }
  return res;
}

ReferenceDotResult ReferenceDot(const DotShape& shape, int n, const float* front, const float* x0,
                                const float* d_dots) {
  const int m = shape.vectors(), k = shape.dim, F = shape.fields;
  const int64_t P = shape.pairs();
  const int first = shape.front ? 1 : 0;
  ReferenceDotResult res;
  res.dots.assign(n * P, 0.0);
  res.front_grad.assign(shape.front ? n * k : 0, 0.0);
  res.input_grad.assign(static_cast<size_t>(n) * F * k, 0.0);
  for (int b = 0; b < n; ++b) {
    auto e = [&](int i, int j) -> double {
      return i < first ? front[b * k + j] : x0[(int64_t{b} * F + i - first) * k + j];
    };
    auto grad = [&](int i, int j) -> double& {
      return i < first ? res.front_grad[b * k + j]
                       : res.input_grad[(int64_t{b} * F + i - first) * k + j];
    };
    int64_t p = 0;
    for (int i = 0; i < m; ++i) {
      for (int j = i + 1; j < m; ++j, ++p) {
        double s = 0;
        for (int c = 0; c < k; ++c) s += e(i, c) * e(j, c);
        res.dots[b * P + p] = s;
        const double d = d_dots[b * P + p];
        for (int c = 0; c < k; ++c) {
          grad(i, c) += d * e(j, c);
          grad(j, c) += d * e(i, c);
        }
      }
    }
  }
  return res;
}

}  // namespace pstrain
