// WayChooser: which of a few interchangeable ways of running a training step to keep, judged by
// the steps' own times (auto's ways of meeting a memory budget).
//
// Step times are noisy where the machine is shared (10-20% from step to step on two busy cores,
// and now and then a step half again as long), and after a change of way they settle over a few
// steps (what the way before left swapped out or evicted comes back; in the simulated H200 a way
// takes up to six steps to reach its pace). So each way's estimate is the median of its last
// few steps, and the first step after a change of way is never counted:
//   1. trial: every way runs in turn for one settling step (none for the first way) and
//      `trial_steps` counted ones;
//   2. confirmation: each way within `close_margin` of the best estimate runs another trial;
//   3. steady: the way with the lowest estimate runs, its estimate following its steps, and it
//      gives way as soon as that estimate exceeds another way's.
// Where a way's settled steps all take the same time, the kept way is the fastest. A way left in
// the steady phase is not measured again unless the kept one's estimate comes to exceed its own:
// an estimate left too high by a run of slow steps (five of nine) stays so.
// A way on trial can thrash (a plan that does not fit at a batch near the limit: a step ten
// times the others), and its step cannot wait for the step's end to be judged: once a step under
// trial has run `give_up_factor` times the best estimate so far, the caller gives it up
// (give_up()): the way is not run again, the rest of the step runs the fastest way known, and
// the step is not counted.
//   WayChooser chooser(5);
//   for (each step) {
//     for (each op) {
//       run_op(way);
//       if (chooser.give_up_after() > 0 && elapsed > chooser.give_up_after())
//         way = chooser.give_up();
//     }
//     chooser.on_step(seconds);
//     way = chooser.way();
//   }
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace tessel::memory {

struct WayChooserOptions {
  int trial_steps = 6;         // past most of what the way before left behind
  double close_margin = 0.10;  // relative to the best estimate
  int window = 9;              // the steps of a way its estimate is the median of
  double give_up_factor = 3;   // a step on trial this many times the best estimate is given up
};

class WayChooser {
 public:
  explicit WayChooser(int ways, WayChooserOptions options = {});

  int way() const { return way_; }  // the way the next step runs
  // Trial or confirmation under way: a measurement of the steady state waits for this to end.
  bool trying() const { return phase_ != Phase::kSteady; }
  // The estimated step time of a way (0 before it ran) and how many of its steps were counted.
  double estimate(int way) const;
  int64_t counted_steps(int way) const { return counted_[way]; }

  // Records the time of the step that just ran the way way() named before the call. Returns
  // whether way() changed.
  bool on_step(double seconds);

  // How long the step under way may run before it is given up: 0 (no bound) in the steady phase,
  // before any step was counted, or where no other way is left. Read after every op: kept, not
  // computed.
  double give_up_after() const { return give_up_after_; }
  // Gives up the step under way and its way for good: way() moves on as at the end of that way's
  // trial, and the step's on_step() is not counted. Returns the way to run the rest of the step
  // (the fastest counted so far, or way() where none is).
  int give_up();
  bool given_up(int way) const { return given_up_[way] != 0; }

 private:
  enum class Phase { kTrial, kConfirm, kSteady };
  int best_way() const;  // the lowest estimate among the counted ways not given up (-1: none)
  bool switch_to(int way);
  bool record_step(double seconds);  // on_step() but for the bound
  double compute_give_up_after() const;
  bool end_trial_of_way();  // the way under trial has had its steps: the next, or the steady phase

  WayChooserOptions options_;
  Phase phase_ = Phase::kTrial;
  int way_ = 0;
  bool settling_ = false;                   // the step running is the first after a change of way
  bool given_up_step_ = false;              // the step running was given up
  double give_up_after_ = 0;                // compute_give_up_after() since the last change
  int trial_step_ = 0;                      // counted steps of the trial under way
  std::vector<std::deque<double>> recent_;  // each way's last counted step times
  std::vector<int64_t> counted_;
  std::vector<char> given_up_;
  std::vector<int> confirm_queue_;  // confirmation: the ways still to try again, closest last
};

}  // namespace tessel::memory
