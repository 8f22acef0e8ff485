// Shard servers started in the test's own process on 127.0.0.1, at ports the kernel picks: the
// cluster the PS server tests build (their fixtures derive from LocalShards and Add one server
// per shard); and the optimizer those tests train with.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "pstrain/config.pb.h"

namespace pstrain::testing {

// The optimizer of `type` the shard tests train with: SGD at 0.1, the others at 0.05, FTRL with
// l1 0.001 and l2 0.01.
inline OptimizerConfig TestOptimizer(OptimizerType type) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(type == SGD ? 0.1f : 0.05f);
  if (type == FTRL) c.set_l1(0.001f), c.set_l2(0.01f);
  return c;
}

struct LocalShards {
  // Creates a server of `options` and starts it; a test failure (and no server added) when
  // either fails, so that a test then fails on the missing shard instead of crashing.
  void Add(ShardServer::Options options) {
    auto server = ShardServer::Create(std::move(options));
    if (!server.ok()) {
      ADD_FAILURE() << "ShardServer::Create: " << server.status();
      return;
    }
    const absl::Status started = (*server)->Start("127.0.0.1:0");
    if (!started.ok()) {
      ADD_FAILURE() << "ShardServer::Start: " << started;
      return;
    }
    addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    servers.push_back(std::move(server).value());
  }

  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<std::string> addresses;  // servers[i]'s
};

}  // namespace pstrain::testing
