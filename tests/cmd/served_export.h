// A `pstrain serve` process over an export, for the command tests that check that serving scores
// rows as `pstrain predict` did (tests/cmd/lists_test.cc, din_test.cc).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "pstrain/serving.grpc.pb.h"
#include "tests/subprocess.h"

namespace pstrain::testing {

class ServedExport {
 public:
  // Starts `pstrain serve --model export_dir` on a free port; ok() says whether it listens.
  ServedExport(const std::string& pstrain, const std::string& export_dir) {
    std::string error;
    if (!server_.Start({pstrain, "serve", "--model", export_dir, "--port", "0", "--threads", "2"},
                       &error)) {
      ADD_FAILURE() << error;
      return;
    }
    const std::string listening = server_.ReadLineContaining("listening on", 60000);
    const int port =
        listening.empty() ? 0 : std::atoi(listening.substr(listening.rfind(':') + 1).c_str());
    if (port <= 0) {
      ADD_FAILURE() << "serve did not say where it listens: " << listening;
      return;
    }
    stub_ = Predictor::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                   grpc::InsecureChannelCredentials()));
  }
  // SIGTERM, and the server exits 0 within a minute.
  ~ServedExport() {
    server_.Signal(SIGTERM);
    EXPECT_EQ(server_.WaitExit(60000), 0);
  }

  bool ok() const { return stub_ != nullptr; }

  grpc::Status Predict(const PredictRequest& req, PredictResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->Predict(&ctx, req, resp);
  }

  // The rows of `csv` (a header, then rows with the label column) sent as CSV requests of 1, 4,
  // 13, ... rows (the server batches them its own way) score as the first column of `scores_tsv`
  // (`pstrain predict --out`) to 1e-6: one scorer, other batch cuts.
  void ExpectCsvScoresAsPredicted(const std::string& csv, const std::string& scores_tsv) {
    ASSERT_TRUE(ok());
    std::vector<float> want;
    std::ifstream in(scores_tsv);
    std::string line;
    while (std::getline(in, line)) {
      float p = NAN;
      ASSERT_TRUE(absl::SimpleAtof(line.substr(0, line.find('\t')), &p)) << line;
      want.push_back(p);
    }
    auto text = ReadFileToString(csv);
    ASSERT_TRUE(text.ok()) << text.status();
    std::vector<std::string> rows = absl::StrSplit(*text, '\n', absl::SkipEmpty());
    ASSERT_FALSE(rows.empty());
    rows.erase(rows.begin());  // the header
    ASSERT_EQ(rows.size(), want.size());
    for (size_t begin = 0, size = 1; begin < rows.size(); begin += size, size = size * 3 + 1) {
      PredictRequest req;
      req.set_row_format(PredictRequest::CSV);
      req.set_rows_have_label(true);
      for (size_t i = begin; i < std::min(rows.size(), begin + size); ++i) req.add_rows(rows[i]);
      PredictResponse resp;
      const grpc::Status s = Predict(req, &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
      ASSERT_EQ(resp.probabilities_size(), req.rows_size());
      for (int i = 0; i < req.rows_size(); ++i) {
        EXPECT_NEAR(resp.probabilities(i), want[begin + i], 1e-6) << "row " << begin + i;
      }
    }
  }

 private:
  Subprocess server_;
  std::unique_ptr<Predictor::Stub> stub_;
};

}  // namespace pstrain::testing
