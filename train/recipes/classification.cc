#include "train/recipes/classification.h"

#include <chrono>
#include <cstdio>

#include "core/allocator.h"
#include "core/autograd.h"
#include "ops/ops.h"
#include "train/recipes/metrics_log.h"

namespace tessel::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

EvalResult evaluate_classifier(nn::Module& model, const data::Dataset& dataset,
                               int64_t batch_size) {
  NoGradGuard no_grad;
  model.eval();
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](auto*) {}),
                          data::DataLoaderOptions().batch_size(batch_size).shuffle(false));
  loader.start_epoch(0);
  EvalResult result;
  int64_t correct = 0;
  double loss_sum = 0;
  while (auto batch = loader.next()) {
    const Tensor logits = model(batch->inputs);
    loss_sum += cross_entropy(logits, batch->targets, -100, 0.0, "sum").item<double>();
    const auto predicted = argmax(logits, 1).to_vector<int64_t>();
    const auto targets = batch->targets.to_vector<int64_t>();
    for (size_t i = 0; i < targets.size(); ++i) correct += predicted[i] == targets[i];
    result.examples += static_cast<int64_t>(targets.size());
  }
  model.train();
  if (result.examples > 0) {
    result.accuracy = static_cast<double>(correct) / static_cast<double>(result.examples);
    result.loss = loss_sum / static_cast<double>(result.examples);
  }
  return result;
}

RecipeResult train_classifier(nn::Module& model, optim::Optimizer& optimizer,
                              data::DataLoader& train_loader, const data::Dataset& test_set,
                              const TrainConfig& config, std::ostream& log) {
  const auto run_start = Clock::now();
  MetricsLog metrics(config.metrics_path);
  auto allocator = memory::allocator_for(Device::cpu());
  const int64_t epochs = *config.epochs;
  const int64_t batches_per_epoch = train_loader.num_batches();
  TESSEL_CHECK(batches_per_epoch > 0, "recipe ", config.recipe,
               ": the training set yields no batch of size ", *config.batch_size);

  RecipeResult result;
  int64_t step = 0;
  EvalResult last_eval;
  bool evaluated_after_last_step = false;

  auto evaluate = [&](int64_t epoch) {
    const auto eval_start = Clock::now();
    last_eval = evaluate_classifier(model, test_set);
    evaluated_after_last_step = true;
    char line[160];
    std::snprintf(line, sizeof(line),
                  "eval  step %6lld | epoch %lld | test loss %.4f | test "
                  "accuracy %.4f | %.1f s",
                  static_cast<long long>(step), static_cast<long long>(epoch), last_eval.loss,
                  last_eval.accuracy, seconds_since(eval_start));
    log << line << std::endl;
    metrics.write({{"event", "eval"},
                   {"step", step},
                   {"epoch", epoch},
                   {"test_loss", last_eval.loss},
                   {"test_accuracy", last_eval.accuracy},
                   {"elapsed_s", seconds_since(run_start)}});
  };

  // Per status interval.
  double interval_loss = 0;
  int64_t interval_steps = 0;
  int64_t interval_samples = 0;
  auto interval_start = Clock::now();
  bool stop = false;

  model.train();
  for (int64_t epoch = 1; epoch <= epochs && !stop; ++epoch) {
    train_loader.start_epoch(epoch - 1);
    while (auto batch = train_loader.next()) {
      const Tensor logits = model(batch->inputs);
      const Tensor loss = cross_entropy(logits, batch->targets);
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
      ++step;
      evaluated_after_last_step = false;
      interval_loss += loss.item<double>();
      ++interval_steps;
      interval_samples += batch->targets.numel();

      const bool last_step = config.steps > 0 && step >= config.steps;
      if (step % config.log_every == 0 || last_step) {
        const double seconds = seconds_since(interval_start);
        const double samples_per_second = seconds > 0 ? interval_samples / seconds : 0.0;
        const memory::AllocatorStats stats = allocator->stats();
        result.final_train_loss = interval_loss / static_cast<double>(interval_steps);
        char line[256];
        std::snprintf(line, sizeof(line),
                      "train step %6lld | epoch %lld/%lld (%3.0f%%) | loss %.4f | lr %.3g | "
                      "%.0f samples/s | memory %s (peak %s)",
                      static_cast<long long>(step), static_cast<long long>(epoch),
                      static_cast<long long>(epochs),
                      100.0 * static_cast<double>((step - 1) % batches_per_epoch + 1) /
                          static_cast<double>(batches_per_epoch),
                      result.final_train_loss, optimizer.lr(), samples_per_second,
                      format_bytes(stats.allocated_bytes).c_str(),
                      format_bytes(stats.peak_allocated_bytes).c_str());
        log << line << std::endl;
        metrics.write({{"event", "train"},
                       {"step", step},
                       {"epoch", epoch},
                       {"loss", result.final_train_loss},
                       {"lr", optimizer.lr()},
                       {"samples_per_s", samples_per_second},
                       {"memory_bytes", stats.allocated_bytes},
                       {"peak_memory_bytes", stats.peak_allocated_bytes},
                       {"elapsed_s", seconds_since(run_start)}});
        interval_loss = 0;
        interval_steps = 0;
        interval_samples = 0;
        interval_start = Clock::now();
      }
      if (config.eval_every > 0 && step % config.eval_every == 0) {
        evaluate(epoch);
        interval_start = Clock::now();  // evaluation time is not training throughput
      }
      if (last_step) {
        stop = true;
        break;
      }
    }
    if (!stop) {
      result.epochs_completed = epoch;
      if (!evaluated_after_last_step) evaluate(epoch);
      interval_start = Clock::now();
    }
  }
  if (!evaluated_after_last_step) evaluate(result.epochs_completed + 1);

  result.steps = step;
  result.test_accuracy = last_eval.accuracy;
  result.seconds = seconds_since(run_start);
  char line[64];
  std::snprintf(line, sizeof(line), "test accuracy: %.4f", result.test_accuracy);
  log << line << std::endl;
  metrics.write({{"event", "final"},
                 {"steps", step},
                 {"epochs_completed", result.epochs_completed},
                 {"test_accuracy", result.test_accuracy},
                 {"final_train_loss", result.final_train_loss},
                 {"wall_s", result.seconds}});
  return result;
}

}  // namespace tessel::train
