#include "cmd/cluster_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pstrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

TEST(ClusterSpecTest, FlagsWinOverEnvironment) {
  auto s = ResolveClusterSpec("a:1000,b,c:3", 2, {{"TF_CONFIG", "{}"}, {"SM_HOSTS", "[]"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->hosts, ElementsAre("a:1000", "b:2223", "c:3"));
  EXPECT_EQ(s->index, 2);
  EXPECT_EQ(s->source, "flags");
}

TEST(ClusterSpecTest, BadFlags) {
  EXPECT_THAT(ResolveClusterSpec("a:1,b:2", 2, {}).status().message(), HasSubstr("--index"));
  EXPECT_THAT(ResolveClusterSpec("a:1,,b:2", 0, {}).status().message(), HasSubstr("--cluster"));
  EXPECT_THAT(ResolveClusterSpec("a:99999", 0, {}).status().message(), HasSubstr("a:99999"));
  EXPECT_THAT(ResolveClusterSpec("a:x", 0, {}).status().message(), HasSubstr("port"));
  EXPECT_THAT(ResolveClusterSpec("a:1", -1, {}).status().message(), HasSubstr("--index"));
  EXPECT_THAT(ResolveClusterSpec("", -1, {}).status().message(), HasSubstr("no cluster spec"));
}

TEST(ClusterSpecTest, TfConfig) {
  const std::string cluster =
      R"("cluster": {"chief": ["h0:2222"], "worker": ["h1:2222"], "ps": ["h0:2223", "h1:2223"]})";
  auto chief = ResolveClusterSpec("", -1, {{"TF_CONFIG", "{" + cluster +
                                                             R"(, "task": {"type": "chief"}})"}});
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_THAT(chief->hosts, ElementsAre("h0:2223", "h1:2223"));
  EXPECT_EQ(chief->index, 0);
  EXPECT_EQ(chief->source, "TF_CONFIG");
  auto worker = ResolveClusterSpec(
      "", -1, {{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": "worker", "index": 0}})"}});
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->index, 1);
  auto ps = ResolveClusterSpec(
      "", -1, {{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": "ps", "index": 1}})"}});
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_EQ(ps->index, 1);
}

TEST(ClusterSpecTest, MalformedTfConfigIsNamed) {
  auto err = [](const std::string& json) {
    return std::string(ResolveClusterSpec("", -1, {{"TF_CONFIG", json}}).status().message());
  };
  EXPECT_THAT(err("{not json"), HasSubstr("TF_CONFIG: expected valid JSON"));
  EXPECT_THAT(err("[]"), HasSubstr("TF_CONFIG: expected a JSON object"));
  EXPECT_THAT(err(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})"),
              HasSubstr("\"ps\""));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"]}})"), HasSubstr("\"task\""));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 1.5}})"),
              HasSubstr("TF_CONFIG task.index"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 3}})"),
              HasSubstr("below 1"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"], "worker": ["a:2"]},
                     "task": {"type": "evaluator"}})"),
              HasSubstr("TF_CONFIG task.type"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1", "b:1"], "worker": ["a:2"]},
                     "task": {"type": "worker"}})"),
              HasSubstr("one chief/worker per ps entry"));
}

TEST(ClusterSpecTest, SageMakerResourceConfig) {
  const std::string rc =
      R"({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], )"
      R"("current_instance_type": "ml.c5.4xlarge", "network_interface_name": "eth0"})";
  auto s = ResolveClusterSpec("", -1, {{kSageMakerResourceConfig, rc}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->hosts, ElementsAre("algo-1:2223", "algo-2:2223"));
  EXPECT_EQ(s->index, 1);
  EXPECT_EQ(s->source, kSageMakerResourceConfig);
  // SM_HOSTS comes first.
  auto env = ResolveClusterSpec(
      "", -1, {{"SM_HOSTS", R"(["x"])"}, {"SM_CURRENT_HOST", "x"}, {kSageMakerResourceConfig, rc}});
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->source, "SM_HOSTS");
  EXPECT_THAT(
      ResolveClusterSpec("", -1, {{kSageMakerResourceConfig, R"({"hosts": ["algo-1"]})"}})
          .status()
          .message(),
      HasSubstr("resourceconfig.json: expected a \"current_host\" string"));
  EXPECT_THAT(ResolveClusterSpec("", -1,
                                 {{kSageMakerResourceConfig,
                                   R"({"current_host": "algo-3", "hosts": ["algo-1"]})"}})
                  .status()
                  .message(),
              HasSubstr("current_host: expected one of"));
  EXPECT_THAT(ResolveClusterSpec("", -1, {{kSageMakerResourceConfig, "{"}}).status().message(),
              HasSubstr("resourceconfig.json: expected valid JSON"));
}

TEST(ClusterSpecTest, SageMaker) {
  auto s = ResolveClusterSpec(
      "", -1, {{"SM_HOSTS", R"(["algo-1","algo-2","algo-3"])"}, {"SM_CURRENT_HOST", "algo-2"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->hosts, ElementsAre("algo-1:2223", "algo-2:2223", "algo-3:2223"));
  EXPECT_EQ(s->index, 1);
  EXPECT_THAT(ResolveClusterSpec("", -1, {{"SM_HOSTS", R"(["algo-1"])"}}).status().message(),
              HasSubstr("SM_CURRENT_HOST"));
  EXPECT_THAT(ResolveClusterSpec("", -1,
                                 {{"SM_HOSTS", R"(["algo-1"])"}, {"SM_CURRENT_HOST", "algo-9"}})
                  .status()
                  .message(),
              HasSubstr("SM_CURRENT_HOST: expected one of SM_HOSTS"));
  EXPECT_THAT(ResolveClusterSpec("", -1, {{"SM_HOSTS", "algo-1"}, {"SM_CURRENT_HOST", "algo-1"}})
                  .status()
                  .message(),
              HasSubstr("SM_HOSTS: expected valid JSON"));
  EXPECT_THAT(ResolveClusterSpec("", -1, {{"SM_HOSTS", "[1]"}, {"SM_CURRENT_HOST", "a"}})
                  .status()
                  .message(),
              HasSubstr("SM_HOSTS: expected a JSON list of strings"));
}

TEST(ClusterSpecTest, OpenMpi) {
  auto s = ResolveClusterSpec("a,b", -1,
                              {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->hosts, ElementsAre("a:2223", "b:2223"));
  EXPECT_EQ(s->index, 1);
  EXPECT_THAT(ResolveClusterSpec("", -1, {{"OMPI_COMM_WORLD_RANK", "0"}}).status().message(),
              HasSubstr("--cluster"));
  EXPECT_THAT(ResolveClusterSpec("a,b", -1,
                                 {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}})
                  .status()
                  .message(),
              HasSubstr("OMPI_COMM_WORLD_SIZE"));
  EXPECT_THAT(ResolveClusterSpec("a,b", -1,
                                 {{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "2"}})
                  .status()
                  .message(),
              HasSubstr("OMPI_COMM_WORLD_RANK"));
}

}  // namespace
}  // namespace pstrain
