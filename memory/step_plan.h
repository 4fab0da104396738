// A residency plan for a whole training step, made from the previous step (Capuchin's idea on
// MegTaiChi's access patterns): steps run the same program, so which activations to swap, which
// to drop for recompute, and when to copy swapped ones back can be decided once, ahead of the
// ops, instead of at the moment an allocation finds no room (when a swap's copy can only stall
// the step). `auto` runs such a plan as one of its ways and keeps it where its steps are faster.
//   StepTrace trace;  trace.begin_step();
//   trace.op(position, seconds, in_backward);  trace.output({key, bytes, ...});  trace.read(...)
//   StepPlan plan = plan_step(trace, StepPlanSettings{budget, state_bytes, bandwidth});
//   for (const PlannedAction& action : plan.actions_after(position)) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace tessel::memory {

// One tensor an op of the step made, named by its AccessPattern key.
struct TracedTensor {
  uint64_t key = 0;
  size_t bytes = 0;
  int64_t made_at = 0;               // the op's position in the step
  double producer_seconds = 0;       // the op's cost (what a recompute runs)
  bool recomputable = false;         // it has an op record (made in forward, by a managed op)
  std::vector<uint64_t> input_keys;  // its op's inputs (0: a tensor no op of the step made)
};

// What one training step ran: per op its cost and pass, per tensor what made it and where it was
// read. Positions count the ops from the step's first.
class StepTrace {
 public:
  // Programs without steps (inference) would grow a trace forever: positions from this one on
  // are not recorded (the zoo's largest training steps run tens of thousands of ops).
  static constexpr int64_t kMaxPositions = int64_t{1} << 18;

  void clear();
  void op(int64_t position, double seconds, bool in_backward);
  void output(TracedTensor tensor);
  void read(uint64_t key, int64_t position);

  int64_t length() const { return static_cast<int64_t>(seconds_.size()); }
  double seconds(int64_t position) const { return seconds_[position]; }
  bool in_backward(int64_t position) const { return backward_[position] != 0; }
  const std::vector<TracedTensor>& tensors() const { return tensors_; }
  // Ascending positions at which `key` was read (its making not counted); empty if never.
  const std::vector<int64_t>& reads(uint64_t key) const;

 private:
  std::vector<double> seconds_;
  std::vector<char> backward_;
  std::vector<TracedTensor> tensors_;
  std::unordered_map<uint64_t, std::vector<int64_t>> reads_;
};

struct StepPlanSettings {
  size_t budget = 0;                 // device bytes the step must stay within
  size_t state_bytes = 0;            // held through the whole step (parameters, optimizer state)
  double link_bytes_per_second = 0;  // each way (<= 0: swapping is not planned)
  double headroom = 0.1;             // part of the budget left for fragmentation and workspaces
  size_t min_bytes = 0;              // smaller tensors are left alone
};

struct PlannedAction {
  enum class Kind { kSwapOut, kEvict, kPrefetch };
  Kind kind;
  uint64_t key;
};

struct StepPlan {
  // Actions to take once the op at a position has run.
  std::vector<std::vector<PlannedAction>> after;
  size_t swapped_bytes = 0;
  size_t evicted_bytes = 0;
  double recompute_seconds = 0;  // the evicted tensors' op costs
  // The planned peak (without headroom), and where the plan could not bring it within budget.
  size_t peak_bytes = 0;
  bool fits = true;
  int64_t length() const { return static_cast<int64_t>(after.size()); }
  std::string summary() const;
};

// Plans the step `trace` ran: activations read again in backward are swapped where the host
// link hides both copies (those dearest to recompute first), then dropped for recompute (the
// cheapest per byte first, each recomputable from tensors the plan keeps), until every position
// fits the budget less the headroom, or nothing more helps.
StepPlan plan_step(const StepTrace& trace, const StepPlanSettings& settings);

}  // namespace tessel::memory
