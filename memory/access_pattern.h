// Where in a training step each tensor is read, step after step. Steps run the same program, so
// the previous step's reads say when a tensor of this step is read next (MegTaiChi's access
// patterns): the residency manager's `auto` weighs candidates by it.
//   pattern.begin_step();  ...  pattern.read(key);  pattern.next_op();  ...
//   pattern.distance_to_next_read(key, last_position)
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tessel::memory {

class AccessPattern {
 public:
  // A tensor the current op makes: the op's place in the step and the output's index.
  uint64_t output_key(size_t output) const {
    return (static_cast<uint64_t>(position_) << 8 | (output & 0xff)) + 1;
  }
  // A tensor no op of the step makes (its storage lives on from step to step).
  static uint64_t state_key(uint64_t storage_id) { return kStateBit | storage_id; }

  // The ops of the program run in the step: reads are counted at the op now running.
  int64_t position() const { return position_; }
  void read(uint64_t key) {
    if (position_ >= kMaxPositions) return;  // no step ends (inference): stop logging
    auto& positions = current_[key];
    if (positions.empty() || positions.back() != position_) positions.push_back(position_);
  }
  void next_op() { ++position_; }
  // At each step boundary. What ran before the first one is no step to go by: it holds what came
  // before the first step (building the model, moving it to the device, the first batch), which
  // would put every read of the next step at the wrong place.
  void begin_step() {
    previous_.swap(current_);
    current_.clear();
    previous_length_ = step_begun_ ? position_ : 0;
    step_begun_ = true;
    position_ = 0;
  }
  bool known() const { return previous_length_ > 0; }

  // Ops from now until the tensor named `key` is next read, going by the previous step: a state
  // tensor not read again this step waits for the next one; a tensor the previous step did not
  // read again is read at the latest two steps on; a tensor the previous step did not have
  // counts the ops since its last read (`last_position`), as staleness does.
  double distance_to_next_read(uint64_t key, int64_t last_position) const {
    auto found = previous_.find(key);
    if (found == previous_.end()) return static_cast<double>(position_ - last_position) + 1;
    const std::vector<int64_t>& positions = found->second;
    auto next = std::upper_bound(positions.begin(), positions.end(), position_);
    if (next != positions.end()) return static_cast<double>(*next - position_);
    if (key & kStateBit) return static_cast<double>(previous_length_ - position_ + positions[0]);
    return 2.0 * static_cast<double>(previous_length_);
  }

 private:
  static constexpr uint64_t kStateBit = uint64_t{1} << 62;
  // A training step of the zoo's largest models runs tens of thousands of ops at most.
  static constexpr int64_t kMaxPositions = int64_t{1} << 18;
  int64_t position_ = 0;
  int64_t previous_length_ = 0;
  bool step_begun_ = false;  // begin_step() was called: the ops since then are a step
  // key -> the positions it was read at, ascending.
  std::unordered_map<uint64_t, std::vector<int64_t>> current_, previous_;
};

}  // namespace tessel::memory
