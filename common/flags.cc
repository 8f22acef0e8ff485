#include "common/flags.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace pstrain {

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::Add(const std::string& name, Kind kind, void* target, const std::string& help) {
  Flag f{name, kind, target, help, "", false};
  switch (kind) {
    case Kind::kString: f.default_text = *static_cast<std::string*>(target); break;
    case Kind::kInt: f.default_text = absl::StrCat(*static_cast<int*>(target)); break;
    case Kind::kInt64: f.default_text = absl::StrCat(*static_cast<int64_t*>(target)); break;
    case Kind::kUint64: f.default_text = absl::StrCat(*static_cast<uint64_t*>(target)); break;
    case Kind::kDouble: f.default_text = absl::StrCat(*static_cast<double*>(target)); break;
    case Kind::kBool: f.default_text = *static_cast<bool*>(target) ? "true" : "false"; break;
    case Kind::kList: break;
  }
  flags_.push_back(std::move(f));
}

void FlagSet::String(const std::string& n, std::string* t, const std::string& h) { Add(n, Kind::kString, t, h); }
void FlagSet::Int(const std::string& n, int* t, const std::string& h) { Add(n, Kind::kInt, t, h); }
void FlagSet::Int64(const std::string& n, int64_t* t, const std::string& h) { Add(n, Kind::kInt64, t, h); }
void FlagSet::Uint64(const std::string& n, uint64_t* t, const std::string& h) { Add(n, Kind::kUint64, t, h); }
void FlagSet::Double(const std::string& n, double* t, const std::string& h) { Add(n, Kind::kDouble, t, h); }
void FlagSet::Bool(const std::string& n, bool* t, const std::string& h) { Add(n, Kind::kBool, t, h); }
void FlagSet::List(const std::string& n, std::vector<std::string>* t, const std::string& h) { Add(n, Kind::kList, t, h); }

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (auto& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

absl::Status FlagSet::Assign(Flag* f, const std::string& v) {
  bool ok = true;
  switch (f->kind) {
    case Kind::kString: *static_cast<std::string*>(f->target) = v; break;
    case Kind::kInt: ok = absl::SimpleAtoi(v, static_cast<int*>(f->target)); break;
    case Kind::kInt64: ok = absl::SimpleAtoi(v, static_cast<int64_t*>(f->target)); break;
    case Kind::kUint64: ok = absl::SimpleAtoi(v, static_cast<uint64_t*>(f->target)); break;
    case Kind::kDouble: ok = absl::SimpleAtod(v, static_cast<double*>(f->target)); break;
    case Kind::kBool: ok = absl::SimpleAtob(v, static_cast<bool*>(f->target)); break;
    case Kind::kList: static_cast<std::vector<std::string>*>(f->target)->push_back(v); break;
  }
  if (!ok) {
    static const char* kTypes[] = {"a string", "an integer", "an integer", "an unsigned integer", "a number", "true or false", "a string"};
    return absl::InvalidArgumentError(absl::StrCat("--", f->name, "=", v, ": expected ",
                                                   kTypes[static_cast<int>(f->kind)]));
  }
  f->set = true;
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      help_ = true;
      continue;
    }
    if (arg == "--") {
      for (++i; i < argc; ++i) RETURN_IF_ERROR(AddPositional(argv[i], argc, argv, first));
      break;
    }
    if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-' && !IsNumber(arg)) {
      // `-epochs 3`: Go's and gflags' single dash. Refused rather than taken as a positional.
      std::string name = arg.substr(1);
      if (const size_t eq = name.find('='); eq != std::string::npos) name.resize(eq);
      const bool known = Find(name) != nullptr ||
                         (absl::StartsWith(name, "no") && Find(name.substr(2)) != nullptr);
      return absl::InvalidArgumentError(absl::StrCat(
          "'", arg, "': flags take two dashes",
          known ? absl::StrCat(": did you mean --", arg.substr(1), "?")
                : absl::StrCat(" (and '", command_, "' has no flag --", name, "; see --help)")));
    }
    if (!absl::StartsWith(arg, "--")) {
      RETURN_IF_ERROR(AddPositional(arg, argc, argv, first));
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* f = Find(name);
    if (f == nullptr && !has_value && absl::StartsWith(name, "no")) {
      Flag* neg = Find(name.substr(2));
      if (neg != nullptr && neg->kind == Kind::kBool) {
        *static_cast<bool*>(neg->target) = false;
        neg->set = true;
        continue;
      }
    }
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " for '", command_, "' (see --help)"));
    }
    if (!has_value) {
      if (f->kind == Kind::kBool) {
        value = "true";
      } else if (i + 1 < argc) {
        const std::string next = argv[i + 1];
        if (absl::StartsWith(next, "--") && next.size() > 2) {
          std::string next_name = next.substr(2);
          if (const size_t e = next_name.find('='); e != std::string::npos) next_name.resize(e);
          if (Find(next_name) != nullptr || next == "--help") {
            return absl::InvalidArgumentError(
                absl::StrCat("--", name, " needs a value, got the flag ", next));
          }
        }
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
    }
    if (absl::Status s = Assign(f, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool FlagSet::IsNumber(const std::string& arg) {
  double d;
  return absl::SimpleAtod(arg, &d);
}

void FlagSet::AllowPositional(int max, const std::string& what) {
  max_positional_ = max;
  positional_what_ = what;
}

absl::Status FlagSet::AddPositional(const std::string& arg, int argc, char** argv, int first) {
  if (static_cast<int>(positional_.size()) < max_positional_) {
    positional_.push_back(arg);
    return absl::OkStatus();
  }
  // The usual cause: an unquoted glob that the shell expanded, so `--train day*.tsv` became
  // `--train day1.tsv day2.tsv`. Name the flag the stray word follows.
  std::string after;
  for (int i = first; i < argc; ++i) {
    if (arg == argv[i]) break;
    if (absl::StartsWith(argv[i], "--")) after = argv[i];
  }
  std::string msg = absl::StrCat("unexpected argument '", arg, "'");
  if (max_positional_ > 0) {
    absl::StrAppend(&msg, " (", command_, " takes at most ", max_positional_, " ",
                    positional_what_, ")");
  } else {
    absl::StrAppend(&msg, ": '", command_, "' takes no positional arguments");
  }
  if (!after.empty()) {
    absl::StrAppend(&msg, "; it follows ", after,
                    ": if the shell expanded a glob there, quote it (--train \"day*.tsv\") or "
                    "repeat the flag for each path");
  }
  return absl::InvalidArgumentError(msg);
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: pstrain ", command_, " [flags]",
                                 max_positional_ > 0 ? absl::StrCat(" [", positional_what_, "]") : "",
                                 "\n\n", summary_, "\n\nflags:\n");
  for (const auto& f : flags_) {
    std::string lhs = absl::StrCat("  --", f.name);
    if (f.kind != Kind::kBool) absl::StrAppend(&lhs, f.kind == Kind::kList ? "=V (repeatable)" : "=V");
    if (lhs.size() < 30) lhs.resize(30, ' ');
    absl::StrAppend(&out, lhs, " ", f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  if (!epilogue_.empty()) absl::StrAppend(&out, "\n", epilogue_);
  return out;
}

void FlagSet::AddEpilogue(const std::string& text) {
  absl::StrAppend(&epilogue_, epilogue_.empty() ? "" : "\n", text);
  if (!epilogue_.empty() && epilogue_.back() != '\n') epilogue_ += '\n';
}

}  // namespace pstrain
