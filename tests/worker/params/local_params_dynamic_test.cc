// LocalParams with dynamic tables (issue 28): Pull / Push and the in-process step's GatherRows /
// ApplyRows route negative ids (common/dynamic_rows.h) to their table's DynamicEmbeddingStore by
// key, expand its 1 + dim floats to the stride with zeros and read the first 1 + dim floats of a
// gradient; fixed ids in the same call keep the fixed store's values; an id of a table the job
// does not have is refused.
#include <memory>
#include <vector>

#include "common/dynamic_rows.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"

namespace pstrain {
namespace {

struct Fixture {
  Config config;
  std::unique_ptr<Model> model;
  std::unique_ptr<LocalParams> params;
  DynamicEmbeddingStore* narrow = nullptr;  // table 0: 1 + 2 floats of the stride 1 + 4

  Fixture() {
    config.mutable_model()->set_embedding_dim(4);
    config.mutable_model()->add_hidden(2);
    config.mutable_sparse_optimizer()->set_type(SGD);
    config.mutable_sparse_optimizer()->set_learning_rate(1.0f);
    model = std::move(Model::Create(config.model(), 2)).value();
    params = std::move(LocalParams::Create(*model, 10, config, 1)).value();
    std::vector<LocalParams::DynamicTable> tables;
    for (int dim : {3, 5}) {
      DynamicEmbeddingStore::Options o;
      o.dim = dim;
      o.optimizer = std::shared_ptr<const Optimizer>(
          std::move(Optimizer::Create(config.sparse_optimizer())).value());
      o.row_init = [dim](int64_t key, float* out) {
        for (int j = 0; j < dim; ++j) out[j] = static_cast<float>(key) + 0.5f * j;
      };
      tables.push_back({dim == 3 ? "narrow" : "wide",
                        std::move(DynamicEmbeddingStore::Create(o)).value()});
    }
    EXPECT_TRUE(params->AddDynamicTables(std::move(tables)).ok());
    narrow = params->dynamic_store(0);
  }
};

TEST(LocalParamsDynamic, PullAndPushRouteByTable) {
  Fixture f;
  ASSERT_EQ(f.params->row_dim(), 5);
  ASSERT_EQ(f.params->num_dynamic(), 2);
  EXPECT_EQ(f.params->dynamic_name(1), "wide");
  const std::vector<int64_t> ids = {3, DynamicRow(0, 7), DynamicRow(1, 9), 4,
                                    DynamicMissingRow(0)};
  std::vector<float> fixed(2 * 5);
  ASSERT_TRUE(f.params->embedding()->Gather({3, 4}, fixed.data()).ok());
  std::vector<float> rows(ids.size() * 5, -1.0f);
  ASSERT_TRUE(f.params->Pull(ids, rows.data(), nullptr).ok());
  const std::vector<float> want = {
      fixed[0], fixed[1], fixed[2], fixed[3], fixed[4],  // fixed row 3
      7, 7.5, 8, 0, 0,                                    // table 0, key 7: 3 floats, then zeros
      9, 9.5, 10, 10.5, 11,                               // table 1, key 9: the whole stride
      fixed[5], fixed[6], fixed[7], fixed[8], fixed[9],  // fixed row 4
      0, 0.5, 1, 0, 0};                                   // table 0, key 0 (missing)
  EXPECT_EQ(rows, want);

  // A push moves each row by its gradient's first 1 + dim floats (SGD, lr 1); the floats past a
  // table's width are ignored.
  std::vector<float> grads(ids.size() * 5, 0.0f);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int j = 0; j < 5; ++j) grads[i * 5 + j] = 0.25f;
  }
  std::vector<float> dense_grad(f.params->dense_size(), 0.0f);
  ASSERT_TRUE(f.params->Push(ids, grads.data(), dense_grad.data(), 1).ok());
  std::vector<float> after(ids.size() * 5);
  ASSERT_TRUE(f.params->Pull(ids, after.data(), nullptr).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int width = i == 1 || i == 4 ? 3 : 5;
    for (int j = 0; j < 5; ++j) {
      const float expect = j < width ? want[i * 5 + j] - 0.25f : 0.0f;
      EXPECT_FLOAT_EQ(after[i * 5 + j], expect) << i << " " << j;
    }
  }
  EXPECT_EQ(f.narrow->metrics().rows_live, 2);  // keys 7 and 0
  EXPECT_EQ(f.params->dynamic_store(1)->metrics().rows_live, 1);

  // The in-process step's calls route the same way.
  InProcessParams* ip = f.params->in_process();
  ASSERT_NE(ip, nullptr);
  std::vector<float> again(ids.size() * 5);
  ASSERT_TRUE(ip->GatherRows(ids, again.data()).ok());
  EXPECT_EQ(again, after);
  ASSERT_TRUE(ip->ApplyRows({DynamicRow(0, 7)}, grads.data(), 2).ok());
  std::vector<float> one(5);
  ASSERT_TRUE(f.params->Pull({DynamicRow(0, 7)}, one.data(), nullptr).ok());
  EXPECT_FLOAT_EQ(one[0], 7 - 0.5f);
  EXPECT_EQ(f.narrow->last_step(), 2);
  // Memory counts the dynamic rows.
  EXPECT_GE(f.params->memory().total_bytes, f.narrow->metrics().bytes);
}

// The in-process step splits its ids by table once (ApplyRows reuses GatherRows' split of the
// same ids on the same thread): ids changed in the same buffer, or another LocalParams, are split
// anew.
TEST(LocalParamsDynamic, InProcessCallsSplitChangedIdsAnew) {
  Fixture f;
  InProcessParams* ip = f.params->in_process();
  ASSERT_NE(ip, nullptr);
  std::vector<int64_t> ids = {3, DynamicRow(0, 7)};
  std::vector<float> rows(ids.size() * 5, -1.0f);
  ASSERT_TRUE(ip->GatherRows(ids, rows.data()).ok());
  EXPECT_EQ(std::vector<float>(rows.begin() + 5, rows.end()),
            (std::vector<float>{7, 7.5, 8, 0, 0}));
  // The same buffer, another id: table 1's key 9 at the whole stride, not table 0's key 7.
  ids[1] = DynamicRow(1, 9);
  ASSERT_TRUE(ip->GatherRows(ids, rows.data()).ok());
  EXPECT_EQ(std::vector<float>(rows.begin() + 5, rows.end()),
            (std::vector<float>{9, 9.5, 10, 10.5, 11}));
  // An update after the gather of the same ids, then after a change of them.
  const std::vector<float> grads(ids.size() * 5, 0.25f);
  ASSERT_TRUE(ip->ApplyRows(ids, grads.data(), 1).ok());
  ids[1] = DynamicRow(0, 7);
  ASSERT_TRUE(ip->ApplyRows(ids, grads.data(), 2).ok());
  EXPECT_EQ(f.narrow->metrics().rows_live, 1);  // key 7 of table 0, updated once
  EXPECT_EQ(f.params->dynamic_store(1)->metrics().rows_live, 1);
  std::vector<float> one(5);
  ASSERT_TRUE(f.params->Pull({DynamicRow(1, 9)}, one.data(), nullptr).ok());
  EXPECT_FLOAT_EQ(one[4], 11 - 0.25f);
  ASSERT_TRUE(f.params->Pull({DynamicRow(0, 7)}, one.data(), nullptr).ok());
  EXPECT_FLOAT_EQ(one[0], 7 - 0.25f);
  // Another LocalParams with one dynamic table, on the same thread and with the ids just split
  // for the first: the id of its missing table 1 is refused, not routed by the first one's split.
  ids[1] = DynamicRow(1, 9);
  ASSERT_TRUE(ip->GatherRows(ids, rows.data()).ok());
  auto other = std::move(LocalParams::Create(*f.model, 10, f.config, 1)).value();
  DynamicEmbeddingStore::Options o;
  o.dim = 3;
  o.optimizer = std::shared_ptr<const Optimizer>(
      std::move(Optimizer::Create(f.config.sparse_optimizer())).value());
  std::vector<LocalParams::DynamicTable> one_table;
  one_table.push_back({"narrow", std::move(DynamicEmbeddingStore::Create(o)).value()});
  ASSERT_TRUE(other->AddDynamicTables(std::move(one_table)).ok());
  ASSERT_NE(other->in_process(), nullptr);
  EXPECT_EQ(other->in_process()->GatherRows(ids, rows.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalParamsDynamic, RefusesAnIdOfAnotherTable) {
  Fixture f;
  std::vector<float> rows(5);
  const absl::Status s = f.params->Pull({DynamicRow(2, 1)}, rows.data(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("dynamic table 2; this job has 2"), std::string::npos)
      << s;
  // Wider than the stride: refused.
  Fixture g;
  Config c = g.config;
  auto model = std::move(Model::Create(c.model(), 2)).value();
  auto p = std::move(LocalParams::Create(*model, 10, c, 1)).value();
  DynamicEmbeddingStore::Options o;
  o.dim = 6;
  o.optimizer = std::shared_ptr<const Optimizer>(
      std::move(Optimizer::Create(c.sparse_optimizer())).value());
  std::vector<LocalParams::DynamicTable> t;
  t.push_back({"x", std::move(DynamicEmbeddingStore::Create(o)).value()});
  EXPECT_FALSE(p->AddDynamicTables(std::move(t)).ok());
}

}  // namespace
}  // namespace pstrain
