// FlagSet (common/flags.h): the parsing rules every pstrain command relies on, and the traps it
// closes (an unquoted glob, a single-dash flag, a value flag without a value).
#include "common/flags.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// argv from words; argv[0] and argv[1] are the binary and the command, as in pstrain.
struct Argv {
  explicit Argv(std::vector<std::string> words) : storage(std::move(words)) {
    storage.insert(storage.begin(), {"pstrain", "cmd"});
    for (auto& w : storage) ptrs.push_back(w.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> storage;
  std::vector<char*> ptrs;
};

struct Targets {
  std::string s = "dflt";
  int i = 7;
  int64_t i64 = 0;
  uint64_t u64 = 0;
  double d = 0.5;
  bool b = false;
  std::vector<std::string> list;
};

void Declare(FlagSet* f, Targets* t) {
  f->String("train_name", &t->s, "a string");
  f->Int("epochs", &t->i, "an int");
  f->Int64("rows", &t->i64, "an int64");
  f->Uint64("seed", &t->u64, "a uint64");
  f->Double("rate", &t->d, "a double");
  f->Bool("shuffle", &t->b, "a bool");
  f->List("train", &t->list, "a list");
}

absl::Status ParseWords(std::vector<std::string> words, Targets* t, FlagSet** out = nullptr) {
  static FlagSet* keep = nullptr;
  delete keep;
  keep = new FlagSet("cmd", "summary");
  Declare(keep, t);
  Argv a(std::move(words));
  if (out != nullptr) *out = keep;
  return keep->Parse(a.argc(), a.argv(), 2);
}

TEST(FlagSet, ParsesEveryKindAndBothSpellings) {
  Targets t;
  FlagSet* f = nullptr;
  ASSERT_TRUE(ParseWords({"--train_name=x", "--epochs", "3", "--rows=-4", "--seed", "18446744073709551615",
                          "--rate=1e-3", "--shuffle", "--train", "a", "--train=b"},
                         &t, &f)
                  .ok());
  EXPECT_EQ(t.s, "x");
  EXPECT_EQ(t.i, 3);
  EXPECT_EQ(t.i64, -4);
  EXPECT_EQ(t.u64, 18446744073709551615ull);
  EXPECT_DOUBLE_EQ(t.d, 1e-3);
  EXPECT_TRUE(t.b);
  EXPECT_EQ(t.list, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(f->WasSet("epochs"));
  EXPECT_FALSE(f->help_requested());
}

TEST(FlagSet, NegatedAndExplicitBooleans) {
  Targets t;
  t.b = true;
  ASSERT_TRUE(ParseWords({"--noshuffle"}, &t).ok());
  EXPECT_FALSE(t.b);
  ASSERT_TRUE(ParseWords({"--shuffle=true"}, &t).ok());
  EXPECT_TRUE(t.b);
  ASSERT_TRUE(ParseWords({"--shuffle=false"}, &t).ok());
  EXPECT_FALSE(t.b);
  absl::Status s = ParseWords({"--shuffle=maybe"}, &t);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected true or false"));
}

TEST(FlagSet, NegativeNumbersAreValuesNotFlags) {
  Targets t;
  ASSERT_TRUE(ParseWords({"--epochs", "-2", "--rate", "-0.5"}, &t).ok());
  EXPECT_EQ(t.i, -2);
  EXPECT_DOUBLE_EQ(t.d, -0.5);
}

TEST(FlagSet, BadValuesNameTheFlagAndTheType) {
  Targets t;
  EXPECT_THAT(std::string(ParseWords({"--epochs=three"}, &t).message()),
              HasSubstr("--epochs=three: expected an integer"));
  EXPECT_THAT(std::string(ParseWords({"--seed=-1"}, &t).message()),
              HasSubstr("expected an unsigned integer"));
  EXPECT_THAT(std::string(ParseWords({"--rate=fast"}, &t).message()), HasSubstr("number"));
  EXPECT_THAT(std::string(ParseWords({"--epochs=99999999999"}, &t).message()),
              HasSubstr("--epochs"));
}

TEST(FlagSet, UnknownFlagIsAnError) {
  Targets t;
  absl::Status s = ParseWords({"--epoch=3"}, &t);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown flag --epoch for 'cmd'"));
}

// The trap of the issue: `pstrain train --train day*.tsv` unquoted trained on the first file only,
// the second match being collected as a positional argument nobody read.
TEST(FlagSet, StrayArgumentAfterAListFlagIsAnErrorWithTheGlobHint) {
  Targets t;
  absl::Status s = ParseWords({"--train", "day1.tsv", "day2.tsv", "--epochs=1"}, &t);
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("unexpected argument 'day2.tsv'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("it follows --train"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("quote it"));
  // After `--` too.
  s = ParseWords({"--", "x"}, &t);
  EXPECT_THAT(std::string(s.message()), HasSubstr("takes no positional arguments"));
}

// `-epochs 3` was silently ignored the same way.
TEST(FlagSet, SingleDashFlagIsAnErrorNamingTheDoubleDashOne) {
  Targets t;
  absl::Status s = ParseWords({"-epochs", "3"}, &t);
  ASSERT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("did you mean --epochs?"));
  s = ParseWords({"-epochs=3"}, &t);
  EXPECT_THAT(std::string(s.message()), HasSubstr("did you mean --epochs=3?"));
  s = ParseWords({"-bogus"}, &t);
  EXPECT_THAT(std::string(s.message()), HasSubstr("has no flag --bogus"));
  // -h is help, not an error.
  FlagSet* f = nullptr;
  ASSERT_TRUE(ParseWords({"-h"}, &t, &f).ok());
  EXPECT_TRUE(f->help_requested());
}

TEST(FlagSet, ValueFlagWithoutValueIsAnError) {
  Targets t;
  EXPECT_THAT(std::string(ParseWords({"--epochs"}, &t).message()), HasSubstr("--epochs needs a value"));
  // The next word is another flag: not taken as the value.
  EXPECT_THAT(std::string(ParseWords({"--train", "--epochs=2"}, &t).message()),
              HasSubstr("--train needs a value, got the flag --epochs=2"));
  // A value that merely starts with dashes but names no flag is a value.
  ASSERT_TRUE(ParseWords({"--train_name", "--weird"}, &t).ok());
  EXPECT_EQ(t.s, "--weird");
}

TEST(FlagSet, DeclaredPositionalsAreAcceptedUpToTheirCount) {
  FlagSet f("config", "summary");
  bool print = false;
  f.Bool("print", &print, "print");
  f.AllowPositional(1, "FILE");
  Argv a({"--print", "x.textproto"});
  ASSERT_TRUE(f.Parse(a.argc(), a.argv(), 2).ok());
  EXPECT_EQ(f.positional(), (std::vector<std::string>{"x.textproto"}));
  FlagSet g("config", "summary");
  g.AllowPositional(1, "FILE");
  Argv b({"x", "y"});
  absl::Status s = g.Parse(b.argc(), b.argv(), 2);
  EXPECT_THAT(std::string(s.message()), HasSubstr("takes at most 1 FILE"));
  EXPECT_THAT(g.Usage(), HasSubstr("usage: pstrain config [flags] [FILE]"));
}

TEST(FlagSet, UsageListsFlagsWithDefaultsAndTheEpilogue) {
  FlagSet f("cmd", "does things");
  Targets t;
  Declare(&f, &t);
  f.AddEpilogue("environment:\n  X=1");
  const std::string u = f.Usage();
  EXPECT_THAT(u, HasSubstr("usage: pstrain cmd [flags]"));
  EXPECT_THAT(u, HasSubstr("does things"));
  EXPECT_THAT(u, HasSubstr("--epochs=V"));
  EXPECT_THAT(u, HasSubstr("(default: 7)"));
  EXPECT_THAT(u, HasSubstr("--train=V (repeatable)"));
  EXPECT_THAT(u, HasSubstr("environment:\n  X=1\n"));
}

}  // namespace
}  // namespace pstrain
