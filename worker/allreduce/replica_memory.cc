#include "worker/allreduce/replica_memory.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "common/status.h"
#include "ps/store/optimizer.h"

namespace pstrain {

absl::StatusOr<std::optional<DataCardinality>> ReadDataCardinality(
    const std::vector<std::string>& train_files) {
  if (train_files.empty()) return std::optional<DataCardinality>();
  const std::string& first = train_files.front();
  const size_t slash = first.rfind('/');
  const std::string path =
      (slash == std::string::npos ? std::string(".") : first.substr(0, slash)) + "/teacher.json";
  if (!PathExists(path)) return std::optional<DataCardinality>();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  auto bad = [&path](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected pstrain datagen's teacher.json, ", what));
  };
  google::protobuf::Struct json;
  if (!google::protobuf::util::JsonStringToMessage(text, &json).ok()) {
    return bad("but it is not a JSON object");
  }
  DataCardinality d;
  d.source = path;
  const auto& f = json.fields();
  auto rows = f.find("rows");
  if (rows == f.end() || rows->second.kind_case() != google::protobuf::Value::kNumberValue ||
      !(rows->second.number_value() >= 0)) {
    return bad("with a number \"rows\"");
  }
  d.rows = static_cast<int64_t>(rows->second.number_value());
  auto cards = f.find("cardinalities");
  if (cards == f.end() || !cards->second.has_struct_value()) {
    return bad("with an object \"cardinalities\"");
  }
  for (const auto& [name, v] : cards->second.struct_value().fields()) {
    if (v.kind_case() != google::protobuf::Value::kNumberValue || !(v.number_value() >= 0)) {
      return bad(absl::StrCat("with a count for \"cardinalities\".\"", name, "\""));
    }
    d.distinct[name] = static_cast<uint64_t>(v.number_value());
  }
  return std::optional<DataCardinality>(std::move(d));
}

absl::StatusOr<ReplicaEstimate> EstimateReplica(const Config& config, const FeatureSpec& spec,
                                                int row_dim, int64_t dense_size,
                                                const std::optional<DataCardinality>& data) {
  ASSIGN_OR_RETURN(auto sparse, Optimizer::Create(config.sparse_optimizer()));
  ASSIGN_OR_RETURN(auto dense, Optimizer::Create(config.dense_optimizer()));
  ReplicaEstimate e;
  int known = 0;
  // Dynamic tables' distinct values, summed over their fields (-1: some field's unknown).
  std::vector<double> dynamic_distinct(spec.num_dynamic_tables(), 0);
  // A field's distinct values in the data, if known: no more than the data's examples.
  const auto distinct_of = [&data](const FeatureSpec::Field& field) {
    std::optional<double> distinct;
    if (data) {
      auto it = data->distinct.find(field.name);
      if (it != data->distinct.end()) distinct = static_cast<double>(it->second);
      if (data->rows > 0) {
        distinct = std::min(distinct.value_or(static_cast<double>(data->rows)),
                            static_cast<double>(data->rows));
      }
    }
    return distinct;
  };
  for (const FeatureSpec::Field& field : spec.fields()) {
    const std::optional<double> distinct = distinct_of(field);
    if (distinct) ++known;
    if (field.dynamic >= 0) {
      double& sum = dynamic_distinct[field.dynamic];
      sum = distinct && sum >= 0 ? sum + *distinct : -1;
      continue;
    }
    const double hashed = static_cast<double>(field.rows) - 1;  // row 0 is "missing"
    e.rows += distinct && hashed > 0 ? hashed * -std::expm1(-*distinct / hashed) + 1 : hashed + 1;
  }
  const int64_t slots = sparse->StateFloats(row_dim);
  const double index = std::min(static_cast<double>(spec.total_rows()), 4096.0 * e.rows) * 4;
  // A stored row: its weights, optimizer slots and generation stamp (ps/store/embedding_store.h).
  e.bytes = static_cast<int64_t>(e.rows * (row_dim + slots + 1) * 4 + index) +
            (dense_size + dense->StateFloats(dense_size)) * 4;
  // Dynamic tables (ps/store/dynamic_store.h): a live row is a slot of 1 + dim weights, their
  // optimizer state and 5 words, plus its map entry (17 bytes at a load of 7/8); the sketch is
  // W x depth x 4 bytes. Rows: the data's distinct values (every one admitted), or the table's
  // cap (max_rows_per_shard / max_bytes_per_shard: the replica is one store, so the cap holds
  // for the whole table, after each eviction), whichever is smaller. With neither the rows
  // are unknown: they count 0 here and the basis says so (each step's check still bounds them).
  std::string dynamic_notes;
  for (int d = 0; d < spec.num_dynamic_tables(); ++d) {
    const FeatureSpec::Table& t = spec.dynamic_table(d);
    const DynamicTableConfig& c = t.dynamic;
    const int64_t width = 1 + t.dim;
    const int64_t row_bytes = (width + sparse->StateFloats(width) + 5) * 4 + (17 * 8 + 6) / 7;
    std::optional<double> rows;
    if (dynamic_distinct[d] >= 0) rows = dynamic_distinct[d];
    if (c.max_rows_per_shard() > 0) {
      rows = std::min(rows.value_or(1e300), static_cast<double>(c.max_rows_per_shard()));
    }
    if (c.max_bytes_per_shard() > 0) {
      rows = std::min(rows.value_or(1e300),
                      static_cast<double>(c.max_bytes_per_shard() / row_bytes));
    }
    if (c.admission() == DynamicTableConfig::COUNT) {
      const int64_t w = (c.sketch_width() + 1023) / 1024 * 1024;
      e.bytes += w * c.sketch_depth() * 4;
    }
    if (rows) {
      e.rows += *rows;
      e.bytes += static_cast<int64_t>(*rows * row_bytes);
    }
    absl::StrAppend(&dynamic_notes, "; dynamic table '", t.name, "': ",
                    rows ? absl::StrFormat("%.0f rows", *rows)
                         : std::string("rows unknown (no data cardinality, no "
                                       "max_rows_per_shard / max_bytes_per_shard cap)"));
  }
  e.basis = data ? absl::StrFormat("%.0f rows of the table's %d: %d of %d fields from the data's "
                                   "distinct values (%s)%s",
                                   e.rows, spec.total_rows(), known, spec.num_fields(),
                                   data->source, known < spec.num_fields() ? ", the others whole" : "")
                 : absl::StrFormat("every row of the table (%d rows; the data's distinct values "
                                   "are unknown: no datagen teacher.json beside it)",
                                   spec.total_rows());
  e.basis += dynamic_notes;
  return e;
}

}  // namespace pstrain
