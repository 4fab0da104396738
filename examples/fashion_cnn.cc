// A model of your own on Fashion-MNIST, written as a libtorch user writes one: a small residual
// CNN (an nn::Module subclass), a shuffled DataLoader, AdamW with a warmup-cosine schedule, the
// loop in plain sight, and a no-grad evaluation of the test set's accuracy. Options:
//   --save=PATH     writes the trained model's state_dict as safetensors, loads it into a fresh
//                   model and evaluates that one too (the same accuracy)
//   --budget=64MiB  train inside a memory budget (the auto policy evicts, recomputes and swaps);
//                   --budget=0.5 keeps half of the activation memory measured on the first step
//   under mpirun    data parallel: each rank trains on its rows of every batch through DDP
//   --plan=8        prices every way of training it on 8 devices of a profile (--profile=PATH,
//                   by default the CPU example profile) and names the fastest that fits; under
//                   mpirun -np 8 with --steps=N it then trains that plan as it is priced, or
//                   frontier point K with --point=K (points under a memory budget train without
//                   the budget)
//   bazel run //examples:fashion_cnn -- --epochs=1
//   bazel build //examples:fashion_cnn && mpirun -np 2 bazel-bin/examples/fashion_cnn --steps=200
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "memory/memory.h"
#include "parallel/ddp.h"
#include "parallel/launch.h"
#include "parallel/mpi_communicator.h"
#include "parallel/parallelize.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/report.h"
#include "parallel/planner/trace_module.h"
#include "tessel.h"

using namespace tessel;

// conv-bn-relu-conv-bn, added to its input, then relu.
class ResidualBlock : public nn::Module {
 public:
  explicit ResidualBlock(int64_t channels) : nn::Module("ResidualBlock") {
    auto conv = [channels] {
      return std::make_shared<nn::Conv2d>(
          nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false));
    };
    conv1 = register_module("conv1", conv());
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(channels));
    conv2 = register_module("conv2", conv());
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(channels));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = relu(bn1->forward(conv1->forward(x)));
    return relu(x + bn2->forward(conv2->forward(y)));
  }

  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
};

// 28x28 grey images -> 10 classes: a 32-channel stem, a residual block, a stride-2 widening to
// 64 channels, another block, global average pooling and a linear classifier.
std::shared_ptr<nn::Sequential> make_net() {
  auto conv_bn_relu = [](int64_t in, int64_t out, int64_t stride) {
    return std::make_shared<nn::Sequential>(
        nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
        nn::BatchNorm2d(out), nn::ReLU());
  };
  return std::make_shared<nn::Sequential>(
      conv_bn_relu(1, 32, 1), std::make_shared<ResidualBlock>(32), conv_bn_relu(32, 64, 2),
      std::make_shared<ResidualBlock>(64), nn::AdaptiveAvgPool2d(nn::IntPair(1, 1)), nn::Flatten(),
      nn::Linear(64, 10));
}

// The share of `data` the model classifies right, without autograd, in batches of the training
// batch's size: a memory budget that fits a training step then fits evaluation too.
double accuracy(nn::Module& model, const std::shared_ptr<data::ImageDataset>& data,
                int64_t batch_size) {
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0;
  data::DataLoader loader(data, data::DataLoaderOptions().batch_size(batch_size).shuffle(false));
  for (data::Batch& batch : loader.epoch(0))
    correct += model(batch.inputs).argmax(1).eq(batch.targets).sum().item<int64_t>();
  model.train();
  return static_cast<double>(correct) / static_cast<double>(data->size());
}

// Relative to the runfiles, where `bazel run` and the tests start.
constexpr const char* kCpuProfile = "parallel/profiles/cpu_2core_example.json";

// --name=value flags; a flag not given keeps `fallback`.
std::string flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return argv[i] + prefix.size();
  return fallback;
}

// The planner's (memory, time) frontier for training this model on `devices` devices of the
// profile, and the fastest plan that fits (printed by rank 0): each op's split, or none when no
// plan fits.
std::vector<planner::PlanFile::Op> plan_fashion_cnn(int devices, int64_t batch_size,
                                                    const std::string& profile_path, int point,
                                                    bool print) {
  std::shared_ptr<nn::Sequential> net = make_net();  // fresh: tracing moves it to the meta device
  planner::ModuleTraceOptions trace({batch_size, 1, 28, 28});
  const planner::Graph graph = planner::trace_module(*net, trace.name("fashion_cnn"));
  planner::PlanOptions options;
  options.config.devices = devices;
  options.config.profile = planner::load_profile(profile_path);
  options.executable_only = true;  // choose among plans that run as priced
  const planner::PlanResult result = planner::plan_graph(graph, options);
  if (print) {
    std::printf(
        "fashion_cnn: %.3fM parameters, %zu ops, batch %lld on %d devices of profile %s\n\n",
        graph.parameter_count() / 1e6, graph.ops.size(), static_cast<long long>(batch_size),
        devices, options.config.profile.name.c_str());
    planner::print_frontier(std::cout, result, batch_size, /*rows=*/10);
    if (result.chosen < 0)
      std::printf("no plan fits in %s per device\n",
                  planner::format_bytes(result.memory_per_device).c_str());
    else
      planner::print_chosen(std::cout << "\n", graph, result);
  }
  if (point >= 0) {
    TESSEL_CHECK(point < static_cast<int>(result.frontier.size()), "--point=", point,
                 ": the frontier has points 0 to ", result.frontier.size() - 1);
    if (print)
      std::printf("\ntraining point %d: %s\n", point, result.frontier[point].summary.c_str());
    return parallel::planned_ops(graph, result, point);
  }
  if (result.chosen < 0) return {};
  return parallel::planned_ops(graph, result, result.chosen);
}

// Trains the model as `ops` split it over this job's ranks (parallel::ParallelModule): every op on
// its shards, the collectives the plan priced between them. Returns the whole trained model.
std::shared_ptr<nn::Sequential> train_as_planned(
    const std::vector<planner::PlanFile::Op>& ops,
    const std::shared_ptr<data::ImageDataset>& train_set, int64_t batch_size, int64_t steps) {
  int tp = 1;
  for (const auto& op : ops) tp = std::max(tp, op.tp);
  parallel::ProcessGrid grid(parallel::world_size() / tp, tp);
  parallel::ParallelModule model(make_net(), ops, grid,
                                 planner::ModuleTraceOptions({batch_size, 1, 28, 28}));
  optim::AdamW optimizer(model.parameters(), optim::AdamWOptions(1e-3));
  optim::CosineWithWarmup schedule(optimizer, /*warmup_steps=*/steps / 20, steps);
  data::DataLoader loader(train_set, data::DataLoaderOptions()
                                         .batch_size(batch_size)
                                         .shuffle(true)
                                         .seed(1)
                                         .drop_last(true));  // the plan's batch, every step
  int64_t step = 0;
  for (int epoch = 0; step < steps; ++epoch) {
    for (data::Batch& batch : loader.epoch(epoch)) {
      // Every rank draws the same batch and keeps the rows of its dp index.
      const int64_t rows = batch_size / grid.dp_size(), first = rows * grid.dp_index();
      Tensor loss =
          model.loss(batch.inputs.narrow(0, first, rows), batch.targets.narrow(0, first, rows));
      optimizer.zero_grad();
      loss.backward();
      model.synchronize_gradients();  // sums over the dp group
      optimizer.step();
      schedule.step();
      ++step;
      if (parallel::world_rank() == 0 && step % 50 == 0)
        std::printf("step %lld loss %.4f\n", static_cast<long long>(step), loss.item<double>());
      if (step >= steps) break;
    }
  }
  auto whole = make_net();
  whole->load_state_dict(model.full_state_dict());
  return whole;
}

int train_fashion_cnn(int argc, char** argv) {
  const std::string data_dir = flag(argc, argv, "data", data::kFashionMnistDir);
  const int epochs = std::stoi(flag(argc, argv, "epochs", "1"));
  const int64_t max_steps = std::stoll(flag(argc, argv, "steps", "0"));  // 0: whole epochs
  const int64_t batch_size = 128;
  const std::string budget = flag(argc, argv, "budget", "");
  const std::string save_path = flag(argc, argv, "save", "");
  const int rank = parallel::world_rank(), ranks = parallel::world_size();
  const int plan_devices = std::stoi(flag(argc, argv, "plan", "0"));
  std::vector<planner::PlanFile::Op> plan;
  if (plan_devices > 0) {
    plan = plan_fashion_cnn(plan_devices, batch_size, flag(argc, argv, "profile", kCpuProfile),
                            std::stoi(flag(argc, argv, "point", "-1")), rank == 0);
    // Planned for this job's ranks: train as the plan says; else the plan was all to show.
    if (plan.empty() || plan_devices != ranks || max_steps == 0) return plan.empty() ? 2 : 0;
  }

  manual_seed(0);  // the same initial model on every rank
  auto train_set = data::load_fashion_mnist(data_dir, data::Split::kTrain);
  auto test_set = data::load_fashion_mnist(data_dir, data::Split::kTest);
  if (!plan.empty()) {
    auto trained = train_as_planned(plan, train_set, batch_size, max_steps);
    const double test_accuracy = accuracy(*trained, test_set, batch_size);
    if (rank == 0)
      std::printf("%lld steps as planned, test accuracy %.4f\n", static_cast<long long>(max_steps),
                  test_accuracy);
    return 0;
  }
  // Tensors made inside the scope (the model, its gradients and the optimizer state too) count
  // against the budget; the data sets, loaded before it, do not. Without --budget nothing is
  // limited.
  // A fraction (--budget=0.5) keeps that share of the activation memory: the first step runs
  // unlimited to measure it, and end_step() then sets the budget.
  std::unique_ptr<memory::MemoryScope> scope;
  if (!budget.empty())
    scope =
        std::make_unique<memory::MemoryScope>(memory::parse_budget(budget), memory::Policy::kAuto);

  std::shared_ptr<nn::Sequential> model = make_net();
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  if (ranks > 1)
    ddp = std::make_unique<parallel::DistributedDataParallel>(model,
                                                              parallel::MpiCommunicator::world());
  optim::AdamW optimizer(model->parameters(), optim::AdamWOptions(1e-3));

  data::DataLoader loader(train_set,
                          data::DataLoaderOptions().batch_size(batch_size).shuffle(true).seed(1));
  // The learning rate rises over the first 5% of the steps, then follows a cosine to zero.
  int64_t total_steps = epochs * loader.num_batches();
  if (max_steps > 0) total_steps = std::min(total_steps, max_steps);
  optim::CosineWithWarmup schedule(optimizer, /*warmup_steps=*/total_steps / 20, total_steps);
  int64_t step = 0;
  for (int epoch = 0; epoch < epochs && (max_steps == 0 || step < max_steps); ++epoch) {
    for (data::Batch& batch : loader.epoch(epoch)) {
      // Every rank draws the same batch and keeps its rows of it.
      const int64_t rows = parallel::part_rows(batch.inputs.size(0), ranks, rank);
      const int64_t first = parallel::part_rows(batch.inputs.size(0), ranks, 0) * rank;
      Tensor inputs = batch.inputs.narrow(0, first, rows);
      Tensor targets = batch.targets.narrow(0, first, rows);
      Tensor loss = cross_entropy(ddp ? ddp->forward(inputs) : model->forward(inputs), targets);
      optimizer.zero_grad();
      loss.backward();  // under DDP, the gradients are averaged over the ranks when it returns
      optimizer.step();
      schedule.step();
      if (scope) {
        std::vector<Tensor> held = optimizer.held_tensors();  // parameters, gradients, state
        for (const Tensor& buffer : model->buffers()) held.push_back(buffer);
        scope->end_step(held);
      }
      ++step;
      if (rank == 0 && step % 50 == 0)
        std::printf("step %lld loss %.4f\n", static_cast<long long>(step), loss.item<double>());
      if (max_steps > 0 && step >= max_steps) break;
    }
  }
  if (ddp) ddp->sync_buffers();  // the ranks' batch-norm statistics, averaged
  const double test_accuracy = accuracy(*model, test_set, batch_size);
  if (rank == 0) {
    std::printf("%lld steps, test accuracy %.4f", static_cast<long long>(step), test_accuracy);
    if (scope) std::printf("; %s", memory::status_line(memory::status()).c_str());
    std::printf("\n");
  }
  if (rank == 0 && !save_path.empty()) {
    // Parameters and batch-norm statistics, by their state_dict names.
    save_safetensors(save_path, model->state_dict());
    std::shared_ptr<nn::Sequential> reloaded = make_net();
    reloaded->load_state_dict(load_safetensors(save_path));
    std::printf("saved to %s and loaded into a new model: test accuracy %.4f\n", save_path.c_str(),
                accuracy(*reloaded, test_set, batch_size));
  }
  return 0;
}

int main(int argc, char** argv) { return parallel::run_ranks(argc, argv, train_fashion_cnn); }
