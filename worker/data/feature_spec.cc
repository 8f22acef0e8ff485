#include "worker/data/feature_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace pstrain {
namespace {

// Maps a 64-bit hash onto [0, n) by multiply-shift (Lemire's fastrange): no division.
inline uint64_t Reduce(uint64_t h, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

}  // namespace

absl::StatusOr<FeatureSpec> FeatureSpec::Create(const FeatureConfig& config) {
  FeatureSpec spec;
  spec.label_name_ = config.label_name();
  spec.hash_seed_ = config.hash_seed();
  std::vector<FieldSpec> specs;
  if (config.preset() == CRITEO) {
    for (int i = 1; i <= 13; ++i) {
      FieldSpec fs;
      fs.set_name(absl::StrCat("I", i));
      fs.set_kind(NUMERIC);
      fs.set_numeric_mode(config.numeric_mode());
      fs.set_numeric_transform(config.numeric_transform());
      fs.set_vocab_size(config.numeric_vocab_size());
      specs.push_back(fs);
    }
    for (int i = 1; i <= 26; ++i) {
      FieldSpec fs;
      fs.set_name(absl::StrCat("C", i));
      fs.set_kind(CATEGORICAL);
      fs.set_vocab_size(config.categorical_vocab_size());
      specs.push_back(fs);
    }
  }
  for (int i = 0; i < config.field_size(); ++i) {
    const FieldSpec& fs = config.field(i);
    if (fs.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("config features.field[", i, "].name: must be set"));
    }
    bool replaced = false;
    for (auto& existing : specs) {
      if (existing.name() == fs.name()) {
        existing.MergeFrom(fs);
        replaced = true;
      }
    }
    if (!replaced) {
      FieldSpec copy = fs;
      if (!copy.has_vocab_size()) {
        copy.set_vocab_size(copy.kind() == NUMERIC ? config.numeric_vocab_size()
                                                   : config.categorical_vocab_size());
      }
      specs.push_back(copy);
    }
  }
  if (specs.empty()) {
    return absl::InvalidArgumentError("config features: no fields (set preset: CRITEO or add field entries)");
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const FieldSpec& fs = specs[i];
    Field f;
    f.name = fs.name();
    f.kind = fs.kind();
    f.numeric_mode = fs.numeric_mode();
    f.numeric_transform = fs.numeric_transform();
    const bool dense = f.kind == NUMERIC && f.numeric_mode == DENSE;
    f.rows = dense ? 2 : fs.vocab_size();
    if (f.rows < 2) {
      return absl::InvalidArgumentError(absl::StrCat("config features field '", f.name,
                                                     "': vocab_size must be >= 2, got ", f.rows));
    }
    for (size_t j = 0; j < i; ++j) {
      if (specs[j].name() == f.name) {
        return absl::InvalidArgumentError(absl::StrCat("config features: field name '", f.name, "' appears twice"));
      }
    }
    f.offset = offset;
    f.seed = config.hash_seed() * 1000003ull + i;
    offset += f.rows;
    spec.fields_.push_back(f);
  }
  spec.total_rows_ = offset;
  return spec;
}

FeatureConfig FeatureSpec::Resolved() const {
  FeatureConfig c;
  c.set_preset(NO_PRESET);
  c.set_hash_seed(hash_seed_);
  c.set_label_name(label_name_);
  for (const Field& f : fields_) {
    FieldSpec* fs = c.add_field();
    fs->set_name(f.name);
    fs->set_kind(f.kind);
    fs->set_numeric_mode(f.numeric_mode);
    fs->set_numeric_transform(f.numeric_transform);
    fs->set_vocab_size(f.rows);
  }
  return c;
}

int FeatureSpec::FieldIndex(const std::string& name) const {
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (fields_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int64_t FeatureSpec::LogSquaredBucket(double x) {
  if (x > 2) {
    const double l = std::log(x);
    return static_cast<int64_t>(std::floor(l * l));
  }
  return static_cast<int64_t>(x);  // int(x) truncates toward zero, as Python's int() does.
}

void FeatureSpec::EncodeOne(int fi, bool present, uint64_t key, double value, int64_t* row,
                            float* scale) const {
  const Field& f = fields_[fi];
  if (!present) {
    *row = static_cast<int64_t>(f.offset);
    *scale = 1.0f;
    return;
  }
  if (f.kind == CATEGORICAL) {
    *row = static_cast<int64_t>(f.offset + 1 + Reduce(HashKey(key, f.seed), f.rows - 1));
    *scale = static_cast<float>(value);
  } else if (f.numeric_mode == DENSE) {
    *row = static_cast<int64_t>(f.offset + 1);
    *scale = static_cast<float>(f.numeric_transform == LOG1P ? std::log1p(std::max(value, 0.0))
                                                             : value);
  } else {
    const uint64_t b = static_cast<uint64_t>(LogSquaredBucket(value));
    *row = static_cast<int64_t>(f.offset + 1 + Reduce(HashKey(b, f.seed), f.rows - 1));
    *scale = 1.0f;
  }
}

void FeatureSpec::Encode(const RawRows& raw, Batch* batch) const {
  const int nf = num_fields();
  if (batch->size == 0) batch->num_fields = nf;
  const int n = raw.size();
  const size_t base = batch->ids.size();
  batch->ids.resize(base + static_cast<size_t>(n) * nf);
  batch->values.resize(base + static_cast<size_t>(n) * nf);
  for (int r = 0; r < n; ++r) {
    for (int f = 0; f < nf; ++f) {
      const size_t i = static_cast<size_t>(r) * nf + f;
      EncodeOne(f, raw.present[i] != 0, raw.key[i], raw.value[i], &batch->ids[base + i],
                &batch->values[base + i]);
    }
  }
  batch->labels.insert(batch->labels.end(), raw.labels.begin(), raw.labels.end());
  batch->size += n;
}

}  // namespace pstrain
