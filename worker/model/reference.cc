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

std::vector<double> ReferenceLogits(const ModelConfig& config, const Model& model,
                                    const ReferenceInput& in) {
  const int F = model.num_fields(), k = model.embedding_dim(), rd = model.row_dim();
  const bool fm = config.type() == DEEPFM || config.type() == FM;
  const bool deep = config.type() == DEEPFM || config.type() == WIDE_DEEP;
  std::vector<double> logits(in.n);
  for (int b = 0; b < in.n; ++b) {
    // x = concat_f s_f v_f, and the first-order term.
    std::vector<double> x(static_cast<size_t>(F) * k);
    double z = in.dense[0];
    for (int f = 0; f < F; ++f) {
      // The entries of (b, f): one, or a list pooled as sum_i s_i row_i.
      const int64_t e = static_cast<int64_t>(b) * F + f;
      const int64_t lo = in.offsets != nullptr ? in.offsets[e] - in.offsets[0] : e;
      const int64_t hi = in.offsets != nullptr ? in.offsets[e + 1] - in.offsets[0] : e + 1;
      for (int64_t i = lo; i < hi; ++i) {
        const double s = in.scales[i];
        const double* row = in.rows + static_cast<int64_t>(in.slots[i]) * rd;
        z += s * row[0];
        for (int j = 0; j < k; ++j) x[f * k + j] += s * row[1 + j];
      }
    }
    if (fm) {
      for (int j = 0; j < k; ++j) {
        double sum = 0, sq = 0;
        for (int f = 0; f < F; ++f) {
          sum += x[f * k + j];
          sq += x[f * k + j] * x[f * k + j];
        }
        z += 0.5 * (sum * sum - sq);
      }
    }
    if (deep) {
      std::vector<double> a = x;
      for (int l = 0;; ++l) {
        const std::string name = absl::StrCat("mlp", l);
        bool found = false;
        for (const DenseTensor& t : model.dense_layout()) found |= t.name == name + "/w";
        if (!found) break;
        const DenseTensor& w = Find(model, name + "/w");
        const DenseTensor& bias = Find(model, name + "/b");
        const int64_t rows = w.shape[0], cols = w.shape[1];
        std::vector<double> next(cols);
        for (int64_t o = 0; o < cols; ++o) {
          double s = in.dense[bias.offset + o];
          for (int64_t i = 0; i < rows; ++i) s += a[i] * in.dense[w.offset + i * cols + o];
          next[o] = std::max(s, 0.0);
        }
        a.swap(next);
      }
      const DenseTensor& w = Find(model, "out/w");
      double out = in.dense[Find(model, "out/b").offset];
      for (size_t i = 0; i < a.size(); ++i) out += a[i] * in.dense[w.offset + i];
      z += out;
    }
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
  const int64_t entries =
      in.offsets != nullptr ? in.offsets[in.n * F] - in.offsets[0] : int64_t{in.n} * F;
  for (int64_t e = 0; e < entries; ++e) {
    const double* row = in.rows + static_cast<int64_t>(in.slots[e]) * rd;
    for (int j = 0; j < rd; ++j) penalty += row[j] * row[j];
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

}  // namespace pstrain
