#include "worker/train/event_writer.h"

#include <dirent.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/file.h"
#include "common/record_frame.h"
#include "gtest/gtest.h"
#include "tensorboard/event.pb.h"

namespace pstrain {
namespace {

// Reads every record of a TFRecord-framed file, checking both CRCs of each.
std::vector<std::string> ReadFramed(const std::string& path) {
  auto data = ReadFileToString(path);
  EXPECT_TRUE(data.ok());
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < data->size()) {
    EXPECT_GE(data->size() - pos, kTFRecordHeaderSize);
    uint64_t len;
    EXPECT_TRUE(DecodeTFRecordHeader(data->data() + pos, &len)) << "header crc at " << pos;
    pos += kTFRecordHeaderSize;
    EXPECT_GE(data->size() - pos, len + kTFRecordFooterSize);
    absl::string_view body(data->data() + pos, len);
    EXPECT_TRUE(CheckTFRecordData(body, data->data() + pos + len)) << "data crc at " << pos;
    out.emplace_back(body);
    pos += len + kTFRecordFooterSize;
  }
  return out;
}

TEST(EventWriter, ScalarsReadBackThroughTheFramingWithCrcs) {
  const std::string dir = testing::TempDir() + "/events_test_" + std::to_string(getpid());
  std::string path;
  {
    auto w = EventWriter::Create(dir);
    ASSERT_TRUE(w.ok()) << w.status();
    path = (*w)->path();
    EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos);
    for (int step = 1; step <= 3; ++step) {
      ASSERT_TRUE((*w)->AddScalar("train/loss", step, 1.0 / step).ok());
    }
    ASSERT_TRUE((*w)->AddScalar("eval/auc", 3, 0.75).ok());
    ASSERT_TRUE((*w)->Flush().ok());
  }
  const auto records = ReadFramed(path);
  ASSERT_EQ(records.size(), 5u);
  tensorboard::Event first;
  ASSERT_TRUE(first.ParseFromString(records[0]));
  EXPECT_EQ(first.file_version(), "brain.Event:2");
  for (int i = 1; i <= 3; ++i) {
    tensorboard::Event e;
    ASSERT_TRUE(e.ParseFromString(records[i]));
    EXPECT_EQ(e.step(), i);
    ASSERT_EQ(e.summary().value_size(), 1);
    EXPECT_EQ(e.summary().value(0).tag(), "train/loss");
    EXPECT_FLOAT_EQ(e.summary().value(0).simple_value(), 1.0f / i);
    EXPECT_GT(e.wall_time(), 1.6e9);
  }
  tensorboard::Event last;
  ASSERT_TRUE(last.ParseFromString(records[4]));
  EXPECT_EQ(last.summary().value(0).tag(), "eval/auc");

  // A flipped byte in the body is caught by the data CRC.
  auto data = ReadFileToString(path);
  std::string corrupt = *data;
  corrupt[corrupt.size() - 6] ^= 0x40;
  uint64_t len = 0;
  size_t pos = 0, last_start = 0;
  while (pos < corrupt.size()) {
    last_start = pos;
    ASSERT_TRUE(DecodeTFRecordHeader(corrupt.data() + pos, &len));
    pos += kTFRecordHeaderSize + len + kTFRecordFooterSize;
  }
  DecodeTFRecordHeader(corrupt.data() + last_start, &len);
  EXPECT_FALSE(CheckTFRecordData(
      absl::string_view(corrupt.data() + last_start + kTFRecordHeaderSize, len),
      corrupt.data() + last_start + kTFRecordHeaderSize + len));
}

}  // namespace
}  // namespace pstrain
