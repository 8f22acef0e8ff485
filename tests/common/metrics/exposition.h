// Test helper: a checker of Prometheus' text exposition format (version 0.0.4), what promtool's
// `check metrics` parses: HELP / TYPE lines, samples `name{label="value",...} value`, every
// sample's family typed before it, label values escaped, numbers (with +Inf, -Inf, NaN), and
// histograms whose buckets are cumulative and end in le="+Inf" equal to _count.
#pragma once

#include <cmath>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pstrain {
namespace testing {

struct Sample {
  std::string name;    // as written (with _bucket / _sum / _count)
  std::string labels;  // the text between the braces
  double value = 0;
};

// Returns "" if `text` is valid, else the first problem with its line number. *samples gets
// every sample.
inline std::string CheckExposition(const std::string& text, std::vector<Sample>* samples) {
  static const std::regex kHelp(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*$)");
  static const std::regex kType(
      R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  static const std::regex kSample(
      R"re(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\})? ([^ ]+)( -?[0-9]+)?$)re");
  std::map<std::string, std::string> types;
  std::map<std::string, double> last_bucket;  // per histogram series (name + labels minus le)
  std::map<std::string, double> counts;       // _count per histogram series
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    std::smatch m;
    if (absl::StartsWith(line, "# HELP")) {
      if (!std::regex_match(line, m, kHelp)) return absl::StrCat("line ", n, ": bad HELP: ", line);
      continue;
    }
    if (absl::StartsWith(line, "# TYPE")) {
      if (!std::regex_match(line, m, kType)) return absl::StrCat("line ", n, ": bad TYPE: ", line);
      if (types.count(m[1])) return absl::StrCat("line ", n, ": second TYPE for ", m[1].str());
      types[m[1]] = m[2];
      continue;
    }
    if (line[0] == '#') continue;  // a comment
    if (!std::regex_match(line, m, kSample)) return absl::StrCat("line ", n, ": bad sample: ", line);
    Sample s{m[1], m[3], 0};
    const std::string v = m[4];
    if (v == "+Inf") {
      s.value = INFINITY;
    } else if (v == "-Inf") {
      s.value = -INFINITY;
    } else if (v == "NaN") {
      s.value = NAN;
    } else if (!absl::SimpleAtod(v, &s.value)) {
      return absl::StrCat("line ", n, ": bad value '", v, "'");
    }
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count", "_total"}) {
      const std::string base = s.name.substr(0, s.name.size() - std::string(suffix).size());
      if (absl::EndsWith(s.name, suffix) && types.count(base) && !types.count(s.name)) family = base;
    }
    if (!types.count(family)) return absl::StrCat("line ", n, ": sample of untyped family ", s.name);
    if (types[family] == "counter" && s.value < 0) return absl::StrCat("line ", n, ": negative counter");
    if (types[family] == "histogram" && absl::EndsWith(s.name, "_bucket")) {
      std::string series = std::regex_replace(s.labels, std::regex(R"re(,?le="[^"]*")re"), "");
      const std::string key = family + "{" + series + "}";
      if (last_bucket.count(key) && s.value < last_bucket[key]) {
        return absl::StrCat("line ", n, ": histogram buckets not cumulative: ", line);
      }
      last_bucket[key] = s.value;
    }
    if (types[family] == "histogram" && absl::EndsWith(s.name, "_count")) {
      counts[family + "{" + s.labels + "}"] = s.value;
    }
    samples->push_back(s);
  }
  // Within a family the order of _count and the buckets is free: compare at the end.
  for (const auto& [key, count] : counts) {
    if (!last_bucket.count(key) || last_bucket[key] != count) {
      return absl::StrCat(key, ": _count ", count, " differs from the +Inf bucket");
    }
  }
  return "";
}

// The value of the sample `name{labels}`, or NaN.
inline double SampleValue(const std::vector<Sample>& samples, const std::string& name,
                          const std::string& labels) {
  for (const Sample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return NAN;
}

}  // namespace testing
}  // namespace pstrain
