#include "common/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/dynamic_rows.h"
#include "common/file.h"
#include "common/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::TextFormat;

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit CollectErrors(absl::string_view source) : source_(source) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    // TextFormat reports 0-based lines and columns.
    if (!errors_.empty()) errors_ += "; ";
    absl::StrAppend(&errors_, source_, ":", line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string source_;
  std::string errors_;
};

// Parses `name` or `name[index]`.
absl::Status SplitIndex(absl::string_view part, std::string* name, int* index) {
  *index = -1;
  const size_t open = part.find('[');
  if (open == absl::string_view::npos) {
    *name = std::string(part);
    return absl::OkStatus();
  }
  if (part.back() != ']') return absl::InvalidArgumentError(absl::StrCat("bad index in '", part, "'"));
  *name = std::string(part.substr(0, open));
  absl::string_view digits = part.substr(open + 1, part.size() - open - 2);
  if (!absl::SimpleAtoi(digits, index) || *index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad index in '", part, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> ParseConfigText(absl::string_view text, absl::string_view source_name) {
  Config config;
  TextFormat::Parser parser;
  CollectErrors errors(source_name);
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(false);
  parser.AllowUnknownExtension(false);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(absl::StrCat("config ", errors.errors()));
  }
  return config;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  // A regular file of at most 16 MiB (a config is a few kB): a FIFO, /dev/zero or a huge file is
  // an error naming it, not a hang or an allocation failure.
  absl::StatusOr<std::string> text = ReadFileToString(path, int64_t{16} << 20);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("config file ", path, ": ", text.status().message()));
  }
  return ParseConfigText(*text, path);
}

void ApplyConfigDefaults(Config* config) {
  if (!config->has_dense_optimizer()) {
    config->mutable_dense_optimizer()->set_type(ADAM);
    config->mutable_dense_optimizer()->set_learning_rate(0.001f);
  }
}

absl::Status ApplyOverride(absl::string_view assignment, Config* config) {
  const size_t eq = assignment.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", assignment, ": expected path=value, e.g. train.batch_size=512"));
  }
  const absl::string_view path = absl::StripAsciiWhitespace(assignment.substr(0, eq));
  const std::string value(absl::StripAsciiWhitespace(assignment.substr(eq + 1)));
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '.');

  Message* msg = config;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string name;
    int index;
    RETURN_IF_ERROR(Annotate(SplitIndex(parts[i], &name, &index), absl::StrCat("--set ", path)));
    const Descriptor* desc = msg->GetDescriptor();
    const FieldDescriptor* field = desc->FindFieldByName(name);
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", path, ": ", desc->full_name(),
                                                     " has no field '", name, "'"));
    }
    const Reflection* refl = msg->GetReflection();
    const bool last = i + 1 == parts.size();
    if (!last) {
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
        return absl::InvalidArgumentError(
            absl::StrCat("--set ", path, ": '", name, "' is not a message"));
      }
      if (field->is_repeated()) {
        if (index < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("--set ", path, ": '", name, "' is repeated; use ", name, "[i]"));
        }
        const int size = refl->FieldSize(*msg, field);
        if (index > size) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--set ", path, ": index ", index, " of '", name, "' is past its end (size ", size, ")"));
        }
        msg = index == size ? refl->AddMessage(msg, field)
                            : refl->MutableRepeatedMessage(msg, field, index);
      } else {
        if (index >= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("--set ", path, ": '", name, "' is not repeated"));
        }
        msg = refl->MutableMessage(msg, field);
      }
      continue;
    }
    // Last component: parse the value through TextFormat so the syntax matches config files.
    if (index >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", path, ": indexing the last component is not supported"));
    }
    std::string text;
    if (field->is_repeated()) {
      refl->ClearField(msg, field);
      text = absl::StrCat(name, ": ", value.empty() || value.front() == '[' ? value
                                                                            : "[" + value + "]");
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING &&
               (value.empty() || value.front() != '"')) {
      text = absl::StrCat(name, ": \"", absl::CEscape(value), "\"");
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      text = absl::StrCat(name, " ", value);
    } else {
      text = absl::StrCat(name, ": ", value);
    }
    TextFormat::Parser parser;
    CollectErrors errors(absl::StrCat("--set ", path));
    parser.RecordErrorsTo(&errors);
    parser.AllowUnknownField(false);
    std::unique_ptr<Message> scratch(msg->New());
    if (!parser.ParseFromString(text, scratch.get())) {
      return absl::InvalidArgumentError(absl::StrCat("bad value '", value, "' for ", path, " (",
                                                     FieldDescriptor::TypeName(field->type()),
                                                     "): ", errors.errors()));
    }
    msg->MergeFrom(*scratch);
  }
  return absl::OkStatus();
}

absl::Status ValidateTableConfig(const TableConfig& t, absl::string_view path) {
  auto bad = [&](absl::string_view member, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("config ", path, member, ": ", what));
  };
  if (t.name().empty()) return bad(".name", "must be set");
  for (char c : t.name()) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') {
      return bad(".name", absl::StrCat("'", absl::CHexEscape(t.name()),
                                       "': expected letters, digits and '_' only"));
    }
  }
  const std::string named = absl::StrCat(" ('", t.name(), "')");
  if (t.dim() < 0 || t.dim() > kMaxTableDim) {
    return bad(named + ".dim", absl::StrCat("must be in [0, ", kMaxTableDim,
                                            "] (0 = model.embedding_dim), got ", t.dim()));
  }
  if (t.has_dynamic()) {
    // Rows keyed by the raw id's hash (docs/CONFIG.md "Dynamic tables"): no size, no ranges.
    if (t.has_rows()) {
      return bad(named + ".rows", "a dynamic table has no rows (they are created when an id is "
                                  "admitted and deleted when it is evicted); remove rows, or "
                                  "remove dynamic for a fixed table");
    }
    if (t.partitions() != 0) {
      return bad(named + ".partitions",
                 absl::StrCat("a dynamic table has no fixed partitions (the PS shards own its "
                              "rows by key hash); remove partitions (got ", t.partitions(), ")"));
    }
    const DynamicTableConfig& d = t.dynamic();
    const std::string dyn = named + ".dynamic.";
    if (d.admit_count() < 1) return bad(dyn + "admit_count", "must be >= 1, got 0");
    if (d.sketch_width() < 1 || d.sketch_width() > (int64_t{1} << 32)) {
      return bad(dyn + "sketch_width",
                 absl::StrCat("must be in [1, 2^32], got ", d.sketch_width()));
    }
    if (d.sketch_depth() < 1 || d.sketch_depth() > 16) {
      return bad(dyn + "sketch_depth", absl::StrCat("must be in [1, 16], got ", d.sketch_depth()));
    }
    // NaN fails the comparison, and so is refused.
    if (!(d.admit_probability() > 0 && d.admit_probability() <= 1)) {
      return bad(dyn + "admit_probability",
                 absl::StrCat("must be in (0, 1], got ", d.admit_probability()));
    }
    if (d.ttl_steps() < 0) {
      return bad(dyn + "ttl_steps", absl::StrCat("must be >= 0 (0: off), got ", d.ttl_steps()));
    }
    if (d.ttl_passes() < 0) {
      return bad(dyn + "ttl_passes", absl::StrCat("must be >= 0 (0: off), got ", d.ttl_passes()));
    }
    if (d.max_rows_per_shard() < 0) {
      return bad(dyn + "max_rows_per_shard",
                 absl::StrCat("must be >= 0 (0: off), got ", d.max_rows_per_shard()));
    }
    if (d.max_bytes_per_shard() < 0) {
      return bad(dyn + "max_bytes_per_shard",
                 absl::StrCat("must be >= 0 (0: off), got ", d.max_bytes_per_shard()));
    }
  } else {
    if (!t.has_rows()) {
      return bad(named + ".rows", "must be set (>= 2: row 0 is the missing row), or set dynamic");
    }
    if (t.rows() < 2) {
      return bad(named + ".rows",
                 absl::StrCat("must be >= 2 (row 0 is the missing row), got ", t.rows()));
    }
    if (t.rows() > (uint64_t{1} << 48)) {
      return bad(named + ".rows", absl::StrCat("must be at most 2^48, got ", t.rows()));
    }
  }
  const TableInitializer& init = t.initializer();
  if (init.has_stddev() && !(init.stddev() >= 0 && std::isfinite(init.stddev()))) {
    return bad(named + ".initializer.stddev", absl::StrCat("must be >= 0, got ", init.stddev()));
  }
  if (init.has_limit() && !(init.limit() > 0 && std::isfinite(init.limit()))) {
    return bad(named + ".initializer.limit", absl::StrCat("must be > 0, got ", init.limit()));
  }
  const TableOptimizer& o = t.optimizer();
  const std::string opt = named + ".optimizer.";
  // NaN fails every comparison below, and so is refused.
  if (o.has_learning_rate() && !(o.learning_rate() > 0 && std::isfinite(o.learning_rate()))) {
    return bad(opt + "learning_rate", absl::StrCat("must be > 0, got ", o.learning_rate()));
  }
  if (o.has_initial_accumulator() && !(o.initial_accumulator() >= 0)) {
    return bad(opt + "initial_accumulator", "must be >= 0");
  }
  if (o.has_beta1() && !(o.beta1() >= 0 && o.beta1() < 1)) {
    return bad(opt + "beta1", "must be in [0, 1)");
  }
  if (o.has_beta2() && !(o.beta2() >= 0 && o.beta2() < 1)) {
    return bad(opt + "beta2", "must be in [0, 1)");
  }
  if (o.has_epsilon() && !(o.epsilon() > 0)) return bad(opt + "epsilon", "must be > 0");
  if ((o.has_l1() && !(o.l1() >= 0)) || (o.has_l2() && !(o.l2() >= 0))) {
    return bad(opt + "l1/l2", "must be >= 0");
  }
  if (o.has_lr_power() && !(o.lr_power() <= 0)) return bad(opt + "lr_power", "must be <= 0");
  if (t.partitions() < 0 || t.partitions() > kMaxTablePartitions) {
    return bad(named + ".partitions",
               absl::StrCat("must be in [0, ", kMaxTablePartitions,
                            "] (0 = the cluster's rule), got ", t.partitions()));
  }
  return absl::OkStatus();
}

absl::Status ValidateListSpec(const FieldSpec& fs, absl::string_view path) {
  const std::string field = absl::StrCat(path, " ('", fs.name(), "')");
  if (fs.has_share_rows_with() && fs.share_rows_with() == fs.name()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".share_rows_with: names the field itself"));
  }
  if (fs.has_share_rows_with() && fs.kind() != CATEGORICAL) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".share_rows_with: only a CATEGORICAL field may share another field's rows"));
  }
  if (!fs.has_list()) return absl::OkStatus();
  const ListSpec& l = fs.list();
  if (fs.kind() != CATEGORICAL) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".list: only CATEGORICAL fields may hold lists; this field is NUMERIC"));
  }
  if (l.max_length() < 1 || l.max_length() > kMaxListLength) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".list.max_length: must be in [1, ",
                                                   kMaxListLength, "], got ", l.max_length()));
  }
  const std::string& sep = l.separator();
  if (sep.empty() || sep.find_first_of(",\t\"\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".list.separator: '", absl::CEscape(sep),
        "' is not allowed: expected a non-empty string without ',', tab, '\"' or a line break "
        "(those delimit columns and lines)"));
  }
  if (l.weights_key() == fs.name()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".list.weights_key: must differ from the field's own name"));
  }
  return absl::OkStatus();
}

absl::Status ValidateConfig(const Config& c) {
  auto bad = [](absl::string_view path, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", what));
  };
  const ModelConfig& m = c.model();
  // Sizes are bounded before anything is allocated: a typo must be an error naming the field,
  // not an allocation failure or a multi-gigabyte model. The bounds are far above any CTR model
  // (the shipped DeepFM: k = 16, 3 layers of 400, 571k dense floats).
  if (m.embedding_dim() <= 0 || m.embedding_dim() > 1024) return bad("model.embedding_dim", absl::StrCat("must be in [1, 1024], got ", m.embedding_dim()));
  if (m.hidden_size() > kMaxHiddenLayers) return bad("model.hidden", absl::StrCat("at most ", kMaxHiddenLayers, " layers, got ", m.hidden_size()));
  int64_t mlp_floats = 0, width = 0;
  for (int i = 0; i < m.hidden_size(); ++i) {
    if (m.hidden(i) <= 0 || m.hidden(i) > kMaxLayerWidth) return bad(absl::StrCat("model.hidden[", i, "]"), absl::StrCat("must be in [1, ", kMaxLayerWidth, "], got ", m.hidden(i)));
    // Weights and bias of layer i (its input is the previous width; the first layer's, the
    // embeddings, is bounded by the fields below and checked with the model).
    if (i > 0) mlp_floats += (width + 1) * m.hidden(i);
    width = m.hidden(i);
  }
  if (mlp_floats > kMaxDenseFloats) return bad("model.hidden", absl::StrCat("the layers after the first hold ", mlp_floats, " floats, more than ", kMaxDenseFloats));
  if (m.embedding_init_stddev() < 0) return bad("model.embedding_init_stddev", "must be >= 0");
  if (m.embedding_l2() < 0) return bad("model.embedding_l2", "must be >= 0");
  if (m.has_blocks()) {
    // The block grammar (ModelBlocks); the model checks the sizes that depend on the fields.
    const ModelBlocks& b = m.blocks();
    if (m.type() != DCN_V2 && m.type() != DLRM && m.type() != BLOCKS && m.type() != DIN) return bad("model.blocks", absl::StrCat("is for model.type DCN_V2, DLRM, DIN or BLOCKS; ", ModelType_Name(m.type()), " is a fixed preset"));
    if (b.has_cross_layers() && (b.cross_layers() < 1 || b.cross_layers() > 16)) return bad("model.blocks.cross_layers", absl::StrCat("must be in [1, 16], got ", b.cross_layers()));
    if (b.cross_rank() < 0) return bad("model.blocks.cross_rank", absl::StrCat("must be >= 0 (0 = full rank), got ", b.cross_rank()));
    if (b.cross_experts() < 0 || b.cross_experts() > 64) return bad("model.blocks.cross_experts", absl::StrCat("must be in [0, 64] (0 or 1 = no mixture), got ", b.cross_experts()));
    if (b.cross_experts() >= 2 && b.cross_rank() <= 0) return bad("model.blocks.cross_experts", absl::StrCat(b.cross_experts(), " experts need low-rank experts: model.blocks.cross_rank > 0, got ", b.cross_rank()));
    if (b.bottom_hidden_size() > kMaxHiddenLayers) return bad("model.blocks.bottom_hidden", absl::StrCat("at most ", kMaxHiddenLayers, " layers, got ", b.bottom_hidden_size()));
    for (int i = 0; i < b.bottom_hidden_size(); ++i) {
      if (b.bottom_hidden(i) <= 0 || b.bottom_hidden(i) > kMaxLayerWidth) return bad(absl::StrCat("model.blocks.bottom_hidden[", i, "]"), absl::StrCat("must be in [1, ", kMaxLayerWidth, "], got ", b.bottom_hidden(i)));
    }
  }
  // Target attention (ListSpec.attention_target; the feature spec checks the target field).
  for (int i = 0; i < c.features().field_size(); ++i) {
    const FieldSpec& fs = c.features().field(i);
    if (!fs.has_list() || !fs.list().has_attention_target()) continue;
    const std::string path = absl::StrCat("features.field[", i, "] ('", fs.name(), "').list.attention_target");
    if (m.type() == LR || m.type() == FM || m.type() == DEEPFM || m.type() == WIDE_DEEP) return bad(path, absl::StrCat("model.type ", ModelType_Name(m.type()), " cannot pool by target attention; expected DIN, or DCN_V2, DLRM or BLOCKS without FM_TERM (docs/CONFIG.md \"DIN\")"));
    if (m.blocks().interaction() == ModelBlocks::FM_TERM && m.blocks().has_mlp() && !m.blocks().mlp()) return bad(path, "the FM_TERM interaction takes an attended field only with the MLP (blocks.mlp: true)");
  }
  if (c.train().has_warm_start() && c.train().warm_start().from().empty()) {
    return bad("train.warm_start.from", "must name a model dir or a checkpoint (--warm_start_from)");
  }

  for (const char* which : {"sparse_optimizer", "dense_optimizer"}) {
    const OptimizerConfig& o =
        absl::string_view(which) == "sparse_optimizer" ? c.sparse_optimizer() : c.dense_optimizer();
    if (!(o.learning_rate() > 0)) return bad(absl::StrCat(which, ".learning_rate"), absl::StrCat("must be > 0, got ", o.learning_rate()));
    if (o.initial_accumulator() < 0) return bad(absl::StrCat(which, ".initial_accumulator"), "must be >= 0");
    if (o.beta1() < 0 || o.beta1() >= 1) return bad(absl::StrCat(which, ".beta1"), "must be in [0, 1)");
    if (o.beta2() < 0 || o.beta2() >= 1) return bad(absl::StrCat(which, ".beta2"), "must be in [0, 1)");
    if (!(o.epsilon() > 0)) return bad(absl::StrCat(which, ".epsilon"), "must be > 0");
    if (o.l1() < 0 || o.l2() < 0) return bad(absl::StrCat(which, ".l1/l2"), "must be >= 0");
    if (o.lr_power() > 0) return bad(absl::StrCat(which, ".lr_power"), "must be <= 0");
    // The schedule (ps/store/lr_schedule.h).
    const LearningRateSchedule& s = o.schedule();
    const std::string sched = absl::StrCat(which, ".schedule.");
    if (s.warmup_steps() < 0) return bad(sched + "warmup_steps", absl::StrCat("must be >= 0, got ", s.warmup_steps()));
    if (s.decay() != LearningRateSchedule::CONSTANT && s.decay_steps() <= 0) {
      return bad(sched + "decay_steps", absl::StrCat("must be > 0 for decay ", LearningRateSchedule::Decay_Name(s.decay()), ", got ", s.decay_steps()));
    }
    if (!(s.decay_rate() > 0 && s.decay_rate() <= 1)) return bad(sched + "decay_rate", absl::StrCat("must be in (0, 1], got ", s.decay_rate()));
    if (!(s.min_factor() >= 0 && s.min_factor() <= 1)) return bad(sched + "min_factor", absl::StrCat("must be in [0, 1], got ", s.min_factor()));
  }

  if (!(c.cluster().max_gradient_abs() > 0)) return bad("cluster.max_gradient_abs", absl::StrCat("must be > 0, got ", c.cluster().max_gradient_abs()));
  const ThreadConfig& t = c.threads();
  // Each tower and thread is a real thread with its own buffers: a bound turns a typo into an
  // error rather than thousands of threads.
  if (t.towers() < 0 || t.towers() > kMaxThreads) return bad("threads.towers", absl::StrCat("must be in [0, ", kMaxThreads, "] (0 = auto), got ", t.towers()));
  if (t.intra_op_threads() < 0 || t.intra_op_threads() > kMaxThreads) return bad("threads.intra_op_threads", absl::StrCat("must be in [0, ", kMaxThreads, "] (0 = auto), got ", t.intra_op_threads()));
  if (t.inter_op_threads() < 0 || t.inter_op_threads() > kMaxThreads) return bad("threads.inter_op_threads", absl::StrCat("must be in [0, ", kMaxThreads, "] (0 = auto), got ", t.inter_op_threads()));

  const TrainConfig& tr = c.train();
  // Batches are allocated whole (examples x fields ids, scores, gradients): a bound keeps a typo
  // from becoming an allocation failure.
  if (tr.batch_size() <= 0 || tr.batch_size() > kMaxBatch) return bad("train.batch_size", absl::StrCat("must be in [1, ", kMaxBatch, "], got ", tr.batch_size()));
  if (tr.global_batch_size() < 0 || tr.global_batch_size() > kMaxBatch) return bad("train.global_batch_size", absl::StrCat("must be in [0, ", kMaxBatch, "] (0: towers x batch_size a worker), got ", tr.global_batch_size()));
  if (tr.global_batch_size() > 0 && tr.has_batch_size()) {
    return bad("train.batch_size", absl::StrCat("is derived from train.global_batch_size (", tr.global_batch_size(), " here): set one of them, not both. The global batch is the update batch, split over the towers and workers (--set train.global_batch_size=N); batch_size is per tower, the update batch then growing with the towers (--set train.global_batch_size=0 --set train.batch_size=N)"));
  }
  if (tr.eval_batch_size() <= 0 || tr.eval_batch_size() > kMaxBatch) return bad("train.eval_batch_size", absl::StrCat("must be in [1, ", kMaxBatch, "], got ", tr.eval_batch_size()));
  if (tr.epochs() <= 0 && tr.max_steps() <= 0) return bad("train.epochs", "must be > 0 unless train.max_steps is set");
  if (tr.max_steps() < 0) return bad("train.max_steps", "must be >= 0");

  const DataConfig& d = c.data();
  if (d.max_bad_record_fraction() < 0 || d.max_bad_record_fraction() > 1) {
    return bad("data.max_bad_record_fraction", absl::StrCat("must be in [0, 1], got ", d.max_bad_record_fraction()));
  }
  if (d.shuffle_buffer() < 0) return bad("data.shuffle_buffer", "must be >= 0");
  if (d.prefetch_batches() <= 0) return bad("data.prefetch_batches", "must be > 0");
  for (int which = 0; which < 2; ++which) {
    const auto& chans = which == 0 ? d.train() : d.eval();
    for (int i = 0; i < chans.size(); ++i) {
      const std::string p = absl::StrCat(which == 0 ? "data.train[" : "data.eval[", i, "]");
      if (!(chans[i].weight() > 0)) return bad(p + ".weight", "must be > 0");
      if (chans[i].format() == FORMAT_UNSPECIFIED) return bad(p + ".format", "must be set");
      if (chans[i].path_size() == 0 && chans[i].pipe_dir().empty()) return bad(p + ".path", "needs at least one path (or pipe_dir)");
    }
  }

  const FeatureConfig& f = c.features();
  if (f.preset() == NO_PRESET && f.field_size() == 0) return bad("features", "needs a preset or at least one field");
  for (int i = 0; i < f.field_size(); ++i) {
    const FieldSpec& fs = f.field(i);
    const std::string p = absl::StrCat("features.field[", i, "]");
    if (fs.name().empty()) return bad(p + ".name", "must be set");
    const bool dense = fs.kind() == NUMERIC && fs.numeric_mode() == DENSE;
    if (!dense && fs.has_vocab_size() && fs.vocab_size() < 2) return bad(p + ".vocab_size", "must be >= 2 (row 0 is the missing value)");
    if (absl::Status s = ValidateListSpec(fs, p); !s.ok()) return s;
  }
  int dynamic_tables = 0;
  for (int i = 0; i < f.table_size(); ++i) {
    absl::Status s = ValidateTableConfig(f.table(i), absl::StrCat("features.table[", i, "]"));
    if (!s.ok()) return s;
    if (f.table(i).has_dynamic() && ++dynamic_tables > kMaxDynamicTables) {
      return bad(absl::StrCat("features.table[", i, "].dynamic"),
                 absl::StrCat("more than ", kMaxDynamicTables, " dynamic tables"));
    }
  }
  if (f.categorical_vocab_size() < 2) return bad("features.categorical_vocab_size", "must be >= 2");
  if (f.numeric_vocab_size() < 2) return bad("features.numeric_vocab_size", "must be >= 2");

  const ClusterConfig& cl = c.cluster();
  if (cl.index() < 0 || (cl.ps_size() > 0 && cl.index() >= cl.ps_size())) return bad("cluster.index", "must be in [0, number of hosts)");
  if (cl.staleness() < 0) {
    return bad("cluster.staleness",
               absl::StrCat("must be >= 0 (the steps a BOUNDED worker may run ahead of the "
                            "slowest; 0 = lockstep), got ", cl.staleness()));
  }
  if (cl.num_partitions() < 0) return bad("cluster.num_partitions", "must be >= 0");
  if (cl.rpc_deadline_ms() <= 0) return bad("cluster.rpc_deadline_ms", "must be > 0");
  if (cl.rpc_retries() < 0) return bad("cluster.rpc_retries", "must be >= 0");
  if (cl.rpc_backoff_ms() <= 0) return bad("cluster.rpc_backoff_ms", "must be > 0");
  if (cl.rpc_max_backoff_ms() < cl.rpc_backoff_ms()) return bad("cluster.rpc_max_backoff_ms", "must be >= rpc_backoff_ms");
  if (cl.rpc_call_deadline_ms() < 0) return bad("cluster.rpc_call_deadline_ms", "must be >= 0");
  if (cl.max_pushes_in_flight() < 1) return bad("cluster.max_pushes_in_flight", "must be >= 1");
  if (cl.dense_sync_steps() < 1) return bad("cluster.dense_sync_steps", "must be >= 1");
  if (cl.lease_ms() < 3000) {
    return bad("cluster.lease_ms",
               absl::StrCat("must be >= 3000 (workers renew their lease at least every third of "
                            "it), got ", cl.lease_ms()));
  }
  if (cl.max_message_mb() < 0 || cl.max_message_mb() > 2047) {
    return bad("cluster.max_message_mb", absl::StrCat("must be in [0, 2047], got ",
                                                      cl.max_message_mb()));
  }
  if (cl.answer_budget_mb() < 0 || cl.answer_budget_mb() > (1 << 20)) {
    return bad("cluster.answer_budget_mb",
               absl::StrCat("must be in [0, 1048576] (0: twice the largest message), got ",
                            cl.answer_budget_mb()));
  }
  if (cl.answer_budget_mb() > 0 && cl.answer_budget_mb() < cl.max_message_mb()) {
    return bad("cluster.answer_budget_mb",
               absl::StrCat("must be at least cluster.max_message_mb (", cl.max_message_mb(),
                            "), so that the largest legal pull fits; got ",
                            cl.answer_budget_mb()));
  }
  if (cl.has_tls() && (cl.tls().ca().empty() || cl.tls().cert().empty() ||
                       cl.tls().key().empty())) {
    return bad("cluster.tls", "needs all of ca, cert and key (PEM file paths)");
  }
  if (c.data().max_record_bytes() < 1024) {
    return bad("data.max_record_bytes",
               absl::StrCat("must be >= 1024, got ", c.data().max_record_bytes()));
  }

  const CheckpointConfig& ck = c.checkpoint();
  if (ck.every_steps() < 0) return bad("checkpoint.every_steps", "must be >= 0");
  if (ck.every_seconds() < 0) return bad("checkpoint.every_seconds", "must be >= 0");
  if (ck.keep() < 1) return bad("checkpoint.keep", "must be >= 1");
  if (ck.incremental_every() < 1) {
    return bad("checkpoint.incremental_every",
               absl::StrCat("must be >= 1 (1: every checkpoint is full), got ",
                            ck.incremental_every()));
  }

  // Early stopping, the best checkpoint and the validation split (docs/CONFIG.md "Early stopping
  // and the best checkpoint").
  if (!(d.validation_fraction() >= 0 && d.validation_fraction() < 1)) {
    return bad("data.validation_fraction",
               absl::StrCat("must be in [0, 1), got ", d.validation_fraction()));
  }
  const EarlyStopping& es = tr.early_stopping();
  if (es.patience_evals() < 0) {
    return bad("train.early_stopping.patience_evals",
               absl::StrCat("must be >= 0 (0 = never stop), got ", es.patience_evals()));
  }
  if (!(es.min_delta() >= 0) || std::isinf(es.min_delta())) {
    return bad("train.early_stopping.min_delta",
               absl::StrCat("must be finite and >= 0, got ", es.min_delta()));
  }
  // What a training run needs (a config without train channels is a fragment: --train and
  // --eval may complete it).
  const bool periodic_data = d.eval_size() > 0 || d.validation_fraction() > 0;
  if (d.train_size() > 0 && (ck.keep_best() || es.patience_evals() > 0) && !periodic_data) {
    return bad(ck.keep_best() ? "checkpoint.keep_best" : "train.early_stopping",
               "needs evaluation data: an eval channel (data.eval, --eval) or "
               "data.validation_fraction > 0");
  }
  if (ck.keep_best() && ck.every_steps() == 0 && ck.every_seconds() == 0) {
    return bad("checkpoint.keep_best",
               "needs periodic checkpoints (checkpoint.every_steps or every_seconds > 0): the "
               "best is chosen among them");
  }
  if (es.patience_evals() > 0 && !ck.keep_best() && tr.eval_every_steps() <= 0) {
    return bad("train.early_stopping.patience_evals",
               "needs periodic evaluations: set train.eval_every_steps > 0 (or "
               "checkpoint.keep_best: true, which evaluates every checkpoint)");
  }
  return absl::OkStatus();
}

int64_t StepBatch(const TrainConfig& train, const ThreadConfig& threads, int worker_index,
                  int num_workers) {
  if (train.global_batch_size() <= 0) {
    return int64_t{std::max(1, threads.towers())} * train.batch_size();
  }
  const int64_t workers = std::max(1, num_workers);
  const int64_t global = train.global_batch_size();
  return std::max<int64_t>(1, global / workers + (worker_index < global % workers ? 1 : 0));
}

double SparseLrShareFactor(const Config& config, int num_workers) {
  const Consistency mode = config.cluster().consistency();
  const OptimizerType type = config.sparse_optimizer().type();
  // Measured to gain (docs/PS.md): ADAGRAD and FTRL; lazy ADAM did not, SGD is not adaptive.
  const bool adaptive = type == ADAGRAD || type == FTRL;
  if (!config.cluster().scale_sparse_lr_by_share() || (mode != ASYNC && mode != BOUNDED) ||
      config.train().global_batch_size() <= 0 || num_workers <= 1 || !adaptive) {
    return 1.0;
  }
  return std::sqrt(1.0 / num_workers);
}

void ScaleSparseLearningRates(double factor, Config* config) {
  OptimizerConfig* sparse = config->mutable_sparse_optimizer();
  sparse->set_learning_rate(static_cast<float>(sparse->learning_rate() * factor));
  for (TableConfig& t : *config->mutable_features()->mutable_table()) {
    if (t.has_optimizer() && t.optimizer().has_learning_rate()) {
      TableOptimizer* o = t.mutable_optimizer();
      o->set_learning_rate(static_cast<float>(o->learning_rate() * factor));
    }
  }
}

std::string ResolveThreadDefaults(int cores, Config* config, int omp_num_threads,
                                  int worker_index, int num_workers) {
  if (cores < 1) cores = 1;
  ThreadConfig* t = config->mutable_threads();
  TrainConfig* train = config->mutable_train();
  const bool global = train->global_batch_size() > 0;
  if (t->inter_op_threads() == 0) t->set_inter_op_threads(std::max(1, std::min(4, cores / 2)));
  // With a global batch, from 8 cores on, half the parser threads' worth of cores is left to the
  // input pipeline and the trainer thread: a tower that shares its core with them holds up every
  // step's barrier (16 cores: 10 to 14 towers ran 122,000-136,000 ex/s, 16 towers 95,000-115,000;
  // docs/PERFORMANCE.md "Many cores").
  const int compute_cores =
      global && cores >= 8 ? std::max(1, cores - t->inter_op_threads() / 2) : cores;
  if (t->towers() == 0) {
    if (global) {
      // As many towers as the share keeps at kMinTowerBatch examples or more; the other cores
      // go to the towers' intra-op teams.
      const int64_t share = StepBatch(*train, *t, worker_index, num_workers);
      t->set_towers(static_cast<int>(
          std::max<int64_t>(1, std::min<int64_t>(compute_cores, share / kMinTowerBatch))));
    } else {
      // One tower per core with one OpenMP thread each, so the towers overlap each other's
      // serial parts. `pstrain tune` measures the alternatives on the user's machine.
      t->set_towers(cores);
    }
  }
  if (global) {
    // The largest tower's share: a step's batch is split evenly (TrainStep).
    const int64_t share = StepBatch(*train, *t, worker_index, num_workers);
    train->set_batch_size(static_cast<int>((share + t->towers() - 1) / t->towers()));
  }
  if (t->intra_op_threads() == 0) {
    int intra = std::max(1, compute_cores / t->towers());
    if (omp_num_threads > 0) intra = std::min(intra, omp_num_threads);
    t->set_intra_op_threads(intra);
  }
  std::string note;
  if (omp_num_threads > 0 && t->intra_op_threads() > omp_num_threads) {
    note = absl::StrCat("OMP_NUM_THREADS=", omp_num_threads, " lowers threads.intra_op_threads from ",
                        t->intra_op_threads(), " to ", omp_num_threads);
    t->set_intra_op_threads(omp_num_threads);
  }
  return note;
}

std::string ConfigToText(const google::protobuf::Message& message) {
  std::string out;
  TextFormat::PrintToString(message, &out);
  return out;
}

}  // namespace pstrain
