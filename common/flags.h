// Command-line flags for one subcommand: `--name=value`, `--name value`, `--bool`, `--nobool`,
// repeatable list flags, and `--help`. abseil's flags are process-global and have no notion of
// subcommands, so each subcommand declares its own FlagSet and gets its own --help.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pstrain {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int* target, const std::string& help);
  void Int64(const std::string& name, int64_t* target, const std::string& help);
  void Uint64(const std::string& name, uint64_t* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);
  // Repeatable: each occurrence appends.
  void List(const std::string& name, std::vector<std::string>* target, const std::string& help);

  // Parses argv[first..argc). Unknown flags and bad values are INVALID_ARGUMENT naming the flag.
  // Positional arguments are collected in positional(). Sets help_requested() on --help / -h.
  absl::Status Parse(int argc, char** argv, int first = 1);
  bool help_requested() const { return help_; }
  // True if the flag appeared on the command line.
  bool WasSet(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  std::string Usage() const;
  // Text printed after the flags in Usage() (e.g. the environment variables a command reads);
  // each call appends a paragraph.
  void AddEpilogue(const std::string& text);

 private:
  enum class Kind { kString, kInt, kInt64, kUint64, kDouble, kBool, kList };
  struct Flag {
    std::string name;
    Kind kind;
    void* target;
    std::string help;
    std::string default_text;
    bool set = false;
  };
  void Add(const std::string& name, Kind kind, void* target, const std::string& help);
  Flag* Find(const std::string& name);
  static absl::Status Assign(Flag* flag, const std::string& value);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  std::string epilogue_;
  bool help_ = false;
};

}  // namespace pstrain
