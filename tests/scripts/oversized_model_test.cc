// scripts/oversized_model.py end to end on tiny data (20k rows with six high-cardinality
// fields): the whole pipeline (datagen, the uncapped single process, the cap from its
// summary.json, PS and allreduce on emulated hosts, the table) and its verdict. On tiny data the
// process itself is larger than the model, so one job cannot show both halves of issue 15's
// target at once: with a generous cap (20x the model) the PS trains on 2 hosts and allreduce does
// not refuse, and the script says the target was missed; at the default cap (the model / 1.5)
// allreduce refuses at startup. docs/PERFORMANCE.md "A model larger than one host" has the real
// run. Needs root and iproute2's `ip netns` (scripts/emulate_hosts.sh); skipped with the reason
// otherwise.
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cmd/job_files.h"
#include "tests/emulated_hosts.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing::RunShell;

TEST(OversizedModelScriptTest, RunsEndToEndOnTinyDataAndJudgesTheTarget) {
  testing::EmulatedHosts probe(2);  // can namespaces be made here at all?
  const std::string why = probe.Create();
  probe.Remove();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string work = absl::StrCat(::testing::TempDir(), "/oversized_model_", getpid());
  const std::string tag = absl::StrCat("t", getpid() % 100000);  // the script adds e.g. "2p"
  const std::string script = absl::StrCat(
      "python3 ", PSTRAIN_SOURCE_DIR, "/scripts/oversized_model.py --binary ", PSTRAIN_BINARY,
      " --work ", work, " --tag ", tag, " --subnet 10.80.0",
      " --rows 20000 --test_rows 4000 --files 2 --timeout_s 240 --allreduce_timeout_s 120");
  std::string out;
  // A cap of 20x the model: the PS trains on 2 hosts, allreduce fits, so the target is missed.
  const int generous = RunShell(script + " --hosts 2 --ratio 0.05", 600, &out);
  EXPECT_EQ(generous, 1) << out;
  const google::protobuf::Struct report = testing::ReadJsonFile(work + "/oversized.json");
  ASSERT_TRUE(report.fields().contains("runs")) << out;
  EXPECT_FALSE(report.fields().at("ok").bool_value());
  const double model = report.fields().at("model_bytes").number_value();
  EXPECT_GT(model, 1e6);  // the single run's params + slots
  EXPECT_EQ(report.fields().at("cap_mb").number_value(),
            static_cast<int>(model / 0.05 / (1024 * 1024)));
  const auto& runs = report.fields().at("runs").list_value().values();
  ASSERT_EQ(runs.size(), 3) << out;  // train, PS on 2 hosts, allreduce
  const auto& ps = runs[1].struct_value().fields();
  EXPECT_EQ(ps.at("status").string_value(), "ok") << out;
  EXPECT_EQ(ps.at("run").string_value(), "ps-async on 2 hosts");
  EXPECT_GT(ps.at("test_auc").number_value(), 0.55);
  EXPECT_EQ(ps.at("parts_mb").list_value().values_size(), 2);  // one per shard
  EXPECT_EQ(runs[2].struct_value().fields().at("status").string_value(), "exit 0") << out;
  EXPECT_THAT(*ReadFileToString(work + "/oversized.md"), HasSubstr("| ps-async on 2 hosts | ok |"));
  // The PS run's checkpoints are removed (--keep_checkpoints keeps them), its summary is not.
  std::string left;
  RunShell("ls " + work + "/ps2/model", 10, &left);
  EXPECT_THAT(left, HasSubstr("summary.json"));
  EXPECT_THAT(left, ::testing::Not(HasSubstr("ckpt-")));

  // The default cap, the model / 1.5, is far below what a rank needs: allreduce refuses.
  const int tight = RunShell(script + " --hosts '' --skip_data --skip_single", 300, &out);
  EXPECT_EQ(tight, 0) << out;
  EXPECT_THAT(out, HasSubstr("| allreduce on 2 hosts | refused at startup |"));
  // Nothing of the script's emulated hosts is left.
  std::string namespaces;
  RunShell("ip netns list", 10, &namespaces);
  EXPECT_THAT(namespaces, ::testing::Not(HasSubstr("pst" + tag)));
  RunShell("rm -rf " + work, 60, &out);
}

}  // namespace
}  // namespace pstrain
