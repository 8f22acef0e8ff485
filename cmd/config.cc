// `pstrain config [training flags] [--all]`: prints the config a training command would run with
// (the --config files merged, the defaults filled, --train/--eval/..., every --set applied and
// validated), as a text proto that `--config` accepts. What `pstrain train` writes to
// <model_dir>/config.textproto is the same text after the thread settings are resolved.
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "cmd/cli.h"
#include "cmd/commands.h"
#include "common/config.h"
#include "common/flags.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Fields whose unset state means "inherit" rather than the schema default (a table's optimizer
// overrides and initializer scale, a field's table): filling them would change the config.
bool UnsetMeansInherit(const FieldDescriptor* f) {
  const std::string& n = f->full_name();
  return f->containing_type()->full_name() == "pstrain.TableOptimizer" ||
         n == "pstrain.TableInitializer.stddev" || n == "pstrain.TableInitializer.limit" ||
         n == "pstrain.FieldSpec.table";
}

// Sets every unset singular field of `m` (recursively, into every set or singular sub-message)
// to its schema default, so that the printed text shows the value each field has.
void FillDefaults(Message* m) {
  const Reflection* r = m->GetReflection();
  const auto* d = m->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (UnsetMeansInherit(f)) continue;
    if (f->is_repeated()) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        for (int j = 0; j < r->FieldSize(*m, f); ++j) FillDefaults(r->MutableRepeatedMessage(m, f, j));
      }
      continue;
    }
    if (f->containing_oneof() != nullptr && !r->HasField(*m, f)) continue;
    if (r->HasField(*m, f) && f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: FillDefaults(r->MutableMessage(m, f)); break;
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, f->default_value_int32()); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, f->default_value_int64()); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, f->default_value_uint32()); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, f->default_value_uint64()); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, f->default_value_double()); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, f->default_value_float()); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, f->default_value_bool()); break;
      case FieldDescriptor::CPPTYPE_ENUM: r->SetEnum(m, f, f->default_value_enum()); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, f->default_value_string()); break;
    }
  }
}

}  // namespace

int RunConfig(int argc, char** argv) {
  FlagSet flags("config",
                "Prints the effective config of a training command given the same flags: the "
                "--config files merged in order, an absent dense_optimizer made Adam, "
                "--train/--eval/--format/--model_dir/--epochs, then each --set, validated.\n"
                "The output is a text proto that --config accepts. Thread settings of 0 are "
                "resolved at run time (see the startup line and <model_dir>/config.textproto).");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  bool all = false, print = true;
  flags.Bool("all", &all, "also print every field left at its schema default");
  flags.Bool("print", &print, "print the config (the default; kept for `pstrain config --print`)");
  Config config;
  if (auto code = ParseTrainingCommand("config", argc, argv, &flags, tf, &config)) return *code;
  // The tables as the job lays them out (FeatureSpec), of the config as given (before --all).
  std::optional<FeatureSpec> spec;
  if (config.features().table_size() > 0) {
    absl::StatusOr<FeatureSpec> made =
        FeatureSpec::Create(config.features(), ResolveModelConfig(config.model()));
    if (!made.ok()) {
      std::fprintf(stderr, "pstrain config: %s\n", std::string(made.status().message()).c_str());
      return 2;
    }
    spec = *std::move(made);
  }
  if (all) FillDefaults(&config);
  if (print) std::printf("%s", ConfigToText(config).c_str());
  if (print && spec.has_value()) {
    // Comments, so that the text stays a config.
    std::printf("# Tables (global rows [offset, offset + rows), a row = 1 + dim floats):\n");
    for (const FeatureSpec::Table& t : spec->tables()) {
      std::string fields;
      for (const FeatureSpec::Field& f : spec->fields()) {
        if (&spec->tables()[f.table] == &t) fields += (fields.empty() ? "" : ", ") + f.name;
      }
      if (t.is_dynamic()) {
        std::printf("#   %s: dim %d, dynamic (rows keyed by the id's hash, index %d), fields %s\n",
                    t.name.c_str(), t.dim, t.dynamic_index, fields.c_str());
        continue;
      }
      std::printf("#   %s: dim %d, rows %llu at offset %llu, partitions %s, fields %s\n",
                  t.is_default ? "(default: the fields naming no table)" : t.name.c_str(), t.dim,
                  static_cast<unsigned long long>(t.rows),
                  static_cast<unsigned long long>(t.offset),
                  t.partitions > 0 ? std::to_string(t.partitions).c_str() : "the cluster's",
                  fields.c_str());
    }
  }
  return 0;
}

}  // namespace pstrain
