// The budget is a hard limit, whatever runs under it. Random programs of ops (element-wise,
// matmul, reductions, backward, dropped references) run under random budgets (a quarter of
// their unconstrained peak and up) with every policy; after every op the allocator's allocated
// bytes and its high-water mark are at most the budget, every op that succeeds computes what it
// computes without a budget (bitwise under none/dtr/swap, the closeness rule under split/auto,
// which may cut work into chunks), and an op the budget cannot hold raises tessel::OutOfMemory
// and leaves the process working: later ops succeed.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "memory/memory.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel::memory {
namespace {

using testing::all_close;

enum class Kind { kInput, kExp, kTanh, kRelu, kAdd, kMul, kMatmul, kSumRows, kBackward, kDrop };

struct Instruction {
  Kind kind;
  int a = 0, b = 0;   // operands: indices of earlier instructions' results
  Shape shape;        // for kInput
  uint32_t seed = 0;  // for kInput
};

using Program = std::vector<Instruction>;

// Square 64x64 and 64x128 / 128x64 blocks (16-32 KiB each), so matmuls and adds mostly apply.
Program random_program(uint32_t seed, int length) {
  std::mt19937 random(seed);
  const std::vector<Shape> shapes = {{64, 64}, {64, 128}, {128, 64}};
  Program program;
  std::vector<int> live;  // results that are tensors and not dropped
  auto pick = [&]() { return live[random() % live.size()]; };
  for (int i = 0; i < length; ++i) {
    Instruction instruction{Kind::kInput};
    const uint32_t choice = live.size() < 2 ? 0 : random() % 10;
    switch (choice) {
      case 0:
        instruction.kind = Kind::kInput;
        instruction.shape = shapes[random() % shapes.size()];
        instruction.seed = random();
        break;
      case 1:
        instruction.kind = Kind::kExp;
        instruction.a = pick();
        break;
      case 2:
        instruction.kind = Kind::kTanh;
        instruction.a = pick();
        break;
      case 3:
        instruction.kind = Kind::kRelu;
        instruction.a = pick();
        break;
      case 4:
        instruction.kind = Kind::kAdd;
        instruction.a = pick();
        instruction.b = pick();
        break;
      case 5:
        instruction.kind = Kind::kMul;
        instruction.a = pick();
        instruction.b = pick();
        break;
      case 6:
        instruction.kind = Kind::kMatmul;
        instruction.a = pick();
        instruction.b = pick();
        break;
      case 7:
        instruction.kind = Kind::kSumRows;
        instruction.a = pick();
        break;
      case 8:
        instruction.kind = Kind::kBackward;
        instruction.a = pick();
        break;
      default: {
        instruction.kind = Kind::kDrop;
        const size_t index = random() % live.size();
        instruction.a = live[index];
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
        break;
      }
    }
    program.push_back(instruction);
    const bool makes_tensor =
        instruction.kind != Kind::kDrop && instruction.kind != Kind::kBackward;
    if (makes_tensor) live.push_back(i);
  }
  return program;
}

Tensor input_values(const Shape& shape, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = value(random);
  return tensor(values, shape).set_requires_grad(true);
}

// What a run left: each instruction's result (undefined where it failed or made none), leaf
// gradients after every backward, and how many out-of-memory errors it met.
struct Outcome {
  std::vector<Tensor> results;
  // Each result's values as it was made (results may be dropped later), outside the budget.
  std::vector<std::vector<float>> values;
  std::map<int, std::vector<float>> gradients;  // by input instruction, at the end
  int ooms = 0;
  int64_t peak = 0;
};

// Applies `instruction` to the results so far; an undefined tensor when an operand is missing
// or the shapes do not fit (the program is shape-agnostic on purpose).
Tensor execute(const Instruction& instruction, const std::vector<Tensor>& results) {
  auto operand = [&](int index) { return results[static_cast<size_t>(index)]; };
  const Tensor a = instruction.kind == Kind::kInput ? Tensor() : operand(instruction.a);
  const Tensor b = operand(instruction.b);
  switch (instruction.kind) {
    case Kind::kInput:
      return input_values(instruction.shape, instruction.seed);
    case Kind::kExp:
      return a.defined() ? exp(tanh(a)) : Tensor();  // bounded: no overflow
    case Kind::kTanh:
      return a.defined() ? tanh(a) : Tensor();
    case Kind::kRelu:
      return a.defined() ? relu(a) : Tensor();
    case Kind::kAdd:
      return a.defined() && b.defined() && a.sizes() == b.sizes() ? add(a, b) : Tensor();
    case Kind::kMul:
      return a.defined() && b.defined() && a.sizes() == b.sizes() ? mul(a, b) : Tensor();
    case Kind::kMatmul:
      return a.defined() && b.defined() && a.size(1) == b.size(0) ? mul(matmul(a, b), 1.0 / 64)
                                                                  : Tensor();
    case Kind::kSumRows:
      return a.defined() ? sum(a, {1}, /*keepdim=*/true) : Tensor();
    case Kind::kBackward:
      // Graphs are shared between results: later backwards go through them again.
      if (a.defined() && a.requires_grad())
        sum(mul(a, a)).backward(Tensor(), /*retain_graph=*/true);
      return Tensor();
    case Kind::kDrop:
      return Tensor();
  }
  return Tensor();
}

// The closeness rule on host values (tensors made here would take room in the budget).
bool close_values(const std::vector<float>& actual, const std::vector<float>& expected, double rtol,
                  double atol) {
  if (actual.size() != expected.size()) return false;
  double largest = 0, worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(expected[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(actual[i]) - expected[i]));
  }
  return worst <= atol + rtol * largest;
}

// Runs `program` in a scope with `budget` (0: unlimited) and `policy`, checking the limit after
// every op; `reference` (when given) is the unlimited run, to compare each result with.
Outcome run(const Program& program, size_t budget, Policy policy, const Outcome* reference) {
  manual_seed(3);
  MemoryScope scope(
      MemoryOptions().budget(budget).policy(policy).cost_source(CostSource::kEstimated));
  const bool bitwise = policy == Policy::kNone || policy == Policy::kDtr || policy == Policy::kSwap;
  Outcome outcome;
  outcome.results.resize(program.size());
  outcome.values.resize(program.size());
  for (size_t i = 0; i < program.size(); ++i) {
    const Instruction& instruction = program[i];
    if (instruction.kind == Kind::kDrop) {
      outcome.results[static_cast<size_t>(instruction.a)] = Tensor();
      continue;
    }
    try {
      outcome.results[i] = execute(instruction, outcome.results);
      // Reading the values may need room too (a contiguous copy).
      if (outcome.results[i].defined()) outcome.values[i] = outcome.results[i].to_vector<float>();
    } catch (const Error& error) {
      EXPECT_NE(dynamic_cast<const OutOfMemory*>(&error), nullptr)
          << "instruction " << i << " (kind " << static_cast<int>(instruction.kind)
          << ") failed with a tessel::Error that is not OutOfMemory: " << error.what();
      outcome.results[i] = Tensor();
      ++outcome.ooms;
      EXPECT_NE(std::string(error.what()).find("out of memory"), std::string::npos);
    }
    if (budget > 0) {
      const AllocatorStats stats = scope.allocator().stats();
      EXPECT_LE(stats.allocated_bytes, static_cast<int64_t>(budget)) << "after instruction " << i;
      EXPECT_LE(stats.peak_allocated_bytes, static_cast<int64_t>(budget))
          << "after instruction " << i;
    }
    if (!outcome.results[i].defined()) continue;
    if (reference) {
      const std::vector<float>& expected = reference->values[i];
      EXPECT_FALSE(expected.empty()) << "instruction " << i << " failed only without a budget";
      if (expected.empty()) continue;
      EXPECT_TRUE(bitwise ? outcome.values[i] == expected
                          : close_values(outcome.values[i], expected, 1e-4, 1e-6))
          << "instruction " << i << " under " << policy_name(policy);
    }
  }
  try {
    for (size_t i = 0; i < program.size(); ++i)
      if (program[i].kind == Kind::kInput && outcome.results[i].defined() &&
          outcome.results[i].grad().defined())
        outcome.gradients[static_cast<int>(i)] = outcome.results[i].grad().to_vector<float>();
  } catch (const OutOfMemory&) {
    ++outcome.ooms;  // no room to read a gradient: the comparison below is skipped
  }
  outcome.peak = scope.allocator().stats().peak_allocated_bytes;
  return outcome;
}

TEST(BudgetProperty, NeverExceededAndResultsUnchangedOverRandomProgramsBudgetsAndPolicies) {
  constexpr int kPrograms = 40;
  int total_ooms = 0, constrained_runs = 0;
  for (uint32_t seed = 1; seed <= kPrograms; ++seed) {
    const Program program = random_program(seed, 80);
    // The unlimited run keeps every result alive: its peak is an upper bound, and the budgets
    // below cut into it.
    const Outcome reference = run(program, 0, Policy::kNone, nullptr);
    ASSERT_EQ(reference.ooms, 0);
    std::mt19937 random(seed * 7919);
    std::uniform_real_distribution<double> fraction(0.25, 1.0);
    for (Policy policy :
         {Policy::kNone, Policy::kDtr, Policy::kSwap, Policy::kSplit, Policy::kAuto}) {
      const size_t budget =
          std::max<size_t>(64 * 1024, static_cast<size_t>(fraction(random) * reference.peak));
      SCOPED_TRACE("program " + std::to_string(seed) + ", policy " + policy_name(policy) +
                   ", budget " + std::to_string(budget) + " of peak " +
                   std::to_string(reference.peak));
      const Outcome constrained = run(program, budget, policy, &reference);
      total_ooms += constrained.ooms;
      ++constrained_runs;
      if (constrained.ooms == 0) {
        for (const auto& [index, values] : reference.gradients) {
          const auto found = constrained.gradients.find(index);
          ASSERT_NE(found, constrained.gradients.end()) << "gradient of input " << index;
          const Tensor actual = tensor(found->second, {static_cast<int64_t>(values.size())});
          const Tensor expected = tensor(values, {static_cast<int64_t>(values.size())});
          EXPECT_TRUE(all_close(actual, expected, 1e-4, 1e-6)) << "gradient of input " << index;
        }
      }
    }
  }
  // The budgets were tight enough to matter somewhere, and loose enough to work somewhere.
  EXPECT_GT(total_ooms, 0);
  EXPECT_LT(total_ooms, constrained_runs * 80);
}

// An out-of-memory error no policy can solve leaves the process working: the same training step
// on a smaller batch then succeeds and computes what it computes without a budget.
TEST(BudgetProperty, AfterAnUnsolvableOutOfMemoryTheNextSmallerStepSucceeds) {
  auto step = [](int64_t batch, size_t budget, Policy policy) {
    manual_seed(11);
    std::optional<MemoryScope> scope;
    if (budget > 0) scope.emplace(MemoryOptions().budget(budget).policy(policy));
    nn::Sequential net{std::make_shared<nn::Linear>(256, 512), std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Linear>(512, 10)};
    Tensor inputs = randn({batch, 256});
    Tensor labels = randint(0, 10, {batch});
    Tensor loss = cross_entropy(net(inputs), labels);
    loss.backward();
    return std::make_pair(loss.item<double>(), net.parameters()[0].grad().to_vector<float>());
  };
  const auto expected_small = step(8, 0, Policy::kNone);
  for (Policy policy : {Policy::kNone, Policy::kDtr, Policy::kSwap, Policy::kAuto}) {
    // 1.6 MiB of parameters and gradients fit; a batch of 4096 (8 MiB of activations) does not.
    const size_t budget = 3 * 1024 * 1024;
    bool out_of_memory = false;
    try {
      step(4096, budget, policy);
    } catch (const OutOfMemory&) {
      out_of_memory = true;
    }
    EXPECT_TRUE(out_of_memory) << policy_name(policy);
    const auto small = step(8, budget, policy);
    EXPECT_EQ(small.first, expected_small.first) << policy_name(policy);
    EXPECT_EQ(small.second, expected_small.second) << policy_name(policy);
  }
}

}  // namespace
}  // namespace tessel::memory
