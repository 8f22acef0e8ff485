#include "worker/data/feature_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/dynamic_rows.h"
#include "common/hash.h"
#include "common/status.h"

namespace pstrain {
namespace {

// Maps a 64-bit hash onto [0, n) by multiply-shift (Lemire's fastrange): no division.
inline uint64_t Reduce(uint64_t h, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

// Row ids are int64 everywhere (Batch::ids); the sum of every table's rows stays below this.
constexpr uint64_t kMaxTotalRows = uint64_t{1} << 62;

}  // namespace

absl::StatusOr<FeatureSpec> FeatureSpec::Create(const FeatureConfig& config) {
  return CreateImpl(config, ModelConfig(), /*check_model=*/false);
}

absl::StatusOr<FeatureSpec> FeatureSpec::Create(const FeatureConfig& config,
                                                const ModelConfig& model) {
  return CreateImpl(config, model, /*check_model=*/true);
}

absl::StatusOr<FeatureSpec> FeatureSpec::CreateImpl(const FeatureConfig& config,
                                                    const ModelConfig& model, bool check_model) {
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
    if (fs.has_table()) {
      const std::string where = absl::StrCat("config features.field[", i, "] ('", fs.name(),
                                             "').table '", fs.table(), "'");
      if (fs.has_vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": a field naming a table has the table's rows; remove vocab_size (or set the "
            "table's rows)"));
      }
      if (fs.has_share_rows_with()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": set either table or share_rows_with, not both (fields naming one table "
            "already share its rows)"));
      }
    }
    bool replaced = false;
    for (auto& existing : specs) {
      if (existing.name() == fs.name()) {
        existing.MergeFrom(fs);
        // A preset field moved into a table leaves its preset vocabulary behind.
        if (fs.has_table()) existing.clear_vocab_size();
        replaced = true;
      }
    }
    if (!replaced) {
      FieldSpec copy = fs;
      if (!copy.has_vocab_size() && !copy.has_table()) {
        copy.set_vocab_size(copy.kind() == NUMERIC ? config.numeric_vocab_size()
                                                   : config.categorical_vocab_size());
      }
      specs.push_back(copy);
    }
  }
  if (specs.empty()) {
    return absl::InvalidArgumentError("config features: no fields (set preset: CRITEO or add field entries)");
  }
  // The named tables, on their own and against each other.
  const int k = model.embedding_dim();
  spec.embedding_dim_ = k;
  spec.has_named_tables_ = config.table_size() > 0;
  std::vector<Table> named;
  int num_dynamic = 0;
  for (int t = 0; t < config.table_size(); ++t) {
    const TableConfig& tc = config.table(t);
    const std::string path = absl::StrCat("features.table[", t, "]");
    RETURN_IF_ERROR(ValidateTableConfig(tc, path));
    for (int u = 0; u < t; ++u) {
      if (config.table(u).name() == tc.name()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config ", path, ".name: '", tc.name(), "' is also the name of features.table[", u,
            "]; table names must be unique"));
      }
    }
    Table table;
    table.name = tc.name();
    table.dim = tc.dim() > 0 ? tc.dim() : k;
    table.rows = tc.rows();
    table.seed = HashKey(HashBytes(tc.name()), config.hash_seed() ^ 0x7461626c65ull);
    table.initializer = tc.initializer();
    if (!table.initializer.has_stddev()) {
      table.initializer.set_stddev(model.embedding_init_stddev());
    }
    if (table.initializer.type() == TableInitializer::UNIFORM && !table.initializer.has_limit()) {
      table.initializer.set_limit(std::sqrt(3.0f) * table.initializer.stddev());
      if (!(table.initializer.limit() > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config ", path, " ('", tc.name(), "').initializer.limit: UNIFORM needs a limit > 0 "
            "(its default, sqrt(3) x stddev, is 0 here)"));
      }
    }
    table.optimizer = tc.optimizer();
    table.partitions = tc.partitions();
    table.fm_join = tc.fm_join();
    if (tc.has_dynamic()) {
      table.rows = 0;
      table.dynamic = tc.dynamic();
      table.dynamic_index = num_dynamic++;
      if (table.dynamic_index >= kMaxDynamicTables) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config ", path, " ('", tc.name(), "').dynamic: more than ", kMaxDynamicTables,
            " dynamic tables (a dynamic row id carries the table in 8 bits)"));
      }
    }
    named.push_back(std::move(table));
  }
  auto named_index = [&](const std::string& name) {
    for (size_t t = 0; t < named.size(); ++t) {
      if (named[t].name == name) return static_cast<int>(t);
    }
    return -1;
  };
  // The named table of each field (-1: the default table); a sharing field takes its target's.
  std::vector<int> table_of(specs.size(), -1);
  for (size_t i = 0; i < specs.size(); ++i) {
    const FieldSpec& fs = specs[i];
    if (!fs.has_table()) continue;
    const std::string where = absl::StrCat("config features field '", fs.name(), "': table '",
                                           fs.table(), "'");
    const int t = named_index(fs.table());
    if (t < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is not a features.table entry (", named.size(), " tables are)"));
    }
    if (fs.kind() == NUMERIC && fs.numeric_mode() == DENSE) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a DENSE numeric field has one row of its own and cannot name a table; use "
          "numeric_mode LOG_SQUARED_BUCKET or no table"));
    }
    table_of[i] = t;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].has_share_rows_with()) continue;
    for (size_t j = 0; j < specs.size(); ++j) {
      if (specs[j].name() == specs[i].share_rows_with()) table_of[i] = table_of[j];
    }
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const FieldSpec& fs = specs[i];
    RETURN_IF_ERROR(ValidateListSpec(fs, absl::StrCat("config features field '", fs.name(), "'")));
    Field f;
    f.name = fs.name();
    f.kind = fs.kind();
    f.numeric_mode = fs.numeric_mode();
    f.numeric_transform = fs.numeric_transform();
    if (fs.has_list()) {
      f.list = true;
      f.combiner = fs.list().combiner();
      f.max_length = fs.list().max_length();
      f.overflow = fs.list().overflow();
      f.separator = fs.list().separator();
      f.weights_key = fs.list().weights_key();
      spec.has_lists_ = true;
    }
    if (fs.has_share_rows_with()) {
      const std::string& target = fs.share_rows_with();
      int t = -1;
      for (size_t j = 0; j < specs.size(); ++j) {
        if (specs[j].name() == target) t = static_cast<int>(j);
      }
      if (t < 0) {
        return absl::InvalidArgumentError(absl::StrCat("config features field '", f.name,
                                                       "': share_rows_with names field '", target,
                                                       "', which does not exist"));
      }
      if (specs[t].has_share_rows_with()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config features field '", f.name, "': share_rows_with names field '", target,
            "', which itself shares the rows of '", specs[t].share_rows_with(),
            "'; name that field instead (no chains)"));
      }
      if (specs[t].kind() != CATEGORICAL) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config features field '", f.name, "': share_rows_with names field '", target,
            "', which is NUMERIC; expected a CATEGORICAL field"));
      }
      f.shares_rows_of = t;
    }
    const bool dense = f.kind == NUMERIC && f.numeric_mode == DENSE;
    f.rows = dense ? 2 : fs.vocab_size();
    if (f.shares_rows_of >= 0) f.rows = specs[f.shares_rows_of].vocab_size();
    if (table_of[i] >= 0) f.rows = named[table_of[i]].rows;  // offset, seed: below
    if (f.rows < 2 && !(table_of[i] >= 0 && named[table_of[i]].is_dynamic())) {
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
    if (f.shares_rows_of < 0 && table_of[i] < 0) {
      if (f.rows > kMaxTotalRows - offset) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config features field '", f.name, "': the fields' rows pass 2^62"));
      }
      offset += f.rows;
    }
    spec.fields_.push_back(f);
  }
  // Sharing fields take their target's slice (the target may come later in the list).
  for (Field& f : spec.fields_) {
    if (f.shares_rows_of < 0) continue;
    const Field& t = spec.fields_[f.shares_rows_of];
    f.offset = t.offset;
    f.rows = t.rows;
    f.seed = t.seed;
  }
  // The tables: the default one (the slices above) when some field uses it, or when no table is
  // named at all; then the named ones, each a contiguous range.
  bool uses_default = named.empty();
  for (int t : table_of) uses_default = uses_default || t < 0;
  if (uses_default) {
    Table d;
    d.is_default = true;
    d.dim = k;
    d.rows = offset;
    d.offset = 0;
    d.initializer.set_stddev(model.embedding_init_stddev());
    spec.tables_.push_back(std::move(d));
  }
  const int first_named = static_cast<int>(spec.tables_.size());
  for (size_t t = 0; t < named.size(); ++t) {
    bool used = false;
    for (int u : table_of) used = used || u == static_cast<int>(t);
    if (!used) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config features.table[", t, "] ('", named[t].name, "'): no field names it (set "
          "FieldSpec.table on the fields that look it up, or remove the table)"));
    }
    if (named[t].rows > kMaxTotalRows - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config features.table[", t, "] ('", named[t].name,
          "').rows: the tables' rows pass 2^62"));
    }
    named[t].offset = offset;
    offset += named[t].rows;  // 0 for a dynamic table
    if (named[t].is_dynamic()) {
      spec.dynamic_tables_.push_back(static_cast<int>(spec.tables_.size()));
    }
    spec.tables_.push_back(named[t]);
  }
  spec.max_dim_ = k;
  for (const Table& t : spec.tables_) spec.max_dim_ = std::max(spec.max_dim_, t.dim);
  for (size_t i = 0; i < spec.fields_.size(); ++i) {
    Field& f = spec.fields_[i];
    f.table = table_of[i] < 0 ? 0 : first_named + table_of[i];
    const Table& t = spec.tables_[f.table];
    f.dim = t.dim;
    f.fm_excluded = t.fm_join == TableConfig::EXCLUDE && t.dim != k;
    if (!t.is_default) {
      f.offset = t.offset;
      f.rows = t.rows;
      f.seed = t.seed;
      f.dynamic = t.dynamic_index;
    }
  }
  // Target attention (list.attention_target): the target is another single-valued CATEGORICAL
  // field of the same embedding dimension (every field has the model's).
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].has_list() || !specs[i].list().has_attention_target()) continue;
    const std::string& name = specs[i].name();
    const std::string& target = specs[i].list().attention_target();
    const std::string where = absl::StrCat("config features field '", name,
                                           "' list.attention_target '", target, "'");
    int t = -1;
    for (size_t j = 0; j < specs.size(); ++j) {
      if (specs[j].name() == target) t = static_cast<int>(j);
    }
    if (t < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": no such field"));
    if (t == static_cast<int>(i)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": names the field itself"));
    }
    if (specs[t].has_list()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the target holds lists; expected a single-valued CATEGORICAL field"));
    }
    if (specs[t].kind() != CATEGORICAL) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the target is NUMERIC; expected a single-valued CATEGORICAL field"));
    }
    Field& f = spec.fields_[i];
    f.attention_target = t;
    f.attention_hidden.assign(specs[i].list().attention_hidden().begin(),
                              specs[i].list().attention_hidden().end());
    if (f.attention_hidden.empty()) f.attention_hidden = {36};
    for (size_t l = 0; l < f.attention_hidden.size(); ++l) {
      if (f.attention_hidden[l] <= 0 || f.attention_hidden[l] > 4096) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config features field '", name, "' list.attention_hidden[", l, "]: ",
            f.attention_hidden[l], ", expected 1..4096"));
      }
    }
    if (f.attention_hidden.size() > 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config features field '", name, "' list.attention_hidden: ",
          f.attention_hidden.size(), " layers, expected at most 16"));
    }
  }
  spec.total_rows_ = offset;
  for (const Field& f : spec.fields_) {
    if (f.weights_key.empty()) continue;
    if (f.weights_key == spec.label_name_ || spec.FieldIndex(f.weights_key) >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config features field '", f.name, "': list.weights_key '", f.weights_key,
          "' is the name of the label or of a field; expected a key of its own"));
    }
  }
  if (check_model) RETURN_IF_ERROR(spec.CheckTableDims(config, model));
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
    if (tables_[f.table].is_default) {
      fs->set_vocab_size(f.rows);
    } else if (f.shares_rows_of < 0) {
      fs->set_table(tables_[f.table].name);
    }
    if (f.list) {
      ListSpec* l = fs->mutable_list();
      l->set_combiner(f.combiner);
      l->set_max_length(f.max_length);
      l->set_overflow(f.overflow);
      l->set_separator(f.separator);
      if (!f.weights_key.empty()) l->set_weights_key(f.weights_key);
      if (f.attention_target >= 0) {
        l->set_attention_target(fields_[f.attention_target].name);
        for (int w : f.attention_hidden) l->add_attention_hidden(w);
      }
    }
    if (f.shares_rows_of >= 0) fs->set_share_rows_with(fields_[f.shares_rows_of].name);
  }
  for (const Table& t : tables_) {
    if (t.is_default) continue;
    TableConfig* tc = c.add_table();
    tc->set_name(t.name);
    tc->set_dim(t.dim);
    if (t.is_dynamic()) {
      *tc->mutable_dynamic() = t.dynamic;
    } else {
      tc->set_rows(t.rows);
    }
    *tc->mutable_initializer() = t.initializer;
    if (t.optimizer.ByteSizeLong() > 0) *tc->mutable_optimizer() = t.optimizer;
    tc->set_partitions(t.partitions);
    tc->set_fm_join(t.fm_join);
  }
  return c;
}

absl::Status FeatureSpec::CheckTableDims(const FeatureConfig& config,
                                         const ModelConfig& model) const {
  const int k = model.embedding_dim();
  const ModelBlocks& b = model.blocks();
  const bool fm = model.type() == DEEPFM || model.type() == FM ||
                  (b.has_interaction() && b.interaction() == ModelBlocks::FM_TERM);
  const bool dot = b.has_interaction() ? b.interaction() == ModelBlocks::DOT : model.type() == DLRM;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const Table& table = tables_[t];
    if (table.is_default || table.dim == k) continue;
    int ci = 0;
    while (ci < config.table_size() && config.table(ci).name() != table.name) ++ci;
    const std::string where =
        absl::StrCat("config features.table[", ci, "] ('", table.name, "').dim: ", table.dim,
                     " differs from model.embedding_dim ", k);
    if (dot) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ", and the DOT interaction (DLRM) takes dot products of every pair of fields, "
          "which needs one dimension; set dim: 0"));
    }
    if (fm && table.fm_join == TableConfig::REFUSE) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ", and the FM term of model.type ", ModelType_Name(model.type()),
          " crosses fields of one dimension: set fm_join: EXCLUDE (its fields then feed the first "
          "order and the dense blocks but not the FM term) or dim: 0"));
    }
  }
  for (const Field& f : fields_) {
    if (f.attention_target < 0) continue;
    const Field& target = fields_[f.attention_target];
    if (target.dim != f.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config features field '", f.name, "' list.attention_target '", target.name,
          "': the target's dimension ", target.dim, " differs from this field's ", f.dim,
          "; expected fields of one dimension (put them in one table)"));
    }
  }
  return absl::OkStatus();
}

int FeatureSpec::TableOfRow(int64_t row) const {
  if (row < 0 || static_cast<uint64_t>(row) >= total_rows_) return -1;
  // The tables are contiguous in row order: the last one starting at or before `row`.
  int lo = 0;
  int hi = num_tables() - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tables_[mid].offset <= static_cast<uint64_t>(row)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

int FeatureSpec::TableIndex(const std::string& name) const {
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tables_[t].name == name) return static_cast<int>(t);
  }
  return -1;
}

absl::Status FeatureSpec::RefuseLists(const std::string& what) const {
  for (const Field& f : fields_) {
    if (f.list) {
      return absl::UnimplementedError(absl::StrCat(
          "field '", f.name, "' holds lists (features.field.list): ", what,
          " do not support list fields yet (docs/FORMATS.md \"Lists\")"));
    }
  }
  return absl::OkStatus();
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
  if (f.dynamic >= 0) {
    // A dynamic table: the key's hash, tagged (common/dynamic_rows.h); no range to reduce into.
    *scale = 1.0f;
    if (!present) {
      *row = DynamicMissingRow(f.dynamic);
    } else if (f.kind == CATEGORICAL) {
      *row = DynamicRow(f.dynamic, HashKey(key, f.seed));
      *scale = static_cast<float>(value);
    } else {  // NUMERIC bucket (a DENSE field cannot name a table)
      *row = DynamicRow(f.dynamic, HashKey(static_cast<uint64_t>(LogSquaredBucket(value)), f.seed));
    }
    return;
  }
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

void FeatureSpec::EncodeList(int fi, const RawRows& raw, size_t i, std::vector<int64_t>* ids,
                             std::vector<float>* values) const {
  const Field& f = fields_[fi];
  const size_t n = std::min<size_t>(raw.ListSize(i), static_cast<size_t>(f.max_length));
  const uint64_t* keys = n > 0 ? raw.list_key.data() + raw.list_begin[i] : nullptr;
  const double* weights = n > 0 ? raw.list_weight.data() + raw.list_begin[i] : nullptr;
  double norm = 1.0;
  if (f.combiner != SUM) {
    double d = 0.0;
    for (size_t j = 0; j < n; ++j) d += f.combiner == MEAN ? weights[j] : weights[j] * weights[j];
    if (f.combiner == SQRTN) d = std::sqrt(d);
    norm = d != 0.0 && std::isfinite(d) ? 1.0 / d : 0.0;
  }
  if (n == 0 || norm == 0.0) {  // empty, or nothing to divide by: the missing row
    ids->push_back(f.dynamic >= 0 ? DynamicMissingRow(f.dynamic) : static_cast<int64_t>(f.offset));
    values->push_back(1.0f);
    return;
  }
  for (size_t j = 0; j < n; ++j) {
    const uint64_t h = HashKey(keys[j], f.seed);
    ids->push_back(f.dynamic >= 0 ? DynamicRow(f.dynamic, h)
                                  : static_cast<int64_t>(f.offset + 1 + Reduce(h, f.rows - 1)));
    values->push_back(static_cast<float>(weights[j] * norm));
  }
}

void FeatureSpec::Encode(const RawRows& raw, Batch* batch) const {
  const int nf = num_fields();
  if (batch->size == 0) batch->num_fields = nf;
  const int n = raw.size();
  if (has_lists_) {
    if (batch->offsets.empty()) batch->offsets.push_back(static_cast<int32_t>(batch->ids.size()));
    for (int r = 0; r < n; ++r) {
      for (int f = 0; f < nf; ++f) {
        const size_t i = static_cast<size_t>(r) * nf + f;
        if (fields_[f].list && raw.present[i] != 0) {
          EncodeList(f, raw, i, &batch->ids, &batch->values);
        } else {
          int64_t row;
          float scale;
          EncodeOne(f, raw.present[i] != 0, raw.key[i], raw.value[i], &row, &scale);
          batch->ids.push_back(row);
          batch->values.push_back(scale);
        }
        batch->offsets.push_back(static_cast<int32_t>(batch->ids.size()));
      }
    }
    batch->labels.insert(batch->labels.end(), raw.labels.begin(), raw.labels.end());
    batch->size += n;
    return;
  }
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
