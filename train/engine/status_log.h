// What a run says while it trains: a status line every --log_every steps (mean loss over the
// interval, learning rate, throughput, memory), a line per evaluation, the final values, and the
// same numbers as JSON lines in --metrics (rank 0 alone; a resumed run appends).
//   StatusLog status(config, layout, plan, optimizer, log);
//   status.step(step, epoch, loss, batch_size);      // after each optimizer step
//   status.eval(step, epoch, {{"test_accuracy", 0.91}});
//   RecipeResult result = status.finish(step);
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

#include "optim/optimizer.h"
#include "train/engine/config.h"
#include "train/engine/metrics_log.h"
#include "train/engine/run_layout.h"
#include "train/engine/training_memory.h"
#include "train/engine/training_plan.h"

namespace tessel::train {

// An evaluation: metrics in display order, e.g. {"test_loss", 0.31}, {"test_accuracy", 0.91}.
using Evaluation = NamedValues;

class StatusLog {
 public:
  // `samples_name`: the word status lines put before "/s" ("samples", "sequences"). `optimizer`
  // gives the learning rate shown. Opens --metrics on rank 0.
  StatusLog(const TrainConfig& config, const RunLayout& layout, const TrainingPlan& plan,
            const optim::Optimizer& optimizer, std::ostream& log,
            std::string samples_name = "samples");
  StatusLog(const StatusLog&) = delete;
  StatusLog& operator=(const StatusLog&) = delete;

  // Status lines show `memory`'s budget, counters and use (the training device's allocator
  // otherwise); it must outlive this log.
  void watch(TrainingMemory& memory) { memory_ = &memory; }
  // The bytes of the data sets this process holds as CPU tensors: when the memory shown is the
  // CPU allocator's (no budget), status lines say how much of it they are, since a planner's
  // prediction covers training alone.
  void count_data(int64_t bytes) { data_bytes_ = bytes; }
  // Call when an epoch's data is ready: the time spent preparing it (and skipping batches on a
  // resume) is not training time.
  void begin_epoch();
  // After the optimizer step that made `step` steps in all, in 1-based `epoch`: `loss` (the
  // global batch's, the same on every rank), the examples it saw, and parts of the loss to show
  // as well (BERT: "mlm_loss", "nsp_loss"). A tessel::Error when the loss is not finite. Prints
  // the mean of the interval every --log_every steps and at the plan's last step.
  void step(int64_t step, int64_t epoch, double loss, int64_t samples,
            const NamedValues& parts = {});
  // An evaluation made after `step`: a line and a metrics record. Its time (since the last
  // step) is not training time.
  void eval(int64_t step, int64_t epoch, const Evaluation& evaluation);
  bool evaluated_at(int64_t step) const { return last_eval_step_ == step; }
  // A checkpoint just written to `path`: a line with the time it took, which is not training
  // time.
  void checkpoint(const std::string& path);
  // The end of the run at `step`: the last evaluation's values, a "final" metrics record, and
  // the result (steps, epochs completed, last interval's loss, last evaluation, wall time).
  RecipeResult finish(int64_t step);

  std::ostream& log() { return log_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Leaves the time since the last event out of the status interval.
  void pause_ends();
  void print_status(int64_t step, int64_t epoch);

  const std::string recipe_;
  const int64_t log_every_;
  const TrainingPlan plan_;
  const optim::Optimizer& optimizer_;
  std::ostream& log_;
  std::string samples_name_;
  MetricsLog metrics_;
  TrainingMemory* memory_ = nullptr;
  Device device_;
  int64_t data_bytes_ = 0;

  Clock::time_point run_start_;
  Clock::time_point last_event_;  // the end of the last step, evaluation, checkpoint or set-up
  // The status interval.
  Clock::time_point interval_start_;
  double interval_loss_ = 0;
  NamedValues interval_parts_;
  int64_t interval_steps_ = 0;
  int64_t interval_samples_ = 0;

  double last_interval_loss_ = 0;
  Evaluation last_eval_;
  int64_t last_eval_step_ = -1;
};

// "12.3 MiB": bytes for status lines.
std::string format_bytes(int64_t bytes);

}  // namespace tessel::train
