// DistributedDataParallel under the memory policies: each rank trains its shard under a budget
// (half its activation memory) with dtr and with swap, and ends bitwise where it ends without a
// budget, so the bucket buffers and the tensors in flight survive eviction and swapping.
// Run with 2 and 4 ranks.
#include <memory>
#include <vector>

#include "core/rng.h"
#include "memory/memory.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "parallel/ddp.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::bitwise_equal;
using testing::MpiTest;

struct RunResult {
  std::vector<Tensor> state;  // parameters, then buffers
  size_t peak = 0;
  size_t fixed = 0;
  memory::PolicyCounters counters;
};

// Activations dominate: 128 KiB activations against about 60 KiB of parameters.
std::shared_ptr<nn::Module> make_mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(64, 128), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 128), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(128, 128), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 10)});
}

class DataParallelMemory : public MpiTest {
 protected:
  RunResult train(const memory::MemoryOptions& options) {
    RunResult result;
    memory::MemoryScope scope(options);
    manual_seed(1234);
    auto model = make_mlp();
    DistributedDataParallel ddp(model, shared_world(), DDPOptions().bucket_cap_mb(0.01));
    optim::SGD sgd(model->parameters(), optim::SGDOptions(0.05).momentum(0.9));
    // Parameters, gradients, momentum and the bucket buffers (one more gradient's worth).
    result.fixed = memory::fixed_memory_bytes(model->parameters(), 2);
    for (int step = 0; step < 3; ++step) {
      manual_seed(100 + 10 * step + rank());
      Tensor input = randn({256, 64});
      Tensor labels = randint(0, 10, {256});
      sgd.zero_grad();
      cross_entropy(ddp.forward(input), labels).backward();
      ddp.finalize();
      sgd.step();
    }
    result.peak = static_cast<size_t>(scope.allocator().memory_stats().base.peak_allocated_bytes);
    result.counters = scope.allocator().policy_counters();
    for (const auto& parameter : model->parameters()) result.state.push_back(parameter);
    for (const auto& buffer : model->buffers()) result.state.push_back(buffer);
    return result;
  }

  memory::MemoryOptions budgeted(const RunResult& reference, memory::Policy policy) {
    return memory::MemoryOptions()
        .budget(memory::activation_budget(reference.fixed, reference.peak, 0.5))
        .policy(policy)
        .min_candidate_bytes(16 * 1024)
        .cost_source(memory::CostSource::kEstimated)  // decisions independent of timing
        .fixed_bytes(reference.fixed);
  }

  void expect_same_state(const RunResult& actual, const RunResult& expected) {
    ASSERT_EQ(actual.state.size(), expected.state.size());
    for (size_t i = 0; i < actual.state.size(); ++i)
      EXPECT_TRUE(bitwise_equal(actual.state[i], expected.state[i])) << "state tensor " << i;
  }
};

TEST_F(DataParallelMemory, DtrBudgetTrainsBitwiseLikeNoBudget) {
  RunResult reference = train(memory::MemoryOptions());
  RunResult dtr = train(budgeted(reference, memory::Policy::kDtr));
  expect_same_state(dtr, reference);
  EXPECT_GT(dtr.counters.evictions, 0);
  EXPECT_GT(dtr.counters.recomputes, 0);
}

TEST_F(DataParallelMemory, SwapBudgetTrainsBitwiseLikeNoBudget) {
  RunResult reference = train(memory::MemoryOptions());
  RunResult swap = train(budgeted(reference, memory::Policy::kSwap));
  expect_same_state(swap, reference);
  EXPECT_GT(swap.counters.swaps_out, 0);
}

}  // namespace
}  // namespace tessel::parallel
