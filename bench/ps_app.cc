// PS round trip on loopback: S in-process shard servers and C client threads (each its own
// PsClient, i.e. its own connections). Each step a client pulls, then pushes (Adagrad on the PS),
// the unique rows of one 1024 x 39 batch (and the dense vector if --dense_size > 0). The push is
// asynchronous (PushAsync, max 2 in flight), as the trainer does; each window ends with a Flush.
//
// Ids: 39 fields of --vocab rows each; within a field, raw keys follow Zipf(--zipf_s) popularity
// and are hashed into the field's rows (the hashing trick). s = 0.74 over 1M-row fields gives
// ~38.6k unique rows per 1024-example batch. Batches are generated before timing.
//
// Peer in the same run: the same pull + push against one in-process EmbeddingStore and DenseStore
// (no gRPC, one thread per client), the ceiling a network PS can approach on this machine.
//
// Reports the median over --windows timed windows (after --warmup steps) of steps/s, rows/s
// (unique rows pulled and pushed per second, all clients) and bytes on the wire per step.
//
//   ninja -C build/release ps_app && build/release/bench/ps_app --out=ps_app.jsonl
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cmd/launcher.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/rpc/security.h"
#include "common/hash.h"
#include "common/json_writer.h"
#include "common/malloc_tuning.h"
#include "common/random.h"
#include "ps/server/shard_server.h"
#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"
#include "worker/ps_client/shard_balance.h"
#include "worker/ps_client/ps_client.h"

namespace pstrain {
namespace {

struct Flags {
  int shards = 2;
  int clients = 2;
  int batch = 1024;
  int fields = 39;
  int64_t vocab = 1000000;
  double zipf_s = 0.74;
  int row_dim = 17;
  int64_t dense_size = 0;
  int batches = 16;  // distinct pre-generated batches, cycled
  int warmup = 16;   // covers every batch, so that timed steps touch no new rows
  int steps = 20;    // per client per window
  int windows = 5;
  bool peer = true;
  std::string out;
  // none | secret (every call carries the cluster secret) | tls (mutual TLS and the secret;
  // certificates for 127.0.0.1 in tls_dir, made by scripts/make_cluster_certs.sh).
  std::string security = "none";
  std::string tls_dir;
};

struct Batch {
  std::vector<int64_t> ids;  // unique, sorted
};

std::vector<Batch> MakeBatches(const Flags& f) {
  // Inverse CDF of Zipf(s) over ranks 1..vocab.
  std::vector<double> cdf(f.vocab);
  double sum = 0;
  for (int64_t r = 0; r < f.vocab; ++r) cdf[r] = (sum += std::pow(r + 1.0, -f.zipf_s));
  for (double& c : cdf) c /= sum;
  Rng rng(42);
  std::vector<Batch> out(f.batches);
  for (Batch& b : out) {
    b.ids.reserve(int64_t{f.batch} * f.fields);
    for (int e = 0; e < f.batch; ++e) {
      for (int field = 0; field < f.fields; ++field) {
        const int64_t rank =
            std::lower_bound(cdf.begin(), cdf.end(), rng.UniformDouble()) - cdf.begin();
        const uint64_t row = HashKey(static_cast<uint64_t>(rank), field) % f.vocab;
        b.ids.push_back(field * f.vocab + static_cast<int64_t>(row));
      }
    }
    std::sort(b.ids.begin(), b.ids.end());
    b.ids.erase(std::unique(b.ids.begin(), b.ids.end()), b.ids.end());
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  double steps_per_s = 0, rows_per_s = 0, bytes_per_step = 0;
};

// Runs `warmup` then `windows` windows of `steps` steps on each of the clients' threads.
// step_fn(client, step, last) does one step (last: the client's last step of the window, which
// must wait for its pushes); bytes_fn() returns the wire bytes so far.
template <typename StepFn, typename BytesFn>
Result Measure(const Flags& f, const std::vector<Batch>& batches, StepFn step_fn,
               BytesFn bytes_fn) {
  auto run = [&](int steps, int64_t first_step) {
    std::vector<std::thread> threads;
    for (int c = 0; c < f.clients; ++c) {
      threads.emplace_back([&, c] {
        for (int s = 0; s < steps; ++s) step_fn(c, first_step + s, s + 1 == steps);
      });
    }
    for (auto& t : threads) t.join();
  };
  int64_t step = 1;
  run(f.warmup, step);
  step += f.warmup;
  std::vector<double> steps_per_s, rows_per_s, bytes_per_step;
  for (int w = 0; w < f.windows; ++w) {
    double rows = 0;
    for (int c = 0; c < f.clients; ++c) {
      for (int s = 0; s < f.steps; ++s) {
        rows += batches[(step + s + c) % batches.size()].ids.size();
      }
    }
    const int64_t bytes_before = bytes_fn();
    const absl::Time t0 = absl::Now();
    run(f.steps, step);
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    step += f.steps;
    const double total_steps = static_cast<double>(f.steps) * f.clients;
    steps_per_s.push_back(total_steps / secs);
    rows_per_s.push_back(rows / secs);
    bytes_per_step.push_back((bytes_fn() - bytes_before) / total_steps);
  }
  return Result{Median(steps_per_s), Median(rows_per_s), Median(bytes_per_step)};
}

int Main(int argc, char** argv) {
  Flags f;
  FlagSet flags("ps_app", "PS pull/push round trip over gRPC on loopback");
  flags.Int("shards", &f.shards, "shard servers (in-process)");
  flags.Int("clients", &f.clients, "client threads, one PsClient each");
  flags.Int("batch", &f.batch, "examples per batch");
  flags.Int("fields", &f.fields, "fields per example");
  flags.Int64("vocab", &f.vocab, "rows per field");
  flags.Double("zipf_s", &f.zipf_s, "Zipf exponent of key popularity within a field");
  flags.Int("row_dim", &f.row_dim, "floats per row");
  flags.Int64("dense_size", &f.dense_size, "dense floats pulled and pushed per step (0 = none)");
  flags.Int("batches", &f.batches, "distinct batches generated before timing");
  flags.Int("warmup", &f.warmup, "untimed steps per client first");
  flags.Int("steps", &f.steps, "steps per client per timed window");
  flags.Int("windows", &f.windows, "timed windows; the median is reported");
  flags.Bool("peer", &f.peer, "also measure the in-process peer");
  flags.String("out", &f.out, "append one JSON line with the results to this file");
  flags.String("security", &f.security, "none | secret | tls (docs/PS.md \"Operations and security\")");
  flags.String("tls_dir", &f.tls_dir,
               "with --security=tls: ca.pem, 127.0.0.1.pem and 127.0.0.1.key "
               "(scripts/make_cluster_certs.sh DIR 127.0.0.1:1)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok() || flags.help_requested()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Usage().c_str());
    return s.ok() ? 0 : 2;
  }
  const int64_t rows = f.vocab * f.fields;
  const int partitions = 4 * f.shards;
  const std::vector<Batch> batches = MakeBatches(f);
  double unique = 0;
  for (const Batch& b : batches) unique += b.ids.size();
  unique /= batches.size();
  std::printf(
      "table %lld rows x %d floats, %d partitions on %d shards; %d clients; "
      "%.0f unique rows per %d x %d batch; dense %lld floats\n",
      static_cast<long long>(rows), f.row_dim, partitions, f.shards, f.clients, unique, f.batch,
      f.fields, static_cast<long long>(f.dense_size));

  OptimizerConfig adagrad;  // the default: Adagrad, lr 0.05
  const int dim = f.row_dim;
  auto row_init = [dim](int64_t row, float* out) {
    for (int j = 0; j < dim; ++j) out[j] = 0.001f * static_cast<float>((row + j) % 97);
  };
  RpcSecurity security;
  if (f.security == "secret" || f.security == "tls") security.secret = std::string(32, 'k');
  if (f.security == "tls") {
    auto ca = ReadFileToString(f.tls_dir + "/ca.pem");
    auto cert = ReadFileToString(f.tls_dir + "/127.0.0.1.pem");
    auto key = ReadFileToString(f.tls_dir + "/127.0.0.1.key");
    if (!ca.ok() || !cert.ok() || !key.ok()) {
      std::fprintf(stderr, "--security=tls: cannot read the PEM files in --tls_dir '%s'\n",
                   f.tls_dir.c_str());
      return 2;
    }
    security.ca_pem = *ca;
    security.cert_pem = *cert;
    security.key_pem = *key;
  } else if (f.security != "none" && f.security != "secret") {
    std::fprintf(stderr, "--security: expected none, secret or tls, got '%s'\n",
                 f.security.c_str());
    return 2;
  }
  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < f.shards; ++s) {
    ShardServer::Options o;
    o.data.shard = s;
    o.data.num_shards = f.shards;
    o.data.rows = rows;
    o.data.partitions = partitions;
    o.data.row_dim = f.row_dim;
    o.data.dense_size = f.dense_size;
    o.data.sparse_optimizer = adagrad;
    o.data.dense_optimizer = adagrad;
    o.data.row_init = row_init;
    o.security = security;
    o.num_workers = f.clients;
    auto server = ShardServer::Create(std::move(o));
    if (!server.ok() || !(*server)->Start("127.0.0.1:0").ok()) {
      std::fprintf(stderr, "cannot start shard %d\n", s);
      return 1;
    }
    addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    servers.push_back(std::move(server).value());
  }
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int c = 0; c < f.clients; ++c) {
    PsClient::Options o;
    o.shards = addresses;
    o.rows = rows;
    o.partitions = partitions;
    o.row_dim = f.row_dim;
    o.dense_size = f.dense_size;
    o.worker_id = c;
    o.security = security;
    auto client = PsClient::Create(o);
    if (!client.ok() || !(*client)->WaitForShards(absl::Seconds(30)).ok()) {
      std::fprintf(stderr, "cannot reach the shards\n");
      return 1;
    }
    clients.push_back(std::move(client).value());
  }

  // Per-client buffers, sized for the largest batch.
  size_t max_ids = 0;
  for (const Batch& b : batches) max_ids = std::max(max_ids, b.ids.size());
  struct Buffers {
    std::vector<float> rows, grads, dense, dense_grad;
  };
  std::vector<Buffers> buf(f.clients);
  for (Buffers& b : buf) {
    b.rows.resize(max_ids * f.row_dim);
    b.grads.assign(max_ids * f.row_dim, 0.01f);
    b.dense.resize(f.dense_size);
    b.dense_grad.assign(f.dense_size, 0.01f);
  }
  std::atomic<bool> failed{false};
  auto ps_step = [&](int c, int64_t step, bool last) {
    const Batch& b = batches[(step + c) % batches.size()];
    Buffers& x = buf[c];
    float* dense = f.dense_size > 0 ? x.dense.data() : nullptr;
    const float* dense_grad = f.dense_size > 0 ? x.dense_grad.data() : nullptr;
    absl::Status s = clients[c]->Pull(b.ids, x.rows.data(), dense);
    // The push runs while the next step starts; the client bounds pushes in flight.
    clients[c]->PushAsync(b.ids, x.grads.data(), dense_grad, step);
    if (last && s.ok()) s = clients[c]->Flush();
    if (!s.ok() && !failed.exchange(true)) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  };
  auto ps_bytes = [&] {
    int64_t total = 0;
    for (const auto& c : clients) total += c->traffic().bytes_sent + c->traffic().bytes_received;
    return total;
  };
  const Result ps = Measure(f, batches, ps_step, ps_bytes);
  for (const auto& c : clients) {
    if (!c->Flush().ok()) failed = true;
  }
  auto stats = clients[0]->GetStats();
  if (stats.ok()) std::printf("%s\n", FormatShardBalance(*stats).c_str());

  // Peer: the same steps on one in-process store, no gRPC.
  Result in_process;
  if (f.peer) {
    EmbeddingStore::Options eo;
    eo.begin = 0;
    eo.end = rows;
    eo.dim = f.row_dim;
    eo.optimizer = Optimizer::Create(adagrad).value();
    eo.row_init = row_init;
    auto local = EmbeddingStore::Create(eo).value();
    std::unique_ptr<DenseStore> local_dense;
    if (f.dense_size > 0) {
      DenseStore::Options d;
      d.size = f.dense_size;
      d.optimizer = eo.optimizer;
      local_dense = DenseStore::Create(d).value();
    }
    auto local_step = [&](int c, int64_t step, bool) {
      const Batch& b = batches[(step + c) % batches.size()];
      if (!local->Gather(b.ids, buf[c].rows.data()).ok() ||
          !local->Apply(b.ids, buf[c].grads.data(), step).ok()) {
        failed = true;
      }
      if (local_dense != nullptr) {
        local_dense->Get(buf[c].dense.data());
        local_dense->Apply(buf[c].dense_grad.data(), step);
      }
    };
    in_process = Measure(f, batches, local_step, [] { return int64_t{0}; });
  }
  if (failed) return 1;

  std::printf("security %s\n", f.security.c_str());
  std::printf("gRPC PS:    %8.1f steps/s  %10.0f rows/s  %6.2f MB on the wire per step\n",
              ps.steps_per_s, ps.rows_per_s, ps.bytes_per_step / 1e6);
  if (f.peer) {
    std::printf("in-process: %8.1f steps/s  %10.0f rows/s  (gRPC / in-process = %.2f)\n",
                in_process.steps_per_s, in_process.rows_per_s,
                ps.rows_per_s / in_process.rows_per_s);
  }
  if (!f.out.empty()) {
    JsonObject j;
    j.Add("bench", "ps_app")
        .Add("shards", f.shards)
        .Add("clients", f.clients)
        .Add("batch", f.batch)
        .Add("fields", f.fields)
        .Add("row_dim", f.row_dim)
        .Add("dense_size", f.dense_size)
        .Add("unique_rows_per_step", unique)
        .Add("steps_per_s", ps.steps_per_s)
        .Add("rows_per_s", ps.rows_per_s)
        .Add("wire_bytes_per_step", ps.bytes_per_step)
        .Add("in_process_rows_per_s", in_process.rows_per_s)
        .Add("ratio_to_in_process", ps.rows_per_s / in_process.rows_per_s)
        .Add("security", f.security)
        .Add("windows", f.windows)
        .Add("steps_per_window", f.steps);
    std::string line = j.str() + "\n";
    FILE* out = std::fopen(f.out.c_str(), "a");
    if (out == nullptr || std::fputs(line.c_str(), out) < 0 || std::fclose(out) != 0) {
      std::fprintf(stderr, "cannot write %s\n", f.out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  // As pstrain's own main does (cmd/pstrain_main.cc), so that the PS path measured here is the
  // one the training commands run.
  pstrain::ReexecWithPassiveOmpWaitPolicy(argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  pstrain::KeepLargeBuffersInTheHeap();
  if (auto env = pstrain::InitLaunchEnvironment(); !env.ok()) {
    std::fprintf(stderr, "%s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  return pstrain::Main(argc, argv);
}
