// serving/server/batcher.h: requests arriving together are scored as one batch, with the scores
// each request would get alone; large requests are split; the queue is bounded; Stop scores what
// is queued; a batch never mixes models.
#include "serving/server/batcher.h"

#include <cmath>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "serving/scorer.h"
#include "tests/serving/serving_test_util.h"

namespace pstrain {
namespace {

using testing_serving::SmallDescription;
using testing_serving::SmallModel;

// n random encoded rows for `model` (ids inside each field's slice, some missing rows).
Batch RandomRows(const ServingModel& model, int n, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.Clear(model.spec().num_fields());
  for (int r = 0; r < n; ++r) {
    for (const auto& f : model.spec().fields()) {
      b.ids.push_back(static_cast<int64_t>(f.offset + rng.Uniform(f.rows)));
      b.values.push_back(1.0f);
    }
    b.labels.push_back(0);
    ++b.size;
  }
  return b;
}

// SmallDescription with c3 a MEAN list of up to 4 ids sharing c1's rows, and c4 a SUM list.
ModelDescription ListDescription() {
  ModelDescription d = SmallDescription();
  FieldSpec* c3 = d.mutable_features()->mutable_field(3);
  c3->clear_vocab_size();
  c3->set_share_rows_with("c1");
  c3->mutable_list()->set_combiner(MEAN);
  c3->mutable_list()->set_max_length(4);
  FieldSpec* c4 = d.mutable_features()->add_field();
  c4->set_name("c4");
  c4->set_vocab_size(50);
  c4->mutable_list()->set_combiner(SUM);
  return d;
}

// n random rows for a model with list fields, encoded (Batch::offsets): lists of 0..4 ids with
// random weights, some single-valued fields missing.
Batch RandomListRows(const ServingModel& model, int n, uint64_t seed) {
  const FeatureSpec& spec = model.spec();
  Rng rng(seed);
  RawRows raw;
  raw.Clear(spec.num_fields());
  for (int r = 0; r < n; ++r) {
    raw.AddRow(0.f);
    for (int f = 0; f < spec.num_fields(); ++f) {
      if (spec.field(f).list) {
        raw.StartList(r, f);
        const int len = static_cast<int>(rng.Uniform(5));
        for (int j = 0; j < len; ++j) raw.AddToList(r, f, rng.Uniform(100), 0.5 + rng.Uniform(4));
      } else if (rng.Uniform(4) != 0) {
        if (spec.field(f).kind == NUMERIC) {
          raw.SetNumeric(r, f, static_cast<double>(rng.Uniform(30)));
        } else {
          raw.SetCategorical(r, f, rng.Uniform(100));
        }
      }
    }
  }
  Batch b;
  spec.Encode(raw, &b);
  EXPECT_FALSE(b.offsets.empty());
  return b;
}

// What a Scorer gives for `rows` scored alone.
std::vector<float> Alone(std::shared_ptr<const ServingModel> model, const Batch& rows) {
  auto scorer = Scorer::Create(model, rows.size, 1);
  EXPECT_TRUE(scorer.ok()) << scorer.status();
  std::vector<float> probs(rows.size);
  EXPECT_TRUE((*scorer)->Score(rows.size, rows.ids.data(), rows.values.data(), nullptr,
                               probs.data(),
                               rows.offsets.empty() ? nullptr : rows.offsets.data()).ok());
  return probs;
}

struct Request {
  std::shared_ptr<ScoreJob> job = std::make_shared<ScoreJob>();
  std::vector<float> probs;
  absl::Notification done;
  absl::Status status;
};

std::unique_ptr<Request> MakeRequest(std::shared_ptr<const ServingModel> model, Batch rows) {
  auto r = std::make_unique<Request>();
  r->probs.assign(rows.size, -1.f);
  r->job->model = std::move(model);
  r->job->rows = std::move(rows);
  r->job->probs = r->probs.data();
  Request* raw = r.get();
  r->job->done = [raw](absl::Status s) {
    raw->status = s;
    raw->done.Notify();
  };
  return r;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  // Bit-identical on the avx512 paths; oneDNN's avx2 kernels may change the last bits of a logit
  // with the batch size (serving/scorer.h).
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "row " << i;
}

TEST(Batcher, RequestsArrivingTogetherAreOneBatch) {
  std::shared_ptr<const ServingModel> model = SmallModel(SmallDescription(), 1);
  Batcher::Options o;
  o.threads = 1;
  o.max_batch = 64;
  o.max_delay = absl::Seconds(5);  // long: the batch closes when 64 rows are there
  auto batcher = Batcher::Create(o);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  std::vector<std::unique_ptr<Request>> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(MakeRequest(model, RandomRows(*model, 8, i)));
  for (auto& r : requests) ASSERT_TRUE((*batcher)->Enqueue(r->job).ok());
  for (auto& r : requests) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(r->status.ok()) << r->status;
    ExpectClose(r->probs, Alone(model, r->job->rows));
  }
  const Batcher::Stats s = (*batcher)->stats();
  EXPECT_EQ(s.batches, 1);
  EXPECT_EQ(s.rows, 64);
  EXPECT_EQ(s.padded_rows, 64);
}

TEST(Batcher, TheWindowClosesAfterMaxDelay) {
  std::shared_ptr<const ServingModel> model = SmallModel(SmallDescription(), 2);
  Batcher::Options o;
  o.threads = 2;
  o.max_batch = 512;
  o.max_delay = absl::Milliseconds(2);
  auto batcher = Batcher::Create(o);
  ASSERT_TRUE(batcher.ok());
  // A lone 3-row request does not wait for 512 rows: it is padded to 8 and answered.
  auto r = MakeRequest(model, RandomRows(*model, 3, 9));
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*batcher)->Enqueue(r->job).ok());
  ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(r->status.ok());
  ExpectClose(r->probs, Alone(model, r->job->rows));
  EXPECT_EQ((*batcher)->stats().padded_rows, 8);
  EXPECT_EQ((*batcher)->PaddedSize(1), 1);
  EXPECT_EQ((*batcher)->PaddedSize(2), 8);
  EXPECT_EQ((*batcher)->PaddedSize(33), 64);
  EXPECT_EQ((*batcher)->PaddedSize(300), 512);
}

TEST(Batcher, LargeRequestsAreSplitAndStillExact) {
  std::shared_ptr<const ServingModel> model = SmallModel(SmallDescription(), 3);
  Batcher::Options o;
  o.threads = 2;
  o.max_batch = 16;
  o.max_delay = absl::ZeroDuration();
  auto batcher = Batcher::Create(o);
  ASSERT_TRUE(batcher.ok());
  auto big = MakeRequest(model, RandomRows(*model, 100, 4));
  auto small = MakeRequest(model, RandomRows(*model, 5, 5));
  ASSERT_TRUE((*batcher)->Enqueue(big->job).ok());
  ASSERT_TRUE((*batcher)->Enqueue(small->job).ok());
  for (Request* r : {big.get(), small.get()}) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(r->status.ok());
    ExpectClose(r->probs, Alone(model, r->job->rows));
  }
  EXPECT_GE((*batcher)->stats().batches, 7);  // 105 rows, at most 16 a batch
  EXPECT_EQ((*batcher)->stats().rows, 105);
}

// Requests of a model with list fields, batched together (padded: 5 + 7 + 9 = 21 rows -> 32)
// and split (a 40-row request over max_batch 16), score as each alone: the batch carries the
// pieces' entries and offsets.
TEST(Batcher, ListRowsAreBatchedWithTheirOffsets) {
  std::shared_ptr<const ServingModel> model = SmallModel(ListDescription(), 11);
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->spec().has_lists());
  for (const int max_batch : {64, 16}) {
    Batcher::Options o;
    o.threads = 2;
    o.max_batch = max_batch;
    o.max_delay = absl::Milliseconds(20);
    auto batcher = Batcher::Create(o);
    ASSERT_TRUE(batcher.ok()) << batcher.status();
    std::vector<std::unique_ptr<Request>> requests;
    for (const int n : {5, 7, 9, 40}) {
      requests.push_back(MakeRequest(model, RandomListRows(*model, n, 30 + n)));
    }
    for (auto& r : requests) ASSERT_TRUE((*batcher)->Enqueue(r->job).ok());
    for (auto& r : requests) {
      ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
      EXPECT_TRUE(r->status.ok()) << r->status;
      ExpectClose(r->probs, Alone(model, r->job->rows));
    }
    EXPECT_EQ((*batcher)->stats().rows, 61);
  }
}

TEST(Batcher, ABatchNeverMixesModels) {
  std::shared_ptr<const ServingModel> a = SmallModel(SmallDescription(), 6);
  std::shared_ptr<const ServingModel> b = SmallModel(SmallDescription(), 7);
  Batcher::Options o;
  o.threads = 1;
  o.max_batch = 64;
  o.max_delay = absl::Milliseconds(20);
  auto batcher = Batcher::Create(o);
  ASSERT_TRUE(batcher.ok());
  std::vector<std::unique_ptr<Request>> requests;
  for (int i = 0; i < 6; ++i) {
    const auto& m = i % 3 == 2 ? b : a;
    requests.push_back(MakeRequest(m, RandomRows(*m, 4, 20 + i)));
  }
  for (auto& r : requests) ASSERT_TRUE((*batcher)->Enqueue(r->job).ok());
  for (auto& r : requests) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    ExpectClose(r->probs, Alone(r->job->model, r->job->rows));
  }
  // The two models' rows score differently: the check above would see a mixed batch.
  EXPECT_NE(Alone(a, requests[0]->job->rows), Alone(b, requests[0]->job->rows));
}

TEST(Batcher, TheQueueIsBoundedAndStopScoresWhatIsQueued) {
  std::shared_ptr<const ServingModel> model = SmallModel(SmallDescription(), 8);
  Batcher::Options o;
  o.threads = 1;
  o.max_batch = 8;
  o.max_delay = absl::Seconds(30);  // nothing is taken before Stop (the batch is never full)
  o.max_queue_rows = 10;
  auto batcher = Batcher::Create(o);
  ASSERT_TRUE(batcher.ok());
  auto first = MakeRequest(model, RandomRows(*model, 4, 1));
  auto second = MakeRequest(model, RandomRows(*model, 3, 2));
  auto too_many = MakeRequest(model, RandomRows(*model, 4, 3));
  ASSERT_TRUE((*batcher)->Enqueue(first->job).ok());
  ASSERT_TRUE((*batcher)->Enqueue(second->job).ok());
  absl::Status full = (*batcher)->Enqueue(too_many->job);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("retry later"), absl::string_view::npos);
  EXPECT_FALSE(too_many->done.HasBeenNotified());
  (*batcher)->Stop();  // scores the 7 queued rows without waiting for the window
  for (Request* r : {first.get(), second.get()}) {
    ASSERT_TRUE(r->done.HasBeenNotified());
    EXPECT_TRUE(r->status.ok());
    ExpectClose(r->probs, Alone(model, r->job->rows));
  }
  EXPECT_EQ((*batcher)->Enqueue(too_many->job).code(), absl::StatusCode::kUnavailable);
  (*batcher)->Stop();  // idempotent
}

}  // namespace
}  // namespace pstrain
