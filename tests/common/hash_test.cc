// Golden values of the hashes that map raw categorical values to embedding rows. Checkpoints
// store rows by id, so a change to any of these functions silently scrambles every saved model:
// the values below are fixed, and a failure here means the hash changed, not the test.
// (tests/worker/data/feature_spec_test.cc pins the rows FeatureSpec derives from them.)
#include "common/hash.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

// murmur3's fmix64.
TEST(HashGolden, Fmix64) {
  EXPECT_EQ(Fmix64(0), 0u);
  EXPECT_EQ(Fmix64(1), 0xb456bcfc34c2cb2cull);
  EXPECT_EQ(Fmix64(0x0123456789abcdefull), 0x87cbfbfe89022ceaull);
  EXPECT_EQ(Fmix64(~0ull), 0x64b5720b4b825f21ull);
}

// HashKey(key, field seed). The seeds are FeatureSpec's: hash_seed * 1000003 + field index, with
// the default hash_seed 0x5eed (field 0 = I1, field 13 = C1 of the Criteo preset).
TEST(HashGolden, HashKey) {
  EXPECT_EQ(HashKey(0, 0), 0x6393d51c06c618dcull);
  EXPECT_EQ(HashKey(1, 0x5eedull * 1000003 + 0), 0x98a218cce7a5121eull);
  EXPECT_EQ(HashKey(0x68fd1e64, 0x5eedull * 1000003 + 13), 0x0d039b5ce567f7d3ull);
  EXPECT_EQ(HashKey(~0ull, 7), 0x8ad065940ae4becaull);
}

// FNV-1a 64 of strings; "", "a" and "foobar" are the published FNV test vectors.
TEST(HashGolden, HashBytes) {
  EXPECT_EQ(HashBytes(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(HashBytes("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(HashBytes("foobar"), 0x85944171f73967e8ull);
  EXPECT_EQ(HashBytes("hello world"), 0x779a65e7023cd2e7ull);
  // A Criteo value as text (readers parse hex values into keys; other text is hashed).
  EXPECT_EQ(HashBytes("68fd1e64"), 0x1ae7327a0f5691ddull);
}

}  // namespace
}  // namespace pstrain
