#include "ps/store/table_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/random.h"

namespace pstrain {

void InitTableRow(const TableInitializer& init, int dim, int stride, int64_t row, uint64_t seed,
                  float* out) {
  out[0] = 0.f;
  Rng rng(HashKey(static_cast<uint64_t>(row), seed));
  const double stddev = init.stddev();
  for (int j = 0; j < dim; ++j) {
    double x = 0;
    switch (init.type()) {
      case TableInitializer::NORMAL:
        x = stddev * rng.Normal();
        break;
      case TableInitializer::TRUNCATED_NORMAL: {
        // TF's truncated_normal: a draw beyond 2 standard deviations is drawn again.
        double z = rng.Normal();
        while (std::fabs(z) > 2.0) z = rng.Normal();
        x = stddev * z;
        break;
      }
      case TableInitializer::UNIFORM:
        x = init.limit() * (2.0 * rng.UniformDouble() - 1.0);
        break;
      case TableInitializer::ZEROS:
        x = 0;
        break;
    }
    out[1 + j] = static_cast<float>(x);
  }
  std::fill(out + 1 + dim, out + stride, 0.f);
}

RowInit TablesRowInit(std::vector<TableRows> tables, RowInit default_init, int stride,
                      uint64_t seed) {
  if (tables.empty()) return default_init;
  return [tables = std::move(tables), default_init = std::move(default_init), stride,
          seed](int64_t row, float* out) {
    for (const TableRows& t : tables) {
      if (row >= t.begin && row < t.end) {
        InitTableRow(t.initializer, t.dim, stride, row, seed, out);
        return;
      }
    }
    if (default_init) {
      default_init(row, out);
    } else {
      std::fill(out, out + stride, 0.f);
    }
  };
}

void ExpandRowsInPlace(float* rows, int64_t n, int width, int stride) {
  if (width == stride) return;
  // Back to front: row i's target [i x stride, ...) starts at or after its source i x width.
  for (int64_t i = n - 1; i >= 0; --i) {
    std::memmove(rows + i * stride, rows + i * width, sizeof(float) * width);
    std::fill(rows + i * stride + width, rows + (i + 1) * stride, 0.f);
  }
}

void NarrowRows(const float* wide, int64_t n, int stride, int width, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * width, wide + i * stride, sizeof(float) * width);
  }
}

RowInit NarrowRowInit(RowInit init, int stride, int width) {
  if (width == stride || !init) return init;
  return [init = std::move(init), stride, width](int64_t row, float* out) {
    thread_local std::vector<float> wide;
    wide.resize(stride);
    init(row, wide.data());
    std::memcpy(out, wide.data(), sizeof(float) * width);
  };
}

absl::Status ResizeRow(const Optimizer& opt, int from, const float* from_weights,
                       int from_state_floats, const float* from_state, int to, float* out_weights,
                       float* out_state) {
  if (from_state != nullptr && from_state_floats != opt.StateFloats(from)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a row of ", from, " floats with ", from_state_floats, " optimizer state floats, but ",
        OptimizerType_Name(opt.type()), " keeps ", opt.StateFloats(from)));
  }
  const int keep = std::min(from, to);
  std::copy(from_weights, from_weights + keep, out_weights);
  std::fill(out_weights + keep, out_weights + to, 0.f);
  opt.InitState(out_state, to);
  if (from_state == nullptr) return absl::OkStatus();
  for (int s = 0; s < opt.state_slots(); ++s) {
    std::copy(from_state + s * from, from_state + s * from + keep, out_state + s * to);
  }
  std::copy(from_state + opt.state_slots() * from, from_state + from_state_floats,
            out_state + opt.state_slots() * to);
  return absl::OkStatus();
}

OptimizerConfig TableOptimizerConfig(const OptimizerConfig& base, const TableOptimizer& o) {
  OptimizerConfig c = base;
  if (o.has_learning_rate()) c.set_learning_rate(o.learning_rate());
  if (o.has_initial_accumulator()) c.set_initial_accumulator(o.initial_accumulator());
  if (o.has_beta1()) c.set_beta1(o.beta1());
  if (o.has_beta2()) c.set_beta2(o.beta2());
  if (o.has_epsilon()) c.set_epsilon(o.epsilon());
  if (o.has_l1()) c.set_l1(o.l1());
  if (o.has_l2()) c.set_l2(o.l2());
  if (o.has_lr_power()) c.set_lr_power(o.lr_power());
  return c;
}

}  // namespace pstrain
