// One training step (forward, loss, backward, SGD with momentum 0.9) of a model zoo network on a
// fixed batch of random data, timed step by step. bench/compare_pytorch drives it over stdin,
// alternating with the same step in PyTorch (bench/torch_train_step.py):
//   train_step_bench --case=resnet18_32 --threads=2      then lines "run N" -> "ms t1 t2 ...",
//   "quit". --profile=N instead prints a per-op time breakdown over N steps (after one warm-up),
//   --by-shape splitting it by input shapes.
//   train_step_bench --case=resnet50_224 --device=cuda --precision=bf16 --batch=128
// Cases: resnet18_32, resnet18_fashion (the Fashion-MNIST recipe's ResNet-18: 1x28x28, 10
// classes, torchvision stem, batch 128), user_cnn_fashion (a user's small CNN on 1x28x28, batch
// 128, AdamW), resnet50_224, shufflenet_224, bert_mini_128,
// bert_base_128, conv3x3_C_S (3x3 conv forward + backward, batch 32, C channels, SxS).
// --batch=N overrides a case's batch. --mode=eval times what evaluation does instead of a
// training step (classifier cases): eval mode, no autograd, forward, loss and argmax.
// --device=cuda needs a build with --config=cuda. --precision=bf16 autocasts forward and loss
// (AutocastGuard, as train --precision=bf16); parameters and optimizer state stay f32. Every
// step ends reading the loss back (item()), which waits for the device, so wall time per step
// covers all of its GPU work.
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

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/device.h"
#include "core/op.h"
#include "core/rng.h"
#include "core/run_main.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace tessel::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kLearningRate = 0.01;
constexpr double kMomentum = 0.9;
constexpr double kAdamWLearningRate = 1e-3;  // the user CNN's AdamW (weight decay 0.01)

// A small CNN as a user writes one for 28x28 grey images: three 3x3 conv-bn-relu blocks of 32,
// 64 (stride 2) and 64 channels, global average pooling, a linear classifier.
std::shared_ptr<nn::Sequential> user_cnn() {
  auto block = [](int64_t in, int64_t out, int64_t stride) {
    return std::make_shared<nn::Sequential>(
        nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
        nn::BatchNorm2d(out), nn::ReLU());
  };
  return std::make_shared<nn::Sequential>(block(1, 32, 1), block(32, 64, 2), block(64, 64, 1),
                                          nn::AdaptiveAvgPool2d(nn::IntPair(1, 1)), nn::Flatten(),
                                          nn::Linear(64, 10));
}

// Where and how a case runs: the device its model and batch live on, and bf16 autocast.
struct StepOptions {
  Device device = Device::cpu();
  bool bf16 = false;
  bool eval = false;  // --mode=eval
};

// A case: the batch size (for samples/s), the trained element count (compare_pytorch checks it
// against PyTorch's) and one full step, returning the loss.
struct TrainCase {
  int64_t batch = 0;
  int64_t parameters = 0;
  std::function<double()> step;
};

int64_t count_elements(const std::vector<Tensor>& tensors) {
  int64_t count = 0;
  for (const Tensor& tensor : tensors) count += tensor.numel();
  return count;
}

// Holds a model, its optimizer and the fixed batch alive for the step closure.
template <typename Model>
struct Holder {
  std::shared_ptr<Model> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::vector<Tensor> batch;
};

enum class OptimizerKind { kSgdMomentum, kAdamW };

// Puts the model on the device before the optimizer takes its parameters (its momentum buffers
// are made where the parameters are), and moves the batch, made on the CPU, there too.
template <typename Model>
std::shared_ptr<Holder<Model>> make_holder(std::shared_ptr<Model> model, std::vector<Tensor> batch,
                                           const StepOptions& options,
                                           OptimizerKind optimizer = OptimizerKind::kSgdMomentum) {
  auto holder = std::make_shared<Holder<Model>>();
  holder->model = std::move(model);
  holder->model->to(options.device);
  holder->model->train();
  if (optimizer == OptimizerKind::kAdamW) {
    holder->optimizer = std::make_unique<optim::AdamW>(holder->model->parameters(),
                                                       optim::AdamWOptions(kAdamWLearningRate));
  } else {
    holder->optimizer = std::make_unique<optim::SGD>(
        holder->model->parameters(), optim::SGDOptions(kLearningRate).momentum(kMomentum));
  }
  for (Tensor& tensor : batch) holder->batch.push_back(tensor.to(options.device));
  return holder;
}

template <typename Model>
TrainCase classifier_case(std::shared_ptr<Model> model, int64_t batch, int64_t size,
                          int64_t classes, const StepOptions& options, int64_t channels = 3,
                          OptimizerKind optimizer = OptimizerKind::kSgdMomentum) {
  auto holder = make_holder(std::move(model),
                            {randn({batch, channels, size, size}), randint(0, classes, {batch})},
                            options, optimizer);
  const int64_t parameters = count_elements(holder->model->parameters());
  if (options.eval) {
    holder->model->eval();
    return {batch, parameters, [holder, bf16 = options.bf16]() {
              NoGradGuard no_grad;
              AutocastGuard autocast(DType::kBFloat16, bf16);
              const Tensor logits = holder->model->forward(holder->batch[0]);
              const Tensor loss = cross_entropy(logits, holder->batch[1], -100, 0.0, "sum");
              argmax(logits, 1).to_vector<int64_t>();  // the predictions, as evaluation reads
              return loss.item<double>();
            }};
  }
  return {batch, parameters, [holder, bf16 = options.bf16]() {
            Tensor loss;
            {
              AutocastGuard autocast(DType::kBFloat16, bf16);
              loss = cross_entropy(holder->model->forward(holder->batch[0]), holder->batch[1]);
            }
            holder->optimizer->zero_grad();
            loss.backward();
            holder->optimizer->step();
            return loss.item<double>();
          }};
}

// BERT (mini or base) with its pre-training heads over every position: MLM labels on 15% of the
// tokens (-100 elsewhere) and NSP labels, the loss of bert_pretraining_loss.
TrainCase bert_case(const models::BertConfig& config, int64_t batch, int64_t seq_len,
                    const StepOptions& options) {
  auto model = std::make_shared<models::BertForPreTraining>(config);
  Tensor input_ids = randint(0, config.vocab_size(), {batch, seq_len});
  Tensor token_types = randint(0, 2, {batch, seq_len});
  Tensor mask = ones({batch, seq_len}, DType::kInt64);
  Tensor targets = randint(0, config.vocab_size(), {batch, seq_len});
  Tensor masked = lt(rand({batch, seq_len}), full({}, 0.15));
  Tensor mlm_labels = where(masked, targets, full({batch, seq_len}, -100, DType::kInt64));
  Tensor nsp_labels = randint(0, 2, {batch});
  auto holder = make_holder(std::move(model),
                            {input_ids, token_types, mask, mlm_labels, nsp_labels}, options);
  return {batch, count_elements(holder->model->parameters()), [holder, bf16 = options.bf16]() {
            const auto& b = holder->batch;
            Tensor loss;
            {
              AutocastGuard autocast(DType::kBFloat16, bf16);
              models::BertPreTrainingOutput output = holder->model->forward(b[0], b[1], b[2]);
              loss = models::bert_pretraining_loss(output, b[3], b[4]).total;
            }
            holder->optimizer->zero_grad();
            loss.backward();
            holder->optimizer->step();
            return loss.item<double>();
          }};
}

// Forward and backward (input and weight gradients) of a 3x3 convolution, stride 1, padding 1.
// With bf16 the convolution runs autocast (its output, and so the incoming gradient, in bf16).
// There is no loss to read back, so off the CPU the step waits for the device by reading one
// weight gradient value.
TrainCase conv_case(int64_t batch, int64_t channels, int64_t size, const StepOptions& options) {
  auto tensors = std::make_shared<std::vector<Tensor>>();
  const DType output_dtype = options.bf16 ? DType::kBFloat16 : DType::kFloat32;
  *tensors = {randn({batch, channels, size, size}).to(options.device).set_requires_grad(true),
              randn({channels, channels, 3, 3}).to(options.device).set_requires_grad(true),
              randn({batch, channels, size, size}).to(output_dtype).to(options.device)};
  return {batch, (*tensors)[1].numel(), [tensors, options]() {
            Tensor& x = (*tensors)[0];
            Tensor& w = (*tensors)[1];
            x.set_grad(Tensor());
            w.set_grad(Tensor());
            Tensor y;
            {
              AutocastGuard autocast(DType::kBFloat16, options.bf16);
              y = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
            }
            y.backward((*tensors)[2]);
            if (!options.device.is_cpu()) return w.grad().view({-1}).select(0, 0).item<double>();
            return w.grad().numel() > 0 ? 0.0 : 1.0;
          }};
}

// `batch` > 0 replaces the case's own batch size.
TrainCase make_case(const std::string& name, int64_t batch, const StepOptions& options) {
  auto batch_or = [batch](int64_t own) { return batch > 0 ? batch : own; };
  if (name == "resnet18_32")
    return classifier_case(
        models::resnet18(models::ResNetOptions().num_classes(10).small_image_stem(true)),
        batch_or(32), 32, 10, options);
  if (name == "resnet18_fashion")
    return classifier_case(models::resnet18(models::ResNetOptions().num_classes(10).in_channels(1)),
                           batch_or(128), 28, 10, options, /*channels=*/1);
  if (name == "user_cnn_fashion")
    return classifier_case(user_cnn(), batch_or(128), 28, 10, options, /*channels=*/1,
                           OptimizerKind::kAdamW);
  if (name == "resnet50_224")
    return classifier_case(models::resnet50(), batch_or(8), 224, 1000, options);
  if (name == "shufflenet_224")
    return classifier_case(models::shufflenet_v2_x1_0(), batch_or(16), 224, 1000, options);
  if (name == "bert_mini_128")
    return bert_case(models::BertConfig::mini(), batch_or(8), 128, options);
  if (name == "bert_base_128")
    return bert_case(models::BertConfig::base(), batch_or(32), 128, options);
  if (options.eval) {
    std::cerr << "train_step_bench: --mode=eval takes a classifier case (resnet18_32, "
                 "resnet18_fashion, user_cnn_fashion, resnet50_224, shufflenet_224), not '"
              << name << "'\n";
    std::exit(2);
  }
  int channels = 0, size = 0;
  if (std::sscanf(name.c_str(), "conv3x3_%d_%d", &channels, &size) == 2)
    return conv_case(batch_or(32), channels, size, options);
  std::cerr << "train_step_bench: unknown case '" << name
            << "' (resnet18_32, resnet18_fashion, user_cnn_fashion, resnet50_224, shufflenet_224, "
               "bert_mini_128, "
               "bert_base_128, conv3x3_C_S)\n";
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
  std::string precision = "f32";
  StepOptions options;
  int64_t batch = 0;
  int profile_steps = 0;
  bool by_shape = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      set_num_threads(std::atoi(argv[i] + 10));
    } else if (std::strncmp(argv[i], "--case=", 7) == 0) {
      case_name = argv[i] + 7;
    } else if (std::strncmp(argv[i], "--device=", 9) == 0) {
      options.device = Device::parse(argv[i] + 9);
    } else if (std::strncmp(argv[i], "--precision=", 12) == 0) {
      precision = argv[i] + 12;
      if (precision != "f32" && precision != "bf16") {
        std::cerr << "train_step_bench: --precision must be f32 or bf16, got '" << precision
                  << "'\n";
        return 2;
      }
      options.bf16 = precision == "bf16";
    } else if (std::strncmp(argv[i], "--mode=", 7) == 0) {
      const std::string mode = argv[i] + 7;
      if (mode != "train" && mode != "eval") {
        std::cerr << "train_step_bench: --mode must be train or eval, got '" << mode << "'\n";
        return 2;
      }
      options.eval = mode == "eval";
    } else if (std::strncmp(argv[i], "--batch=", 8) == 0) {
      batch = std::atoll(argv[i] + 8);
      if (batch <= 0) {
        std::cerr << "train_step_bench: --batch must be a positive integer, got '" << (argv[i] + 8)
                  << "'\n";
        return 2;
      }
    } else if (std::strncmp(argv[i], "--profile=", 10) == 0) {
      profile_steps = std::atoi(argv[i] + 10);
    } else if (std::strcmp(argv[i], "--by-shape") == 0) {
      by_shape = true;
    } else {
      std::cerr << "train_step_bench: unknown argument '" << argv[i] << "'\n";
      return 2;
    }
  }
  // Fails here, before a model is built, when the device is not there: a build without
  // --config=cuda, or no GPU.
  if (!options.device.is_cpu()) zeros({1}).to(options.device).item<double>();
  manual_seed(0);
  const TrainCase train_case = make_case(case_name, batch, options);
  if (profile_steps > 0) {
    profile(train_case, profile_steps, by_shape);
    return 0;
  }
  std::cout << "ready batch " << train_case.batch << " threads " << get_num_threads() << " device "
            << options.device << " precision " << precision << " mode "
            << (options.eval ? "eval" : "train") << " params " << train_case.parameters
            << std::endl;
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

int main(int argc, char** argv) { return tessel::run_main(argc, argv, tessel::bench::run); }
