#include "ps/store/table_rows.h"

#include <algorithm>
#include <cmath>

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

}  // namespace pstrain
