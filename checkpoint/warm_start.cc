#include "checkpoint/warm_start.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {
namespace {

// "a/b/ckpt-7/" -> "ckpt-7".
std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status Prefixed(const absl::Status& s, const std::string& from) {
  return absl::Status(s.code(), absl::StrCat("warm start from ", from, ": ", s.message()));
}

// The tables and fields of a resolved description (FeatureSpec::Resolved's layout).
struct Layout {
  struct Table {
    std::string name;  // "" for the default table
    int dim = 0;
    int64_t rows = 0;
    int64_t offset = 0;
    bool dynamic = false;  // keyed by the hash of the raw id (no rows, no offset)
  };
  std::vector<Table> tables;  // the default table first when it has rows
  // What feeds the dense vector: each field's name, kind and dim, in order.
  std::vector<std::string> dense_inputs;
  // The default table's fields as their rows depend on them: position, name, rows, sharing.
  std::vector<std::string> default_fields;
};

Layout LayoutOf(const ModelDescription& d) {
  const FeatureConfig& f = d.features();
  const int k = d.model().embedding_dim();
  Layout l;
  int64_t default_rows = 0;
  for (int i = 0; i < f.field_size(); ++i) {
    const FieldSpec& fs = f.field(i);
    if (!fs.has_table() && fs.share_rows_with().empty()) default_rows += fs.vocab_size();
  }
  if (default_rows > 0) l.tables.push_back({"", k, default_rows, 0});
  int64_t offset = default_rows;
  for (const TableConfig& t : f.table()) {
    const bool dynamic = t.has_dynamic();
    const int64_t rows = dynamic ? 0 : static_cast<int64_t>(t.rows());
    l.tables.push_back({t.name(), t.dim(), rows, offset, dynamic});
    offset += rows;
  }
  auto dim_of_table = [&](const std::string& name) {
    for (const TableConfig& t : f.table()) {
      if (t.name() == name) return t.dim();
    }
    return k;
  };
  for (int i = 0; i < f.field_size(); ++i) {
    const FieldSpec& fs = f.field(i);
    int dim = k;
    std::string table;
    if (fs.has_table()) {
      table = fs.table();
    } else if (!fs.share_rows_with().empty()) {
      for (const FieldSpec& o : f.field()) {
        if (o.name() == fs.share_rows_with() && o.has_table()) table = o.table();
      }
    }
    if (!table.empty()) dim = dim_of_table(table);
    l.dense_inputs.push_back(
        absl::StrCat("'", fs.name(), "' (", FieldKind_Name(fs.kind()), ", dim ", dim, ")"));
    if (table.empty()) {
      l.default_fields.push_back(absl::StrCat("field[", i, "] '", fs.name(), "' of ",
                                              fs.vocab_size(), " rows",
                                              fs.share_rows_with().empty()
                                                  ? ""
                                                  : " sharing '" + fs.share_rows_with() + "'"));
    }
  }
  return l;
}

// The first entry where two lists differ, as "<a> in the warm-start checkpoint, <b> in the
// config", or "" when they are the same.
std::string FirstDifference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      return absl::StrCat(a[i], " in the warm-start checkpoint, ", b[i], " in the config");
    }
  }
  if (a.size() == b.size()) return "";
  return a.size() > b.size() ? absl::StrCat(a[n], " only in the warm-start checkpoint")
                             : absl::StrCat(b[n], " only in the config");
}

}  // namespace

std::string TableWarmStart::Summary() const {
  std::vector<std::string> taken_names, fresh_names;
  for (const Take& t : taken) {
    taken_names.push_back(t.name.empty() ? "the default table"
                                         : "'" + t.name + "'" + (t.dynamic ? " (dynamic)" : ""));
  }
  for (const std::string& f : fresh) {
    fresh_names.push_back(f.empty() ? "the default table" : "'" + f + "'");
  }
  return absl::StrCat("tables taken: ",
                      taken_names.empty() ? "none" : absl::StrJoin(taken_names, ", "),
                      "; new (initialized): ",
                      fresh_names.empty() ? "none" : absl::StrJoin(fresh_names, ", "),
                      dense ? "; the dense vector copied"
                            : absl::StrCat("; the dense vector starts fresh (", dense_reason, ")"));
}

absl::StatusOr<TableWarmStart> PlanTableWarmStart(const ModelDescription& saved,
                                                  const ModelDescription& wanted) {
  // The model itself must be the same: compare the descriptions without their features.
  ModelDescription a = saved, b = wanted;
  a.clear_features();
  b.clear_features();
  RETURN_IF_ERROR(CompareModelDescriptions(a, b, "the warm-start checkpoint"));
  if (saved.features().hash_seed() != wanted.features().hash_seed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "features.hash_seed: ", saved.features().hash_seed(), " in the warm-start checkpoint, ",
        wanted.features().hash_seed(), " in the config (every table's hashing depends on it)"));
  }
  const Layout from = LayoutOf(saved), to = LayoutOf(wanted);
  TableWarmStart plan;
  auto kind = [](bool dynamic) {
    return dynamic ? "dynamic (a row per 64-bit hash of one raw id)"
                   : "fixed (a row per hash bucket of many raw ids)";
  };
  for (const Layout::Table& t : to.tables) {
    const Layout::Table* src = nullptr;
    for (const Layout::Table& s : from.tables) {
      if (s.name == t.name) src = &s;
    }
    const std::string what =
        t.name.empty() ? "the default table (the fields that name no table)"
                       : absl::StrCat("table '", t.name, "'");
    if (src == nullptr) {
      plan.fresh.push_back(t.name);
      continue;
    }
    if (src->dynamic != t.dynamic) {
      // Neither maps to the other: a bucket mixes ids whose own rows a dynamic table would need,
      // and a dynamic key is a hash no bucket can be found from without the raw id.
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": ", kind(src->dynamic), " in the warm-start checkpoint, ", kind(t.dynamic),
          " in the config; neither's rows map to the other's (rename the table to start it "
          "fresh)"));
    }
    if (src->dim != t.dim) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": dim ", src->dim, " in the warm-start checkpoint, ", t.dim,
                       " in the config (its rows would not fit; rename the table to start it "
                       "fresh)"));
    }
    if (t.dynamic) {
      plan.taken.push_back({t.name, 0, 0, 0, /*dynamic=*/true});
      continue;
    }
    if (src->rows != t.rows) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": ", src->rows, " rows in the warm-start checkpoint, ", t.rows,
                       " in the config (ids hash to other rows; rename the table to start it "
                       "fresh)"));
    }
    if (t.name.empty()) {
      const std::string d = FirstDifference(from.default_fields, to.default_fields);
      if (!d.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, " has other fields: ", d, " (a field's rows and hashing depend on "
                         "its place there)"));
      }
    }
    plan.taken.push_back({t.name, src->offset, src->offset + src->rows, t.offset});
  }
  const std::string d = FirstDifference(from.dense_inputs, to.dense_inputs);
  if (!d.empty()) {
    plan.dense = false;
    plan.dense_reason = absl::StrCat("the fields feeding it differ: ", d);
  }
  return plan;
}

absl::StatusOr<CheckpointChoice> ChooseWarmStartCheckpoint(const WarmStart& warm_start,
                                                           const ModelDescription& wanted,
                                                           Env* env,
                                                           std::optional<TableWarmStart>* tables) {
  if (tables != nullptr) tables->reset();
  const std::string& from = warm_start.from();
  if (!env->IsDirectory(from)) {
    return absl::NotFoundError(absl::StrCat(
        "warm start from ", from, ": no such directory (--warm_start_from takes a model dir or "
        "one of its ckpt-<step> directories)"));
  }
  CheckpointChoice c;
  if (ParseCheckpointName(BaseName(from)).has_value()) {
    c.dir = from;
    absl::StatusOr<std::vector<CheckpointLink>> chain = VerifyCheckpointChain(c.dir);
    if (!chain.ok()) return Prefixed(chain.status(), from);
    c.chain = *std::move(chain);
    c.manifest = c.chain.back().manifest;
  } else {
    absl::StatusOr<std::optional<CheckpointChoice>> chosen = ChooseCheckpoint(from);
    if (absl::IsDataLoss(chosen.status())) {  // ChooseCheckpoint's advice is for a resume
      return absl::DataLossError(absl::StrCat("warm start from ", from, ": no usable checkpoint "
                                              "there (every one refused, see the errors above)"));
    }
    if (!chosen.ok()) return Prefixed(chosen.status(), from);
    if (!*chosen) {
      return absl::NotFoundError(absl::StrCat("warm start from ", from,
                                              ": no checkpoint there (no LATEST file)"));
    }
    c = **std::move(chosen);
  }
  if (!c.manifest.has_model()) {
    PSTRAIN_LOG(WARNING) << "warm start from " << c.dir << ": its MANIFEST (version 1) does not "
                         << "describe the model; accepted if the shapes match (rows, row size, "
                         << "dense size), but a changed feature hashing or field order would go "
                         << "unnoticed";
    return c;
  }
  const ModelDescription& saved = c.manifest.model();
  absl::Status s = CompareModelDescriptions(saved, wanted, "the warm-start checkpoint");
  if (!s.ok() && tables != nullptr &&
      (saved.features().table_size() > 0 || wanted.features().table_size() > 0)) {
    // Tables changed: table by table (PlanTableWarmStart), or its refusal.
    absl::StatusOr<TableWarmStart> plan = PlanTableWarmStart(saved, wanted);
    if (plan.ok()) *tables = *std::move(plan);
    s = plan.status();
  }
  if (s.ok() && !warm_start.reset_optimizer()) {
    for (const auto& [name, a, b] :
         {std::make_tuple("sparse_optimizer.type", saved.sparse_optimizer().type(),
                          wanted.sparse_optimizer().type()),
          std::make_tuple("dense_optimizer.type", saved.dense_optimizer().type(),
                          wanted.dense_optimizer().type())}) {
      if (a != b) {
        s = absl::FailedPreconditionError(absl::StrCat(
            name, ": ", OptimizerType_Name(a), " in the warm-start checkpoint, ",
            OptimizerType_Name(b), " in the config; --reset_optimizer copies the parameters "
            "only and starts the optimizer slots fresh"));
        break;
      }
    }
  }
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("warm start from ", c.dir, ": ", s.message()));
  }
  return c;
}

}  // namespace pstrain
