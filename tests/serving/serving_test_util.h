// Test helper: small ServingModels with known contents, built without training.
#pragma once

#include <google/protobuf/text_format.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"
#include "serving/serving_model.h"

namespace pstrain {
namespace testing_serving {

inline std::string FreshDir(const std::string& name) {
  std::string templ = ::testing::TempDir() + "/" + name + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return ::testing::TempDir() + "/" + name;
  return templ;
}

// 3 categorical fields of 50 rows, 1 numeric (bucketed) of 20, DeepFM k = 4, MLP 8-4.
inline ModelDescription SmallDescription() {
  ModelDescription d;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    features {
      preset: NO_PRESET
      field { name: "n1" kind: NUMERIC vocab_size: 20 }
      field { name: "c1" vocab_size: 50 }
      field { name: "c2" vocab_size: 50 }
      field { name: "c3" vocab_size: 50 }
      hash_seed: 3
    }
    model { type: DEEPFM embedding_dim: 4 hidden: [ 8, 4 ] embedding_init_stddev: 0.05 }
    init_seed: 9
    init_rule: 1
  )pb", &d));
  return d;
}

// Tables (FeatureConfig.table): c1 in the default table (dim k = 4); `item` (dim 4, UNIFORM) shared
// by the candidate and a history list; `small` (dim 2, TRUNCATED_NORMAL, out of the FM term) of a
// bucketed numeric field. `small` is narrower than the stride 1 + 4: its rows are stored and
// exported at 3 floats.
inline ModelDescription TablesDescription() {
  ModelDescription d;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    features {
      preset: NO_PRESET
      field { name: "c1" vocab_size: 50 }
      field { name: "item" table: "item" }
      field { name: "history" table: "item" list { combiner: MEAN max_length: 5 } }
      field { name: "n1" kind: NUMERIC table: "small" }
      table { name: "item" dim: 4 rows: 100 initializer { type: UNIFORM limit: 0.2 } }
      table { name: "small" dim: 2 rows: 10 fm_join: EXCLUDE
              initializer { type: TRUNCATED_NORMAL stddev: 0.1 } }
      hash_seed: 3
    }
    model { type: DEEPFM embedding_dim: 4 hidden: [ 8, 4 ] embedding_init_stddev: 0.05 }
    init_seed: 9
    init_rule: 1
  )pb", &d));
  return d;
}

// A model for `d` with every third row stored (values from `seed`, larger than the initial ones
// so that trained and untrained rows score differently) and a random dense vector.
inline std::unique_ptr<ServingModel> SmallModel(const ModelDescription& d, uint64_t seed,
                                                int64_t step = 7) {
  auto m = ServingModel::Create(d, ServingModel::Origin{"test", step, step});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  Rng rng(seed);
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < (*m)->table_rows(); r += 3) ids.push_back(r);
  std::vector<float> rows(ids.size() * (*m)->row_dim());
  for (float& x : rows) x = static_cast<float>(rng.Normal() * 0.5);
  EXPECT_TRUE((*m)->StoreRows(ids, rows.data()).ok());
  (*m)->model().InitDense(seed, (*m)->mutable_dense()->data());
  (*(*m)->mutable_dense())[0] = -0.25f;  // a bias, so that it is not zero
  return *std::move(m);
}

// Every row of the table, gathered.
inline std::vector<float> AllRows(const ServingModel& m) {
  std::vector<int64_t> ids(m.table_rows());
  for (int64_t r = 0; r < m.table_rows(); ++r) ids[r] = r;
  std::vector<float> rows(ids.size() * m.row_dim());
  EXPECT_TRUE(m.Gather(ids, rows.data()).ok());
  return rows;
}

}  // namespace testing_serving
}  // namespace pstrain
