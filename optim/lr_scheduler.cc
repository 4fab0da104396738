#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"

namespace tessel::optim {

namespace {

constexpr double kPi = 3.14159265358979323846;

// Steps are stored as doubles in scalar state; they stay exact below 2^53.
constexpr double kMaxExactStep = 9007199254740992.0;

void check_warmup_and_total(const char* scheduler, int64_t warmup_steps, int64_t total_steps) {
  TESSEL_CHECK(warmup_steps >= 0, scheduler, ": warmup_steps must be >= 0, got ", warmup_steps);
  TESSEL_CHECK(total_steps > 0, scheduler, ": total_steps must be > 0, got ", total_steps);
  TESSEL_CHECK(warmup_steps <= total_steps, scheduler, ": warmup_steps (", warmup_steps,
               ") must not exceed total_steps (", total_steps, ")");
}

// Fraction of the warmup done at `step` (< warmup_steps).
double warmup_fraction(int64_t step, int64_t warmup_steps) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
}

}  // namespace

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer), base_lr_(optimizer.lr()) {}

void LRScheduler::apply_initial_lr() { optimizer_.set_lr(lr_at(0)); }

void LRScheduler::step() {
  ++step_count_;
  optimizer_.set_lr(lr_at(step_count_));
}

NamedScalars LRScheduler::state_scalars() const {
  return {{"step_count", static_cast<double>(step_count_)}, {"base_lr", base_lr_}};
}

void LRScheduler::load_state_scalars(const NamedScalars& scalars) {
  std::vector<std::string> problems;
  std::set<std::string> given;
  double step_count = -1;
  double base_lr = -1;
  for (const auto& [key, value] : scalars) {
    if (!given.insert(key).second) {
      problems.push_back("'" + key + "' appears twice");
    } else if (key == "step_count") {
      if (value >= 0 && value == std::floor(value) && value < kMaxExactStep) {
        step_count = value;
      } else {
        problems.push_back("'step_count' must be a non-negative whole number, got " +
                           std::to_string(value));
      }
    } else if (key == "base_lr") {
      if (std::isfinite(value) && value >= 0) {
        base_lr = value;
      } else {
        problems.push_back("'base_lr' must be finite and >= 0, got " + std::to_string(value));
      }
    } else {
      problems.push_back("unexpected scalar '" + key + "' (expected step_count, base_lr)");
    }
  }
  for (const char* key : {"step_count", "base_lr"})
    if (!given.count(key)) problems.push_back(std::string("missing '") + key + "'");
  std::string message;
  for (const auto& problem : problems) message += "\n  " + problem;
  TESSEL_CHECK(problems.empty(), name(),
               ": load_state_scalars failed, nothing was loaded:", message);

  const int64_t old_step_count = step_count_;
  const double old_base_lr = base_lr_;
  step_count_ = static_cast<int64_t>(step_count);
  base_lr_ = base_lr;
  try {
    optimizer_.set_lr(lr_at(step_count_));
  } catch (...) {
    step_count_ = old_step_count;
    base_lr_ = old_base_lr;
    throw;
  }
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  TESSEL_CHECK(step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
  TESSEL_CHECK(std::isfinite(gamma) && gamma >= 0, "StepLR: gamma must be finite and >= 0, got ",
               gamma);
  apply_initial_lr();
}

double StepLR::lr_at(int64_t step) const {
  return base_lr() * std::pow(gamma_, static_cast<double>(step / step_size_));
}

CosineWithWarmup::CosineWithWarmup(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                                   double min_lr)
    : LRScheduler(optimizer),
      warmup_steps_(warmup_steps),
      total_steps_(total_steps),
      min_lr_(min_lr) {
  check_warmup_and_total("CosineWithWarmup", warmup_steps, total_steps);
  TESSEL_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= base_lr(),
               "CosineWithWarmup: min_lr must be in [0, base lr = ", base_lr(), "], got ", min_lr);
  apply_initial_lr();
}

double CosineWithWarmup::lr_at(int64_t step) const {
  if (step < warmup_steps_) return base_lr() * warmup_fraction(step, warmup_steps_);
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps_) /
                        static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup_steps_)));
  // A restored base_lr below min_lr would make the cosine climb; never go under 0 either way.
  const double floor_lr = std::min(min_lr_, base_lr());
  return floor_lr + (base_lr() - floor_lr) * 0.5 * (1.0 + std::cos(kPi * progress));
}

LinearWarmupDecay::LinearWarmupDecay(Optimizer& optimizer, int64_t warmup_steps,
                                     int64_t total_steps)
    : LRScheduler(optimizer), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  check_warmup_and_total("LinearWarmupDecay", warmup_steps, total_steps);
  apply_initial_lr();
}

double LinearWarmupDecay::lr_at(int64_t step) const {
  if (step < warmup_steps_) return base_lr() * warmup_fraction(step, warmup_steps_);
  const double remaining = static_cast<double>(total_steps_ - step) /
                           static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup_steps_));
  return base_lr() * std::max(0.0, remaining);
}

}  // namespace tessel::optim
