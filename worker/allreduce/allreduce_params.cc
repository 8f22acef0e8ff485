#include "worker/allreduce/allreduce_params.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/dynamic_rows.h"
#include "common/status.h"

namespace pstrain {
namespace {

// What a rank does in a round.
enum Kind : int64_t {
  kStep = 1,    // Push: its gradients of one step
  kJoined = 2,  // its data ran out: empty gradients, waiting for the others to finish
  kSave = 3,    // a checkpoint at a step boundary
};

// DynamicEmbeddingStore's stripes (its kStripes): each opens its own chunks of slots.
constexpr int64_t kDynamicStripes = 1024;

const char* KindName(int64_t kind) {
  return kind == kStep ? "step" : kind == kJoined ? "joined" : kind == kSave ? "save" : "?";
}

}  // namespace

// All int64 so that one MPI_Allgather of kHeaderWords MPI_INT64_T carries it. `stop`: 0, 1 (a
// stop signal) or 2 (the end of the pass: EndPass).
struct AllreduceParams::Header {
  int64_t kind, step, n_ids, stop, due;
};

absl::StatusOr<std::unique_ptr<AllreduceParams>> AllreduceParams::Create(
    std::unique_ptr<LocalParams> replica, AllreduceOptions options) {
  int rank = 0, size = 1;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (replica->dense_size() > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("dense size ", replica->dense_size(),
                                                   " exceeds MPI's int counts"));
  }
  if (options.sparse_as_dense && replica->num_dynamic() > 0) {
    // The dense buffer is indexed by row number; a dynamic row has a 64-bit key instead.
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce.sparse_as_dense: table '", replica->dynamic_name(0),
        "' is dynamic (rows keyed by the id's 64-bit hash), which has no row range to allreduce "
        "as a dense buffer; use the allgather (the default: allreduce.sparse_as_dense false)"));
  }
  if (options.sparse_as_dense) {
    const int64_t floats = replica->total_rows() * (replica->row_dim() + 1);
    if (floats * 4 > options.max_dense_table_bytes || floats > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "allreduce.sparse_as_dense: the embedding table's gradient is %d rows x (%d + 1) floats = "
          "%.1f MB per step, above the limit of %.1f MB (allreduce.max_dense_table_mb); allgather "
          "(the default) moves only the rows a batch touches",
          replica->total_rows(), replica->row_dim(), floats * 4 / 1e6,
          options.max_dense_table_bytes / 1e6));
    }
  }
  return std::unique_ptr<AllreduceParams>(
      new AllreduceParams(std::move(replica), std::move(options), rank, size));
}

AllreduceParams::AllreduceParams(std::unique_ptr<LocalParams> replica, AllreduceOptions options,
                                 int rank, int size)
    : replica_(std::move(replica)),
      opt_(std::move(options)),
      rank_(rank),
      size_(size),
      deltas_(opt_.incremental_every),
      last_checkpoint_time_(opt_.env->MonotonicSeconds()) {}

absl::Status AllreduceParams::Check(int rc, const char* call, int64_t step) const {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return absl::UnavailableError(absl::StrCat(
      "rank ", rank_, " of ", size_, ": ", call, " failed at step ", step, ": ",
      absl::string_view(text, len), " (another rank failed or the network broke)"));
}

absl::Status AllreduceParams::Pull(absl::Span<const int64_t> ids, float* rows, float* dense) {
  return replica_->Pull(ids, rows, dense);
}

bool AllreduceParams::TakeCheckpointRequest() {
  return std::exchange(checkpoint_requested_, false);
}

absl::StatusOr<std::vector<AllreduceParams::Header>> AllreduceParams::ExchangeHeaders(
    int64_t kind, int64_t step, int64_t n_ids, bool due) {
  const bool signalled = opt_.local_stop != nullptr && opt_.local_stop->load();
  const int64_t stop = end_pass_ ? 2 : signalled ? 1 : 0;
  Header mine{kind, step, n_ids, stop, due};
  constexpr int kHeaderWords = sizeof(Header) / sizeof(int64_t);
  std::vector<Header> all(size_);
  RETURN_IF_ERROR(Check(MPI_Allgather(&mine, kHeaderWords, MPI_INT64_T, all.data(), kHeaderWords,
                                      MPI_INT64_T, MPI_COMM_WORLD),
                        "MPI_Allgather (round header)", step));
  CountAllgather(sizeof(Header));
  for (const Header& h : all) {
    // The end of the pass wins over a signal at the same step: the pass is over either way.
    if (h.stop == 2) pass_ended_ = true;
    if (h.stop != 0) agreed_stop_ = true;
    if (h.due) checkpoint_requested_ = true;
  }
  return all;
}

absl::Status AllreduceParams::Push(absl::Span<const int64_t> ids, const float* row_grads,
                                   const float* dense_grad, int64_t step) {
  // The step schedule needs no agreement (ScheduledAt); rank 0's clock does.
  const bool due =
      rank_ == 0 && opt_.checkpoint_every_seconds > 0 &&
      opt_.env->MonotonicSeconds() - last_checkpoint_time_ >= opt_.checkpoint_every_seconds;
  ASSIGN_OR_RETURN(std::vector<Header> all,
                   ExchangeHeaders(kStep, step, static_cast<int64_t>(ids.size()), due));
  for (int r = 0; r < size_; ++r) {
    if (all[r].kind == kSave) {
      return absl::InternalError(absl::StrCat("rank ", rank_, " is at step ", step, " while rank ",
                                              r, " checkpoints: the ranks are out of step"));
    }
  }
  return Exchange(all, ids, row_grads, dense_grad);
}

absl::Status AllreduceParams::Exchange(const std::vector<Header>& all,
                                       absl::Span<const int64_t> ids, const float* row_grads,
                                       const float* dense_grad) {
  int active = 0;
  int64_t step = 0;
  for (const Header& h : all) {
    if (h.kind != kStep) continue;
    ++active;
    step = std::max(step, h.step);
  }
  const float scale = 1.0f / static_cast<float>(active);
  const int D = row_dim();
  const int64_t dsz = dense_size();

  // Dense: one fused buffer. A joined rank contributes zeros.
  if (dense_grad != nullptr) {
    dense_.assign(dense_grad, dense_grad + dsz);
  } else {
    dense_.assign(dsz, 0.0f);
  }
  if (size_ > 1) {
    RETURN_IF_ERROR(Check(MPI_Allreduce(MPI_IN_PLACE, dense_.data(), static_cast<int>(dsz),
                                        MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                          "MPI_Allreduce (dense gradient)", step));
    CountAllreduce(dsz * 4);
  }
  for (float& g : dense_) g *= scale;

  merged_ids_.clear();
  merged_rows_.clear();
  if (opt_.sparse_as_dense) {
    // [rows x D gradients][rows flags]: a flag counts the ranks that touched the row, so that
    // exactly the rows of the allgather path are updated (also those whose gradient is zero).
    const int64_t rows = replica_->total_rows();
    table_.assign(rows * (D + 1), 0.0f);
    float* flags = table_.data() + rows * D;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::copy(row_grads + i * D, row_grads + (i + 1) * D, table_.data() + ids[i] * D);
      flags[ids[i]] = 1.0f;
    }
    if (size_ > 1) {
      RETURN_IF_ERROR(Check(MPI_Allreduce(MPI_IN_PLACE, table_.data(),
                                          static_cast<int>(table_.size()), MPI_FLOAT, MPI_SUM,
                                          MPI_COMM_WORLD),
                            "MPI_Allreduce (embedding table gradient)", step));
      CountAllreduce(static_cast<int64_t>(table_.size()) * 4);
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (flags[r] == 0.0f) continue;
      merged_ids_.push_back(r);
      const float* g = table_.data() + r * D;
      for (int d = 0; d < D; ++d) merged_rows_.push_back(g[d] * scale);
    }
  } else {
    counts_.resize(size_);
    displs_.resize(size_);
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      displs_[r] = static_cast<int>(total);
      counts_[r] = static_cast<int>(all[r].n_ids);
      total += all[r].n_ids;
    }
    if (total * D > INT_MAX) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "step ", step, ": ", total, " gradient rows over all ranks exceed MPI's int counts"));
    }
    all_ids_.resize(total);
    all_rows_.resize(total * D);
    const int64_t dummy_id = 0;
    const float dummy_row = 0;
    RETURN_IF_ERROR(Check(
        MPI_Allgatherv(ids.empty() ? &dummy_id : ids.data(), static_cast<int>(ids.size()),
                       MPI_INT64_T, all_ids_.data(), counts_.data(), displs_.data(), MPI_INT64_T,
                       MPI_COMM_WORLD),
        "MPI_Allgatherv (sparse ids)", step));
    for (int r = 0; r < size_; ++r) {
      counts_[r] *= D;
      displs_[r] *= D;
    }
    RETURN_IF_ERROR(Check(
        MPI_Allgatherv(ids.empty() ? &dummy_row : row_grads, static_cast<int>(ids.size() * D),
                       MPI_FLOAT, all_rows_.data(), counts_.data(), displs_.data(), MPI_FLOAT,
                       MPI_COMM_WORLD),
        "MPI_Allgatherv (sparse gradient rows)", step));
    CountAllgather(static_cast<int64_t>(ids.size()) * (8 + 4 * D));
    // Sum per id in the order of the gathered buffer (rank 0's rows first), which is the same
    // on every rank: the same float additions in the same order give bit-identical sums.
    slot_.clear();
    for (int64_t i = 0; i < total; ++i) {
      const float* g = all_rows_.data() + i * D;
      auto [it, inserted] = slot_.try_emplace(all_ids_[i], static_cast<int64_t>(merged_ids_.size()));
      if (inserted) {
        merged_ids_.push_back(all_ids_[i]);
        merged_rows_.insert(merged_rows_.end(), g, g + D);
      } else {
        float* out = merged_rows_.data() + it->second * D;
        for (int d = 0; d < D; ++d) out[d] += g[d];
      }
    }
    for (float& g : merged_rows_) g *= scale;
  }
  RETURN_IF_ERROR(CheckReplicaGrowth(step));
  last_step_ = step;
  return replica_->Push(merged_ids_, merged_rows_.data(), dense_.data(), step);
}

absl::Status AllreduceParams::CheckReplicaGrowth(int64_t step) const {
  if (opt_.replica_budget_bytes < 0) return absl::OkStatus();
  // The most this step can add (EmbeddingStore's allocation units): every merged row new, each
  // in a new arena chunk's worth of rows at most, and each opening an index page not yet there.
  // With a store per table (compact widths), the widest row bounds every row, and each store
  // may open a chunk.
  // Dynamic rows (negative ids) go to their tables' stores, counted apart below.
  std::vector<int64_t> dynamic_ids(replica_->num_dynamic(), 0);
  int64_t rows_added = 0;
  for (const int64_t id : merged_ids_) {
    if (IsDynamicRow(id)) {
      const int d = DynamicTableOf(id);
      if (d < static_cast<int>(dynamic_ids.size())) ++dynamic_ids[d];
    } else {
      ++rows_added;
    }
  }
  int64_t row_bytes = 0, growth = 0;
  for (const EmbeddingStore* store : replica_->embeddings()) {
    const EmbeddingStore::Stats st = store->stats();
    row_bytes = std::max<int64_t>(row_bytes, (store->dim() + store->state_floats()) * 4);
    growth += st.chunk_bytes +
              std::min(rows_added * st.index_page_bytes, st.max_index_bytes - st.index_bytes);
  }
  growth += rows_added * row_bytes;
  // A dynamic table's store (ps/store/dynamic_store.h), every id new and admitted: its slot and
  // map entry (bytes_per_row), a new chunk of chunk_rows slots for each new row at most (one a
  // stripe, 1024 stripes), every stripe's map doubling at most once (its current bytes) and the
  // key in the change log (8 bytes, twice for the log's doubling).
  // Admission rejects most first sightings, so this is far above what a step adds.
  for (int d = 0; d < replica_->num_dynamic(); ++d) {
    if (dynamic_ids[d] == 0) continue;
    const DynamicEmbeddingStore& store = *replica_->dynamic_store(d);
    const int64_t n = dynamic_ids[d];
    const int64_t chunks = std::min<int64_t>(n, kDynamicStripes);
    growth += (n + chunks * (store.options().chunk_rows - 1)) * store.bytes_per_row() +
              store.metrics().map_bytes + 2 * n * static_cast<int64_t>(sizeof(uint64_t));
  }
  const int64_t now = replica_->memory().total_bytes;
  if (now + growth <= opt_.replica_budget_bytes) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "at step %d the replica holds %.0f MB and this step's %d rows could take it past the %.0f "
      "MB this rank may use: stopping before it does (the OOM killer would end the job without "
      "a word). Every rank holds every trained row; the parameter server (`pstrain host`) "
      "splits them over the shards",
      step, now / 1048576.0, static_cast<int64_t>(merged_ids_.size()),
      opt_.replica_budget_bytes / 1048576.0));
}

absl::Status AllreduceParams::EvictDynamic(const WorkerState& state, int64_t* step) {
  // The pass ends only when every rank read all its data (a rank whose data ran out sits in a
  // checkpoint of the others' with a finished state); the step is the job's. One MPI_MAX of
  // {step, 1 - pass end} gives both to every rank.
  const bool pass_end = state.finished() && !state.max_steps_reached();
  int64_t agreed[2] = {*step, pass_end ? 0 : 1};
  if (size_ > 1) {
    RETURN_IF_ERROR(Check(MPI_Allreduce(MPI_IN_PLACE, agreed, 2, MPI_INT64_T, MPI_MAX,
                                        MPI_COMM_WORLD),
                          "MPI_Allreduce (dynamic tables' eviction point)", *step));
    CountAllreduce(16);
  }
  *step = agreed[0];
  WorkerState at;
  at.set_step(agreed[0]);
  at.set_finished(agreed[1] == 0);
  // The same rows, metadata and step on every rank: the same victims (the store breaks ties by
  // key), the same sketch ageing.
  EvictDynamicTables(at, opt_.checkpoint_every_steps, replica_.get());
  if (rank_ != 0) {
    // Rank 0's checkpoints raise its stores' generations and drop their change logs (rows and
    // tombstones logged for deltas); the other ranks write nothing, so they drop theirs here,
    // or their logs would grow with every key ever updated or evicted.
    for (int d = 0; d < replica_->num_dynamic(); ++d) {
      DynamicEmbeddingStore* s = replica_->dynamic_store(d);
      s->BeginGeneration(s->generation() + 1, s->generation() + 1);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> AllreduceParams::SaveRound(const WorkerState& state) {
  // Every rank records the job's step (a rank whose data ran out counted fewer steps of its
  // own): the checkpoint is named after it and every rank resumes from it.
  WorkerState job_state = state;
  int64_t step = std::max(state.step(), last_step_);
  if (replica_->num_dynamic() > 0) RETURN_IF_ERROR(EvictDynamic(state, &step));
  job_state.set_step(step);
  const std::string mine = job_state.SerializeAsString();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size_), offsets(size_);
  RETURN_IF_ERROR(Check(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD),
                        "MPI_Gather (worker state sizes)", step));
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[r] = total;
    total += lens[r];
  }
  std::string gathered(rank_ == 0 ? total : 0, '\0');
  RETURN_IF_ERROR(Check(MPI_Gatherv(mine.data(), len, MPI_BYTE, gathered.data(), lens.data(),
                                    offsets.data(), MPI_BYTE, 0, MPI_COMM_WORLD),
                        "MPI_Gatherv (worker states)", step));
  if (rank_ != 0) bytes_sent_ += 4 + len;

  // Rank 0 writes; its result (the directory, or the error) is broadcast so that every rank
  // returns the same thing.
  absl::StatusOr<std::string> written = std::string();
  if (rank_ == 0) {
    std::map<int, WorkerState> states;
    for (int r = 0; r < size_; ++r) {
      if (!states[r].ParseFromArray(gathered.data() + offsets[r], lens[r])) {
        written = absl::InternalError(absl::StrCat("worker state of rank ", r, " does not parse"));
        break;
      }
    }
    if (written.ok()) {
      written = SaveCheckpoint(opt_.checkpoint_dir, step, states, *replica_, opt_.keep,
                               absl::StrCat("pstrain allreduce (", size_, " ranks)"),
                               opt_.model, &deltas_);
    }
  }
  int64_t code_len[2] = {0, 0};
  std::string text;
  if (rank_ == 0) {
    text = written.ok() ? *written : std::string(written.status().message());
    code_len[0] = static_cast<int64_t>(written.status().code());
    code_len[1] = static_cast<int64_t>(text.size());
  }
  RETURN_IF_ERROR(Check(MPI_Bcast(code_len, 2, MPI_INT64_T, 0, MPI_COMM_WORLD),
                        "MPI_Bcast (checkpoint result)", step));
  text.resize(code_len[1]);
  RETURN_IF_ERROR(Check(MPI_Bcast(text.data(), static_cast<int>(code_len[1]), MPI_CHAR, 0,
                                  MPI_COMM_WORLD),
                        "MPI_Bcast (checkpoint result)", step));
  if (rank_ == 0) bytes_sent_ += (size_ - 1) * (16 + code_len[1]);
  last_checkpoint_time_ = opt_.env->MonotonicSeconds();
  if (code_len[0] == 0) checkpoint_step_ = step;
  if (rank_ == 0) return written;
  if (code_len[0] != 0) {
    return absl::Status(static_cast<absl::StatusCode>(code_len[0]),
                        absl::StrCat("rank 0 could not write the checkpoint: ", text));
  }
  return text;
}

absl::StatusOr<std::string> AllreduceParams::Save(const WorkerState& state, bool final) {
  if (!final) {
    ASSIGN_OR_RETURN(std::vector<Header> all, ExchangeHeaders(kSave, state.step(), 0, false));
    for (int r = 0; r < size_; ++r) {
      if (all[r].kind == kStep) {
        return absl::InternalError(absl::StrCat("rank ", rank_, " checkpoints at step ",
                                                state.step(), " while rank ", r,
                                                " steps: the ranks are out of step"));
      }
    }
    return SaveRound(state);
  }
  // This rank's data ran out: take part in the others' rounds until every rank has finished.
  std::string dir;
  while (true) {
    ASSIGN_OR_RETURN(std::vector<Header> all, ExchangeHeaders(kJoined, state.step(), 0, false));
    int steps = 0, saves = 0;
    for (const Header& h : all) {
      steps += h.kind == kStep;
      saves += h.kind == kSave;
    }
    if (steps > 0 && saves > 0) {
      return absl::InternalError(absl::StrCat("round with both steps and checkpoints (",
                                              KindName(all[0].kind), " on rank 0)"));
    }
    if (steps > 0) {
      RETURN_IF_ERROR(Exchange(all, {}, nullptr, nullptr));
      continue;
    }
    // A checkpoint of the others (scheduled, or because of SIGTERM: then they stop after it and
    // so does this rank), or every rank has finished: the final checkpoint.
    ASSIGN_OR_RETURN(dir, SaveRound(state));
    if (saves == 0 || agreed_stop_) return dir;
  }
}

absl::StatusOr<std::optional<std::string>> AllreduceParams::Restore(WorkerState* state) {
  absl::StatusOr<std::optional<std::string>> restored =
      RestoreLatestCheckpoint(opt_.checkpoint_dir, replica_.get(), state, rank_, size_,
                              opt_.model, &deltas_);
  if (restored.ok()) {
    restored = RestoreOrWarmStart(*std::move(restored), opt_.warm_start, [&] {
      return WarmStartParams(*opt_.warm_start, opt_.model, replica_.get());
    });
  }
  // -2: failed, -1: fresh start, else the step restored. Exchanged before returning any error so
  // that no rank is left waiting for the others.
  int64_t mine = !restored.ok() ? -2 : *restored ? state->step() : -1;
  std::vector<int64_t> all(size_);
  RETURN_IF_ERROR(Check(MPI_Allgather(&mine, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T,
                                      MPI_COMM_WORLD),
                        "MPI_Allgather (restored step)", 0));
  CountAllgather(8);
  if (!restored.ok()) return restored.status();
  if (*restored) last_step_ = checkpoint_step_ = state->step();
  for (int r = 0; r < size_; ++r) {
    if (all[r] == -2) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r, " could not restore from ", opt_.checkpoint_dir,
                       " (its error is in its log)"));
    }
    if (all[r] != all[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the ranks restored different checkpoints from ", opt_.checkpoint_dir, ": rank 0 ",
          all[0] < 0 ? "none" : absl::StrCat("step ", all[0]), ", rank ", r, " ",
          all[r] < 0 ? "none" : absl::StrCat("step ", all[r]),
          "; every rank must see the same checkpoint directory (a shared file system)"));
    }
  }
  return restored;
}

uint32_t AllreduceParams::ReplicaChecksum() const {
  uint32_t crc = 0;
  auto add = [&crc](const auto& v) {
    crc = crc32c::Extend(crc, v.data(), v.size() * sizeof(v[0]));
  };
  // Range by range: a copy of the whole replica would double a rank's memory at its end.
  constexpr int64_t kRange = int64_t{1} << 20;
  for (const EmbeddingStore* store : replica_->embeddings()) {
    for (int64_t from = store->begin(); from < store->end(); from += kRange) {
      const EmbeddingSnapshot rows = store->Snapshot(from, from + kRange);
      add(rows.ids);
      add(rows.weights);
      add(rows.state);
    }
  }
  // The dynamic tables: rows, their metadata (count, last pass and step), the admission sketch
  // and the counters, so that admissions and evictions must agree too. A full copy of each
  // table (transient, at the end of the job).
  for (int d = 0; d < replica_->num_dynamic(); ++d) {
    absl::StatusOr<DynamicSnapshot> s = replica_->dynamic_store(d)->Snapshot(0);
    if (!s.ok()) continue;  // a full snapshot does not fail
    add(s->keys);
    add(s->weights);
    add(s->state);
    add(s->counts);
    add(s->last_pass);
    add(s->last_step_of);
    add(s->sketch);
    const int64_t counters[] = {s->last_step,   s->pass,       s->admitted,
                                s->rejected,    s->evicted_ttl, s->evicted_capacity,
                                s->seen};
    crc = crc32c::Extend(crc, counters, sizeof(counters));
  }
  const DenseSnapshot dense = replica_->dense()->Snapshot();
  add(dense.weights);
  add(dense.state);
  return crc;
}

absl::Status AllreduceParams::Finish(TrainSummary* summary) {
  if (agreed_stop_ && !pass_ended_) return absl::OkStatus();
  const uint32_t crc = ReplicaChecksum();
  std::printf("pstrain allreduce: rank %d of %d: replica crc32c %08x after step %lld\n", rank_,
              size_, crc, static_cast<long long>(last_step_));
  std::fflush(stdout);
  const StoreMemory memory = replica_->memory();
  struct Totals {
    int64_t crc, examples, examples_this_run;
    double examples_per_sec;
    StoreMemory memory;
  } mine{crc, summary->examples, summary->examples_this_run, summary->examples_per_sec, memory};
  std::vector<Totals> all(size_);
  RETURN_IF_ERROR(Check(MPI_Allgather(&mine, sizeof(Totals), MPI_BYTE, all.data(),
                                      sizeof(Totals), MPI_BYTE, MPI_COMM_WORLD),
                        "MPI_Allgather (replica checksums)", last_step_));
  CountAllgather(sizeof(Totals));
  // The pass's steps (a rank whose data ran out early did fewer); every rank began the pass at
  // the same step.
  summary->steps = last_step_ - summary->pass_first_step;
  summary->examples = 0;
  summary->examples_this_run = 0;
  summary->examples_per_sec = 0;
  summary->memory_per = "rank";
  summary->memory.clear();
  for (int r = 0; r < size_; ++r) {
    if (all[r].crc != all[0].crc) {
      return absl::InternalError(absl::StrFormat(
          "the replicas diverged: rank 0 has crc32c %08x, rank %d has %08x", all[0].crc, r,
          all[r].crc));
    }
    summary->examples += all[r].examples;
    summary->examples_this_run += all[r].examples_this_run;
    summary->examples_per_sec += all[r].examples_per_sec;
    summary->memory.push_back(all[r].memory);
  }
  // Every rank's bytes including this last exchange's.
  int64_t bytes = bytes_sent_;
  RETURN_IF_ERROR(Check(MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_INT64_T, MPI_SUM,
                                      MPI_COMM_WORLD),
                        "MPI_Allreduce (bytes sent)", last_step_));
  summary->wire_bytes = bytes;
  return absl::OkStatus();
}

}  // namespace pstrain
