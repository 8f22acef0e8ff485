#include "ps/server/answer_budget.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pstrain {

AnswerBudget::AnswerBudget(int64_t budget, std::string owner, Timer* timer, Env* env)
    : budget_(budget),
      owner_(std::move(owner)),
      waiting_({owner_, "pulls waiting for the answer budget", kMaxWaiting}, &mu_, timer, env,
               [](Waiter* w, absl::Status status) { w->Refuse(std::move(status)); },
               [this](Waiter* w, absl::Duration waited) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                 return Expired(w->bytes_, waited);  // under mu_ (the list's lock)
               }) {}

absl::Status AnswerBudget::TooLarge(int64_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      owner_, ": a pull answering ", bytes, " bytes exceeds the shard's answer budget (", budget_,
      " bytes, cluster.answer_budget_mb)"));
}

absl::Status AnswerBudget::Expired(int64_t bytes, absl::Duration waited) const {
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s: a pull answering %d bytes waited %.1f s for the shard's answer budget (%d bytes, "
      "cluster.answer_budget_mb; %d in flight, %d pulls waiting)",
      owner_, bytes, absl::ToDoubleSeconds(waited), budget_, used_, waiting_.size()));
}

void AnswerBudget::Acquire(Waiter* waiter, int64_t bytes, absl::Time until) {
  if (bytes > budget_) {
    waiter->Refuse(TooLarge(bytes));
    return;
  }
  absl::Status refused;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (waiting_.size() == 0 && used_ + bytes <= budget_) {
      used_ += bytes;
      peak_ = std::max(peak_, used_);
    } else if (refused = waiting_.CanHold(); refused.ok()) {
      waiter->bytes_ = bytes;
      id = waiting_.Hold(waiter);
      ++waited_;
    }
  }
  if (!refused.ok()) {
    waiter->Refuse(std::move(refused));
  } else if (id == 0) {
    waiter->Admit();
  } else {
    waiting_.Arm(id, until);
  }
}

void AnswerBudget::Release(int64_t bytes) {
  std::vector<Waiter*> admit;
  {
    absl::MutexLock lock(&mu_);
    used_ -= bytes;
    bool blocked = false;
    waiting_.TakeIf([&](Waiter* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (blocked || used_ + w->bytes_ > budget_) {
        blocked = true;  // in arrival order: none passes the first that does not fit
        return false;
      }
      used_ += w->bytes_;
      peak_ = std::max(peak_, used_);
      admit.push_back(w);
      return true;
    });
  }
  for (Waiter* w : admit) w->Admit();
}

void AnswerBudget::Cancel(Waiter* waiter) {
  waiting_.Cancel(waiter, absl::CancelledError(absl::StrCat(
                              owner_, ": the pull was cancelled while waiting for the budget")));
}

void AnswerBudget::Stop() { waiting_.Stop(); }

int64_t AnswerBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

int64_t AnswerBudget::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

int64_t AnswerBudget::waited() const {
  absl::MutexLock lock(&mu_);
  return waited_;
}

}  // namespace pstrain
