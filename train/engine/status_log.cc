#include "train/engine/status_log.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "core/allocator.h"
#include "core/error.h"
#include "train/engine/setup.h"

namespace tessel::train {
namespace {

double seconds_between(std::chrono::steady_clock::time_point start,
                       std::chrono::steady_clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

// "test_accuracy" -> "test accuracy"
std::string spaced(std::string name) {
  for (char& c : name)
    if (c == '_') c = ' ';
  return name;
}

double find_value(const NamedValues& values, const std::string& name, double fallback) {
  for (const auto& [key, value] : values)
    if (key == name) return value;
  return fallback;
}

nlohmann::ordered_json to_json(const NamedValues& values) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [key, value] : values) out[key] = value;
  return out;
}

}  // namespace

StatusLog::StatusLog(const TrainConfig& config, const RunLayout& layout, const TrainingPlan& plan,
                     const optim::Optimizer& optimizer, std::ostream& log, std::string samples_name)
    : recipe_(config.recipe),
      log_every_(config.log_every),
      plan_(plan),
      optimizer_(optimizer),
      log_(log),
      samples_name_(std::move(samples_name)),
      metrics_(layout.is_main() ? config.metrics_path : std::string(),
               /*append=*/config.resume.has_value()),
      device_(training_device(config)),
      run_start_(Clock::now()),
      last_event_(run_start_),
      interval_start_(run_start_) {}

void StatusLog::pause_ends() {
  const Clock::time_point now = Clock::now();
  if (interval_steps_ == 0) {
    interval_start_ = now;
  } else {
    interval_start_ += now - last_event_;
  }
  last_event_ = now;
}

void StatusLog::begin_epoch() { pause_ends(); }

void StatusLog::step(int64_t step, int64_t epoch, double loss, int64_t samples,
                     const NamedValues& parts) {
  last_event_ = Clock::now();
  TESSEL_CHECK(std::isfinite(loss), "recipe ", recipe_, ": the loss is not finite at step ", step,
               " (", loss, "); try a smaller --lr");
  interval_loss_ += loss;
  for (const auto& [name, value] : parts) {
    bool found = false;
    for (auto& [key, sum] : interval_parts_)
      if (key == name) sum += value, found = true;
    if (!found) interval_parts_.emplace_back(name, value);
  }
  ++interval_steps_;
  interval_samples_ += samples;
  if (step % log_every_ == 0 || plan_.done(step)) print_status(step, epoch);
}

void StatusLog::print_status(int64_t step, int64_t epoch) {
  const double seconds = seconds_between(interval_start_, Clock::now());
  const double samples_per_second = seconds > 0 ? interval_samples_ / seconds : 0.0;
  const double ms_per_step = interval_steps_ > 0 ? 1000.0 * seconds / interval_steps_ : 0.0;
  const memory::AllocatorStats stats =
      memory_ ? memory_->stats() : memory::allocator_for(device_)->stats();
  const double lr = optimizer_.lr();
  last_interval_loss_ = interval_loss_ / static_cast<double>(interval_steps_);
  char line[160];
  std::snprintf(line, sizeof(line), "train step %6lld | epoch %lld/%lld (%3.0f%%) | loss %.4f",
                static_cast<long long>(step), static_cast<long long>(epoch),
                static_cast<long long>(plan_.epochs),
                100.0 * static_cast<double>((step - 1) % plan_.batches_per_epoch + 1) /
                    static_cast<double>(plan_.batches_per_epoch),
                last_interval_loss_);
  std::string text = line;
  nlohmann::ordered_json record = {
      {"event", "train"}, {"step", step}, {"epoch", epoch}, {"loss", last_interval_loss_}};
  for (auto& [name, sum] : interval_parts_) {
    const double mean = sum / static_cast<double>(interval_steps_);
    char part[96];
    std::snprintf(part, sizeof(part), " | %s %.4f", spaced(name).c_str(), mean);
    text += part;
    record[name] = mean;
  }
  std::snprintf(line, sizeof(line), " | lr %.3g | %.0f %s/s | %.0f ms/step | memory %s (peak %s",
                lr, samples_per_second, samples_name_.c_str(), ms_per_step,
                format_bytes(stats.allocated_bytes).c_str(),
                format_bytes(stats.peak_allocated_bytes).c_str());
  std::string data;
  if (data_bytes_ > 0 && device_.is_cpu() && !(memory_ && memory_->active())) {
    data = ", of which data sets " + format_bytes(data_bytes_);
    record["data_bytes"] = data_bytes_;
  }
  log_ << text << line << data << ")"
       << (memory_ ? memory_->report(interval_steps_, &record) : std::string()) << std::endl;
  record["lr"] = lr;
  record[samples_name_ + "_per_s"] = samples_per_second;
  record["ms_per_step"] = ms_per_step;
  record["memory_bytes"] = stats.allocated_bytes;
  record["peak_memory_bytes"] = stats.peak_allocated_bytes;
  record["elapsed_s"] = seconds_between(run_start_, Clock::now());
  metrics_.write(record);
  interval_loss_ = 0;
  interval_parts_.clear();
  interval_steps_ = 0;
  interval_samples_ = 0;
  interval_start_ = Clock::now();
  last_event_ = interval_start_;
}

void StatusLog::eval(int64_t step, int64_t epoch, const Evaluation& evaluation) {
  const double eval_seconds = seconds_between(last_event_, Clock::now());
  last_eval_ = evaluation;
  last_eval_step_ = step;
  char head[64];
  std::snprintf(head, sizeof(head), "eval  step %6lld | epoch %lld", static_cast<long long>(step),
                static_cast<long long>(epoch));
  std::string line = head;
  for (const auto& [name, value] : evaluation) {
    char part[96];
    std::snprintf(part, sizeof(part), " | %s %.4f", spaced(name).c_str(), value);
    line += part;
  }
  char tail[32];
  std::snprintf(tail, sizeof(tail), " | %.1f s", eval_seconds);
  log_ << line << tail << std::endl;
  nlohmann::ordered_json record = {{"event", "eval"}, {"step", step}, {"epoch", epoch}};
  record.update(to_json(evaluation));
  record["eval_s"] = eval_seconds;
  record["elapsed_s"] = seconds_between(run_start_, Clock::now());
  metrics_.write(record);
  pause_ends();
}

void StatusLog::checkpoint(const std::string& path) {
  char line[96];
  std::snprintf(line, sizeof(line), " (%.1f s)", seconds_between(last_event_, Clock::now()));
  log_ << "checkpoint " << path << line << std::endl;
  pause_ends();
}

RecipeResult StatusLog::finish(int64_t step) {
  RecipeResult result;
  result.steps = step;
  result.epochs_completed = step / plan_.batches_per_epoch;
  result.final_train_loss = last_interval_loss_;
  result.final_eval = last_eval_;
  result.test_accuracy = find_value(last_eval_, "test_accuracy", 0.0);
  result.seconds = seconds_between(run_start_, Clock::now());
  for (const auto& [name, value] : last_eval_) {
    char line[96];
    std::snprintf(line, sizeof(line), "%s: %.4f", spaced(name).c_str(), value);
    log_ << line << std::endl;
  }
  nlohmann::ordered_json record = {{"event", "final"},
                                   {"steps", step},
                                   {"epochs_completed", result.epochs_completed},
                                   {"final_train_loss", result.final_train_loss}};
  record.update(to_json(last_eval_));
  record["wall_s"] = result.seconds;
  metrics_.write(record);
  return result;
}

std::string format_bytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

}  // namespace tessel::train
