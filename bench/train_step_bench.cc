// One training step (forward, loss, backward, SGD with momentum 0.9) of a model zoo network on a
// fixed batch of random data, timed step by step. bench/compare_pytorch drives it over stdin,
// alternating with the same step in PyTorch (bench/torch_train_step.py):
//   train_step_bench --case=resnet18_32 --threads=2      then lines "run N" -> "ms t1 t2 ...",
//   "quit". --profile=N instead prints a per-op time breakdown over N steps (after one warm-up),
//   --by-shape splitting it by input shapes.
// Cases: resnet18_32, resnet50_224, shufflenet_224, bert_mini_128, conv3x3_C_S (3x3 conv
// forward + backward, batch 32, C channels, SxS).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/op.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "ops/ops.h"
#include "train/optim/sgd.h"

namespace tessel::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kLearningRate = 0.01;
constexpr double kMomentum = 0.9;

// A case: the batch size (for samples/s) and one full step, returning the loss.
struct TrainCase {
  int64_t batch = 0;
  std::function<double()> step;
};

// Holds a model, its optimizer and the fixed batch alive for the step closure.
template <typename Model>
struct Holder {
  std::shared_ptr<Model> model;
  std::unique_ptr<optim::SGD> optimizer;
  std::vector<Tensor> batch;
};

template <typename Model>
TrainCase classifier_case(std::shared_ptr<Model> model, int64_t batch, int64_t size,
                          int64_t classes) {
  auto holder = std::make_shared<Holder<Model>>();
  holder->model = std::move(model);
  holder->model->train();
  holder->optimizer = std::make_unique<optim::SGD>(
      holder->model->parameters(), optim::SGDOptions(kLearningRate).momentum(kMomentum));
  holder->batch = {randn({batch, 3, size, size}), randint(0, classes, {batch})};
  return {batch, [holder]() {
            Tensor loss = cross_entropy(holder->model->forward(holder->batch[0]), holder->batch[1]);
            holder->optimizer->zero_grad();
            loss.backward();
            holder->optimizer->step();
            return loss.item<double>();
          }};
}

// BERT mini with its pre-training heads over every position: MLM labels on 15% of the tokens
// (-100 elsewhere) and NSP labels, the loss of bert_pretraining_loss.
TrainCase bert_case(int64_t batch, int64_t seq_len) {
  auto holder = std::make_shared<Holder<models::BertForPreTraining>>();
  const models::BertConfig config = models::BertConfig::mini();
  holder->model = std::make_shared<models::BertForPreTraining>(config);
  holder->model->train();
  holder->optimizer = std::make_unique<optim::SGD>(
      holder->model->parameters(), optim::SGDOptions(kLearningRate).momentum(kMomentum));
  Tensor input_ids = randint(0, config.vocab_size(), {batch, seq_len});
  Tensor token_types = randint(0, 2, {batch, seq_len});
  Tensor mask = ones({batch, seq_len}, DType::kInt64);
  Tensor targets = randint(0, config.vocab_size(), {batch, seq_len});
  Tensor masked = lt(rand({batch, seq_len}), full({}, 0.15));
  Tensor mlm_labels = where(masked, targets, full({batch, seq_len}, -100, DType::kInt64));
  Tensor nsp_labels = randint(0, 2, {batch});
  holder->batch = {input_ids, token_types, mask, mlm_labels, nsp_labels};
  return {batch, [holder]() {
            const auto& b = holder->batch;
            models::BertPreTrainingOutput output = holder->model->forward(b[0], b[1], b[2]);
            Tensor loss = models::bert_pretraining_loss(output, b[3], b[4]).total;
            holder->optimizer->zero_grad();
            loss.backward();
            holder->optimizer->step();
            return loss.item<double>();
          }};
}

// Forward and backward (input and weight gradients) of a 3x3 convolution, stride 1, padding 1.
TrainCase conv_case(int64_t batch, int64_t channels, int64_t size) {
  auto tensors = std::make_shared<std::vector<Tensor>>();
  *tensors = {randn({batch, channels, size, size}).set_requires_grad(true),
              randn({channels, channels, 3, 3}).set_requires_grad(true),
              randn({batch, channels, size, size})};
  return {batch, [tensors]() {
            Tensor& x = (*tensors)[0];
            Tensor& w = (*tensors)[1];
            x.set_grad(Tensor());
            w.set_grad(Tensor());
            conv2d(x, w, Tensor(), {1, 1}, {1, 1}).backward((*tensors)[2]);
            return w.grad().numel() > 0 ? 0.0 : 1.0;
          }};
}

TrainCase make_case(const std::string& name) {
  if (name == "resnet18_32")
    return classifier_case(
        models::resnet18(models::ResNetOptions().num_classes(10).small_image_stem(true)), 32, 32,
        10);
  if (name == "resnet50_224") return classifier_case(models::resnet50(), 8, 224, 1000);
  if (name == "shufflenet_224") return classifier_case(models::shufflenet_v2_x1_0(), 16, 224, 1000);
  if (name == "bert_mini_128") return bert_case(8, 128);
  int channels = 0, size = 0;
  if (std::sscanf(name.c_str(), "conv3x3_%d_%d", &channels, &size) == 2)
    return conv_case(32, channels, size);
  std::cerr << "train_step_bench: unknown case '" << name
            << "' (resnet18_32, resnet50_224, shufflenet_224, bert_mini_128, conv3x3_C_S)\n";
  std::exit(2);
}

double time_step_ms(const TrainCase& train_case) {
  const auto start = Clock::now();
  train_case.step();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Per-op breakdown: the dispatcher's trace hook fires after every op, so the time since the
// previous hook is charged to the op that just ended (with the autograd engine's and the
// optimizer's own work between ops).
std::string shapes_of(const std::vector<Tensor>& inputs) {
  std::string text;
  for (const Tensor& input : inputs)
    if (input.defined()) text += " " + shape_str(input.sizes());
  return text;
}

void profile(const TrainCase& train_case, int steps, bool by_shape) {
  train_case.step();
  std::map<std::string, std::pair<double, int64_t>> per_op;
  auto last = Clock::now();
  TraceHook previous = set_trace_hook([&](const OpDef& op, const std::vector<Tensor>& inputs,
                                          const std::vector<Tensor>&, const Attrs&) {
    const auto now = Clock::now();
    auto& entry = per_op[by_shape ? op.name + shapes_of(inputs) : op.name];
    entry.first += std::chrono::duration<double, std::milli>(now - last).count();
    entry.second += 1;
    last = now;
  });
  const auto start = Clock::now();
  last = start;
  for (int i = 0; i < steps; ++i) train_case.step();
  const double total = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  set_trace_hook(previous);
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(per_op.begin(),
                                                                       per_op.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("%-32s %10s %7s %8s\n", "op", "ms/step", "share", "calls");
  for (const auto& [name, entry] : rows)
    std::printf("%-32s %10.2f %6.1f%% %8.1f\n", name.c_str(), entry.first / steps,
                100.0 * entry.first / total, static_cast<double>(entry.second) / steps);
  std::printf("%-32s %10.2f\n", "total", total / steps);
}

int run(int argc, char** argv) {
  std::string case_name;
  int profile_steps = 0;
  bool by_shape = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      set_num_threads(std::atoi(argv[i] + 10));
    } else if (std::strncmp(argv[i], "--case=", 7) == 0) {
      case_name = argv[i] + 7;
    } else if (std::strncmp(argv[i], "--profile=", 10) == 0) {
      profile_steps = std::atoi(argv[i] + 10);
    } else if (std::strcmp(argv[i], "--by-shape") == 0) {
      by_shape = true;
    } else {
      std::cerr << "train_step_bench: unknown argument '" << argv[i] << "'\n";
      return 2;
    }
  }
  manual_seed(0);
  const TrainCase train_case = make_case(case_name);
  if (profile_steps > 0) {
    profile(train_case, profile_steps, by_shape);
    return 0;
  }
  std::cout << "ready batch " << train_case.batch << " threads " << get_num_threads() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream words(line);
    std::string command;
    int steps = 0;
    words >> command >> steps;
    if (command == "quit") break;
    if (command != "run" || steps <= 0) {
      std::cout << "error: expected 'run N' or 'quit', got '" << line << "'" << std::endl;
      continue;
    }
    std::cout << "ms";
    for (int i = 0; i < steps; ++i) std::cout << " " << time_step_ms(train_case);
    std::cout << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace tessel::bench

int main(int argc, char** argv) {
  try {
    return tessel::bench::run(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "train_step_bench: " << error.what() << "\n";
    return 1;
  }
}
