// libFuzzer target: what `pstrain serve` does with a client's bytes (docs/SERVING.md).
//   - Every input: the bytes parsed as a pstrain.PredictRequest (as the handler's raw parse does),
//     its own fields checked (serving/request_rows.h CheckRequestFields) and its rows or examples
//     parsed against the served model's feature spec (ParseRequestRows: TSV, CSV, feature lists)
//     and encoded (FeatureSpec::Encode), the path every Predict call takes before it is queued.
//   - First byte % 4 == 2: the bytes after it sent as the body of a raw Predict call to a real
//     PredictServer (serving/server/predict_server.h) over loopback TCP (127.0.0.1, started once
//     per process over a tiny export): the server's own parse, the row limit, the batcher, the
//     scoring and the answer. First byte % 4 == 3: a Reload call whose authorization metadata is
//     a piece of the input (the admin-token check; with the right token, a reload of the export
//     directory, which holds no newer version). First byte % 4 == 1: the bytes after it as the
//     admin token's file (`--admin_token_file`, common/rpc/security.h ReadCredentialFile; the
//     file's mode 0600, or 0644 when the first byte's bit 2 is set): a token it accepts is one
//     gRPC metadata can carry (16 or more printable ASCII bytes, no space), or the run aborts.
// Nothing may crash, hang (every call has a 5 s deadline; the server answers every malformed
// request INVALID_ARGUMENT) or allocate without bound (the server's max_request_rows is 64).
// Seed corpus: fuzz/corpus/serve_requests/ (requests in each form, by scripts/make_fuzz_corpus.sh).
#include <sys/stat.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/rpc/security.h"
#include "fuzz/fuzz_util.h"
#include "pstrain/serving.pb.h"
#include "serving/export.h"
#include "serving/request_rows.h"
#include "serving/server/predict_server.h"
#include "serving/serving_model.h"
#include "worker/train/checkpoint.h"

namespace {

using namespace pstrain;

constexpr char kToken[] = "fuzz-admin-token";

// A Criteo-shaped model of small vocabularies, exported once, and a server over it.
struct Served {
  std::unique_ptr<ServingModel> model;
  std::unique_ptr<PredictServer> server;
  std::unique_ptr<grpc::GenericStub> stub;
};

Served* Start() {
  constexpr char kName[] = "serve_requests";
  auto* s = new Served;
  auto config = ParseConfigText(
      "features { categorical_vocab_size: 50 }\n"
      "model { embedding_dim: 2 hidden: 4 }\n",
      "serve_requests_fuzzer");
  if (!config.ok()) fuzz::SetupFailed(kName, config.status().ToString());
  ApplyConfigDefaults(&*config);
  auto description = DescribeModel(*config);
  if (!description.ok()) fuzz::SetupFailed(kName, description.status().ToString());
  auto model = ServingModel::Create(*description, {"fuzz", 1, 1});
  if (!model.ok()) fuzz::SetupFailed(kName, model.status().ToString());
  s->model = *std::move(model);
  const std::string base = fuzz::ScratchDir("serve");
  ExportOptions eo;
  eo.version = 1;
  if (!PathExists(base + "/1")) {
    auto written = WriteExport(*s->model, base, eo);
    if (!written.ok()) fuzz::SetupFailed(kName, written.status().ToString());
  }
  PredictServer::Options o;
  o.model_path = base;
  o.address = "127.0.0.1:0";
  o.max_request_rows = 64;
  o.batching.max_batch = 16;
  o.batching.max_delay = absl::ZeroDuration();
  o.watch = false;
  o.admin_token = kToken;
  auto server = PredictServer::Start(std::move(o));
  if (!server.ok()) fuzz::SetupFailed(kName, server.status().ToString());
  s->server = *std::move(server);
  s->stub = std::make_unique<grpc::GenericStub>(
      MakeChannel("127.0.0.1:" + std::to_string(s->server->port()), RpcSecurity(),
                  grpc::ChannelArguments()));
  return s;
}

// A unary call of `method` with `body` and `token` ("" = no authorization metadata), waited for.
void Call(grpc::GenericStub* stub, const std::string& method, const std::string& body,
          const std::string& token) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  if (!token.empty()) ctx.AddMetadata("authorization", token);
  const grpc::Slice slice(body);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  stub->UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                  [&done](const grpc::Status&) { done.Notify(); });
  done.WaitForNotification();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Served* served = Start();
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  // The parse and the row checks, directly.
  PredictRequest request;
  if (request.ParseFromString(body) && CheckRequestFields(request).ok()) {
    const FeatureSpec& spec = served->model->spec();
    RawRows raw;
    raw.Clear(spec.num_fields());
    if (ParseRequestRows(request, spec, &raw).ok() && raw.size() > 0) {
      Batch batch;
      batch.Clear(spec.num_fields());
      spec.Encode(raw, &batch);
    }
  }
  switch (data[0] % 4) {
    case 2:
      Call(served->stub.get(), "/pstrain.Predictor/Predict", body, "");
      break;
    case 1: {
      static const std::string path = fuzz::ScratchDir("serve_requests") + "/admin_token";
      if (!fuzz::WriteFile(path, body)) break;
      chmod(path.c_str(), (data[0] & 4) != 0 ? 0644 : 0600);
      absl::StatusOr<std::string> token = ReadCredentialFile(path, "the admin token");
      if (token.ok()) {
        if ((data[0] & 4) != 0 || token->size() < 16) abort();
        for (char c : *token) {
          if (c <= ' ' || c > '~') abort();
        }
      }
      break;
    }
    case 3: {
      fuzz::InputReader in(data + 1, size - 1);
      std::string token = in.Byte() % 2 == 0 ? std::string("Bearer ") + kToken : in.Piece(256);
      // gRPC's client refuses (asserts on) metadata values outside printable ASCII: the server
      // sees only such values from a real client, so those are the ones worth sending.
      for (char& c : token) {
        if (c < 0x20 || c > 0x7e) c = '?';
      }
      Call(served->stub.get(), "/pstrain.Predictor/Reload", in.Rest(), token);
      break;
    }
    default:
      break;
  }
  return 0;
}
