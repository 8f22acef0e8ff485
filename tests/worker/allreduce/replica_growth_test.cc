// AllreduceParams' per-step memory check (AllreduceOptions::replica_budget_bytes) with a dynamic
// table: the growth it assumes for a step's dynamic ids covers what the table's store really
// takes, so a budget that the step's new rows would pass stops the step before anything is
// stored. One rank (an MPI singleton): the check is each rank's own, on identical replicas.
#include <mpi.h>

#include <memory>
#include <vector>

#include "common/dynamic_rows.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/allreduce/allreduce_params.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { ASSERT_EQ(MPI_Init(nullptr, nullptr), MPI_SUCCESS); }
  void TearDown() override { MPI_Finalize(); }
};
const auto* const kMpi = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

Config SmallConfig() {
  Config config;
  config.mutable_model()->set_embedding_dim(4);
  config.mutable_model()->add_hidden(2);
  config.mutable_sparse_optimizer()->set_type(ADAGRAD);
  config.mutable_sparse_optimizer()->set_learning_rate(0.1f);
  return config;
}

// 10 fixed rows and one dynamic table of 1 + 2 floats that admits every id.
std::unique_ptr<AllreduceParams> MakeParams(const Model& model, const Config& config,
                                            int64_t budget) {
  auto replica = std::move(LocalParams::Create(model, 10, config, 1)).value();
  DynamicEmbeddingStore::Options o;
  o.dim = 3;
  o.optimizer = std::shared_ptr<const Optimizer>(
      std::move(Optimizer::Create(config.sparse_optimizer())).value());
  std::vector<LocalParams::DynamicTable> tables;
  tables.push_back({"ids", std::move(DynamicEmbeddingStore::Create(o)).value()});
  EXPECT_TRUE(replica->AddDynamicTables(std::move(tables)).ok());
  AllreduceOptions ao;
  ao.replica_budget_bytes = budget;
  return std::move(AllreduceParams::Create(std::move(replica), std::move(ao))).value();
}

TEST(ReplicaGrowth, ADynamicStepIsStoppedBeforeItPassesTheBudget) {
  const Config config = SmallConfig();
  auto model = std::move(Model::Create(config.model(), 2)).value();
  constexpr int kIds = 3000;
  std::vector<int64_t> ids;
  for (int k = 1; k <= kIds; ++k) ids.push_back(DynamicRow(0, 1000 + 7 * k));
  auto free = MakeParams(*model, config, -1);
  const std::vector<float> grads(ids.size() * free->row_dim(), 0.01f);
  const std::vector<float> dense(free->dense_size(), 0.0f);

  // What the step really adds: every id a new row of the store.
  const int64_t before = free->replica()->memory().total_bytes;
  ASSERT_TRUE(free->Push(ids, grads.data(), dense.data(), 1).ok());
  ASSERT_EQ(free->replica()->dynamic_store(0)->metrics().rows_live, kIds);
  const int64_t grown = free->replica()->memory().total_bytes - before;
  ASSERT_GT(grown, kIds * 3 * 4);

  // A budget one byte short of it: the step stops, naming its rows, and stores nothing.
  auto tight = MakeParams(*model, config, before + grown - 1);
  ASSERT_EQ(tight->replica()->memory().total_bytes, before);
  const absl::Status s = tight->Push(ids, grads.data(), dense.data(), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("this step's 3000 rows could take it past"));
  EXPECT_EQ(tight->replica()->dynamic_store(0)->metrics().rows_live, 0);

  // Room for the bound (every id a new row in a new chunk, the maps doubling): it trains.
  auto roomy = MakeParams(*model, config, before + 64 * grown);
  EXPECT_TRUE(roomy->Push(ids, grads.data(), dense.data(), 1).ok());
}

}  // namespace
}  // namespace pstrain
