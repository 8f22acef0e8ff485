#include "worker/tune/search.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/status.h"

namespace pstrain {

int TuneCandidate::batch() const {
  return std::max(1, (step + towers - 1) / std::max(1, towers));
}

bool TuneCandidate::operator<(const TuneCandidate& o) const {
  return std::tie(towers, intra, inter, step) < std::tie(o.towers, o.intra, o.inter, o.step);
}

bool TuneCandidate::operator==(const TuneCandidate& o) const {
  return std::tie(towers, intra, inter, step) == std::tie(o.towers, o.intra, o.inter, o.step);
}

std::string TuneCandidate::Name() const {
  return absl::StrFormat("%dx%dx%d@%d", towers, intra, inter, step);
}

bool TuneSpace::Allowed(const TuneCandidate& c) const {
  if (c.towers < 1 || c.intra < 1 || c.inter < 1 || c.intra > intra_cap) return false;
  const int compute = c.towers * c.intra;
  if (compute > cores) return false;
  if (!search_inter) return c.inter == default_inter;
  return c.inter <= std::min(cores, std::max(1, cores - compute + std::max(1, cores / 4)));
}

std::vector<int> PowersOfTwo(int n) {
  std::vector<int> v;
  for (int p = 1; p <= n; p *= 2) v.push_back(p);
  if (v.back() != n) v.push_back(n);
  return v;
}

CoarseGrid CoarseCandidates(const TuneSpace& space, int global_batch) {
  CoarseGrid grid;
  const std::vector<int> inter_values =
      space.search_inter ? PowersOfTwo(space.cores) : std::vector<int>{space.default_inter};
  for (int t : PowersOfTwo(space.cores)) {
    for (int i : PowersOfTwo(space.cores)) {
      for (int j : inter_values) {
        const TuneCandidate c{t, i, j, global_batch};
        if (space.Allowed(c)) {
          grid.candidates.push_back(c);
        } else {
          ++grid.not_allowed;
        }
      }
    }
  }
  // Fullest compute first, then more towers (they overlap each other's serial parts), then fewer
  // parser threads.
  std::sort(grid.candidates.begin(), grid.candidates.end(),
            [](const TuneCandidate& a, const TuneCandidate& b) {
              return std::make_tuple(-a.towers * a.intra, -a.towers, a.inter) <
                     std::make_tuple(-b.towers * b.intra, -b.towers, b.inter);
            });
  return grid;
}

std::vector<TuneCandidate> NeighbourCandidates(const TuneSpace& space, const TuneCandidate& best) {
  std::vector<TuneCandidate> out;
  for (int dt : {-1, 0, 1}) {
    for (int di : {-1, 0, 1}) {
      for (int dj : {-1, 0, 1}) {
        const TuneCandidate c{best.towers + dt, best.intra + di, best.inter + dj, best.step};
        if (space.Allowed(c)) out.push_back(c);
      }
    }
  }
  return out;
}

std::vector<TuneCandidate> BatchSizeCandidates(const TuneCandidate& best,
                                               const std::vector<int>& batch_sizes) {
  std::vector<TuneCandidate> out;
  for (int size : batch_sizes) {
    const int step = std::min(kMaxBatch, best.towers * size);
    out.push_back(TuneCandidate{best.towers, best.intra, best.inter, step});
  }
  return out;
}

TuneBudget::TuneBudget(Env* env, double budget_s)
    : env_(env), budget_s_(budget_s), start_(env->MonotonicSeconds()) {}

bool TuneBudget::Fits() const {
  if (measured_ == 0) return true;
  return elapsed() + spent_ / measured_ <= budget_s_;
}

void TuneBudget::Charge(double seconds) {
  spent_ += seconds;
  ++measured_;
}

double TuneBudget::elapsed() const { return env_->MonotonicSeconds() - start_; }

namespace {

// The first of the fastest (measuring order breaks ties).
const MeasuredSetting& Fastest(const std::vector<MeasuredSetting>& measured) {
  return *std::max_element(measured.begin(), measured.end(),
                           [](const MeasuredSetting& a, const MeasuredSetting& b) {
                             return a.examples_per_sec < b.examples_per_sec;
                           });
}

// Measures the candidates of one phase in order, skipping those already measured (or already
// found over the budget), while the budget allows.
class Search {
 public:
  Search(const TuneSearchOptions& options, const MeasureFn& measure, TuneResult* result)
      : options_(options),
        measure_(measure),
        result_(result),
        budget_(options.env, options.budget_s) {}

  absl::Status Run(const std::vector<TuneCandidate>& candidates) {
    for (const TuneCandidate& c : candidates) {
      if (!seen_.insert(c).second) continue;
      if (!budget_.Fits()) {
        result_->not_tried.push_back(c);
        continue;
      }
      const double t0 = options_.env->MonotonicSeconds();
      absl::StatusOr<double> eps = measure_(c);
      if (!eps.ok()) return Annotate(eps.status(), c.Name());
      budget_.Charge(options_.env->MonotonicSeconds() - t0);
      result_->measured.push_back({c, *eps});
      if (options_.on_measured) options_.on_measured(result_->measured.back());
    }
    return absl::OkStatus();
  }

  const TuneBudget& budget() const { return budget_; }

 private:
  const TuneSearchOptions& options_;
  const MeasureFn& measure_;
  TuneResult* const result_;
  TuneBudget budget_;
  std::set<TuneCandidate> seen_;
};

}  // namespace

absl::StatusOr<TuneResult> SearchSettings(const TuneSearchOptions& options,
                                          const MeasureFn& measure) {
  TuneResult result;
  result.space = options.space;
  result.global_batch = options.global_batch;
  result.budget_s = options.budget_s;
  result.allow_batch_change = options.allow_batch_change;
  Search search(options, measure, &result);
  CoarseGrid coarse = CoarseCandidates(options.space, options.global_batch);
  result.not_allowed = coarse.not_allowed;
  RETURN_IF_ERROR(search.Run(coarse.candidates));
  RETURN_IF_ERROR(search.Run(NeighbourCandidates(options.space, Fastest(result.measured).c)));
  result.best_fixed = Fastest(result.measured);
  if (!options.batch_sizes.empty()) {
    RETURN_IF_ERROR(search.Run(BatchSizeCandidates(result.best_fixed.c, options.batch_sizes)));
  }
  result.fastest = Fastest(result.measured);
  result.recommended =
      result.batch_changes() && !options.allow_batch_change ? result.best_fixed : result.fastest;
  result.seconds = search.budget().elapsed();
  return result;
}

}  // namespace pstrain
