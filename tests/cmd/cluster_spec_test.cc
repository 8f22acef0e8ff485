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

// SageMaker's TF containers with their parameter-server option (sagemaker-tensorflow-training's
// _build_tf_config_for_ps): "master" on hosts[0], "worker" on the others, one ps per host, and
// "environment": "cloud". `pstrain host` is host i = worker i: the same host as ps i.
const char kSageMakerTfCluster[] =
    R"("cluster": {"master": ["algo-1:2222"], "worker": ["algo-2:2222", "algo-3:2222"],)"
    R"( "ps": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]}, "environment": "cloud")";

// Kubeflow TFJob: every replica its own pod, addresses <job>-<type>-<index>.<ns>.svc:2222, and
// independent replica counts (here 2 ps, a chief and 3 workers).
const char kKubeflowCluster[] =
    R"("cluster": {"chief": ["ctr-chief-0.default.svc:2222"],)"
    R"( "ps": ["ctr-ps-0.default.svc:2222", "ctr-ps-1.default.svc:2222"],)"
    R"( "worker": ["ctr-worker-0.default.svc:2222", "ctr-worker-1.default.svc:2222",)"
    R"( "ctr-worker-2.default.svc:2222"]})";

Env TfEnv(const std::string& cluster, const std::string& task) {
  return {{"TF_CONFIG", "{" + cluster + R"(, "task": )" + task + "}"}};
}

TEST(ClusterSpecTest, SageMakerTfContainerTfConfigForHost) {
  auto master = ResolveClusterSpec("", -1, TfEnv(kSageMakerTfCluster, R"({"type": "master", "index": 0})"));
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_THAT(master->hosts, ElementsAre("algo-1:2223", "algo-2:2223", "algo-3:2223"));
  EXPECT_EQ(master->index, 0);
  EXPECT_EQ(master->source, "TF_CONFIG");
  auto worker = ResolveClusterSpec("", -1, TfEnv(kSageMakerTfCluster, R"({"type": "worker", "index": 1})"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->index, 2);  // algo-3
  // The separate TF ps process of that layout is not pstrain's: `pstrain host` says what to run.
  auto ps = ResolveClusterSpec("", -1, TfEnv(kSageMakerTfCluster, R"({"type": "ps", "index": 1})"));
  EXPECT_THAT(ps.status().message(), HasSubstr("a PS-only task runs `pstrain ps`"));
}

// Inside SageMaker the hosts come from SM_HOSTS even when a TF container also set TF_CONFIG
// (the issue: TF_CONFIG was read first, so a TF container with its PS option failed).
TEST(ClusterSpecTest, SageMakerHostsComeBeforeTfConfig) {
  Env env = TfEnv(kKubeflowCluster, R"({"type": "worker", "index": 0})");
  env["SM_HOSTS"] = R"(["algo-1","algo-2"])";
  env["SM_CURRENT_HOST"] = "algo-2";
  auto s = ResolveClusterSpec("", -1, env);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->source, "SM_HOSTS");
  EXPECT_EQ(s->index, 1);
  // --default_port applies to SageMaker's bare names.
  s = ResolveClusterSpec("", -1, env, 3000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->hosts, ElementsAre("algo-1:3000", "algo-2:3000"));
}

// A Kubeflow pod must not become `pstrain host` i: the PS and worker pods would both be host i
// (two chiefs). The error names the commands to run instead.
TEST(ClusterSpecTest, KubeflowSeparatePodsAreRefusedByHost) {
  auto s = ResolveClusterSpec("", -1, TfEnv(kKubeflowCluster, R"({"type": "worker", "index": 0})"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("run `pstrain ps` in the ps tasks and `pstrain "
                                              "worker` in the chief and worker tasks"));
  auto eval = ResolveClusterSpec("", -1, TfEnv(kKubeflowCluster, R"({"type": "evaluator", "index": 0})"));
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_TRUE(eval->evaluator);
}

TEST(ClusterSpecTest, KubeflowPsPod) {
  auto t = PsTaskFromEnvironment(TfEnv(kKubeflowCluster, R"({"type": "ps", "index": 1})"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  EXPECT_EQ((*t)->shard, 1);
  EXPECT_EQ((*t)->num_shards, 2);
  EXPECT_EQ((*t)->port, 2222);
  EXPECT_EQ((*t)->num_workers, 4);  // the chief and 3 workers
  auto w = PsTaskFromEnvironment(TfEnv(kKubeflowCluster, R"({"type": "chief", "index": 0})"));
  EXPECT_THAT(w.status().message(), HasSubstr("run `pstrain worker` in chief and worker tasks"));
  auto none = PsTaskFromEnvironment({});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(ClusterSpecTest, KubeflowWorkerPods) {
  auto chief = WorkerTaskFromEnvironment(TfEnv(kKubeflowCluster, R"({"type": "chief", "index": 0})"));
  ASSERT_TRUE(chief.ok() && chief->has_value()) << chief.status();
  EXPECT_THAT((*chief)->ps, ElementsAre("ctr-ps-0.default.svc:2222", "ctr-ps-1.default.svc:2222"));
  EXPECT_EQ((*chief)->index, 0);
  EXPECT_EQ((*chief)->num_workers, 4);
  auto w2 = WorkerTaskFromEnvironment(TfEnv(kKubeflowCluster, R"({"type": "worker", "index": 2})"));
  ASSERT_TRUE(w2.ok() && w2->has_value()) << w2.status();
  EXPECT_EQ((*w2)->index, 3);
  // Without a chief, worker 0 is the chief.
  auto plain = WorkerTaskFromEnvironment(
      {{"TF_CONFIG", R"({"cluster": {"worker": ["w0:1", "w1:1"], "ps": ["p0:1"]},)"
                     R"( "task": {"type": "worker", "index": 1}})"}});
  ASSERT_TRUE(plain.ok() && plain->has_value()) << plain.status();
  EXPECT_EQ((*plain)->index, 1);
  EXPECT_EQ((*plain)->num_workers, 2);
  // TF1's master is the chief.
  auto master = WorkerTaskFromEnvironment(TfEnv(kSageMakerTfCluster, R"({"type": "master", "index": 0})"));
  ASSERT_TRUE(master.ok() && master->has_value()) << master.status();
  EXPECT_EQ((*master)->index, 0);
  EXPECT_EQ((*master)->num_workers, 3);
  auto eval = WorkerTaskFromEnvironment(TfEnv(kKubeflowCluster, R"({"type": "evaluator"})"));
  ASSERT_TRUE(eval.ok() && eval->has_value());
  EXPECT_TRUE((*eval)->evaluator);
  auto ps = WorkerTaskFromEnvironment(TfEnv(kKubeflowCluster, R"({"type": "ps", "index": 0})"));
  EXPECT_THAT(ps.status().message(), HasSubstr("run `pstrain ps` in ps tasks"));
}

TEST(ClusterSpecTest, MalformedTfConfigIsNamed) {
  auto err = [](const std::string& json) {
    return std::string(ParseTfConfig(json).status().message());
  };
  EXPECT_THAT(err("{not json"), HasSubstr("TF_CONFIG: expected valid JSON"));
  EXPECT_THAT(err("[]"), HasSubstr("TF_CONFIG: expected a JSON object"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"]}})"), HasSubstr("\"task\""));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 1.5}})"),
              HasSubstr("TF_CONFIG task.index"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 3}})"),
              HasSubstr("below the 1 \"ps\" entries"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 1e300}})"),
              HasSubstr("TF_CONFIG task.index"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"], "worker": ["a:2"]}, "task": {"type": "boss"}})"),
              HasSubstr("chief, master, worker, ps or evaluator, got 'boss'"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"], "chief": ["a:2"], "master": ["a:3"]},)"
                  R"( "task": {"type": "chief"}})"),
              HasSubstr("not both"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"], "chief": ["a:2", "b:2"]}, "task": {"type": "chief"}})"),
              HasSubstr("one entry"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:1"], "worker": ["a:2"]}, "task": {"type": "master"}})"),
              HasSubstr("a \"master\" list"));
  EXPECT_THAT(err(R"({"cluster": {"ps": ["a:x"]}, "task": {"type": "ps"}})"),
              HasSubstr("TF_CONFIG cluster.ps: expected host:port"));
  EXPECT_THAT(err(R"({"cluster": {"ps": "a:1"}, "task": {"type": "ps"}})"),
              HasSubstr("TF_CONFIG cluster.ps: expected a non-empty JSON list"));
  // For `pstrain host`: a cluster without ps.
  EXPECT_THAT(ResolveClusterSpec("", -1, {{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]},)"
                                                        R"( "task": {"type": "worker"}})"}})
                  .status()
                  .message(),
              HasSubstr("\"ps\""));
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

// TF_CONFIG nested 20,000 deep took protobuf's JSON parser over 20 s (time quadratic in the
// depth) and said nothing: nesting past kMaxJsonDepth is refused at once, naming the limit, for
// every JSON of the environment. That the call returns at all is part of the test (the CTest
// timeout bounds it); at the limit, and with brackets inside strings, it still parses.
TEST(ClusterSpecTest, DeepJsonNestingIsRefusedBeforeParsing) {
  const std::string head =
      R"({"cluster": {"ps": ["a:1"], "worker": ["a:1"]}, "task": {"type": "worker", )"
      R"("index": 0}, "environment": )";
  auto nested = [&](int levels) {  // the object is level 1; "environment" opens the rest
    return head + std::string(levels - 1, '[') + std::string(levels - 1, ']') + "}";
  };
  absl::StatusOr<TfConfig> deep = ParseTfConfig(nested(20000));
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(deep.status().message()),
              HasSubstr("TF_CONFIG: expected JSON nested at most 32 deep (arrays and objects), "
                        "got deeper at byte"));
  EXPECT_FALSE(ParseTfConfig(nested(kMaxJsonDepth + 1)).ok());
  absl::StatusOr<TfConfig> at_limit = ParseTfConfig(nested(kMaxJsonDepth));
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->task_type, "worker");
  // Brackets and escaped quotes inside a string are text, not nesting.
  absl::StatusOr<TfConfig> text = ParseTfConfig(
      head + "\"" + std::string(1000, '[') + "\\\"{{" + std::string(1000, '{') + "\"}");
  EXPECT_TRUE(text.ok()) << text.status();
  // SageMaker's JSON goes through the same parser.
  absl::StatusOr<ClusterSpec> sm = ResolveClusterSpec(
      "", -1, {{"SM_HOSTS", std::string(20000, '[') + std::string(20000, ']')},
               {"SM_CURRENT_HOST", "algo-1"}});
  EXPECT_THAT(std::string(sm.status().message()),
              HasSubstr("SM_HOSTS: expected JSON nested at most 32 deep"));
}

}  // namespace
}  // namespace pstrain
