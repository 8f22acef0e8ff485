// Serve requests do not carry lists yet: a model with a list field refuses every request with an
// error naming the field (never reading one id of the list).
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serving/request_rows.h"

namespace pstrain {
namespace {

TEST(RequestRowsLists, AModelWithAListFieldRefusesRequestsNamingTheField) {
  FeatureConfig c;
  c.set_preset(NO_PRESET);
  c.add_field()->set_name("item");
  FieldSpec* history = c.add_field();
  history->set_name("history");
  history->set_share_rows_with("item");
  history->mutable_list();
  auto spec = FeatureSpec::Create(c);
  ASSERT_TRUE(spec.ok()) << spec.status();
  PredictRequest request;
  request.set_row_format(PredictRequest::CSV);
  request.add_rows("a1,a1|b2");
  RawRows rows;
  const absl::Status s = ParseRequestRows(request, *spec, &rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::AllOf(::testing::HasSubstr("'history'"),
                               ::testing::HasSubstr("serve requests do not support list fields")));
  EXPECT_EQ(rows.size(), 0);
}

}  // namespace
}  // namespace pstrain
