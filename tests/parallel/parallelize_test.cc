// Unchanged models trained as the planner's plans (parallel/parallelize.h) against one process
// training the whole model on the whole batch: a small residual CNN with batch norm and the zoo's
// ResNet-18 (channel-split convolutions, column and row, normalisation and pooling by channels,
// row- and column-split classifiers) on a line of tensor-parallel ranks, and an MLP and a CNN
// without batch norm on a dp x tp grid at 4 ranks, and plans with per-op degrees (ops splitting
// the batch or the model over both of two ranks, and on four ranks ops on a 2 x 2 grid beside
// ops over all four, for the MLP, the CNNs, a tagger, ShuffleNet, ResNet-18 and BERT). For several
// points of each frontier: two SGD steps give the same losses, first gradients and final parameters
// within the closeness rule, and each step issues exactly the collectives the planner priced (kind,
// group, bytes). ShuffleNet v2 trains the same; its channel split and shuffle are views that cut
// across channel-split tensors, which the runtime gathers as the planner prices. BERT pre-training
// (a step of five inputs) runs its frontier points with attention split by heads, embedding tables
// split by vocabulary or by columns (the word table tied to the decoder), the loss split by
// classes, on a line and on a dp x tp grid (masked-LM rows ignored unevenly over dp). A user's
// tagger runs its word table (with a padding row) split by vocabulary or by columns and its
// nll_loss split by classes. A plan made for another model, or with degrees the grid does not have,
// is a clear error on every rank. ZeRO's three stages over the dp group (2 x 1 at 2 ranks, 2 x 2 at
// 4) train what the same plan trains without ZeRO, with SGD and AdamW, and keep the whole optimizer
// state.
#include "parallel/parallelize.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "models/trace.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/counting_communicator.h"
#include "parallel/launch.h"
#include "parallel/planner/planner.h"
#include "parallel/process_group.h"
#include "parallel/zero.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"
#include "train/tasks/planned_module.h"

namespace tessel::parallel {
namespace {

using tessel::testing::all_close;
using tessel::testing::throws_error;
using testing::MpiTest;

constexpr int kSteps = 2;
constexpr double kLearningRate = 1e-3;  // small: steps of random data stay well conditioned

class Block : public nn::Module {
 public:
  explicit Block(int64_t channels) : Module("Block") {
    conv1 = register_module(
        "conv1", std::make_shared<nn::Conv2d>(nn::Conv2dOptions(channels, channels, 3).padding(1)));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(channels));
    conv2 = register_module(
        "conv2", std::make_shared<nn::Conv2d>(nn::Conv2dOptions(channels, channels, 3).padding(1)));
  }
  Tensor forward(const Tensor& x) override {
    return relu(add(conv2->forward(relu(bn1->forward(conv1->forward(x)))), x));
  }
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1;
};

// A user's residual CNN: conv-bn-relu, a residual block, a strided conv, pooling, a classifier.
std::shared_ptr<nn::Module> residual_cnn(bool batch_norm) {
  manual_seed(7);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 8, 3).padding(1)));
  if (batch_norm) model->push_back(std::make_shared<nn::BatchNorm2d>(8));
  model->push_back(std::make_shared<nn::ReLU>());
  if (batch_norm) model->push_back(std::make_shared<Block>(8));
  model->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(8, 16, 3).stride(2).padding(1)));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(nn::IntPair(1, 1)));
  model->push_back(std::make_shared<nn::Flatten>());
  model->push_back(std::make_shared<nn::Linear>(16, 8));
  return model;
}

std::shared_ptr<nn::Module> mlp() {
  manual_seed(11);
  return std::make_shared<nn::Sequential>(nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 16),
                                          nn::ReLU(), nn::Linear(16, 8));
}

// A model and its training step as the tests run it, whole or through a plan: a fresh model
// (the same initial values each time), the step's trace (its inputs and loss) and the whole
// batch of each step.
struct Case {
  std::function<std::shared_ptr<nn::Module>()> make;
  planner::ModuleTraceOptions trace;
  std::function<std::vector<Tensor>(int step)> batch;
};

// Images (or features) of `input_shape` and labels of 8 classes.
Case labelled(std::function<std::shared_ptr<nn::Module>()> make, const Shape& input_shape) {
  return {std::move(make), planner::ModuleTraceOptions(input_shape), [input_shape](int step) {
            manual_seed(100 + step);
            Tensor input = randn(input_shape);
            return std::vector<Tensor>{input, randint(0, 8, {input_shape[0]})};
          }};
}

// ShuffleNet v2 x0.5 of the zoo on 64 x 64 images: its channel split (chunk) and shuffle are views
// across channel-split tensors.
Case shufflenet_case() {
  return labelled(
      [] {
        manual_seed(5);
        return std::shared_ptr<nn::Module>(models::make_shufflenet(
            "shufflenet_v2_x0_5", models::ShuffleNetV2Options().num_classes(8)));
      },
      {8, 3, 64, 64});
}

// BERT pre-training: ids, token types, a mask with padding, masked-LM labels that ignore most
// positions (more on some rows than others) and next-sentence labels. Dropout off: the split and
// the whole model then compute the same thing.
Case bert_case() {
  constexpr int64_t kBatch = 4, kSeq = 8, kVocab = 64;
  auto make = [] {
    manual_seed(13);
    return std::shared_ptr<nn::Module>(
        std::make_shared<models::BertForPreTraining>(models::BertConfig()
                                                         .vocab_size(kVocab)
                                                         .hidden_size(32)
                                                         .num_attention_heads(4)
                                                         .intermediate_size(64)
                                                         .num_hidden_layers(2)
                                                         .max_position_embeddings(kSeq)
                                                         .hidden_dropout_prob(0)
                                                         .attention_probs_dropout_prob(0)));
  };
  auto batch = [](int step) {
    manual_seed(200 + step);
    Tensor ids = randint(0, kVocab, {kBatch, kSeq});
    Tensor types = randint(0, 2, {kBatch, kSeq});
    Tensor mask = ones({kBatch, kSeq}, TensorOptions(DType::kInt64));
    narrow(narrow(mask, 0, 1, 1), 1, kSeq - 3, 3).fill_(0);  // row 1 padded
    // Row r predicts r + 1 of its tokens; the others are ignored.
    Tensor labels = full({kBatch, kSeq}, -100, TensorOptions(DType::kInt64));
    for (int64_t r = 0; r < kBatch; ++r)
      narrow(narrow(labels, 0, r, 1), 1, 0, r + 1).copy_(narrow(narrow(ids, 0, r, 1), 1, 0, r + 1));
    return std::vector<Tensor>{ids, types, mask, labels, randint(0, 2, {kBatch})};
  };
  return {make, models::bert_pretraining_step(kBatch, kSeq), batch};
}

// A user's token tagger: a word table with a padding row, a classifier, log-probabilities and
// nll_loss over the positions (some ignored). Its plans split the table by
// vocabulary or columns and the loss by classes.
class Tagger : public nn::Module {
 public:
  static constexpr int64_t kVocab = 32, kClasses = 8, kBatch = 8, kSeq = 6;
  Tagger() : Module("Tagger") {
    words = register_module(
        "words", std::make_shared<nn::Embedding>(nn::EmbeddingOptions(kVocab, 16).padding_idx(0)));
    classifier = register_module("classifier", std::make_shared<nn::Linear>(16, kClasses));
  }
  Tensor forward(const Tensor& ids) override {
    Tensor hidden = reshape(words->forward(ids), {ids.numel(), 16});
    return log_softmax(classifier->forward(hidden), 1);
  }
  std::shared_ptr<nn::Embedding> words;
  std::shared_ptr<nn::Linear> classifier;
};

Case tagger_case() {
  auto make = [] {
    manual_seed(17);
    return std::shared_ptr<nn::Module>(std::make_shared<Tagger>());
  };
  auto step = [](nn::Module& module, const std::vector<Tensor>& inputs) {
    const Tensor& labels = inputs.at(1);
    return nll_loss(module.forward(inputs.at(0)), reshape(labels, {labels.numel()}));
  };
  auto batch = [](int step) {
    manual_seed(300 + step);
    // Id 0 is the padding row (no gradient, though its positions are scored); every third row's
    // last position is ignored (-100).
    Tensor ids = randint(0, 4, {Tagger::kBatch, Tagger::kSeq});
    Tensor labels = randint(0, Tagger::kClasses, {Tagger::kBatch, Tagger::kSeq});
    for (int64_t row = 0; row < Tagger::kBatch; row += 3)
      narrow(narrow(labels, 0, row, 1), 1, Tagger::kSeq - 1, 1).fill_(-100);
    return std::vector<Tensor>{ids, labels};
  };
  return {make,
          planner::ModuleTraceOptions(
              {{"ids", {Tagger::kBatch, Tagger::kSeq}}, {"labels", {Tagger::kBatch, Tagger::kSeq}}},
              step),
          batch};
}

// Ops split as BERT's tensor-parallel plans split them: the frontier's points with each.
bool heads_split(const planner::PlanFile::Op& op) {
  return op.op == "bmm" && op.strategy == "heads";
}
bool table_by_columns(const planner::PlanFile::Op& op) {
  return op.op == "embedding" && op.strategy == "column";
}
bool loss_by_classes(const planner::PlanFile::Op& op) {
  return op.op == "cross_entropy" && op.strategy == "vocab";
}

// The rows of `full` this dp index holds.
Tensor rows(const Tensor& full, int dp, int index) {
  const int64_t length = full.size(0) / dp;
  return narrow(full, 0, index * length, length).contiguous();
}

// A profile where splitting pays: slow compute, fast links.
planner::DeviceProfile test_profile(int devices) {
  planner::DeviceProfile profile;
  profile.name = "test";
  profile.devices_per_node = devices;
  profile.memory_per_device = 1e9;
  profile.gemm_flops = profile.conv_flops = 1e8;
  profile.elementwise_flops = 1e8;
  profile.memory_bandwidth = 1e9;
  profile.op_overhead_s = 1e-6;
  for (auto& level : profile.collectives)
    for (auto& link : level) link = {1e-6, 1e10};
  return profile;
}

struct RunResult {
  std::vector<float> losses;
  std::vector<std::map<std::string, Tensor>> gradients;  // per step, whole
  std::map<std::string, Tensor> state;                   // after the last step
};

RunResult whole_run(const Case& c) {
  auto model = c.make();
  optim::SGD sgd(model->parameters(), optim::SGDOptions(kLearningRate));
  RunResult run;
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    Tensor loss = c.trace.step()(*model, c.batch(step));
    loss.backward();
    run.gradients.emplace_back();
    for (const auto& [name, tensor] : model->named_parameters())
      run.gradients.back()[name] = tensor.grad().clone();
    sgd.step();
    run.losses.push_back(loss.item<float>());
  }
  for (const auto& [name, tensor] : model->named_parameters()) run.state[name] = tensor;
  for (const auto& [name, tensor] : model->named_buffers()) run.state[name] = tensor;
  return run;
}

// Every call both groups recorded, sorted ("world" when they are one).
std::vector<StepCollective> issued(CountingCommunicator& dp, CountingCommunicator& tp) {
  std::vector<StepCollective> calls;
  const bool one = &dp == &tp;
  for (const auto& record : dp.records)
    calls.push_back({record.kind, one ? "world" : "dp", record.bytes});
  if (!one)
    for (const auto& record : tp.records) calls.push_back({record.kind, "tp", record.bytes});
  std::sort(calls.begin(), calls.end());
  dp.records.clear();
  tp.records.clear();
  return calls;
}

std::string listed(const std::vector<StepCollective>& calls) {
  std::string text;
  for (const auto& call : calls)
    text += call.kind + " " + call.group + " " + std::to_string(call.bytes) + "\n";
  return text;
}

RunResult planned_run(const Case& c, const std::vector<planner::PlanFile::Op>& ops,
                      const ProcessGrid& grid, bool one_group = false,
                      bool per_rank_batch_norm = false) {
  auto dp = std::make_shared<CountingCommunicator>(grid.data_parallel_on_device());
  auto tp =
      one_group ? dp : std::make_shared<CountingCommunicator>(grid.tensor_parallel_on_device());
  ParallelModule parallel(c.make(), ops, dp, tp, c.trace);
  parallel.set_per_rank_batch_norm(per_rank_batch_norm);
  optim::SGD sgd(parallel.parameters(), optim::SGDOptions(kLearningRate));
  RunResult run;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Tensor> local;
    for (const Tensor& whole : c.batch(step))
      local.push_back(rows(whole, grid.dp_size(), grid.dp_index()));
    sgd.zero_grad();
    Tensor loss = parallel.loss(local);
    loss.backward();
    // The step sends what the planner priced for it, no more and no less.
    const auto planned = parallel.planned_collectives();
    const auto calls = issued(*dp, *tp);
    std::string plan_text;
    for (const auto& op : ops)
      plan_text += std::to_string(op.index) + " " + op.op + " " + op.strategy +
                   " dp=" + std::to_string(op.dp) + " tp=" + std::to_string(op.tp) + "\n";
    EXPECT_TRUE(calls == planned) << "issued:\n"
                                  << listed(calls) << "planned:\n"
                                  << listed(planned) << "plan:\n"
                                  << plan_text;
    parallel.synchronize_gradients();
    issued(*dp, *tp);  // the gradient all-reduce: not the plan's business
    run.gradients.push_back(parallel.full_gradients());
    issued(*dp, *tp);
    sgd.step();
    run.losses.push_back(loss.item<float>());
  }
  EXPECT_EQ(parallel.unplanned_moves(), 0);
  run.state = parallel.full_state_dict();
  return run;
}

// Frontier points of `make`'s model on dp x tp devices that run on that grid, with at least one
// op split over tp when tp > 1: the fastest, the smallest and up to two between.
std::vector<std::vector<planner::PlanFile::Op>> frontier_plans(
    const Case& c, int dp, int tp, std::vector<std::string>* summaries, bool per_op_degrees = false,
    const std::vector<std::function<bool(const planner::PlanFile::Op&)>>& wanted = {}) {
  auto model = c.make();
  const planner::Graph graph = planner::trace_module(*model, c.trace);
  // Per-op degrees run over one group: dp and tp are then each op's choice on those devices.
  const int devices = per_op_degrees ? std::max(dp, tp) : dp * tp;
  planner::PlanOptions options;
  options.config.devices = devices;
  options.config.max_tp = tp;
  // Grids that split the model at tp: on models this small, whole ops' gradients can make every
  // such point dominated by data parallelism, which these tests are not about.
  options.config.min_tp = per_op_degrees ? 1 : tp;
  options.config.optimizer_states = 0;
  options.config.profile = test_profile(devices);
  options.remat_fractions = {1.0};
  options.per_op_degrees = per_op_degrees;
  planner::PlanResult result = planner::plan_graph(graph, options);
  // Batch norm over a batch split is priced as the forty-odd element-wise calls it runs as: on
  // models this small no frontier point then splits its batch. Where a test wants such an op,
  // the points come from a device whose element-wise work, copies (data parallelism's gradient
  // buckets) and per-op overhead cost nothing.
  const auto has_wanted_ops = [&] {
    for (const auto& want : wanted) {
      bool found = false;
      for (size_t p = 0; p < result.frontier.size() && !found; ++p) {
        const auto ops = planned_ops(graph, result, static_cast<int>(p));
        found = std::any_of(ops.begin(), ops.end(), want);
      }
      if (!found) return false;
    }
    return true;
  };
  if (!has_wanted_ops()) {
    options.config.profile.op_overhead_s = 0;
    options.config.profile.op_kinds["elementwise"] = {"bytes", 1e18, 1e18, 0, 0};
    options.config.profile.op_kinds["concat"] = {"bytes", 1e18, 1e18, 0, 0};
    result = planner::plan_graph(graph, options);
  }
  std::vector<int> usable;
  for (size_t p = 0; p < result.frontier.size(); ++p) {
    const auto ops = planned_ops(graph, result, static_cast<int>(p));
    bool on_grid = true, split = tp == 1, batch_split = false;
    for (const auto& op : ops) {
      on_grid = on_grid && (op.dp == 1 || op.dp == dp) && (op.tp == 1 || op.tp == tp);
      split = split || (op.tp > 1 && op.strategy != "replicate");
      batch_split = batch_split || op.dp > 1;
    }
    // Per-op degrees: points that split the batch in some ops and the model in others.
    if (on_grid && split && (!per_op_degrees || batch_split)) usable.push_back(static_cast<int>(p));
  }
  std::set<int> picked;
  if (!usable.empty()) {
    picked.insert(usable.front());
    picked.insert(usable.back());
    picked.insert(usable[usable.size() / 3]);
    picked.insert(usable[2 * usable.size() / 3]);
  }
  // And the first point with an op of each wanted kind.
  for (const auto& want : wanted)
    for (int p : usable) {
      const auto ops = planned_ops(graph, result, p);
      if (std::none_of(ops.begin(), ops.end(), want)) continue;
      picked.insert(p);
      break;
    }
  std::vector<std::vector<planner::PlanFile::Op>> plans;
  for (int p : picked) {
    plans.push_back(planned_ops(graph, result, p));
    summaries->push_back(result.frontier[p].summary);
  }
  return plans;
}

// An op of a plan that runs batch norm over a batch split.
bool splits_batch_norm_batch(const planner::PlanFile::Op& op) {
  return op.op == "batch_norm" && op.dp > 1;
}

void expect_same_run(const RunResult& planned, const RunResult& whole) {
  ASSERT_EQ(planned.losses.size(), whole.losses.size());
  for (size_t step = 0; step < whole.losses.size(); ++step)
    EXPECT_NEAR(planned.losses[step], whole.losses[step], 1e-4 * std::abs(whole.losses[step]))
        << "step " << step;
  // The first step's gradients; later steps start from parameters that differ by rounding,
  // which a batch-norm channel of almost no variance amplifies: their losses are held, and the
  // state at the end more loosely.
  for (const auto& [name, tensor] : whole.gradients.at(0)) {
    auto found = planned.gradients.at(0).find(name);
    ASSERT_TRUE(found != planned.gradients.at(0).end()) << name;
    EXPECT_TRUE(all_close(found->second, tensor, 1e-4, 1e-5)) << name;
  }
  for (const auto& [name, tensor] : whole.state) {
    auto found = planned.state.find(name);
    ASSERT_TRUE(found != planned.state.end()) << name;
    EXPECT_TRUE(all_close(found->second, tensor, 1e-3, 1e-4)) << name;
  }
}

// Each plan with per-op degrees (described by `what`), run over one group of `grid`'s ranks,
// trains what one process trains, with exactly the planned collectives.
void expect_per_op_plans_train_like_one_process(
    const Case& c, const std::vector<std::vector<planner::PlanFile::Op>>& plans,
    const std::vector<std::string>& what, const ProcessGrid& grid) {
  const RunResult whole = whole_run(c);
  for (size_t p = 0; p < plans.size(); ++p) {
    SCOPED_TRACE(what[p]);
    if (parallel::world_rank() == 0) std::cout << "  per-op plan: " << what[p] << "\n";
    expect_same_run(planned_run(c, plans[p], grid, /*one_group=*/true), whole);
  }
}

class ParallelizeTest : public MpiTest {
 protected:
  // Each step issues the planner's collectives and nothing else (planned_run).
  static void check_frontier(
      const Case& c, int dp, int tp,
      const std::vector<std::function<bool(const planner::PlanFile::Op&)>>& wanted = {}) {
    ProcessGrid grid(dp, tp);
    std::vector<std::string> summaries;
    const auto plans = frontier_plans(c, dp, tp, &summaries, false, wanted);
    ASSERT_FALSE(plans.empty()) << "no frontier point splits over tp=" << tp;
    for (size_t k = 0; k < wanted.size(); ++k)
      ASSERT_TRUE(std::any_of(
          plans.begin(), plans.end(),
          [&](const auto& plan) { return std::any_of(plan.begin(), plan.end(), wanted[k]); }))
          << "no frontier point has an op of wanted kind " << k;
    const RunResult whole = whole_run(c);
    for (size_t p = 0; p < plans.size(); ++p) {
      SCOPED_TRACE(summaries[p]);
      if (rank() == 0) std::cout << "plan: " << summaries[p] << "\n";
      expect_same_run(planned_run(c, plans[p], grid), whole);
    }
  }
};

TEST_F(ParallelizeTest, ResidualCnnWithBatchNormAsPlannedOnATensorParallelLine) {
  check_frontier(labelled([] { return residual_cnn(true); }, {8, 3, 8, 8}), 1, size());
}

TEST_F(ParallelizeTest, ResNet18OfTheZooAsPlannedOnATensorParallelLine) {
  check_frontier(labelled(
                     [] {
                       manual_seed(3);
                       return std::shared_ptr<nn::Module>(
                           models::resnet18(models::ResNetOptions().num_classes(8)));
                     },
                     {8, 3, 64, 64}),
                 1, size());
}

TEST_F(ParallelizeTest, ShuffleNetOfTheZooAsPlannedOnATensorParallelLine) {
  check_frontier(shufflenet_case(), 1, size());
}

// A planned step holds what the planner prices it at: what the step adds to the memory held
// before it is the plan's activations and backward's working set within 15%. The locals of tensors
// the model has let go are freed a few ops later (once they were freed in batches, when their count
// had doubled: ShuffleNet's step held 1.3-1.6 times its price, the model's intermediates of half a
// step at once).
TEST_F(ParallelizeTest, APlannedStepHoldsWhatThePlannerPrices) {
  if (size() != 2) GTEST_SKIP() << "priced for 2 ranks";
  const Case c = shufflenet_case();
  planner::PlanOptions options;
  options.config.devices = 2;
  options.config.min_tp = 2;
  options.config.optimizer_states = 0;
  options.config.profile = test_profile(2);
  options.remat_fractions = {1.0};
  const planner::Graph graph = planner::trace_module(*c.make(), c.trace);
  const planner::PlanResult result = planner::plan_graph(graph, options);
  ASSERT_FALSE(result.frontier.empty());
  const planner::PlanBreakdown& priced = result.frontier.front().breakdown;  // the smallest
  const ProcessGrid grid(1, 2);
  ParallelModule parallel(c.make(), planned_ops(graph, result, 0),
                          std::make_shared<CountingCommunicator>(grid.data_parallel_on_device()),
                          std::make_shared<CountingCommunicator>(grid.tensor_parallel_on_device()),
                          c.trace);
  optim::SGD sgd(parallel.parameters(), optim::SGDOptions(kLearningRate));
  auto allocator = memory::allocator_for(Device::cpu());
  double added = 0;
  for (int step = 0; step < 2; ++step) {
    const std::vector<Tensor> batch = c.batch(step);
    sgd.zero_grad();
    const double before = static_cast<double>(allocator->stats().allocated_bytes);
    allocator->reset_peak();
    Tensor loss = parallel.loss(batch);
    loss.backward();
    added = static_cast<double>(allocator->stats().peak_allocated_bytes) - before;
    parallel.synchronize_gradients();
    sgd.step();
  }
  // Activations and backward's working set; the parameters' gradients, made as the activations
  // are let go in backward, add less than their whole at the peak.
  const double expected = priced.activation_bytes + priced.backward_working_bytes;
  EXPECT_LT(added, 1.15 * expected);
  EXPECT_GT(added, 0.85 * expected);
}

TEST_F(ParallelizeTest, MlpAsPlannedOnADataTimesTensorParallelGrid) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid needs 4 ranks";
  check_frontier(labelled(mlp, {8, 12}), 2, 2);
}

// Ops over the whole batch inside a data-parallel plan: their inputs' rows are gathered, and
// their parameters' gradients are whole on every rank already (not summed over dp).
TEST_F(ParallelizeTest, OpsOverTheWholeBatchInADataParallelPlan) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid needs 4 ranks";
  ProcessGrid grid(2, 2);
  std::vector<std::string> summaries;
  const Case c = labelled(mlp, {8, 12});
  auto plans = frontier_plans(c, 2, 2, &summaries);
  ASSERT_FALSE(plans.empty());
  auto plan = plans.back();
  for (size_t op = 0; op < 2; ++op) plan[op] = {plan[op].index, plan[op].op, "replicate", 1, 1, {}};
  expect_same_run(planned_run(c, plan, grid), whole_run(c));
}

// TensorOpt's whole space on a line of two ranks: each op splits the batch or the model over
// both ranks, or runs whole, so tensors move between the two splits.
TEST_F(ParallelizeTest, PerOpDegreesOnALineOfTwoRanks) {
  if (size() != 2) GTEST_SKIP() << "per-op degrees run over one group of two ranks";
  ProcessGrid grid(2, 1);
  for (const auto& [name, c] : std::vector<std::pair<std::string, Case>>{
           {"mlp", labelled(mlp, {8, 12})},
           {"cnn", labelled([] { return residual_cnn(false); }, {8, 3, 8, 8})},
           {"cnn with batch norm", labelled([] { return residual_cnn(true); }, {32, 3, 8, 8})},
           {"shufflenet", shufflenet_case()},
           {"bert", bert_case()},
           {"tagger", tagger_case()}}) {
    SCOPED_TRACE(name);
    std::vector<std::string> summaries;
    // With batch norm: a point that normalises over a batch split among those run.
    const auto plans =
        frontier_plans(c, 2, 2, &summaries, /*per_op_degrees=*/true, {splits_batch_norm_batch});
    ASSERT_FALSE(plans.empty()) << "no per-op point mixes batch and model splits";
    if (name == "cnn with batch norm") {
      ASSERT_TRUE(std::any_of(plans.begin(), plans.end(), [&](const auto& plan) {
        return std::any_of(plan.begin(), plan.end(), splits_batch_norm_batch);
      })) << "no per-op point splits a batch norm's batch";
    }
    expect_per_op_plans_train_like_one_process(c, plans, summaries, grid);
  }
}

// A table with a padding row split by vocabulary or by columns, and nll_loss split by classes:
// the frontier's points, and each with its table and its loss cut those ways (on so small a model
// the planner's test profile seldom picks them).
TEST_F(ParallelizeTest, TaggerWithAPaddingRowAndNllLossAsPlannedOnATensorParallelLine) {
  const Case c = tagger_case();
  ProcessGrid grid(1, size());
  std::vector<std::string> summaries;
  const auto plans = frontier_plans(c, 1, size(), &summaries);
  ASSERT_FALSE(plans.empty());
  const RunResult whole = whole_run(c);
  const auto recut = [&](std::vector<planner::PlanFile::Op> plan, const std::string& op_name,
                         const std::string& strategy) {
    for (auto& op : plan)
      if (op.op == op_name) op = {op.index, op.op, strategy, 1, size(), op.parameters};
    return plan;
  };
  for (size_t p = 0; p < plans.size(); ++p) {
    SCOPED_TRACE(summaries[p]);
    expect_same_run(planned_run(c, plans[p], grid), whole);
    for (const auto& cut : std::vector<std::pair<std::string, std::string>>{
             {"nll_loss", "vocab"}, {"embedding", "vocab"}, {"embedding", "column"}}) {
      SCOPED_TRACE(cut.first + " " + cut.second);
      const auto plan = recut(plans[p], cut.first, cut.second);
      ASSERT_TRUE(std::any_of(plan.begin(), plan.end(), [&](const planner::PlanFile::Op& op) {
        return op.op == cut.first && op.strategy == cut.second;
      }));
      expect_same_run(planned_run(c, plan, grid), whole);
    }
  }
}

// Plans of `c`'s model for per-op degrees over part of four ranks: ops on the 2 x 2 grid (batch
// over the ranks of one parity, model over the pairs) beside ops splitting the batch or the model
// over all four or running whole, so tensors move between grids (an all-to-all between the lines,
// local cuts and gathers between the batch's line and the grid's rows, and otherwise through the
// whole tensor). Each per-op frontier point as it is, with every op that has a strategy of the
// same kind on the 2 x 2 grid moved there, and with every other such op moved there: those that
// mix the 2 x 2 grid with another and that the planner marks executable (BERT's word table is
// tied to its decoder: a plan that cuts it on one grid and reads it on another is not run).
// `what`: each plan's description.
std::vector<std::vector<planner::PlanFile::Op>> plans_over_part_of_four_ranks(
    const Case& c, std::vector<std::string>* what) {
  auto model = c.make();
  const planner::Graph graph = planner::trace_module(*model, c.trace);
  planner::PlannerConfig config;
  config.devices = 4;
  config.max_tp = 4;
  config.profile = test_profile(4);
  const auto strategies = planner::enumerate_strategies(graph, config);
  const auto executable = [&](const std::vector<planner::PlanFile::Op>& plan) {
    std::vector<int> choice;
    for (const auto& op : plan) {
      const auto& list = strategies[static_cast<size_t>(op.index)];
      const auto found = std::find_if(list.begin(), list.end(), [&](const planner::Strategy& s) {
        return s.dp == op.dp && s.tp == op.tp && planner::split_kind_name(s.kind) == op.strategy;
      });
      choice.push_back(static_cast<int>(found - list.begin()));
    }
    return planner::describe_choice(graph, strategies, config, choice, 1.0).executable;
  };
  // Op i moved to the 2 x 2 grid with its strategy's kind, where it has one there.
  const auto on_grid = [&](planner::PlanFile::Op op) {
    for (const planner::Strategy& s : strategies[static_cast<size_t>(op.index)])
      if (s.dp == 2 && s.tp == 2 && planner::split_kind_name(s.kind) == op.strategy) {
        op.dp = 2;
        op.tp = 2;
        return std::make_pair(op, true);
      }
    return std::make_pair(op, false);
  };
  planner::PlanOptions options;
  options.config = config;
  options.config.optimizer_states = 0;
  options.remat_fractions = {1.0};
  options.per_op_degrees = true;
  const planner::PlanResult result = planner::plan_graph(graph, options);
  std::vector<std::vector<planner::PlanFile::Op>> plans;
  for (size_t p = 0; p < result.frontier.size(); ++p) {
    for (int every : {0, 1, 2}) {  // 0: the point as the planner chose it
      auto plan = planned_ops(graph, result, static_cast<int>(p));
      int candidates = 0;
      for (auto& op : plan) {
        auto [recut, ok] = on_grid(op);
        if (every > 0 && ok && candidates++ % every == 0) op = recut;
      }
      std::set<std::pair<int, int>> grids;
      for (const auto& op : plan)
        if (op.dp > 1 || op.tp > 1) grids.insert({op.dp, op.tp});
      if (grids.size() < 2 || !grids.count({2, 2}) || !executable(plan)) continue;
      const char* how[] = {", as chosen", ", every such op on the 2 x 2 grid",
                           ", every other such op on the 2 x 2 grid"};
      plans.push_back(plan);
      what->push_back(result.frontier[p].summary + how[every]);
    }
  }
  return plans;
}

// Per-op degrees over part of four ranks (plans_over_part_of_four_ranks) train what one process
// trains, with exactly the planned collectives.
TEST_F(ParallelizeTest, PerOpDegreesOverPartOfFourRanks) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid inside one group needs 4 ranks";
  ProcessGrid grid(4, 1);
  const Case resnet = labelled(
      [] {
        manual_seed(3);
        return std::shared_ptr<nn::Module>(
            models::resnet18(models::ResNetOptions().num_classes(8)));
      },
      {8, 3, 32, 32});
  for (const auto& [name, c] : std::vector<std::pair<std::string, Case>>{
           {"mlp", labelled(mlp, {8, 12})},
           {"cnn", labelled([] { return residual_cnn(false); }, {16, 3, 8, 8})},
           {"cnn with batch norm", labelled([] { return residual_cnn(true); }, {32, 3, 8, 8})},
           {"tagger", tagger_case()},
           {"bert", bert_case()},
           {"resnet18", resnet}}) {
    SCOPED_TRACE(name);
    if (rank() == 0) std::cout << name << "\n";
    std::vector<std::string> what;
    const auto plans = plans_over_part_of_four_ranks(c, &what);
    EXPECT_FALSE(plans.empty()) << "no plan mixed the 2 x 2 grid with another";
    expect_per_op_plans_train_like_one_process(c, plans, what, grid);
  }
}

TEST_F(ParallelizeTest, CnnWithoutBatchNormAsPlannedOnADataTimesTensorParallelGrid) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid needs 4 ranks";
  check_frontier(labelled([] { return residual_cnn(false); }, {8, 3, 8, 8}), 2, 2);
}

// Batch norm over a dp split normalises by the whole batch's statistics (gathered over dp), so
// the plan trains what one process trains, running statistics included.
TEST_F(ParallelizeTest, ResidualCnnWithBatchNormAsPlannedOnAGrid) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid needs 4 ranks";
  check_frontier(labelled([] { return residual_cnn(true); }, {8, 3, 8, 8}), 2, 2,
                 {splits_batch_norm_batch});
}

// A data-parallel frontier point of `c`'s model on 2 ranks that splits a batch norm's batch
// (empty if there is none).
std::vector<planner::PlanFile::Op> plan_splitting_a_batch_norm(const Case& c) {
  std::vector<std::string> summaries;
  for (const auto& ops : frontier_plans(c, 2, 1, &summaries, false, {splits_batch_norm_batch}))
    if (std::any_of(ops.begin(), ops.end(), splits_batch_norm_batch)) return ops;
  return {};
}

// With per-rank statistics (DDP's way) a data-parallel plan normalises each rank's rows by their
// own, with no collective for them: its first loss is the mean of the two halves' losses, each
// half normalised alone.
TEST_F(ParallelizeTest, PerRankBatchNormNormalisesEachRanksRows) {
  if (size() != 2) GTEST_SKIP() << "two data-parallel ranks";
  ProcessGrid grid(2, 1);
  const Case c = labelled([] { return residual_cnn(true); }, {8, 3, 8, 8});
  const auto plan = plan_splitting_a_batch_norm(c);
  ASSERT_FALSE(plan.empty()) << "no data-parallel point splits a batch norm's batch";
  const RunResult run = planned_run(c, plan, grid, /*one_group=*/false,
                                    /*per_rank_batch_norm=*/true);
  auto model = c.make();
  const std::vector<Tensor> batch = c.batch(0);
  double expected = 0;
  for (int half : {0, 1})
    expected += cross_entropy(model->forward(rows(batch[0], 2, half)), rows(batch[1], 2, half))
                    .item<double>() /
                2;
  EXPECT_NEAR(run.losses.at(0), expected, 1e-4 * std::abs(expected));
  EXPECT_GT(std::abs(run.losses.at(0) - whole_run(c).losses.at(0)), 1e-4)
      << "per-rank statistics should differ from the whole batch's";
}

// Batch norm over a dp split runs as element-wise ops and reductions (batch_norm_over_dp), not
// one batch_norm call: the planner prices that many op calls beyond the one (each op and
// collective dispatched, counted forward and backward against per-rank statistics, which run
// batch_norm and its backward alone).
TEST_F(ParallelizeTest, BatchNormOverDataParallelRanksRunsTheCallsThePlannerPrices) {
  if (size() != 2) GTEST_SKIP() << "two data-parallel ranks";
  ProcessGrid grid(2, 1);
  const Case c = labelled([] { return residual_cnn(true); }, {8, 3, 8, 8});
  const auto plan = plan_splitting_a_batch_norm(c);
  ASSERT_FALSE(plan.empty()) << "no data-parallel point splits a batch norm's batch";
  const auto norms = std::count_if(plan.begin(), plan.end(), splits_batch_norm_batch);
  // Op calls of one forward and one backward.
  auto calls = [&](bool per_rank_batch_norm) {
    auto dp = std::make_shared<CountingCommunicator>(grid.data_parallel_on_device());
    ParallelModule parallel(c.make(), plan, dp, dp, c.trace);
    parallel.set_per_rank_batch_norm(per_rank_batch_norm);
    std::vector<Tensor> local;
    for (const Tensor& whole : c.batch(0))
      local.push_back(rows(whole, grid.dp_size(), grid.dp_index()));
    int64_t counted = 0;
    TraceHook previous =
        set_trace_hook([&](const OpDef&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                           const Attrs&) { ++counted; });
    Tensor loss = parallel.loss(local);
    const int64_t forward = counted;
    loss.backward();
    set_trace_hook(previous);
    return std::make_pair(forward, counted - forward);
  };
  const auto [whole_forward, whole_backward] = calls(false);
  const auto [own_forward, own_backward] = calls(true);
  EXPECT_EQ(whole_forward - own_forward, norms * planner::kBatchNormOverDpForwardCalls);
  EXPECT_EQ(whole_backward - own_backward, norms * planner::kBatchNormOverDpBackwardCalls);
}

// A plan's training under an optimizer of `stage` (0: none; else ZeroOptimizer over the dp
// group): the losses, the parameters and buffers whole, and the optimizer state (whole over dp,
// this rank's tp shards).
struct OptimizedRun {
  std::vector<float> losses;
  std::map<std::string, Tensor> state;
  optim::NamedTensors optimizer_state;
  size_t shared_shards = 0;   // parameters and buffers ZeRO cut over part of the ranks
  std::vector<double> norms;  // of the whole gradient, per step
};

// With `one_line`, per-op degrees over one group of every rank (`grid` dp x 1), ZeRO over it
// keeping the tensors the plan cuts over all of it as each rank's own and cutting those it cuts
// over part of it over the ranks holding the same part (parallel::zero_cuts).
OptimizedRun run_with_zero(const Case& c, const std::vector<planner::PlanFile::Op>& ops,
                           const ProcessGrid& grid, int stage, bool adamw, bool one_line = false) {
  constexpr int kZeroSteps = 3;
  // Large enough that a gradient off by a factor shows in the parameters.
  constexpr double kZeroLearningRate = 0.05;
  const auto dp_group = grid.data_parallel_on_device();
  const auto tp_group = one_line ? dp_group : grid.tensor_parallel_on_device();
  auto parallel = std::make_shared<ParallelModule>(c.make(), ops, dp_group, tp_group, c.trace);
  auto planned = std::make_shared<train::PlannedModule>(parallel, c.make());
  const MakeShardOptimizer make =
      [&](const optim::NamedTensors& parameters) -> std::unique_ptr<optim::Optimizer> {
    if (adamw)
      return std::make_unique<optim::AdamW>(parameters, optim::AdamWOptions(kZeroLearningRate));
    return std::make_unique<optim::SGD>(parameters,
                                        optim::SGDOptions(kZeroLearningRate).momentum(0.9));
  };
  const ZeroCuts cuts = one_line ? zero_cuts(*planned) : ZeroCuts();
  std::unique_ptr<optim::Optimizer> optimizer =
      stage == 0
          ? make(planned->named_parameters())
          : std::make_unique<ZeroOptimizer>(planned, dp_group, make, static_cast<ZeroStage>(stage),
                                            cuts.own, cuts.shared);
  planned->hand_gradients_to(*optimizer);
  OptimizedRun run;
  run.shared_shards = cuts.shared.size();
  for (int step = 0; step < kZeroSteps; ++step) {
    std::vector<Tensor> local;
    for (const Tensor& whole : c.batch(step))
      local.push_back(rows(whole, grid.dp_size(), grid.dp_index()));
    optimizer->zero_grad();
    Tensor loss = planned->loss(local);
    loss.backward();
    // The whole gradient's norm, as a clip reads it (ZeRO's from its parts, over the groups).
    if (auto* zero = dynamic_cast<ZeroOptimizer*>(optimizer.get())) {
      std::set<std::string> split;
      for (const auto& [name, dim] : planned->split_parameter_dims()) split.insert(name);
      run.norms.push_back(zero->clip_grad_norm(1e9, *tp_group, split));
    } else {
      double squares = 0;
      for (const auto& [name, grad] : parallel->full_gradients())
        squares += sum(mul(grad, grad)).item<double>();
      run.norms.push_back(std::sqrt(squares));
    }
    optimizer->step();
    run.losses.push_back(loss.item<float>());
  }
  run.optimizer_state = optimizer->state_tensors();  // stage 3: gathers the parameters too
  run.state = parallel->full_state_dict();
  return run;
}

// ZeRO beside a plan on a dp x tp grid (2 x 2 at 4 ranks; at 2 ranks a data-parallel plan, 2 x
// 1): each stage trains what the plan trains without ZeRO, and its optimizer state gathers to
// the same whole tensors (each rank's shards of what the plan cuts).
// Also beside per-op degrees over one group of every rank, ZeRO over it: on 2 ranks frontier
// points of the line; on 4, plans with ops on a 2 x 2 grid beside ops over all four (the shards
// cut on that grid are ZeRO's over its pairs).
TEST_F(ParallelizeTest, ZeroStagesBesideAPlanTrainLikeThePlanAlone) {
  const int tp = size() / 2;
  for (bool one_line : {false, true}) {
    ProcessGrid grid(one_line ? size() : 2, one_line ? 1 : tp);
    for (const auto& [name, c] : std::vector<std::pair<std::string, Case>>{
             {"mlp", labelled(mlp, {8, 12})},
             {"cnn", labelled([] { return residual_cnn(false); }, {8, 3, 8, 8})}}) {
      std::vector<std::string> summaries;
      const auto plans = !one_line ? frontier_plans(c, 2, tp, &summaries)
                         : size() == 2
                             ? frontier_plans(c, 2, 2, &summaries, /*per_op_degrees=*/true)
                             : plans_over_part_of_four_ranks(c, &summaries);
      ASSERT_FALSE(plans.empty()) << name;
      size_t shared_shards = 0;
      // The fastest point and the one that keeps the least; on 4 ranks, the first that cuts a
      // weight on the 2 x 2 grid and the last.
      size_t first = 0;
      const auto cuts_a_weight_on_the_grid = [](const std::vector<planner::PlanFile::Op>& plan) {
        return std::any_of(plan.begin(), plan.end(), [](const planner::PlanFile::Op& op) {
          return op.dp == 2 && op.tp == 2 && op.strategy != "replicate" &&
                 (op.op == "linear" || op.op == "conv2d");
        });
      };
      if (one_line && size() == 4)
        while (first + 1 < plans.size() && !cuts_a_weight_on_the_grid(plans[first])) ++first;
      for (size_t p : {first, plans.size() - 1}) {
        for (bool adamw : {false, true}) {
          const OptimizedRun plain = run_with_zero(c, plans[p], grid, 0, adamw, one_line);
          for (int stage : {1, 2, 3}) {
            SCOPED_TRACE(name + " " + summaries[p] + (adamw ? " AdamW" : " SGD") + " ZeRO-" +
                         std::to_string(stage) + (one_line ? " per-op degrees" : ""));
            const OptimizedRun zero = run_with_zero(c, plans[p], grid, stage, adamw, one_line);
            shared_shards += zero.shared_shards;
            ASSERT_EQ(zero.losses.size(), plain.losses.size());
            for (size_t step = 0; step < plain.losses.size(); ++step) {
              EXPECT_NEAR(zero.losses[step], plain.losses[step],
                          1e-4 * std::abs(plain.losses[step]))
                  << "step " << step;
              EXPECT_NEAR(zero.norms[step], plain.norms[step], 1e-4 * plain.norms[step])
                  << "gradient norm, step " << step;
            }
            for (const auto& [tensor_name, tensor] : plain.state)
              EXPECT_TRUE(all_close(zero.state.at(tensor_name), tensor, 1e-4, 1e-6)) << tensor_name;
            ASSERT_EQ(zero.optimizer_state.size(), plain.optimizer_state.size());
            for (size_t i = 0; i < plain.optimizer_state.size(); ++i) {
              EXPECT_EQ(zero.optimizer_state[i].first, plain.optimizer_state[i].first);
              EXPECT_TRUE(all_close(zero.optimizer_state[i].second, plain.optimizer_state[i].second,
                                    1e-4, 1e-6))
                  << plain.optimizer_state[i].first;
            }
          }
        }
      }
      if (one_line && size() == 4) {
        EXPECT_GT(shared_shards, 0u) << name << ": nothing cut on the 2 x 2 grid";
      }
    }
  }
}

TEST_F(ParallelizeTest, BertAsPlannedOnATensorParallelLine) {
  check_frontier(bert_case(), 1, size(), {heads_split, table_by_columns, loss_by_classes});
}

TEST_F(ParallelizeTest, BertAsPlannedOnADataTimesTensorParallelGrid) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid needs 4 ranks";
  check_frontier(bert_case(), 2, 2, {heads_split, table_by_columns});
}

// The word table split by vocabulary rows (Megatron-LM's split; on the test profile's fast links
// no frontier point has it): each rank looks up its rows, the lookups are summed, and the tied
// decoder uses the same rows without a move.
TEST_F(ParallelizeTest, BertWithTheWordTableSplitByVocabulary) {
  const int dp = size() == 4 ? 2 : 1, tp = size() / dp;
  const Case c = bert_case();
  std::vector<std::string> summaries;
  auto plans = frontier_plans(c, dp, tp, &summaries, false, {table_by_columns});
  auto plan = std::find_if(plans.begin(), plans.end(),
                           [](const auto& ops) { return table_by_columns(ops[0]); });
  ASSERT_TRUE(plan != plans.end()) << "no frontier point splits the word table by columns";
  (*plan)[0].strategy = "vocab";
  expect_same_run(planned_run(c, *plan, ProcessGrid(dp, tp)), whole_run(c));
}

// A state gathered under one plan loads into a run under another, and into the unsplit model.
TEST_F(ParallelizeTest, StateMovesBetweenPlans) {
  ProcessGrid grid(1, size());
  std::vector<std::string> summaries;
  const auto make = [] { return residual_cnn(true); };
  const Shape shape{8, 3, 8, 8};
  const Case c = labelled(make, shape);
  const auto plans = frontier_plans(c, 1, size(), &summaries);
  ASSERT_GE(plans.size(), 2u);
  ParallelModule first(make(), plans.front(), grid, planner::ModuleTraceOptions(shape));
  optim::SGD sgd(first.parameters(), optim::SGDOptions(kLearningRate));
  const auto batch = c.batch(0);
  first.loss(batch[0], batch[1]).backward();
  sgd.step();  // one step away from the initial state
  const auto state = first.full_state_dict();

  ParallelModule second(make(), plans.back(), grid, planner::ModuleTraceOptions(shape));
  second.load_state_dict(state);
  for (const auto& [name, tensor] : second.full_state_dict())
    EXPECT_TRUE(tessel::testing::bitwise_equal(tensor, state.at(name))) << name;
  auto whole = make();
  whole->load_state_dict(state);
  const auto next = c.batch(1);
  EXPECT_NEAR(second.loss(next[0], next[1]).item<float>(),
              cross_entropy(whole->forward(next[0]), next[1]).item<float>(), 1e-4);

  const auto before = second.full_state_dict();  // the step above updated the running statistics
  auto missing = state;
  missing.erase(missing.begin());
  EXPECT_TRUE(throws_error([&] { second.load_state_dict(missing); }, "no tensor named"));
  auto reshaped = state;
  reshaped.begin()->second = zeros({3});
  EXPECT_TRUE(throws_error([&] { second.load_state_dict(reshaped); }, "has shape [3]"));
  for (const auto& [name, tensor] : second.full_state_dict())  // nothing changed
    EXPECT_TRUE(tessel::testing::bitwise_equal(tensor, before.at(name))) << name;
}

TEST_F(ParallelizeTest, APlanForAnotherModelOrGridIsAClearError) {
  ProcessGrid grid(1, size());
  std::vector<std::string> summaries;
  const auto cnn_plans = frontier_plans(labelled([] { return residual_cnn(true); }, {8, 3, 8, 8}),
                                        1, size(), &summaries);
  ASSERT_FALSE(cnn_plans.empty());
  EXPECT_TRUE(throws_error(
      [&] {
        ParallelModule(mlp(), cnn_plans[0], grid, planner::ModuleTraceOptions({8, 12}));
      },
      "the plan has"));
  auto renamed = cnn_plans[0];
  renamed[0].op = "linear";
  EXPECT_TRUE(throws_error(
      [&] {
        ParallelModule(residual_cnn(true), renamed, grid,
                       planner::ModuleTraceOptions({8, 3, 8, 8}));
      },
      "the plan was made for another model"));
  auto other_degree = cnn_plans[0];
  other_degree[0].tp = 2 * size();
  EXPECT_TRUE(throws_error(
      [&] {
        ParallelModule(residual_cnn(true), other_degree, grid,
                       planner::ModuleTraceOptions({8, 3, 8, 8}));
      },
      "per-op degrees"));
  ParallelModule parallel(residual_cnn(true), cnn_plans[0], grid,
                          planner::ModuleTraceOptions({8, 3, 8, 8}));
  EXPECT_TRUE(throws_error(
      [&] {
        parallel.loss(randn({4, 3, 8, 8}), randint(0, 8, {4}));
      },
      "is not 1/1 of the batch"));
}

}  // namespace
}  // namespace tessel::parallel
