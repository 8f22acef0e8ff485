// PsCheckpointer against a real shard on loopback: a round at the step LATEST already names
// leaves the committed checkpoint as it is (checkpoint/layout.h IsCommittedCheckpoint).
#include "worker/ps_client/ps_checkpoint.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"

namespace pstrain {
namespace {

std::string FreshDir(const std::string& name) {
  std::string templ = testing::TempDir() + "/" + name + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return testing::TempDir() + "/" + name;
  return templ;
}

std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : "<" + s.status().ToString() + ">";
}

// A round whose step is the committed checkpoint's (the chief's scheduled round on the last
// step, then the final round) used to rewrite that checkpoint in place, removing its MANIFEST
// first: a crash then left LATEST naming an incomplete checkpoint. Now the round releases the
// workers and returns the committed checkpoint untouched.
TEST(PsCheckpointer, ARoundAtTheCommittedStepLeavesItAsItIs) {
  ShardServer::Options so;
  so.data.rows = 100;
  so.data.partitions = 2;
  so.data.row_dim = 3;
  so.data.dense_size = 4;
  so.data.sparse_optimizer.set_type(SGD);
  so.data.dense_optimizer.set_type(SGD);
  const std::string dir = FreshDir("ps_same_step");
  so.data.checkpoint_dir = dir;  // the shard writes only under its job's checkpoint dir
  auto shard = ShardServer::Create(so);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE((*shard)->Start("127.0.0.1:0").ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*shard)->port());

  PsClient::Options co;
  co.shards = {address};
  co.rows = so.data.rows;
  co.partitions = so.data.partitions;
  co.row_dim = so.data.row_dim;
  co.dense_size = so.data.dense_size;
  auto client = PsClient::Create(co);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForShards(absl::Seconds(10)).ok());

  PsCheckpointer::Options po;
  po.dir = dir;
  po.keep = 1;
  po.shards = {address};
  po.client = client->get();
  po.timeout = absl::Seconds(20);
  PsCheckpointer checkpointer(po);

  WorkerState state;
  state.set_step(4);
  auto first = checkpointer.Save(state, false);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, dir + "/ckpt-4");
  std::vector<std::string> committed;
  for (const char* f : {"MANIFEST", "shard-0-of-1", "worker-0.state"}) {
    committed.push_back(Slurp(*first + "/" + f));
  }
  state.set_examples(7);  // a rewrite would change worker-0.state and the MANIFEST
  auto same = checkpointer.Save(state, false);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, *first);
  std::vector<std::string> now;
  for (const char* f : {"MANIFEST", "shard-0-of-1", "worker-0.state"}) {
    now.push_back(Slurp(*first + "/" + f));
  }
  EXPECT_EQ(now, committed);
  // The rounds were released and completed: shard 0 says so.
  const InfoResponse info = (*shard)->Info();
  EXPECT_EQ(info.checkpoint_released_round(), info.checkpoint_round());
  EXPECT_EQ(info.checkpoint_done_round(), info.checkpoint_round());
  EXPECT_EQ(info.checkpoint_done_dir(), *first);
  (*shard)->Shutdown(absl::ZeroDuration());
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace pstrain
