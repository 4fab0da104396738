#include "train/recipes/training_loop.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/error.h"
#include "optim/sgd.h"
#include "train/recipes/distributed.h"
#include "train/recipes/memory_budget.h"
#include "train/recipes/metrics_log.h"
#include "train/state/checkpoint.h"

namespace tessel::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
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

std::string format_bytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& config,
                                                 const optim::NamedTensors& parameters,
                                                 const optim::AdamWOptions& adamw_options) {
  const std::string& name = *config.optimizer;
  if (name == "sgd")
    return std::make_unique<optim::SGD>(parameters, optim::SGDOptions(*config.lr).momentum(0.9));
  if (name == "adam")
    return std::make_unique<optim::Adam>(parameters, optim::AdamOptions(*config.lr));
  TESSEL_CHECK(name == "adamw", "--optimizer: unknown optimizer '", name, "' (sgd, adam or adamw)");
  optim::AdamWOptions options = adamw_options;
  return std::make_unique<optim::AdamW>(parameters, options.lr(*config.lr));
}

int64_t planned_steps(const TrainConfig& config, int64_t batches_per_epoch) {
  return *config.epochs * batches_per_epoch;
}

std::string resolve_resume_path(const TrainConfig& config) {
  TESSEL_CHECK(config.resume.has_value(), "resolve_resume_path: the config does not resume");
  namespace fs = std::filesystem;
  if (config.resume->empty()) {
    TESSEL_CHECK(!config.checkpoint_dir.empty(),
                 "--resume without a value resumes from --checkpoint_dir, which is not set (or "
                 "pass --resume=PATH)");
    const std::string latest = latest_checkpoint(config.checkpoint_dir);
    TESSEL_CHECK(!latest.empty(), "--resume: no checkpoint in '", config.checkpoint_dir,
                 "' (no complete checkpoint named by ", config.checkpoint_dir, "/latest)");
    return latest;
  }
  const std::string& path = *config.resume;
  TESSEL_CHECK(fs::exists(path), "--resume: '", path, "' does not exist");
  if (fs::exists(fs::path(path) / "latest")) {
    const std::string latest = latest_checkpoint(path);
    TESSEL_CHECK(!latest.empty(), "--resume: '", path, "/latest' names no complete checkpoint");
    return latest;
  }
  return path;
}

RecipeResult run_training(const TrainingTask& task, const TrainConfig& config, std::ostream& log) {
  TESSEL_CHECK(task.model && task.optimizer && task.start_epoch && task.train_step && task.evaluate,
               "run_training: the task needs a model, an optimizer, start_epoch, train_step and "
               "evaluate");
  const auto run_start = Clock::now();
  const int64_t epochs = *config.epochs;
  const int64_t batches_per_epoch = task.batches_per_epoch;
  TESSEL_CHECK(batches_per_epoch > 0, "recipe ", config.recipe,
               ": the training set yields no batch of size ", *config.batch_size);
  const int64_t total_steps = planned_steps(config, batches_per_epoch);
  const int64_t last_step = config.steps > 0 ? std::min(config.steps, total_steps) : total_steps;

  RecipeResult result;
  int64_t step = 0;
  bool resumed = false;
  // With --tp > 1: checkpoints hold whole tensors, gathered to save and sliced to resume.
  const std::optional<CheckpointSharding> sharding = checkpoint_sharding(*task.model);
  const CheckpointSharding* sharding_or_null = sharding ? &*sharding : nullptr;
  const DistributedRun& run = distributed_run();
  const bool main_rank = run.is_main();
  if (config.resume) {
    const std::string path = resolve_resume_path(config);
    NamedScalars extra;
    // Each rank takes back its own RNG state (ranks draw different amounts: dropout on their
    // own shard) when the checkpoint was saved in this layout.
    CheckpointRank this_rank;
    this_rank.rank = run.distributed() ? run.world->rank() : 0;
    this_rank.ranks = run.distributed() ? run.world->size() : 1;
    this_rank.layout = run.layout();
    step = load_checkpoint(path, *task.model, *task.optimizer, task.scheduler, &extra,
                           sharding_or_null, &this_rank);
    if (!this_rank.own_rng)
      log << "note: the checkpoint was saved by " << this_rank.saved_ranks << " rank(s)"
          << (this_rank.saved_layout.empty() ? "" : " as " + this_rank.saved_layout)
          << ", this run has " << this_rank.ranks
          << (this_rank.layout.empty() ? "" : " as " + this_rank.layout)
          << ": every rank continues from rank 0's random-number state, so dropout does not "
             "replay bit for bit (an exact resume needs the same --dp and --tp)"
          << std::endl;
    const double saved_batches = find_value(extra, "batches_per_epoch", -1);
    const double saved_seed = find_value(extra, "seed", -1);
    TESSEL_CHECK(saved_batches == static_cast<double>(batches_per_epoch) &&
                     saved_seed == static_cast<double>(config.seed),
                 "--resume: checkpoint '", path, "' was trained with ", saved_batches,
                 " batches per epoch and --seed=", saved_seed, ", this run has ", batches_per_epoch,
                 " and --seed=", config.seed,
                 ": resume with the same --data, --batch_size and --seed");
    const double saved_total = find_value(extra, "planned_steps", -1);
    if (saved_total != static_cast<double>(total_steps))
      log << "note: the checkpoint's run planned " << saved_total << " steps, this one "
          << total_steps << " (--epochs differs): the schedule continues with the new length"
          << std::endl;
    log << "resumed from " << path << " at step " << step << std::endl;
    result.resumed_from_step = step;
    resumed = true;
  }
  // A resumed run appends to its metrics file.
  // Rank 0 alone writes metrics and checkpoints.
  MetricsLog metrics(main_rank ? config.metrics_path : std::string(),
                     /*append=*/config.resume.has_value());
  // --memory_budget / --memory_policy: the training state moves into the budget here.
  TrainingMemory training_memory(config, *task.model, *task.optimizer, log);

  int64_t saved_step = resumed ? step : -1;  // that state is on disk already
  auto save = [&]() {
    if (config.checkpoint_dir.empty() || saved_step == step) return;
    saved_step = step;
    // Every rank's RNG state goes to the checkpoint, so that each resumes its own stream.
    const std::vector<RngState> rank_rngs = run.gather_rng_states();
    // The first data-parallel replica's tensor-parallel ranks gather the split tensors.
    if (!main_rank && !(sharding && run.dp_rank == 0)) {
      if (run.distributed()) run.world->barrier();
      return;
    }
    const auto save_start = Clock::now();
    const NamedScalars extra = {{"batches_per_epoch", static_cast<double>(batches_per_epoch)},
                                {"seed", static_cast<double>(config.seed)},
                                {"planned_steps", static_cast<double>(total_steps)}};
    CheckpointContents contents = capture_checkpoint(step, *task.model, *task.optimizer,
                                                     task.scheduler, extra, sharding_or_null);
    contents.rank_rngs = rank_rngs;
    contents.rank_layout = run.layout();
    if (main_rank) {
      result.last_checkpoint = write_checkpoint(config.checkpoint_dir, contents);
      char line[96];
      std::snprintf(line, sizeof(line), " (%.1f s)", seconds_since(save_start));
      log << "checkpoint " << result.last_checkpoint << line << std::endl;
    }
    // Every rank goes on once the checkpoint is on disk (a later --resume may read it at once).
    if (run.distributed()) run.world->barrier();
  };

  Evaluation last_eval;
  bool evaluated_after_last_step = false;
  auto evaluate = [&](int64_t epoch) {
    const auto eval_start = Clock::now();
    last_eval = task.evaluate();
    evaluated_after_last_step = true;
    char head[64];
    std::snprintf(head, sizeof(head), "eval  step %6lld | epoch %lld", static_cast<long long>(step),
                  static_cast<long long>(epoch));
    std::string line = head;
    for (const auto& [name, value] : last_eval) {
      char part[96];
      std::snprintf(part, sizeof(part), " | %s %.4f", spaced(name).c_str(), value);
      line += part;
    }
    char tail[32];
    std::snprintf(tail, sizeof(tail), " | %.1f s", seconds_since(eval_start));
    log << line << tail << std::endl;
    nlohmann::ordered_json record = {{"event", "eval"}, {"step", step}, {"epoch", epoch}};
    record.update(to_json(last_eval));
    record["eval_s"] = seconds_since(eval_start);
    record["elapsed_s"] = seconds_since(run_start);
    metrics.write(record);
  };

  // Per status interval.
  double interval_loss = 0;
  NamedValues interval_parts;
  int64_t interval_steps = 0;
  int64_t interval_samples = 0;
  auto interval_start = Clock::now();

  auto status = [&](int64_t epoch) {
    const double seconds = seconds_since(interval_start);
    const double samples_per_second = seconds > 0 ? interval_samples / seconds : 0.0;
    const double ms_per_step = interval_steps > 0 ? 1000.0 * seconds / interval_steps : 0.0;
    const memory::AllocatorStats stats = training_memory.stats();  // the training device's
    const double lr = task.optimizer->lr();
    result.final_train_loss = interval_loss / static_cast<double>(interval_steps);
    char line[160];
    std::snprintf(line, sizeof(line), "train step %6lld | epoch %lld/%lld (%3.0f%%) | loss %.4f",
                  static_cast<long long>(step), static_cast<long long>(epoch),
                  static_cast<long long>(epochs),
                  100.0 * static_cast<double>((step - 1) % batches_per_epoch + 1) /
                      static_cast<double>(batches_per_epoch),
                  result.final_train_loss);
    std::string text = line;
    nlohmann::ordered_json record = {
        {"event", "train"}, {"step", step}, {"epoch", epoch}, {"loss", result.final_train_loss}};
    for (auto& [name, sum] : interval_parts) {
      const double mean = sum / static_cast<double>(interval_steps);
      char part[96];
      std::snprintf(part, sizeof(part), " | %s %.4f", spaced(name).c_str(), mean);
      text += part;
      record[name] = mean;
    }
    std::snprintf(line, sizeof(line), " | lr %.3g | %.0f %s/s | %.0f ms/step | memory %s (peak %s)",
                  lr, samples_per_second, task.samples_name.c_str(), ms_per_step,
                  format_bytes(stats.allocated_bytes).c_str(),
                  format_bytes(stats.peak_allocated_bytes).c_str());
    log << text << line << training_memory.report(interval_steps, &record) << std::endl;
    record["lr"] = lr;
    record[task.samples_name + "_per_s"] = samples_per_second;
    record["ms_per_step"] = ms_per_step;
    record["memory_bytes"] = stats.allocated_bytes;
    record["peak_memory_bytes"] = stats.peak_allocated_bytes;
    record["elapsed_s"] = seconds_since(run_start);
    metrics.write(record);
    interval_loss = 0;
    interval_parts.clear();
    interval_steps = 0;
    interval_samples = 0;
    interval_start = Clock::now();
  };

  // --precision=bf16: autocast for the whole step. Its backward pass and optimizer update keep
  // the dtypes of what they read (the engine turns autocast off; updates are f32), so this
  // amounts to autocasting the forward pass.
  auto train_step = [&](StepResult* step_result) {
    AutocastGuard autocast(DType::kBFloat16, config.precision == "bf16");
    return task.train_step(step_result);
  };
  task.model->train();
  bool stop = step >= last_step;
  result.epochs_completed = step / batches_per_epoch;
  for (int64_t epoch = step / batches_per_epoch + 1; epoch <= epochs && !stop; ++epoch) {
    const auto epoch_setup = Clock::now();
    task.start_epoch(epoch - 1, step - (epoch - 1) * batches_per_epoch);
    if (interval_steps == 0) {
      interval_start = Clock::now();
    } else {
      interval_start += Clock::now() - epoch_setup;  // skipping batches is not training time
    }
    StepResult step_result;
    while (!stop && train_step(&step_result)) {
      if (task.scheduler) task.scheduler->step();
      ++step;
      training_memory.after_step(log);  // a fractional budget starts after the first step
      evaluated_after_last_step = false;
      TESSEL_CHECK(std::isfinite(step_result.loss), "recipe ", config.recipe,
                   ": the loss is not finite at step ", step, " (", step_result.loss,
                   "); try a smaller --lr");
      interval_loss += step_result.loss;
      for (const auto& [name, value] : step_result.parts) {
        bool found = false;
        for (auto& [key, sum] : interval_parts)
          if (key == name) sum += value, found = true;
        if (!found) interval_parts.emplace_back(name, value);
      }
      ++interval_steps;
      interval_samples += step_result.samples;
      stop = step >= last_step;

      if (step % config.log_every == 0 || stop) status(epoch);
      const auto pause_start = Clock::now();
      if (config.eval_every > 0 && step % config.eval_every == 0) evaluate(epoch);
      if (config.checkpoint_every > 0 && step % config.checkpoint_every == 0) save();
      if (step == epoch * batches_per_epoch) {
        result.epochs_completed = epoch;
        if (!evaluated_after_last_step) evaluate(epoch);
        save();
      }
      // Evaluation and saving do not count as training time in the status lines.
      interval_start += Clock::now() - pause_start;
    }
  }
  if (!evaluated_after_last_step) evaluate(step / batches_per_epoch + 1);
  save();

  result.steps = step;
  result.final_eval = last_eval;
  result.test_accuracy = find_value(last_eval, "test_accuracy", 0.0);
  result.seconds = seconds_since(run_start);
  for (const auto& [name, value] : last_eval) {
    char line[96];
    std::snprintf(line, sizeof(line), "%s: %.4f", spaced(name).c_str(), value);
    log << line << std::endl;
  }
  nlohmann::ordered_json record = {{"event", "final"},
                                   {"steps", step},
                                   {"epochs_completed", result.epochs_completed},
                                   {"final_train_loss", result.final_train_loss}};
  record.update(to_json(last_eval));
  record["wall_s"] = result.seconds;
  metrics.write(record);
  return result;
}

}  // namespace tessel::train
