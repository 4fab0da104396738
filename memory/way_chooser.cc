#include "memory/way_chooser.h"

#include <algorithm>

#include "core/error.h"

namespace tessel::memory {

WayChooser::WayChooser(int ways, WayChooserOptions options) : options_(options) {
  TESSEL_CHECK(ways >= 1, "WayChooser: needs at least one way, got ", ways);
  TESSEL_CHECK(options_.trial_steps >= 1 && options_.window >= 1 && options_.close_margin >= 0,
               "WayChooser: trial_steps and window must be at least 1 and close_margin at least 0");
  TESSEL_CHECK(options_.give_up_factor > 1, "WayChooser: give_up_factor must be above 1, got ",
               options_.give_up_factor);
  recent_.resize(static_cast<size_t>(ways));
  counted_.assign(static_cast<size_t>(ways), 0);
  given_up_.assign(static_cast<size_t>(ways), 0);
}

double WayChooser::estimate(int way) const {
  std::vector<double> times(recent_[way].begin(), recent_[way].end());
  if (times.empty()) return 0;
  std::sort(times.begin(), times.end());
  const size_t middle = times.size() / 2;
  return times.size() % 2 ? times[middle] : 0.5 * (times[middle - 1] + times[middle]);
}

int WayChooser::best_way() const {
  int best = -1;
  for (int way = 0; way < static_cast<int>(recent_.size()); ++way)
    if (counted_[way] > 0 && !given_up_[way] && (best < 0 || estimate(way) < estimate(best)))
      best = way;
  return best;
}

bool WayChooser::switch_to(int way) {
  const bool changed = way != way_;
  way_ = way;
  settling_ = changed;
  trial_step_ = 0;
  return changed;
}

bool WayChooser::on_step(double seconds) {
  const bool changed = record_step(seconds);
  give_up_after_ = compute_give_up_after();
  return changed;
}

bool WayChooser::record_step(double seconds) {
  if (given_up_step_) {
    given_up_step_ = false;
    return false;
  }
  if (settling_) {
    settling_ = false;
    return false;
  }
  std::deque<double>& recent = recent_[way_];
  recent.push_back(seconds);
  if (static_cast<int>(recent.size()) > options_.window) recent.pop_front();
  ++counted_[way_];
  if (phase_ == Phase::kSteady) {
    const int best = best_way();
    return best != way_ && switch_to(best);
  }
  if (++trial_step_ < options_.trial_steps) return false;
  return end_trial_of_way();
}

bool WayChooser::end_trial_of_way() {
  const int ways = static_cast<int>(recent_.size());
  if (phase_ == Phase::kTrial) {
    if (way_ + 1 < ways) return switch_to(way_ + 1);
    const int best = best_way();
    const double close = (1 + options_.close_margin) * estimate(best);
    for (int way = 0; way < ways; ++way)
      if (way != best && !given_up_[way] && estimate(way) <= close) confirm_queue_.push_back(way);
    std::sort(confirm_queue_.begin(), confirm_queue_.end(),
              [&](int a, int b) { return estimate(a) > estimate(b); });
    phase_ = Phase::kConfirm;
  }
  if (!confirm_queue_.empty()) {
    const int next = confirm_queue_.back();
    confirm_queue_.pop_back();
    return switch_to(next);
  }
  phase_ = Phase::kSteady;
  return switch_to(best_way());
}

double WayChooser::compute_give_up_after() const {
  if (phase_ == Phase::kSteady) return 0;
  bool other_way_left = false;
  for (int way = 0; way < static_cast<int>(given_up_.size()); ++way)
    if (way != way_ && !given_up_[way]) other_way_left = true;
  const int best = best_way();
  if (!other_way_left || best < 0) return 0;
  return options_.give_up_factor * estimate(best);
}

int WayChooser::give_up() {
  TESSEL_CHECK(give_up_after() > 0,
               "WayChooser: no step to give up (steady phase, nothing counted "
               "yet, or the last way left)");
  given_up_[way_] = 1;
  end_trial_of_way();
  given_up_step_ = true;
  give_up_after_ = 0;  // no second bound in the step given up
  const int fastest = best_way();
  return fastest >= 0 ? fastest : way_;
}

}  // namespace tessel::memory
