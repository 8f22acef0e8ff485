#include "ps/store/table_rows.h"

#include <algorithm>
#include <cmath>
#include <utility>

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
