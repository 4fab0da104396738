// Exact resume: training 20 steps straight and training 10, saving, loading into a freshly built
// model, optimizer and schedule, and training 10 more give bitwise-equal parameters, buffers,
// optimizer state and learning rate. The model has dropout and batch norm and every step draws
// its data from the RNG, so the RNG state, the running statistics and the schedule all matter.
#include <filesystem>
#include <functional>
#include <memory>

#include "core/rng.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/optim.h"
#include "tests/testing.h"
#include "train/state/checkpoint.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using testing::bitwise_equal;

// Linear -> BatchNorm (on (N, C, 1, 1)) -> ReLU -> Dropout -> Linear.
class DropoutBatchNormNet : public nn::Module {
 public:
  DropoutBatchNormNet() : Module("DropoutBatchNormNet") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 8));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(8));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.3));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 3));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t n = x.size(0);
    Tensor hidden = (*bn)((*fc1)(x).reshape({n, 8, 1, 1})).reshape({n, 8});
    return (*fc2)((*drop)(relu(hidden)));
  }
  std::shared_ptr<nn::Linear> fc1;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> fc2;
};

struct Training {
  std::shared_ptr<DropoutBatchNormNet> net;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::LRScheduler> schedule;
};
using MakeTraining = std::function<Training()>;

Training sgd_momentum_step_lr() {
  Training training;
  training.net = std::make_shared<DropoutBatchNormNet>();
  training.optimizer = std::make_unique<optim::SGD>(
      training.net->named_parameters(), optim::SGDOptions(0.2).momentum(0.9).weight_decay(1e-4));
  training.schedule = std::make_unique<optim::StepLR>(*training.optimizer, 4, 0.5);
  return training;
}

Training adamw_cosine_warmup() {
  Training training;
  training.net = std::make_shared<DropoutBatchNormNet>();
  training.optimizer =
      std::make_unique<optim::AdamW>(training.net->named_parameters(), optim::AdamWOptions(0.01));
  training.schedule =
      std::make_unique<optim::CosineWithWarmup>(*training.optimizer, 5, 20, /*min_lr=*/1e-4);
  return training;
}

// Steps on fresh random data: inputs, labels and dropout masks all come from the global RNG.
void train_steps(Training& training, int steps) {
  for (int i = 0; i < steps; ++i) {
    training.optimizer->zero_grad();
    Tensor inputs = randn({16, 6});
    Tensor labels = randint(0, 3, {16});
    Tensor loss = cross_entropy((*training.net)(inputs), labels);
    loss.backward();
    training.optimizer->step();
    training.schedule->step();
  }
}

std::string fresh_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / "resume_test" / info->name();
  fs::remove_all(dir);
  return dir.string();
}

// Number of state entries (model, and optimizer when asked) that differ bitwise; the names must
// agree.
int count_differences(const Training& actual, const Training& expected,
                      bool include_optimizer = true) {
  int differences = 0;
  auto compare = [&](const nn::NamedTensors& a, const nn::NamedTensors& b) {
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      if (!bitwise_equal(a[i].second, b[i].second)) ++differences;
    }
  };
  compare(actual.net->state_dict(), expected.net->state_dict());
  if (include_optimizer)
    compare(actual.optimizer->state_tensors(), expected.optimizer->state_tensors());
  return differences;
}

void expect_bitwise_resume(const MakeTraining& make) {
  constexpr uint64_t kSeed = 2024;
  manual_seed(kSeed);
  Training straight = make();
  train_steps(straight, 20);
  const RngState rng_after_straight = get_rng_state();

  const std::string dir = fresh_dir();
  manual_seed(kSeed);
  Training first_half = make();
  train_steps(first_half, 10);
  save_checkpoint(dir, 10, *first_half.net, *first_half.optimizer, first_half.schedule.get(),
                  {{"epoch", 1}});
  const RngState rng_at_save = get_rng_state();

  // A fresh run from another seed, so nothing but the checkpoint can make it match.
  manual_seed(777);
  Training resumed = make();
  EXPECT_GT(count_differences(resumed, first_half, /*include_optimizer=*/false), 0);
  NamedScalars extra;
  ASSERT_EQ(
      load_latest_checkpoint(dir, *resumed.net, *resumed.optimizer, resumed.schedule.get(), &extra),
      10);
  EXPECT_EQ(extra, (NamedScalars{{"epoch", 1}}));
  EXPECT_EQ(get_rng_state(), rng_at_save);
  EXPECT_EQ(resumed.schedule->step_count(), 10);
  EXPECT_EQ(resumed.optimizer->lr(), first_half.optimizer->lr());
  train_steps(resumed, 10);

  const nn::NamedTensors expected_state = straight.net->state_dict();
  const nn::NamedTensors actual_state = resumed.net->state_dict();
  ASSERT_EQ(actual_state.size(), expected_state.size());
  for (size_t i = 0; i < actual_state.size(); ++i) {
    EXPECT_EQ(actual_state[i].first, expected_state[i].first);
    EXPECT_TRUE(bitwise_equal(actual_state[i].second, expected_state[i].second))
        << actual_state[i].first;
  }
  const optim::NamedTensors expected_optimizer = straight.optimizer->state_tensors();
  const optim::NamedTensors actual_optimizer = resumed.optimizer->state_tensors();
  ASSERT_EQ(actual_optimizer.size(), expected_optimizer.size());
  for (size_t i = 0; i < actual_optimizer.size(); ++i) {
    EXPECT_EQ(actual_optimizer[i].first, expected_optimizer[i].first);
    EXPECT_TRUE(bitwise_equal(actual_optimizer[i].second, expected_optimizer[i].second))
        << actual_optimizer[i].first;
  }
  EXPECT_EQ(resumed.optimizer->state_scalars(), straight.optimizer->state_scalars());
  EXPECT_EQ(resumed.schedule->state_scalars(), straight.schedule->state_scalars());
  EXPECT_EQ(get_rng_state(), rng_after_straight);
}

TEST(ExactResume, SGDMomentumWithStepLRMatchesAStraightRunBitwise) {
  expect_bitwise_resume(sgd_momentum_step_lr);
}

TEST(ExactResume, AdamWWithCosineWarmupMatchesAStraightRunBitwise) {
  expect_bitwise_resume(adamw_cosine_warmup);
}

// The control: the same resume without the saved RNG state draws other data and masks.
TEST(ExactResume, ResumingWithAnotherRngStateDiverges) {
  manual_seed(2024);
  Training straight = sgd_momentum_step_lr();
  train_steps(straight, 12);

  const std::string dir = fresh_dir();
  manual_seed(2024);
  Training first_half = sgd_momentum_step_lr();
  train_steps(first_half, 10);
  save_checkpoint(dir, 10, *first_half.net, *first_half.optimizer, first_half.schedule.get());
  Training resumed = sgd_momentum_step_lr();
  load_latest_checkpoint(dir, *resumed.net, *resumed.optimizer, resumed.schedule.get());
  EXPECT_EQ(count_differences(resumed, first_half), 0);
  manual_seed(5);
  train_steps(resumed, 2);
  EXPECT_GT(count_differences(resumed, straight), 0);
}

}  // namespace
}  // namespace tessel::train
