#include "worker/data/file_list.h"

#include <dirent.h>
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status.h"

namespace pstrain {

bool IsDataFileName(absl::string_view name) {
  // Hadoop's hidden-file rule (Spark's _SUCCESS, .crc files, editors' dot files), and JSON
  // sidecars: no format pstrain reads is JSON, and datagen's teacher.json sits beside its parts.
  return !name.empty() && name[0] != '.' && name[0] != '_' && !absl::EndsWith(name, ".json");
}

namespace {

// A strict parser for exactly the manifest's shape: an array whose elements are strings or
// objects with string members. Errors carry the byte offset into the text.
class ManifestParser {
 public:
  ManifestParser(absl::string_view text, absl::string_view name) : text_(text), name_(name) {}

  absl::Status Parse(std::string* prefix, std::vector<std::string>* keys) {
    bool have_prefix = false;
    SkipSpace();
    RETURN_IF_ERROR(Expect('['));
    SkipSpace();
    if (Peek() == ']') return Error("expected the prefix object {\"prefix\": ...} first");
    while (true) {
      SkipSpace();
      if (Peek() == '{') {
        if (have_prefix || !keys->empty()) {
          return Error("expected a key string (the prefix object must come first, once)");
        }
        RETURN_IF_ERROR(ParsePrefixObject(prefix));
        have_prefix = true;
      } else if (Peek() == '"') {
        if (!have_prefix) return Error("expected the prefix object {\"prefix\": ...} first");
        std::string key;
        RETURN_IF_ERROR(ParseString(&key));
        if (key.empty()) return Error("empty key");
        keys->push_back(std::move(key));
      } else {
        return Error("expected a key string or the prefix object");
      }
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      RETURN_IF_ERROR(Expect(']'));
      break;
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("expected the end of the file after ']'");
    return absl::OkStatus();
  }

 private:
  int Peek() const { return pos_ < text_.size() ? static_cast<unsigned char>(text_[pos_]) : -1; }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest ", name_, ": offset ", pos_, ": ", what));
  }
  absl::Status Expect(char c) {
    if (Peek() != static_cast<unsigned char>(c))
      return Error(absl::StrCat("expected '", std::string(1, c), "'"));
    ++pos_;
    return absl::OkStatus();
  }

  absl::Status ParsePrefixObject(std::string* prefix) {
    RETURN_IF_ERROR(Expect('{'));
    bool seen = false;
    SkipSpace();
    if (Peek() == '}') return Error("expected \"prefix\" in the prefix object");
    while (true) {
      SkipSpace();
      const size_t key_pos = pos_;
      std::string member;
      RETURN_IF_ERROR(ParseString(&member));
      SkipSpace();
      RETURN_IF_ERROR(Expect(':'));
      SkipSpace();
      std::string value;
      RETURN_IF_ERROR(ParseString(&value));
      if (member == "prefix") {
        if (seen) {
          pos_ = key_pos;
          return Error("\"prefix\" appears twice");
        }
        *prefix = std::move(value);
        seen = true;
      }  // other string members are ignored, as SageMaker does
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      RETURN_IF_ERROR(Expect('}'));
      break;
    }
    if (!seen) return Error("expected a \"prefix\" member in the prefix object");
    return absl::OkStatus();
  }

  absl::Status ParseHex4(uint32_t* out) {
    *out = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const int c = Peek();
      const char* digit = c > 0 ? std::strchr(kHexDigits, std::tolower(c)) : nullptr;
      if (digit == nullptr) return Error("expected 4 hex digits after \\u");
      *out = *out * 16 + static_cast<uint32_t>(digit - kHexDigits);
    }
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::Status ParseString(std::string* out) {
    if (Peek() != '"') return Error("expected a string");
    ++pos_;
    out->clear();
    while (true) {
      const int c = Peek();
      if (c < 0) return Error("unterminated string");
      if (c < 0x20) return Error("control character in a string");
      ++pos_;
      if (c == '"') return absl::OkStatus();
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      const size_t escape_pos = pos_ - 1;
      const int e = Peek();
      ++pos_;
      static constexpr char kEscaped[] = "\"\\/bfnrt";
      static constexpr char kMeaning[] = "\"\\/\b\f\n\r\t";
      if (const char* m = e > 0 ? std::strchr(kEscaped, e) : nullptr) {
        out->push_back(kMeaning[m - kEscaped]);
        continue;
      }
      if (e != 'u') {
        pos_ = escape_pos;
        return Error("invalid escape");
      }
      uint32_t cp;
      RETURN_IF_ERROR(ParseHex4(&cp));
      if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair encodes one code point
        uint32_t lo;
        if (Peek() != '\\' || pos_ + 1 >= text_.size() || text_[pos_ + 1] != 'u') {
          return Error("expected a low surrogate \\uDC00..\\uDFFF");
        }
        pos_ += 2;
        RETURN_IF_ERROR(ParseHex4(&lo));
        if (lo < 0xDC00 || lo > 0xDFFF) return Error("expected a low surrogate \\uDC00..\\uDFFF");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      } else if (cp >= 0xDC00 && cp < 0xE000) {
        return Error("unpaired low surrogate");
      }
      AppendUtf8(cp, out);
    }
  }

  static constexpr char kHexDigits[] = "0123456789abcdef";
  absl::string_view text_;
  absl::string_view name_;
  size_t pos_ = 0;
};

bool HasGlobChars(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir == ".") return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

absl::Status ExpandManifest(const std::string& path, std::vector<std::string>* out) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  std::string prefix;
  std::vector<std::string> keys;
  RETURN_IF_ERROR(ParseManifest(text, path, &prefix, &keys));
  if (prefix.find("://") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest ", path, ": prefix '", prefix,
        "' is remote; pstrain reads local files only (copy the data to local disk or use pipe "
        "mode, then give a local prefix)"));
  }
  if (!prefix.empty() && prefix[0] != '/') prefix = JoinPath(DirName(path), prefix);
  for (const std::string& key : keys) {
    std::string file = prefix + key;
    struct stat st;
    if (::stat(file.c_str(), &st) != 0) {
      return absl::NotFoundError(
          absl::StrCat("manifest ", path, ": key '", key, "': ", file, ": ", std::strerror(errno)));
    }
    if (S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest ", path, ": key '", key, "': ", file, " is a directory"));
    }
    out->push_back(std::move(file));
  }
  return absl::OkStatus();
}

absl::Status ExpandDirectory(const std::string& path, std::vector<std::string>* out) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("open directory ", path, ": ", std::strerror(errno)));
  }
  std::vector<std::string> files;
  while (const dirent* e = ::readdir(dir)) {
    if (!IsDataFileName(e->d_name)) continue;
    std::string file = JoinPath(path, e->d_name);
    struct stat st;
    if (::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(std::move(file));
  }
  ::closedir(dir);
  std::sort(files.begin(), files.end());
  out->insert(out->end(), files.begin(), files.end());
  return absl::OkStatus();
}

absl::Status ExpandGlob(const std::string& pattern, std::vector<std::string>* out) {
  glob_t g;
  const int rc = ::glob(pattern.c_str(), GLOB_MARK, nullptr, &g);  // GLOB_MARK: dirs end in '/'
  if (rc == GLOB_NOMATCH) {
    return absl::NotFoundError(absl::StrCat("no file matches the pattern ", pattern));
  }
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("glob ", pattern, ": read error"));
  }
  size_t added = 0;
  for (size_t i = 0; i < g.gl_pathc; ++i) {  // glob(3) sorts its matches
    std::string match = g.gl_pathv[i];
    if (!match.empty() && match.back() == '/') continue;
    out->push_back(std::move(match));
    ++added;
  }
  ::globfree(&g);
  if (added == 0) {
    return absl::NotFoundError(absl::StrCat("the pattern ", pattern, " matches only directories"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseManifest(absl::string_view text, absl::string_view name, std::string* prefix,
                           std::vector<std::string>* keys) {
  prefix->clear();
  keys->clear();
  return ManifestParser(text, name).Parse(prefix, keys);
}

absl::StatusOr<std::vector<std::string>> ExpandPath(const std::string& path) {
  std::vector<std::string> out;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      RETURN_IF_ERROR(ExpandDirectory(path, &out));
    } else if (S_ISREG(st.st_mode) && absl::EndsWith(path, ".manifest")) {
      RETURN_IF_ERROR(ExpandManifest(path, &out));
    } else {
      out.push_back(path);
    }
  } else if (errno == ENOENT && HasGlobChars(path)) {
    RETURN_IF_ERROR(ExpandGlob(path, &out));
  } else if (errno == ENOENT || errno == ENOTDIR) {
    return absl::NotFoundError(absl::StrCat("data path ", path, " does not exist"));
  } else {
    return absl::UnavailableError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ExpandPath(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandPath(p));
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

}  // namespace pstrain
