// ZeroOptimizer against plain data parallel training: stage 1 (optimizer state in parts, DDP's
// gradients) and stage 2 (gradients reduce-scattered during backward, no DDP) train an MLP whose
// last bias has fewer elements than 4 ranks, and a conv net with batch norm, like DDP with the
// whole optimizer (SGD with momentum and weight decay, AdamW); each rank holds only its part of
// the state and (stage 2) of the gradients, and clips by the whole gradient's norm; stage 3
// (parameters gathered on use) trains like DDP too, sends what the planner prices and keeps only
// parts of the parameters between uses; the gathered state is the plain optimizer's, and a
// checkpoint resumes bitwise under ZeRO and as the plain optimizer's. Run with 2 and 4 ranks.
#include "parallel/zero.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "memory/memory.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "parallel/counting_communicator.h"
#include "parallel/ddp.h"
#include "parallel/process_group.h"
#include "parallel/subgroup_communicator.h"
#include "parallel/tensor_parallel.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::all_close;
using tessel::testing::bitwise_equal;
using tessel::testing::throws_error;
using testing::MpiTest;

using MakeModel = std::function<std::shared_ptr<nn::Module>()>;
using MakeOptimizer =
    std::function<std::unique_ptr<optim::Optimizer>(const optim::NamedTensors& parameters)>;

std::shared_ptr<nn::Module> mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 3)});
}

std::shared_ptr<nn::Module> conv_net() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 4, 3).padding(1)),
      std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(4)), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::AdaptiveAvgPool2d>(nn::IntPair(1, 1)), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(4, 5)});
}

MakeOptimizer sgd() {
  return [](const optim::NamedTensors& parameters) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(parameters,
                                        optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
  };
}

MakeOptimizer adamw() {
  return [](const optim::NamedTensors& parameters) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(parameters, optim::AdamWOptions(1e-2));
  };
}

// This rank's loss at `step`: its own random batch (seeded by step and rank), mean over it;
// through `ddp` when given.
Tensor rank_loss(nn::Module& model, DistributedDataParallel* ddp, const Shape& input_shape,
                 int64_t classes, int step, int rank) {
  manual_seed(7919 * (step + 1) + 104729 * (rank + 1));
  Tensor input = randn(input_shape);
  Tensor target = randint(0, classes, {input_shape[0]});
  return cross_entropy(ddp ? ddp->forward(input) : model.forward(input), target);
}

struct Case {
  MakeModel make;
  Shape input_shape;
  int64_t classes;
};

Case mlp_case() { return {mlp, {5, 6}, 3}; }
Case conv_case() { return {conv_net, {3, 3, 6, 6}, 5}; }

class Zero : public MpiTest {
 protected:
  // Two copies of the same model: one trained with DDP and the whole optimizer, one with
  // ZeroOptimizer at `stage` (and DDP under stage 1). Their parameters agree after every step.
  void expect_matches_ddp(const Case& c, const MakeOptimizer& make, ZeroStage stage,
                          double rtol = 1e-5) {
    manual_seed(1000 + rank());  // different on every rank: both must start from rank 0's
    std::shared_ptr<nn::Module> plain = c.make();
    std::shared_ptr<nn::Module> sharded = c.make();
    sharded->load_state_dict(plain->state_dict());
    DistributedDataParallel plain_ddp(plain, shared_world());
    std::unique_ptr<DistributedDataParallel> sharded_ddp;
    if (stage == ZeroStage::kOptimizerState)
      sharded_ddp = std::make_unique<DistributedDataParallel>(sharded, shared_world());
    std::unique_ptr<optim::Optimizer> whole = make(plain->named_parameters());
    ZeroOptimizer zero(sharded, shared_world(), make, stage);

    for (int step = 0; step < 3; ++step) {
      whole->zero_grad();
      rank_loss(*plain, &plain_ddp, c.input_shape, c.classes, step, rank()).backward();
      whole->step();

      zero.zero_grad();
      rank_loss(*sharded, sharded_ddp.get(), c.input_shape, c.classes, step, rank()).backward();
      zero.step();

      auto expected = plain->named_parameters();
      auto actual = sharded->named_parameters();
      ASSERT_EQ(actual.size(), expected.size());
      for (size_t i = 0; i < actual.size(); ++i)
        EXPECT_TRUE(all_close(actual[i].second, expected[i].second, rtol))
            << actual[i].first << " after step " << step;
    }
  }
};

TEST_F(Zero, Stage1MatchesDdpWithSgdAndAdamW) {
  for (const Case& c : {mlp_case(), conv_case()}) {
    expect_matches_ddp(c, sgd(), ZeroStage::kOptimizerState);
    expect_matches_ddp(c, adamw(), ZeroStage::kOptimizerState);
  }
}

TEST_F(Zero, Stage2MatchesDdpWithSgdAndAdamW) {
  for (const Case& c : {mlp_case(), conv_case()}) {
    expect_matches_ddp(c, sgd(), ZeroStage::kGradients);
    expect_matches_ddp(c, adamw(), ZeroStage::kGradients);
  }
}

TEST_F(Zero, Stage3MatchesDdpWithSgdAndAdamW) {
  for (const Case& c : {mlp_case(), conv_case()}) {
    expect_matches_ddp(c, sgd(), ZeroStage::kParameters);
    expect_matches_ddp(c, adamw(), ZeroStage::kParameters);
  }
}

// Under stage 2 the whole gradient exists nowhere after backward: clipping takes the norm from
// every rank's parts and scales them as clip_grad_norm scales DDP's averaged gradients.
TEST_F(Zero, ClipsByTheNormOfTheWholeGradient) {
  manual_seed(21 + rank());
  std::shared_ptr<nn::Module> plain = mlp();
  std::shared_ptr<nn::Module> sharded = mlp();
  sharded->load_state_dict(plain->state_dict());
  DistributedDataParallel plain_ddp(plain, shared_world());
  std::unique_ptr<optim::Optimizer> whole = sgd()(plain->named_parameters());
  ZeroOptimizer zero(sharded, shared_world(), sgd(), ZeroStage::kGradients);
  rank_loss(*plain, &plain_ddp, {5, 6}, 3, 0, rank()).backward();
  rank_loss(*sharded, nullptr, {5, 6}, 3, 0, rank()).backward();
  const double expected = optim::clip_grad_norm(plain->parameters(), 0.01);
  const double actual = zero.clip_grad_norm(0.01);
  EXPECT_GT(expected, 0.01);  // so the gradients are scaled
  EXPECT_NEAR(actual, expected, 1e-6 * expected);
  whole->step();
  zero.step();
  auto want = plain->named_parameters();
  auto got = sharded->named_parameters();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(all_close(got[i].second, want[i].second)) << got[i].first;
}

// A step sends what the planner prices for ZeRO (parallel/planner/strategies.cc): under stage 2
// one reduce-scatter of each parameter's gradient and one all-gather of each parameter, nothing
// else; under stage 1 the all-gathers (DDP's all-reduces go over DDP's own communicator).
TEST_F(Zero, SendsOneReduceScatterAndOneAllGatherPerParameter) {
  for (ZeroStage stage : {ZeroStage::kOptimizerState, ZeroStage::kGradients}) {
    manual_seed(31);
    std::shared_ptr<nn::Module> model = conv_net();
    std::unique_ptr<DistributedDataParallel> ddp;
    if (stage == ZeroStage::kOptimizerState)
      ddp = std::make_unique<DistributedDataParallel>(model, shared_world());
    auto counted = std::make_shared<CountingCommunicator>(shared_world());
    ZeroOptimizer zero(model, counted, sgd(), stage);
    counted->reset();
    zero.zero_grad();
    rank_loss(*model, ddp.get(), {3, 3, 6, 6}, 5, 0, rank()).backward();
    zero.step();
    // (kind, bytes) of each call; reduce-scatters come in backward's order, all-gathers after.
    std::vector<std::pair<std::string, int64_t>> expected, sent;
    for (const Tensor& parameter : model->parameters()) {
      const auto bytes = static_cast<int64_t>(parameter.nbytes());
      if (stage == ZeroStage::kGradients) expected.emplace_back("reduce_scatter", bytes);
      expected.emplace_back("all_gather", bytes);
    }
    for (const auto& record : counted->records) sent.emplace_back(record.kind, record.bytes);
    const size_t gradients = stage == ZeroStage::kGradients ? model->parameters().size() : 0;
    for (size_t i = 0; i < sent.size(); ++i)
      EXPECT_EQ(sent[i].first, i < gradients ? "reduce_scatter" : "all_gather") << i;
    std::sort(expected.begin(), expected.end());
    std::sort(sent.begin(), sent.end());
    EXPECT_EQ(sent, expected);
  }
}

// Stage 3 sends, per step, one reduce-scatter of each gradient, one all-gather of each parameter
// for its forward op, and one more for a parameter its op reads again in backward to make the
// gradient of its input: the batch norm's weight, not the first convolution's (its input needs
// no gradient) nor any bias. That is what the planner prices, but for the last layer's weight:
// from the second step on its backward op, which runs right after the forward, finds it still
// whole. Then each gather but the first of a step was started by the one before.
TEST_F(Zero, Stage3GathersEachParameterForItsForwardAndBackwardOps) {
  manual_seed(37);
  std::shared_ptr<nn::Module> model = conv_net();
  auto counted = std::make_shared<CountingCommunicator>(shared_world());
  ZeroOptimizer zero(model, counted, sgd(), ZeroStage::kParameters);
  std::vector<std::pair<std::string, int64_t>> expected;
  for (const auto& [name, parameter] : model->named_parameters()) {
    const auto bytes = static_cast<int64_t>(parameter.nbytes());
    expected.emplace_back("reduce_scatter", bytes);
    expected.emplace_back("all_gather", bytes);
    if (name == "1.weight" || name == "5.weight") expected.emplace_back("all_gather", bytes);
  }
  std::sort(expected.begin(), expected.end());
  for (int step = 0; step < 3; ++step) {
    if (step == 1)
      expected.erase(std::find(expected.begin(), expected.end(),
                               std::make_pair(std::string("all_gather"), int64_t{80})));
    counted->reset();
    const int64_t gathers = zero.gathers(), prefetched = zero.prefetched_gathers();
    zero.zero_grad();
    rank_loss(*model, nullptr, {3, 3, 6, 6}, 5, step, rank()).backward();
    zero.step();
    std::vector<std::pair<std::string, int64_t>> sent;
    for (const auto& record : counted->records) sent.emplace_back(record.kind, record.bytes);
    std::sort(sent.begin(), sent.end());
    EXPECT_EQ(sent, expected) << "step " << step;
    EXPECT_EQ(zero.gathers() - gathers, 8);
    EXPECT_EQ(zero.prefetched_gathers() - prefetched, step == 0 ? 0 : 7) << "step " << step;
  }
}

// Under stage 3 no parameter's bytes stay whole outside the ops that use them: after backward and
// after the step each rank holds its parts only; gather_parameters() keeps them whole until the
// next zero_grad().
TEST_F(Zero, Stage3HoldsOnlyPartsOfTheParameters) {
  manual_seed(41);
  std::shared_ptr<nn::Module> model = mlp();
  const std::vector<Tensor> parameters = model->parameters();
  ZeroOptimizer zero(model, shared_world(), adamw(), ZeroStage::kParameters);
  auto sharded = [&] {
    for (const Tensor& parameter : parameters)
      if (parameter.storage()->state() != Residency::kSharded) return false;
    return true;
  };
  EXPECT_TRUE(sharded());
  zero.zero_grad();
  Tensor loss = rank_loss(*model, nullptr, {5, 6}, 3, 0, rank());
  EXPECT_TRUE(sharded());
  loss.backward();
  EXPECT_TRUE(sharded());
  zero.step();
  EXPECT_TRUE(sharded());
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_FALSE(parameters[i].grad().defined());
    EXPECT_EQ(zero.shard_optimizer().parameters()[i].numel(), zero.part_count(i));
  }
  // Whole on every rank while held: one rank alone may read them.
  zero.gather_parameters();
  for (const Tensor& parameter : parameters)
    EXPECT_EQ(parameter.storage()->state(), Residency::kResident);
  const int64_t gathers = zero.gathers();
  if (rank() == 0) {
    for (const Tensor& parameter : parameters)
      EXPECT_TRUE(std::isfinite(sum(parameter).item<float>()));
  }
  EXPECT_EQ(zero.gathers(), gathers);
  zero.zero_grad();
  EXPECT_TRUE(sharded());
  // A value written into a parameter (load_state_dict, the same on every rank) reaches this
  // rank's part.
  manual_seed(43);
  std::shared_ptr<nn::Module> other = mlp();
  model->load_state_dict(other->state_dict());
  EXPECT_TRUE(sharded());
  auto now = model->named_parameters();
  auto want = other->named_parameters();
  for (size_t i = 0; i < now.size(); ++i)
    EXPECT_TRUE(bitwise_equal(now[i].second, want[i].second)) << now[i].first;
}

// On a 2 x 2 grid (4 ranks), ZeRO over each data-parallel group of a Megatron-LM MLP split over
// the tensor-parallel group (column-parallel, then row-parallel linear) trains like DDP over the
// same groups, at every stage, and clips by the norm of the whole model's gradient: the split
// parameters' squares add over tp, the replicated bias counts once.
TEST_F(Zero, EveryStageBesideTensorParallelism) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid needs 4 ranks";
  ProcessGrid grid(2, 2);
  const int64_t tp = register_tp_group(grid.tensor_parallel());
  auto split_mlp = [&] {
    manual_seed(71);  // the same whole layers everywhere; each rank keeps its part
    nn::Linear first(6, 16), second(16, 3);
    auto column = std::make_shared<ColumnParallelLinear>(6, 16, tp);
    auto row = std::make_shared<RowParallelLinear>(16, 3, tp);
    column->load_from(first);
    row->load_from(second);
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        column, std::make_shared<nn::ReLU>(), row});
  };
  const auto split_dims = tensor_parallel_split_dims(*split_mlp());
  std::set<std::string> split;
  for (const auto& entry : split_dims) split.insert(entry.first);
  ASSERT_EQ(split.size(), 3u);  // the column layer's weight and bias, the row layer's weight
  // The whole gradient's norm from DDP-averaged gradients of the split model.
  auto whole_norm = [&](nn::Module& model) {
    double split_squares = 0, replicated = 0;
    for (const auto& [name, parameter] : model.named_parameters()) {
      const double squares = sum(mul(parameter.grad(), parameter.grad())).item<float>();
      (split.count(name) ? split_squares : replicated) += squares;
    }
    Tensor total = from_vector<double>({split_squares}, {1});
    grid.tensor_parallel()->all_reduce(total);
    return std::sqrt(total.item<double>() + replicated);
  };
  for (ZeroStage stage :
       {ZeroStage::kOptimizerState, ZeroStage::kGradients, ZeroStage::kParameters}) {
    for (const MakeOptimizer& make : {sgd(), adamw()}) {
      std::shared_ptr<nn::Module> plain = split_mlp(), sharded = split_mlp();
      DistributedDataParallel plain_ddp(plain, grid.data_parallel());
      std::unique_ptr<DistributedDataParallel> sharded_ddp;
      if (stage == ZeroStage::kOptimizerState)
        sharded_ddp = std::make_unique<DistributedDataParallel>(sharded, grid.data_parallel());
      std::unique_ptr<optim::Optimizer> whole = make(plain->named_parameters());
      ZeroOptimizer zero(sharded, grid.data_parallel(), make, stage);
      for (int step = 0; step < 3; ++step) {
        // Each data-parallel replica's batch, the same on its tensor-parallel ranks.
        whole->zero_grad();
        rank_loss(*plain, &plain_ddp, {5, 6}, 3, step, grid.dp_index()).backward();
        const double expected = whole_norm(*plain);
        const double scale = 0.05 * expected / (expected + 1e-6);  // as clip_grad_norm scales
        for (const Tensor& parameter : plain->parameters()) parameter.grad().mul_(scale);
        whole->step();
        zero.zero_grad();
        rank_loss(*sharded, sharded_ddp.get(), {5, 6}, 3, step, grid.dp_index()).backward();
        EXPECT_NEAR(zero.clip_grad_norm(0.05 * expected, *grid.tensor_parallel(), split), expected,
                    1e-5 * expected)
            << "stage " << static_cast<int>(stage) << " step " << step;
        zero.step();
        auto want = plain->named_parameters();
        auto got = sharded->named_parameters();
        for (size_t i = 0; i < got.size(); ++i)
          EXPECT_TRUE(all_close(got[i].second, want[i].second, 1e-5))
              << got[i].first << " stage " << static_cast<int>(stage) << " step " << step;
      }
    }
  }
}

// On a 2 x 2 grid, a model whose batch is split over the tensor-parallel group too (each rank
// its rows, replicated weights: the vision models' trunk beside --tp) has gradients that are
// partial sums over tp. Under stages 2 and 3 sum_gradients_over adds them up before the
// reduce-scatter over dp: the same parameters as DDP over dp followed by a sum over tp.
TEST_F(Zero, PartialGradientsAreSummedBeforeTheReduceScatter) {
  if (size() != 4) GTEST_SKIP() << "a 2 x 2 grid needs 4 ranks";
  ProcessGrid grid(2, 2);
  // Each rank's half of its replica's rows: half of that replica's mean loss.
  auto half_loss = [&](nn::Module& model, DistributedDataParallel* ddp, int step) {
    return mul(rank_loss(model, ddp, {5, 6}, 3, step, rank()), 0.5);
  };
  for (ZeroStage stage : {ZeroStage::kGradients, ZeroStage::kParameters}) {
    manual_seed(83);
    std::shared_ptr<nn::Module> plain = mlp(), sharded = mlp();
    sharded->load_state_dict(plain->state_dict());
    DistributedDataParallel plain_ddp(plain, grid.data_parallel());
    // SGD: a gradient left unsummed (half of it) would show.
    std::unique_ptr<optim::Optimizer> whole = sgd()(plain->named_parameters());
    ZeroOptimizer zero(sharded, grid.data_parallel(), sgd(), stage);
    zero.sum_gradients_over(grid.tensor_parallel(), sharded->parameters());
    for (int step = 0; step < 3; ++step) {
      whole->zero_grad();
      half_loss(*plain, &plain_ddp, step).backward();
      for (const Tensor& parameter : plain->parameters())
        grid.tensor_parallel()->all_reduce(parameter.grad());
      whole->step();
      zero.zero_grad();
      half_loss(*sharded, nullptr, step).backward();
      zero.step();
      auto want = plain->named_parameters();
      auto got = sharded->named_parameters();
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(all_close(got[i].second, want[i].second, 1e-5))
            << got[i].first << " stage " << static_cast<int>(stage) << " step " << step;
    }
  }
  std::shared_ptr<nn::Module> model = mlp();
  ZeroOptimizer zero(model, grid.data_parallel(), adamw(), ZeroStage::kGradients);
  EXPECT_TRUE(throws_error([&] { zero.sum_gradients_over(grid.tensor_parallel(), {zeros({3})}); },
                           "not one of the module's trainable parameters"));
}

// Every rank holds its part of each parameter's state (and, under stage 2, of its gradient), and
// the parts cover every element exactly once.
TEST_F(Zero, EachRankHoldsOnlyItsPartsOfStateAndGradients) {
  manual_seed(3);
  std::shared_ptr<nn::Module> model = mlp();
  ZeroOptimizer zero(model, shared_world(), adamw(), ZeroStage::kGradients);
  zero.zero_grad();
  rank_loss(*model, nullptr, {5, 6}, 3, 0, rank()).backward();
  auto parameters = model->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_FALSE(parameters[i].grad().defined()) << "parameter " << i << " kept its gradient";
    const Tensor& part = zero.shard_optimizer().parameters()[i];
    ASSERT_TRUE(part.grad().defined());
    EXPECT_EQ(part.grad().numel(), zero.part_count(i));
    EXPECT_EQ(zero.part_count(i), part_rows(parameters[i].numel(), size(), rank()));
    Tensor covered = from_vector<int64_t>({zero.part_count(i)}, {1});
    world().all_reduce(covered);
    EXPECT_EQ(covered.item<int64_t>(), parameters[i].numel());
  }
  zero.step();
  int64_t state = 0, whole = 0;
  for (const auto& entry : zero.shard_optimizer().state_tensors()) state += entry.second.numel();
  for (const Tensor& parameter : parameters) whole += 2 * parameter.numel();  // AdamW: 2 moments
  Tensor total = from_vector<int64_t>({state}, {1});
  world().all_reduce(total);
  EXPECT_EQ(total.item<int64_t>(), whole);
  EXPECT_LE(state, (whole + size() - 1) / size() + 2 * static_cast<int64_t>(parameters.size()));
}

// state_tensors() gathers the parts into what the whole optimizer holds, under the same names;
// loading it resumes bitwise under ZeRO and, as the plain optimizer's state, like DDP.
TEST_F(Zero, GatheredStateIsThePlainOptimizersAndResumesBitwise) {
  const Case c = mlp_case();
  for (ZeroStage stage :
       {ZeroStage::kOptimizerState, ZeroStage::kGradients, ZeroStage::kParameters}) {
    auto train = [&](nn::Module& model, ZeroOptimizer& zero, DistributedDataParallel* ddp, int from,
                     int to) {
      for (int step = from; step < to; ++step) {
        zero.zero_grad();
        rank_loss(model, ddp, c.input_shape, c.classes, step, rank()).backward();
        zero.step();
      }
    };
    auto make_ddp = [&](const std::shared_ptr<nn::Module>& model) {
      return stage == ZeroStage::kOptimizerState
                 ? std::make_unique<DistributedDataParallel>(model, shared_world())
                 : nullptr;
    };
    manual_seed(11);
    std::shared_ptr<nn::Module> straight = c.make();
    std::shared_ptr<nn::Module> resumed = c.make();
    resumed->load_state_dict(straight->state_dict());
    auto straight_ddp = make_ddp(straight);
    ZeroOptimizer straight_zero(straight, shared_world(), adamw(), stage);
    train(*straight, straight_zero, straight_ddp.get(), 0, 4);

    // Two steps, a checkpoint in whole tensors, then a fresh model and optimizer from it.
    auto first_ddp = make_ddp(resumed);
    ZeroOptimizer first(resumed, shared_world(), adamw(), stage);
    train(*resumed, first, first_ddp.get(), 0, 2);
    auto model_state = resumed->state_dict();
    optim::NamedTensors state = first.state_tensors();
    optim::NamedScalars scalars = first.state_scalars();

    // The plain optimizer after the same two steps holds the same state under the same names.
    manual_seed(11);
    std::shared_ptr<nn::Module> plain = c.make();
    DistributedDataParallel plain_ddp(plain, shared_world());
    std::unique_ptr<optim::Optimizer> whole = adamw()(plain->named_parameters());
    for (int step = 0; step < 2; ++step) {
      whole->zero_grad();
      rank_loss(*plain, &plain_ddp, c.input_shape, c.classes, step, rank()).backward();
      whole->step();
    }
    optim::NamedTensors plain_state = whole->state_tensors();
    ASSERT_EQ(state.size(), plain_state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      EXPECT_EQ(state[i].first, plain_state[i].first);
      EXPECT_TRUE(all_close(state[i].second, plain_state[i].second)) << state[i].first;
    }
    EXPECT_EQ(scalars, whole->state_scalars());

    manual_seed(500 + rank());
    std::shared_ptr<nn::Module> restarted = c.make();
    restarted->load_state_dict(model_state);
    auto restarted_ddp = make_ddp(restarted);
    ZeroOptimizer again(restarted, shared_world(), adamw(), stage);
    again.load_state_tensors(state);
    again.load_state_scalars(scalars);
    train(*restarted, again, restarted_ddp.get(), 2, 4);
    auto expected = straight->named_parameters();
    auto actual = restarted->named_parameters();
    for (size_t i = 0; i < actual.size(); ++i)
      EXPECT_TRUE(bitwise_equal(actual[i].second, expected[i].second)) << actual[i].first;

    // The same checkpoint as the plain optimizer's state continues like ZeRO.
    std::shared_ptr<nn::Module> as_plain = c.make();
    as_plain->load_state_dict(model_state);
    DistributedDataParallel as_plain_ddp(as_plain, shared_world());
    std::unique_ptr<optim::Optimizer> loaded = adamw()(as_plain->named_parameters());
    loaded->load_state_tensors(state);
    loaded->load_state_scalars(scalars);
    for (int step = 2; step < 4; ++step) {
      loaded->zero_grad();
      rank_loss(*as_plain, &as_plain_ddp, c.input_shape, c.classes, step, rank()).backward();
      loaded->step();
    }
    auto continued = as_plain->named_parameters();
    for (size_t i = 0; i < continued.size(); ++i)
      EXPECT_TRUE(all_close(continued[i].second, expected[i].second)) << continued[i].first;
  }
}

TEST_F(Zero, BadUsesAreClearErrors) {
  manual_seed(5);
  std::shared_ptr<nn::Module> model = mlp();
  EXPECT_TRUE(throws_error([&] { ZeroOptimizer unused(nullptr, shared_world(), adamw()); },
                           "module is null"));
  EXPECT_TRUE(throws_error(
      [&] {
        ZeroOptimizer unused(model, shared_world(), [](const optim::NamedTensors&) {
          return std::unique_ptr<optim::Optimizer>();
        });
      },
      "make_optimizer returned null"));
  EXPECT_TRUE(throws_error(
      [&] {
        ZeroOptimizer unused(model, shared_world(), [&](const optim::NamedTensors&) {
          return adamw()(model->named_parameters());  // the whole parameters, not the parts
        });
      },
      "exactly the"));
  // Tensors each rank keeps as its own must be the module's.
  EXPECT_TRUE(throws_error(
      [&] {
        ZeroOptimizer unused(model, shared_world(), adamw(), ZeroStage::kGradients,
                             {"no_such.weight"});
      },
      "'own' names no_such.weight, which is not a parameter or buffer of the module"));
  // So must those shared with some ranks, each in one of the two, over some of the ranks.
  const std::string first = model->named_parameters().at(0).first;
  const std::shared_ptr<Communicator> alone =
      std::make_shared<SubgroupCommunicator>(shared_world(), std::vector<int>{rank()}, "alone");
  EXPECT_TRUE(throws_error(
      [&] {
        ZeroOptimizer unused(model, shared_world(), adamw(), ZeroStage::kGradients, {},
                             {{"no_such.weight", alone}});
      },
      "'shared' names no_such.weight, which is not a trainable parameter or a buffer"));
  EXPECT_TRUE(throws_error(
      [&] {
        ZeroOptimizer unused(model, shared_world(), adamw(), ZeroStage::kGradients, {first},
                             {{first, alone}});
      },
      "is in both 'own' and 'shared'"));
  EXPECT_TRUE(throws_error(
      [&] {
        ZeroOptimizer unused(model, shared_world(), adamw(), ZeroStage::kGradients, {},
                             {{first, nullptr}});
      },
      "must be some of the group's"));
  // A model that differs on one rank is an error on every rank, before any update.
  std::shared_ptr<nn::Module> uneven =
      rank() == 0
          ? mlp()
          : std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
                std::make_shared<nn::Linear>(6, 3)});
  for (ZeroStage stage : {ZeroStage::kOptimizerState, ZeroStage::kGradients})
    EXPECT_TRUE(throws_error([&] { ZeroOptimizer unused(uneven, shared_world(), adamw(), stage); },
                             "differ"));
  // Stage 3 drops a parameter's bytes: it must own them.
  struct ViewParameter : nn::Module {
    ViewParameter() { register_parameter("w", zeros({40}).narrow(0, 0, 18).view({3, 6})); }
  };
  EXPECT_TRUE(throws_error(
      [&] {
        ZeroOptimizer unused(std::make_shared<ViewParameter>(), shared_world(), adamw(),
                             ZeroStage::kParameters);
      },
      "must own its storage"));
  // Nor may a memory policy recompute ops (and gather parameters) differently on each rank.
  {
    memory::MemoryScope scope(size_t{64} << 20, memory::Policy::kDtr);
    std::shared_ptr<nn::Module> scoped = mlp();
    EXPECT_TRUE(throws_error(
        [&] { ZeroOptimizer unused(scoped, shared_world(), adamw(), ZeroStage::kParameters); },
        "use stage 2 under a memory policy"));
  }
  // A state tensor of the wrong shape changes nothing.
  ZeroOptimizer zero(model, shared_world(), adamw(), ZeroStage::kGradients);
  zero.zero_grad();
  rank_loss(*model, nullptr, {5, 6}, 3, 0, rank()).backward();
  zero.step();
  optim::NamedTensors state = zero.state_tensors();
  optim::NamedTensors broken = state;
  broken[0].second = zeros({7});
  EXPECT_TRUE(throws_error([&] { zero.load_state_tensors(broken); }, "has shape"));
  optim::NamedTensors after = zero.state_tensors();
  for (size_t i = 0; i < state.size(); ++i)
    EXPECT_TRUE(bitwise_equal(after[i].second, state[i].second)) << state[i].first;
}

}  // namespace
}  // namespace tessel::parallel
