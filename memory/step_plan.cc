#include "memory/step_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iomanip>
#include <limits>
#include <sstream>

namespace tessel::memory {

void StepTrace::clear() {
  seconds_.clear();
  backward_.clear();
  tensors_.clear();
  reads_.clear();
}

void StepTrace::op(int64_t position, double seconds, bool in_backward) {
  if (position < 0 || position >= kMaxPositions) return;
  if (position >= length()) {
    seconds_.resize(position + 1, 0.0);
    backward_.resize(position + 1, 0);
  }
  seconds_[position] += seconds;
  backward_[position] = in_backward ? 1 : 0;
}

void StepTrace::output(TracedTensor tensor) {
  if (tensor.made_at < kMaxPositions) tensors_.push_back(std::move(tensor));
}

void StepTrace::read(uint64_t key, int64_t position) {
  if (position >= kMaxPositions) return;
  auto& positions = reads_[key];
  if (positions.empty() || positions.back() != position) positions.push_back(position);
}

const std::vector<int64_t>& StepTrace::reads(uint64_t key) const {
  static const std::vector<int64_t> kNone;
  auto found = reads_.find(key);
  return found == reads_.end() ? kNone : found->second;
}

std::string StepPlan::summary() const {
  std::ostringstream out;
  out << std::setprecision(3) << "plan: swap " << swapped_bytes / 1048576.0 << " MiB, recompute "
      << evicted_bytes / 1048576.0 << " MiB (" << recompute_seconds * 1e3 << " ms), peak "
      << peak_bytes / 1048576.0 << " MiB" << (fits ? "" : " (over the budget)");
  return out.str();
}

namespace {

// Busy intervals of one direction of the host link, in seconds of the step.
class LinkTimeline {
 public:
  // The earliest free slot of `length` starting at or after `from`.
  double earliest(double from, double length) const {
    double start = from;
    for (bool moved = true; moved;) {
      moved = false;
      for (const auto& busy : busy_)
        if (start < busy.second && busy.first < start + length) {
          start = busy.second;
          moved = true;
        }
    }
    return start;
  }
  // The latest free slot of `length` ending at or before `until`; returns its start.
  double latest(double until, double length) const {
    double end = until;
    for (bool moved = true; moved;) {
      moved = false;
      for (const auto& busy : busy_)
        if (end - length < busy.second && busy.first < end) {
          end = busy.first;
          moved = true;
        }
    }
    return end - length;
  }
  void reserve(double start, double length) { busy_.emplace_back(start, start + length); }

 private:
  std::vector<std::pair<double, double>> busy_;
};

struct Candidate {
  const TracedTensor* tensor;
  int64_t last_forward_read;
  int64_t first_backward_read;
  int64_t last_read;
};

}  // namespace

StepPlan plan_step(const StepTrace& trace, const StepPlanSettings& settings) {
  StepPlan plan;
  const int64_t length = trace.length();
  plan.after.resize(length);
  int64_t backward_start = length;
  for (int64_t p = 0; p < length; ++p)
    if (trace.in_backward(p)) {
      backward_start = p;
      break;
    }
  // Seconds of the step when each op ends, going by the ops' own costs (not the stalls and
  // recomputes of the step traced).
  std::vector<double> ends(length);
  double now = 0;
  for (int64_t p = 0; p < length; ++p) ends[p] = now += trace.seconds(p);
  auto start_of = [&](int64_t p) { return ends[p] - trace.seconds(p); };

  // Bytes held at each position with nothing moved: state plus every tensor from its op to its
  // last read.
  std::vector<double> over(length + 1, 0.0);
  std::unordered_map<uint64_t, Candidate> by_key;
  std::vector<Candidate> candidates;
  for (const TracedTensor& tensor : trace.tensors()) {
    if (tensor.made_at >= length) continue;
    // Reads past the last op recorded (by the next step's first op) do not count.
    std::vector<int64_t> reads = trace.reads(tensor.key);
    reads.erase(
        std::remove_if(reads.begin(), reads.end(),
                       [&](int64_t read) { return read >= length || read < tensor.made_at; }),
        reads.end());
    const int64_t last = reads.empty() ? tensor.made_at : reads.back();
    over[tensor.made_at] += static_cast<double>(tensor.bytes);
    over[last + 1] -= static_cast<double>(tensor.bytes);
    Candidate candidate{&tensor, tensor.made_at, -1, last};
    for (int64_t read : reads) {
      if (read < backward_start)
        candidate.last_forward_read = std::max(candidate.last_forward_read, read);
      if (read >= backward_start) {
        candidate.first_backward_read = read;
        break;
      }
    }
    by_key[tensor.key] = candidate;
    if (tensor.made_at < backward_start && candidate.first_backward_read > 0 &&
        candidate.first_backward_read > candidate.last_forward_read + 1 &&
        tensor.bytes >= settings.min_bytes)
      candidates.push_back(candidate);
  }
  const double target = static_cast<double>(settings.budget) * (1.0 - settings.headroom) -
                        static_cast<double>(settings.state_bytes);
  double running = 0;
  for (int64_t p = 0; p < length; ++p) {
    running += over[p];
    over[p] = running - target;
  }
  over.resize(length);
  auto max_over = [&](int64_t from, int64_t to) {  // over positions [from, to]
    double most = -std::numeric_limits<double>::infinity();
    for (int64_t p = std::max<int64_t>(from, 0); p <= std::min(to, length - 1); ++p)
      most = std::max(most, over[p]);
    return most;
  };
  auto lower = [&](int64_t from, int64_t to, size_t bytes) {
    for (int64_t p = std::max<int64_t>(from, 0); p <= std::min(to, length - 1); ++p)
      over[p] -= static_cast<double>(bytes);
  };

  // Where a tensor is back on the device between its backward reads: kept tensors from their op,
  // swapped ones once their prefetch has run.
  std::unordered_map<uint64_t, int64_t> back_from;     // key -> first position held again
  std::unordered_map<uint64_t, int64_t> swapped_from;  // key -> first position off the device

  // 1. Swaps, dearest to recompute per byte first, while the link hides both copies.
  if (settings.link_bytes_per_second > 0) {
    std::vector<Candidate> order = candidates;
    std::stable_sort(order.begin(), order.end(), [](const Candidate& a, const Candidate& b) {
      return a.tensor->producer_seconds / static_cast<double>(a.tensor->bytes) >
             b.tensor->producer_seconds / static_cast<double>(b.tensor->bytes);
    });
    LinkTimeline out, in;
    for (const Candidate& c : order) {
      if (max_over(c.last_forward_read + 1, c.first_backward_read - 1) <= 0) continue;
      const double copy = static_cast<double>(c.tensor->bytes) / settings.link_bytes_per_second;
      const double out_start = out.earliest(ends[c.last_forward_read], copy);
      const double in_start = in.latest(start_of(c.first_backward_read), copy);
      if (in_start <= out_start + copy) continue;
      // Held until the op during which its copy out ends; held again after the op the prefetch
      // follows (the last to end before the copy back must start).
      int64_t freed = c.last_forward_read + 1;
      while (freed < length && ends[freed] < out_start + copy) ++freed;
      int64_t prefetch = c.first_backward_read - 1;
      while (prefetch > freed && ends[prefetch] > in_start) --prefetch;
      // Only a copy done within forward lowers the peak, where backward begins.
      if (freed >= backward_start || prefetch <= freed || max_over(freed + 1, prefetch) <= 0)
        continue;
      out.reserve(out_start, copy);
      in.reserve(in_start, copy);
      lower(freed + 1, prefetch, c.tensor->bytes);
      back_from[c.tensor->key] = prefetch + 1;
      swapped_from[c.tensor->key] = freed + 1;
      plan.swapped_bytes += c.tensor->bytes;
    }
  }

  // 2. Recomputes. An evicted tensor comes back once, when backward first needs it or, earlier,
  // when an evicted tensor made from it comes back (a recompute reads its inputs; once
  // recomputed a tensor stays until its last read, as checkpointing's segments do). Tensors
  // dead after forward (read by no backward op) are recomputed on the way, and dropped again.
  std::unordered_map<uint64_t, int64_t> back_at;  // evicted key -> position it is recomputed at
  struct Lowering {
    uint64_t key;
    int64_t from, to;  // back_at (or a swapped tensor's back_from) moves from `from` to `to`
    bool swapped;
  };
  auto lowered = [](const std::vector<Lowering>& lowerings, uint64_t key) {
    return std::any_of(lowerings.begin(), lowerings.end(),
                       [&](const Lowering& lowering) { return lowering.key == key; });
  };
  // Whether `key` can be on the device at `position` for a recompute that reads it, with what it
  // costs (ops run) and which evicted tensors must come back earlier for it.
  std::function<bool(uint64_t, int64_t, int, double&, std::vector<Lowering>&)> available =
      [&](uint64_t key, int64_t position, int depth, double& cost,
          std::vector<Lowering>& lowerings) -> bool {
    auto found = by_key.find(key);
    if (found == by_key.end()) return true;  // state, or a tensor from before the step
    const Candidate& c = found->second;
    if (c.tensor->made_at >= position) return false;
    auto evicted_at = back_at.find(key);
    if (evicted_at != back_at.end()) {
      if (evicted_at->second <= position || lowered(lowerings, key)) return true;
      lowerings.push_back({key, evicted_at->second, position, false});
    } else if (c.last_read >= position) {
      auto back = back_from.find(key);
      if (back == back_from.end() || back->second <= position) return true;
      // Swapped: its prefetch moves up, if its copy out is done by then.
      if (swapped_from[key] >= position) return false;
      if (!lowered(lowerings, key)) lowerings.push_back({key, back->second, position, true});
      return true;
    } else {
      cost += c.tensor->producer_seconds;  // dead by then: recomputed on the way
    }
    if (!c.tensor->recomputable || depth > 16) return false;
    for (uint64_t input : c.tensor->input_keys)
      if (input != 0 && !available(input, position, depth + 1, cost, lowerings)) return false;
    return true;
  };
  std::unordered_map<uint64_t, std::vector<uint64_t>> consumers;
  for (const TracedTensor& tensor : trace.tensors())
    for (uint64_t input : tensor.input_keys)
      if (input != 0) consumers[input].push_back(tensor.key);
  // Where the first recompute that reads `key` runs: that of an evicted tensor made from it,
  // directly or through tensors dead after forward (recomputed on the way).
  std::function<int64_t(uint64_t, int)> first_needed_by_recompute = [&](uint64_t key, int depth) {
    int64_t first = length;
    auto found = consumers.find(key);
    if (found == consumers.end() || depth > 16) return first;
    for (uint64_t consumer : found->second) {
      auto evicted_at = back_at.find(consumer);
      if (evicted_at != back_at.end()) {
        first = std::min(first, evicted_at->second);
        continue;
      }
      auto traced = by_key.find(consumer);
      if (traced != by_key.end() && traced->second.last_read < backward_start)
        first = std::min(first, first_needed_by_recompute(consumer, depth + 1));
    }
    return first;
  };
  std::vector<char> hopeless(length, 0);
  while (true) {
    int64_t worst = -1;
    for (int64_t p = 0; p < length; ++p)
      if (!hopeless[p] && over[p] > 0 && (worst < 0 || over[p] > over[worst])) worst = p;
    if (worst < 0) break;
    const Candidate* best = nullptr;
    double best_rate = std::numeric_limits<double>::infinity();
    std::vector<Lowering> best_lowerings;
    int64_t best_back = 0;
    for (const Candidate& c : candidates) {
      const uint64_t key = c.tensor->key;
      if (!c.tensor->recomputable || back_at.count(key) || back_from.count(key) ||
          worst <= c.last_forward_read || worst >= c.first_backward_read)
        continue;
      const int64_t back = std::min(c.first_backward_read, first_needed_by_recompute(key, 0));
      if (worst >= back) continue;
      double cost = c.tensor->producer_seconds;
      std::vector<Lowering> lowerings;
      bool ok = true;
      for (uint64_t input : c.tensor->input_keys)
        if (input != 0 && !available(input, back, 1, cost, lowerings)) ok = false;
      if (!ok) continue;
      // Inputs brought back earlier hold their bytes from then on, where that must still fit.
      double held = 0;
      for (const Lowering& lowering : lowerings) {
        const double bytes = static_cast<double>(by_key[lowering.key].tensor->bytes);
        if (max_over(lowering.to, lowering.from - 1) + bytes >
            std::max(0.0, over[worst] - static_cast<double>(c.tensor->bytes)))
          ok = false;
        held += bytes * static_cast<double>(lowering.from - lowering.to);
      }
      if (!ok) continue;
      const double saved = static_cast<double>(c.tensor->bytes) *
                           static_cast<double>(back - c.last_forward_read - 1);
      if (saved <= held) continue;
      const double rate = cost / static_cast<double>(c.tensor->bytes) * saved / (saved - held);
      if (rate < best_rate) {
        best_rate = rate;
        best = &c;
        best_back = back;
        best_lowerings = std::move(lowerings);
      }
    }
    if (!best) {
      hopeless[worst] = 1;
      plan.fits = false;
      continue;
    }
    for (const Lowering& lowering : best_lowerings) {
      (lowering.swapped ? back_from : back_at)[lowering.key] = lowering.to;
      for (int64_t p = lowering.to; p < lowering.from; ++p)
        over[p] += static_cast<double>(by_key[lowering.key].tensor->bytes);
    }
    back_at[best->tensor->key] = best_back;
    lower(best->last_forward_read + 1, best_back - 1, best->tensor->bytes);
    plan.evicted_bytes += best->tensor->bytes;
    plan.recompute_seconds += best->tensor->producer_seconds;
  }
  for (const Candidate& c : candidates) {
    const uint64_t key = c.tensor->key;
    if (back_at.count(key))
      plan.after[c.last_forward_read].push_back({PlannedAction::Kind::kEvict, key});
    auto back = back_from.find(key);
    if (back == back_from.end()) continue;
    plan.after[c.last_forward_read].push_back({PlannedAction::Kind::kSwapOut, key});
    plan.after[back->second - 1].push_back({PlannedAction::Kind::kPrefetch, key});
  }
  double peak = 0;
  for (double value : over) peak = std::max(peak, value + target);
  plan.peak_bytes = static_cast<size_t>(peak + static_cast<double>(settings.state_bytes));
  return plan;
}

}  // namespace tessel::memory
