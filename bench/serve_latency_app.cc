// `pstrain serve` on one core, measured by a client over loopback in the same run: for requests
// of each size (rows of raw Criteo TSV), the saturation throughput (a closed loop keeping
// --concurrency requests outstanding) and the latency distribution at half that load (an open
// loop sending at a fixed rate: latency counts from the intended send time, so a stalled server
// cannot hide its queueing). The server is the real binary pinned to --server_cpu (taskset), the
// client this process pinned to --client_cpu; every call has a deadline. The target: p99 <= 5 ms
// for 32-row requests at half the saturation load.
//
// usage: serve_latency_app --pstrain build/release/pstrain --model EXPORT --rows test.tsv
//                          [--sizes 1,32,512] [--seconds 5] [--concurrency 16]
//                          [--server_cpu 0] [--client_cpu 1] [--server_args "..."] [--out f.json]
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/app_util.h"
#include "cmd/launcher.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/json_writer.h"
#include "pstrain/serving.grpc.pb.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

struct Call {
  grpc::ClientContext ctx;
  PredictResponse resp;
  Clock::time_point start;
};

// Completed calls' latencies and failures, from gRPC's callback threads.
class Recorder {
 public:
  void Done(Clock::time_point start, Clock::time_point end, bool ok, int rows_expected,
            int rows_got) {
    const double ms = std::chrono::duration<double, std::milli>(end - start).count();
    absl::MutexLock l(&mu_);
    if (!ok || rows_got != rows_expected) {
      ++failed_;
    } else if (recording_) {
      latencies_.push_back(ms);
    }
    --outstanding_;
  }
  void Started() {
    absl::MutexLock l(&mu_);
    ++outstanding_;
  }
  void SetRecording(bool on) {
    absl::MutexLock l(&mu_);
    recording_ = on;
    if (on) latencies_.clear();
  }
  // Waits (bounded) until no call is outstanding.
  bool Drain(absl::Duration limit) {
    absl::MutexLock l(&mu_);
    auto none = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return outstanding_ == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&none), limit);
  }
  std::vector<double> latencies() {
    absl::MutexLock l(&mu_);
    return latencies_;
  }
  int64_t failed() {
    absl::MutexLock l(&mu_);
    return failed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<double> latencies_ ABSL_GUARDED_BY(mu_);
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool recording_ ABSL_GUARDED_BY(mu_) = false;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

void Send(Predictor::Stub* stub, const PredictRequest& req, Clock::time_point start,
          Recorder* rec, std::function<void()> then) {
  auto* call = new Call;
  call->start = start;
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  rec->Started();
  const int n = req.rows_size();
  stub->async()->Predict(&call->ctx, &req, &call->resp,
                         [call, rec, n, then](grpc::Status s) {
                           const Clock::time_point end = Clock::now();
                           // The next call starts before this one counts as done, so Drain
                           // cannot see zero outstanding while the closed loop still runs.
                           if (then) then();
                           rec->Done(call->start, end, s.ok(), n,
                                     call->resp.probabilities_size());
                           delete call;
                         });
}

int Main(int argc, char** argv) {
  std::string pstrain, model, rows_path, sizes_flag = "1,32,512", out, server_args;
  int seconds = 5, concurrency = 16, server_cpu = 0, client_cpu = 1;
  FlagSet flags("serve_latency_app", "Latency and saturation of pstrain serve on one core.");
  flags.String("pstrain", &pstrain, "the pstrain binary (required)");
  flags.String("model", &model, "the export to serve (required)");
  flags.String("rows", &rows_path, "Criteo TSV rows with the label column (required)");
  flags.String("sizes", &sizes_flag, "rows per request, comma-separated");
  flags.Int("seconds", &seconds, "measured seconds of each phase (after 1 s of warm-up)");
  flags.Int("concurrency", &concurrency, "outstanding requests in the saturation phase");
  flags.Int("server_cpu", &server_cpu, "the CPU the server is pinned to");
  flags.Int("client_cpu", &client_cpu, "the CPU this client is pinned to");
  flags.String("server_args", &server_args, "more flags for pstrain serve");
  flags.String("out", &out, "write the results as JSON here");
  if (std::optional<int> code = ParseAppFlags(flags, argc, argv)) return *code;
  auto env = InitLaunchEnvironment();
  if (!env.ok() || pstrain.empty() || model.empty() || rows_path.empty()) {
    std::fprintf(stderr, "--pstrain, --model and --rows are required\n");
    return 2;
  }
  std::vector<std::string> lines;
  {
    std::ifstream in(rows_path);
    std::string line;
    while (std::getline(in, line) && lines.size() < 100000) lines.push_back(line);
  }
  std::vector<int> sizes;
  for (absl::string_view s : absl::StrSplit(sizes_flag, ',')) {
    int v;
    if (!absl::SimpleAtoi(s, &v) || v < 1 || v > static_cast<int>(lines.size())) {
      std::fprintf(stderr, "--sizes: bad size %s\n", std::string(s).c_str());
      return 2;
    }
    sizes.push_back(v);
  }

  // The server, pinned to its core; this client on another.
  std::vector<std::string> argv_server = {"/usr/bin/taskset", "-c", absl::StrCat(server_cpu),
                                          pstrain, "serve", "--model", model, "--port", "0",
                                          "--threads", "1", "--max_request_rows", "4096"};
  for (absl::string_view a : absl::StrSplit(server_args, ' ', absl::SkipEmpty())) {
    argv_server.emplace_back(a);
  }
  testing::Subprocess server;
  std::string error;
  if (!server.Start(argv_server, &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  const std::string ready = server.ReadLineContaining("listening on", 120000);
  if (ready.empty()) {
    std::fprintf(stderr, "the server did not start\n");
    return 1;
  }
  const std::string port = ready.substr(ready.rfind(':') + 1);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(client_cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = Predictor::NewStub(channel);

  std::string results = "[";
  absl::PrintF("%s; server: %s\n", env->cpu_model, ready);
  absl::PrintF("%8s %14s %14s %12s %12s %12s %12s %8s\n", "rows/req", "sat. req/s", "sat. pred/s",
               "half req/s", "p50 ms", "p99 ms", "mean ms", "failed");
  for (int size : sizes) {
    // Requests of `size` rows, cut from the rows in turn.
    std::vector<PredictRequest> reqs;
    for (size_t at = 0; reqs.size() < 64; at = (at + size) % (lines.size() - size)) {
      PredictRequest r;
      r.set_rows_have_label(true);
      for (int i = 0; i < size; ++i) r.add_rows(lines[at + i]);
      reqs.push_back(std::move(r));
    }
    // Saturation: a closed loop.
    Recorder sat;
    std::atomic<bool> stop{false};
    std::atomic<int64_t> next{0}, completed{0};
    std::function<void()> again = [&] {
      completed.fetch_add(1);
      if (!stop.load()) {
        Send(stub.get(), reqs[next.fetch_add(1) % reqs.size()], Clock::now(), &sat, again);
      }
    };
    for (int c = 0; c < concurrency; ++c) {
      Send(stub.get(), reqs[next.fetch_add(1) % reqs.size()], Clock::now(), &sat, again);
    }
    absl::SleepFor(absl::Seconds(1));
    const int64_t c0 = completed.load();
    const absl::Time t0 = absl::Now();
    absl::SleepFor(absl::Seconds(seconds));
    const double sat_rps = (completed.load() - c0) / absl::ToDoubleSeconds(absl::Now() - t0);
    stop = true;
    if (!sat.Drain(absl::Seconds(30))) {
      std::fprintf(stderr, "calls still outstanding after 30 s\n");
      return 1;
    }
    // Half the saturation load: an open loop at a fixed rate.
    Recorder half;
    const double rate = sat_rps / 2;
    const auto interval = std::chrono::duration<double>(1.0 / rate);
    const auto begin = Clock::now();
    const int64_t warm = static_cast<int64_t>(rate * 1.0);
    const int64_t total = warm + static_cast<int64_t>(rate * seconds);
    for (int64_t i = 0; i < total; ++i) {
      const auto when = begin + std::chrono::duration_cast<Clock::duration>(interval * i);
      std::this_thread::sleep_until(when);
      if (i == warm) half.SetRecording(true);
      Send(stub.get(), reqs[i % reqs.size()], when, &half, nullptr);
    }
    if (!half.Drain(absl::Seconds(30))) {
      std::fprintf(stderr, "calls still outstanding after 30 s\n");
      return 1;
    }
    const std::vector<double> lat = half.latencies();
    double mean = 0;
    for (double v : lat) mean += v;
    mean /= std::max<size_t>(1, lat.size());
    const double p50 = Percentile(lat, 0.5), p99 = Percentile(lat, 0.99);
    const int64_t failed = sat.failed() + half.failed();
    absl::PrintF("%8d %14.0f %14.0f %12.0f %12.3f %12.3f %12.3f %8d\n", size, sat_rps,
                 sat_rps * size, rate, p50, p99, mean, failed);
    JsonObject j;
    j.Add("rows_per_request", size)
        .Add("saturation_requests_per_sec", sat_rps)
        .Add("saturation_predictions_per_sec", sat_rps * size)
        .Add("half_load_requests_per_sec", rate)
        .Add("p50_ms", p50)
        .Add("p99_ms", p99)
        .Add("mean_ms", mean)
        .Add("samples", static_cast<int64_t>(lat.size()))
        .Add("failed", failed);
    absl::StrAppend(&results, results.size() > 1 ? "," : "", j.str());
  }
  results += "]";
  server.Signal(SIGTERM);
  const int status = server.WaitExit(60000);
  if (!out.empty()) {
    JsonObject doc;
    doc.Add("cpu_model", env->cpu_model)
        .Add("server", ready)
        .Add("server_exit_status", status)
        .AddRaw("results", results);
    if (int code = WriteJsonResults(out, doc.str())) return code;
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

PSTRAIN_APP_MAIN()
