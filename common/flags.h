// Command-line flags for one subcommand: `--name=value`, `--name value`, `--bool`, `--nobool`,
// repeatable list flags, and `--help`. abseil's flags are process-global and have no notion of
// subcommands, so each subcommand declares its own FlagSet and gets its own --help.
//
// Traps closed (a flag that is silently not applied is worse than an error):
//   - a positional argument is an error unless the command declared positionals
//     (AllowPositional): `--train day*.tsv` unquoted makes the shell pass the second match as one,
//     so the error says to quote globs or repeat the flag;
//   - `-name` (one dash) is an error naming `--name` when such a flag exists;
//   - a value flag followed by nothing is an error.
//
// Memory: the FlagSet keeps pointers to the targets, which must outlive Parse. Not thread-safe.
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

  // Accepts up to `max` positional arguments (after the flags or after `--`), described as
  // `what` in the usage line and errors. Without this call a positional argument is an error.
  void AllowPositional(int max, const std::string& what);

  // Parses argv[first..argc). Unknown flags, bad values and unexpected positional arguments are
  // INVALID_ARGUMENT naming the argument and what was expected. Sets help_requested() on --help /
  // -h.
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
  static bool IsNumber(const std::string& arg);
  absl::Status AddPositional(const std::string& arg, int argc, char** argv, int first);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  std::string epilogue_;
  bool help_ = false;
  int max_positional_ = 0;
  std::string positional_what_;
};

}  // namespace pstrain
