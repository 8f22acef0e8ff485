#include "ps/store/dynamic_checkpoint.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "common/status.h"
#include "ps/store/dynamic_file.h"

namespace pstrain {
namespace {

// One link's snapshots of one dynamic table, one per shard file that has the table, with the
// shard file each came from.
struct LinkSnapshots {
  std::vector<DynamicSnapshot> parts;
  std::vector<std::string> paths;
  std::vector<bool> own;  // written by this very shard of this shard count
};

// Keeps the rows and tombstones of `part` that `owns` (re-sharding: every old shard's file is
// read and each new shard keeps its keys).
void KeepOwned(int table, const DynamicKeyFilter& owns, DynamicSnapshot* part) {
  if (!owns) return;
  const int64_t n = part->rows();
  const int dim = part->dim, sf = part->state_floats;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!owns(table, part->keys[i])) continue;
    if (kept != i) {
      part->keys[kept] = part->keys[i];
      part->counts[kept] = part->counts[i];
      part->last_pass[kept] = part->last_pass[i];
      part->last_step_of[kept] = part->last_step_of[i];
      std::copy_n(part->weights.begin() + i * dim, dim, part->weights.begin() + kept * dim);
      std::copy_n(part->state.begin() + i * sf, sf, part->state.begin() + kept * sf);
    }
    ++kept;
  }
  part->keys.resize(kept);
  part->counts.resize(kept);
  part->last_pass.resize(kept);
  part->last_step_of.resize(kept);
  part->weights.resize(kept * dim);
  part->state.resize(kept * sf);
  part->deleted.erase(std::remove_if(part->deleted.begin(), part->deleted.end(),
                                     [&](uint64_t key) { return !owns(table, key); }),
                      part->deleted.end());
}

// One snapshot of a link's parts (already cut to the owned keys): rows and tombstones merged in
// key order (each key is in at most one part: every old shard owned its own keys). The sketch
// and the counters: this shard's own part's when the link has one (a restore onto the same
// layout is exact); otherwise (re-sharding) the sketch is the sum of the parts' (saturating):
// a key's counts were in its old shard's sketch only, so the sum never undercounts it (the
// count-min property holds; it overcounts more), and the counters are the parts' sum when
// `sum_counters` (the one store that carries them) and restart at 0 otherwise.
absl::StatusOr<DynamicSnapshot> Merge(LinkSnapshots link, const std::string& name,
                                      bool sum_counters) {
  DynamicSnapshot out;
  const DynamicSnapshot& first = link.parts.front();
  out.dim = first.dim;
  out.optimizer = first.optimizer;
  out.state_floats = first.state_floats;
  out.changed_since = first.changed_since;
  out.sketch_width = first.sketch_width;
  out.sketch_depth = first.sketch_depth;
  int own = -1;
  int64_t rows = 0;
  for (size_t i = 0; i < link.parts.size(); ++i) {
    const DynamicSnapshot& p = link.parts[i];
    if (p.dim != out.dim || p.optimizer != out.optimizer || p.state_floats != out.state_floats ||
        (p.changed_since == 0) != (out.changed_since == 0) ||
        p.sketch_width != out.sketch_width || p.sketch_depth != out.sketch_depth) {
      return absl::DataLossError(absl::StrCat(
          link.paths[i], ": dynamic table '", name, "' has another shape (dim ", p.dim,
          ", state ", p.state_floats, ", sketch ", p.sketch_width, " x ", p.sketch_depth,
          ", delta ", p.changed_since > 0, ") than in ", link.paths[0], " (dim ", out.dim,
          ", state ", out.state_floats, ", sketch ", out.sketch_width, " x ", out.sketch_depth,
          ", delta ", out.changed_since > 0, ")"));
    }
    out.last_step = std::max(out.last_step, p.last_step);
    out.pass = std::max(out.pass, p.pass);
    rows += p.rows();
    if (link.own[i]) own = static_cast<int>(i);
  }
  // Rows in key order across the parts.
  std::vector<std::pair<uint64_t, std::pair<int, int64_t>>> order;
  order.reserve(rows);
  for (size_t i = 0; i < link.parts.size(); ++i) {
    for (int64_t r = 0; r < link.parts[i].rows(); ++r) {
      order.push_back({link.parts[i].keys[r], {static_cast<int>(i), r}});
    }
  }
  std::sort(order.begin(), order.end());
  const int dim = out.dim, sf = out.state_floats;
  out.keys.reserve(rows);
  out.weights.reserve(rows * dim);
  out.state.reserve(rows * sf);
  for (const auto& [key, at] : order) {
    const DynamicSnapshot& p = link.parts[at.first];
    const int64_t r = at.second;
    out.keys.push_back(key);
    out.counts.push_back(p.counts[r]);
    out.last_pass.push_back(p.last_pass[r]);
    out.last_step_of.push_back(p.last_step_of[r]);
    out.weights.insert(out.weights.end(), p.weights.begin() + r * dim,
                       p.weights.begin() + (r + 1) * dim);
    out.state.insert(out.state.end(), p.state.begin() + r * sf, p.state.begin() + (r + 1) * sf);
  }
  for (const DynamicSnapshot& p : link.parts) {
    out.deleted.insert(out.deleted.end(), p.deleted.begin(), p.deleted.end());
  }
  std::sort(out.deleted.begin(), out.deleted.end());
  out.deleted.erase(std::unique(out.deleted.begin(), out.deleted.end()), out.deleted.end());
  if (own >= 0) {
    DynamicSnapshot& p = link.parts[own];
    out.sketch = std::move(p.sketch);
    out.admitted = p.admitted;
    out.rejected = p.rejected;
    out.evicted_ttl = p.evicted_ttl;
    out.evicted_capacity = p.evicted_capacity;
    out.seen = p.seen;
  } else if (sum_counters) {
    for (const DynamicSnapshot& p : link.parts) {
      out.admitted += p.admitted;
      out.rejected += p.rejected;
      out.evicted_ttl += p.evicted_ttl;
      out.evicted_capacity += p.evicted_capacity;
      out.seen += p.seen;
    }
  }
  if (own < 0 && out.sketch_depth > 0) {
    out.sketch.assign(first.sketch.size(), 0);
    for (const DynamicSnapshot& p : link.parts) {
      for (size_t c = 0; c < out.sketch.size() && c < p.sketch.size(); ++c) {
        const uint64_t sum = uint64_t{out.sketch[c]} + p.sketch[c];
        out.sketch[c] = static_cast<uint32_t>(std::min<uint64_t>(sum, UINT32_MAX));
      }
    }
  }
  return out;
}

}  // namespace

absl::Status LoadDynamicTables(absl::Span<const CheckpointLink> chain,
                               absl::Span<DynamicEmbeddingStore* const> stores,
                               absl::Span<const std::string> names, const DynamicKeyFilter& owns,
                               const std::string& own_file, ParameterLoadMode mode,
                               bool carry_counters) {
  if (stores.empty()) return absl::OkStatus();
  std::map<std::string, int> index_of;
  for (int d = 0; d < static_cast<int>(names.size()); ++d) index_of[names[d]] = d;
  for (const CheckpointLink& link : chain) {
    std::vector<LinkSnapshots> tables(stores.size());
    for (const auto& f : link.manifest.file()) {
      // A PS job's shard files hold DYNM groups; a `pstrain train` checkpoint has a file of its
      // own per dynamic table (dynamic-<table>, worker/train/checkpoint.h).
      if (!IsShardFileName(f.name()) && !absl::StartsWith(f.name(), "dynamic-")) continue;
      const std::string path = link.dir + "/" + f.name();
      ASSIGN_OR_RETURN(auto reader, BlockReader::Open(path));
      while (true) {
        ASSIGN_OR_RETURN(std::string tag, reader->PeekTag());
        if (tag.empty()) break;
        if (tag != kDynamicMetaTag) {
          Block b;
          RETURN_IF_ERROR(reader->Next(&b).status());
          continue;
        }
        // Its errors name the file and the block.
        ASSIGN_OR_RETURN(NamedDynamicSnapshot named, ReadDynamicSnapshot(reader.get()));
        const auto it = index_of.find(named.name);
        if (it == index_of.end()) {
          if (mode.skip_unknown_dynamic) continue;  // a warm start: the config dropped it
          return absl::FailedPreconditionError(absl::StrCat(
              path, " holds the rows of dynamic table '", named.name,
              "', which this job's config does not have (its dynamic tables are named by "
              "features.table[*].name)"));
        }
        const int d = it->second;
        const DynamicEmbeddingStore& store = *stores[d];
        if (named.snapshot.dim != store.dim()) {
          return absl::FailedPreconditionError(
              absl::StrCat(path, ": dynamic table '", named.name, "' has rows of ",
                           named.snapshot.dim, " floats, this job's have ", store.dim(),
                           " (1 + the table's dim)"));
        }
        KeepOwned(d, owns, &named.snapshot);
        tables[d].parts.push_back(std::move(named.snapshot));
        tables[d].paths.push_back(path);
        // A warm start (!keep_step) is a new job: its counters restart even from a same-named
        // shard file, and the sketch is the parts' sum.
        tables[d].own.push_back(mode.keep_step && !own_file.empty() && f.name() == own_file);
      }
    }
    for (size_t d = 0; d < tables.size(); ++d) {
      if (tables[d].parts.empty()) continue;  // a table new in this config: it starts empty
      ASSIGN_OR_RETURN(DynamicSnapshot merged,
                       Merge(std::move(tables[d]), names[d], mode.keep_step && carry_counters));
      DynamicEmbeddingStore& store = *stores[d];
      if (!mode.keep_step) {
        // A warm start: the new job counts its own steps and passes (TTL from the restore).
        merged.last_step = 0;
        merged.pass = 0;
        std::fill(merged.last_step_of.begin(), merged.last_step_of.end(), 0);
        std::fill(merged.last_pass.begin(), merged.last_pass.end(), 0);
      }
      if (!mode.keep_optimizer_state) {
        // Fresh slots of the store's own optimizer (a warm start's reset; a served model keeps
        // none: SGD's are empty).
        const Optimizer& opt = *store.options().optimizer;
        merged.optimizer = opt.type();
        merged.state_floats = store.state_floats();
        merged.state.assign(merged.rows() * merged.state_floats, 0.f);
        for (int64_t r = 0; r < merged.rows(); ++r) {
          opt.InitState(merged.state.data() + r * merged.state_floats, merged.dim);
        }
      }
      if (store.options().admission != DynamicEmbeddingStore::Admission::kCount) {
        // A store without an admission sketch (a served model's) takes none.
        merged.sketch.clear();
        merged.sketch_width = 0;
        merged.sketch_depth = 0;
      }
      RETURN_IF_ERROR(Annotate(store.Restore(merged),
                               absl::StrCat(link.dir, ": dynamic table '", names[d], "'")));
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
