// The CUDA kernels of the tensor-parallel ops (//parallel:tensor_parallel_cuda) on one rank and
// one GPU (tagged gpu): a tp group of one over NCCL against the same op on the CPU over a one-rank
// MPI group, forward and backward, contiguous and strided inputs, bit for bit (a group of one
// makes the reduce, the gather and the scatter identities). Skips when no GPU is visible. The
// multi-rank layout is tensor_parallel_test's (CPU, mpirun).
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "cuda/runtime.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "parallel/communicator.h"
#include "parallel/process_group.h"
#include "parallel/tensor_parallel.h"
#include "tests/gpu_skip.h"
#include "tests/parallel/one_rank_mpi.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::bitwise_equal;
using tessel::testing::throws_error;

const auto* const kMpi = ::testing::AddGlobalTestEnvironment(new OneRankMpiEnvironment);

const Device kGpu = Device::cuda(0);

// The one-rank groups, registered once: MPI for CPU tensors, NCCL (the grid's) for cuda:0's.
int64_t cpu_group() {
  static const int64_t id =
      register_tp_group(make_device_communicator(MPI_COMM_WORLD, Device::cpu()));
  return id;
}
int64_t gpu_group() {
  static const ProcessGrid grid(1, 1, CommOptions(), MPI_COMM_WORLD, kGpu);
  static const int64_t id = register_tp_group(grid.tensor_parallel_on_device());
  return id;
}

using TpOp = std::function<Tensor(const Tensor&, int64_t)>;

struct Case {
  std::string name;
  Shape sizes;                                // of the leaf
  std::function<Tensor(const Tensor&)> view;  // what the op sees: the leaf or a strided view
};

std::vector<Case> cases() {
  auto same = [](const Tensor& x) { return x; };
  return {
      {"2-D", {3, 4}, same},
      {"2-D transposed", {4, 6}, [](const Tensor& x) { return transpose(x, 0, 1); }},
      {"3-D", {2, 3, 4}, same},
      {"3-D permuted",
       {4, 2, 6},
       [](const Tensor& x) {
         return permute(x, {1, 2, 0});
       }},
      {"3-D narrowed", {2, 3, 8}, [](const Tensor& x) { return narrow(x, 2, 2, 4); }},
  };
}

// op(view(leaf)) on `device` over `group`: its output and the leaf's gradient of
// sum(output * upstream), both on the CPU.
std::pair<Tensor, Tensor> run(const TpOp& op, const Case& c, const Tensor& values,
                              const Tensor& upstream, Device device, int64_t group) {
  // A leaf of its own on either device (values.to(cpu) would be values itself).
  Tensor leaf = values.detach().to(device).set_requires_grad(true);
  Tensor output = op(c.view(leaf), group);
  // The loss in f32: the CPU has no bf16 arithmetic (the tp ops move bf16 as it is).
  sum(mul(output.to(DType::kFloat32), upstream.to(DType::kFloat32).to(device))).backward();
  return {output.detach().to(Device::cpu()), leaf.grad().to(Device::cpu())};
}

class TensorParallelGpu : public ::testing::Test {
 protected:
  void SetUp() override { TESSEL_SKIP_IF_NO_GPU(); }
};

TEST_F(TensorParallelGpu, TheGridsTpGroupOnAGpuIsNccl) {
  const auto& group = tp_group(gpu_group());
  EXPECT_EQ(group->device(), kGpu);
  EXPECT_EQ(group->name(), "tp");
  EXPECT_EQ(group->size(), 1);
}

TEST_F(TensorParallelGpu, EveryOpForwardAndBackwardMatchesTheCpuBitForBit) {
  const std::vector<std::pair<std::string, TpOp>> ops = {
      {"copy_to_tp", copy_to_tp},
      {"reduce_from_tp", reduce_from_tp},
      {"gather_from_tp", [](const Tensor& x, int64_t group) { return gather_from_tp(x, group); }},
      {"scatter_to_tp", [](const Tensor& x, int64_t group) { return scatter_to_tp(x, group); }},
      {"gather_from_tp along dim 0",
       [](const Tensor& x, int64_t group) { return gather_from_tp(x, group, 0); }},
      {"scatter_to_tp along dim 0",
       [](const Tensor& x, int64_t group) { return scatter_to_tp(x, group, 0); }},
      {"all_to_all_tp (last dim to first)",
       [](const Tensor& x, int64_t group) { return all_to_all_tp(x, x.dim() - 1, 0, group); }},
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    for (const Case& c : cases()) {
      manual_seed(3);
      const Tensor values = randn(c.sizes, dtype);
      const Shape out_sizes = c.view(values).sizes();  // a group of one keeps every shape
      const Tensor upstream = randn(out_sizes, dtype);
      for (const auto& [name, op] : ops) {
        SCOPED_TRACE(name + " on " + c.name + " " + dtype_name(dtype));
        const auto [cpu_out, cpu_grad] = run(op, c, values, upstream, Device::cpu(), cpu_group());
        const auto [gpu_out, gpu_grad] = run(op, c, values, upstream, kGpu, gpu_group());
        EXPECT_TRUE(bitwise_equal(gpu_out, cpu_out));
        EXPECT_TRUE(bitwise_equal(gpu_grad, cpu_grad));
      }
    }
  }
}

TEST_F(TensorParallelGpu, MaxFromTpAndTheVocabParallelLossMatchTheCpu) {
  manual_seed(7);
  const Tensor logits = randn({5, 6});
  const Tensor target = from_vector<int64_t>({0, 5, -100, 3, 2}, {5});
  EXPECT_TRUE(bitwise_equal(max_from_tp(logits.to(kGpu), gpu_group()).to(Device::cpu()),
                            max_from_tp(logits, cpu_group())));

  Tensor cpu_logits = logits.clone().set_requires_grad(true);
  Tensor gpu_logits = logits.to(kGpu).set_requires_grad(true);
  Tensor cpu_loss = vocab_parallel_cross_entropy(cpu_logits, target, cpu_group());
  Tensor gpu_loss = vocab_parallel_cross_entropy(gpu_logits, target.to(kGpu), gpu_group());
  EXPECT_TRUE(tessel::testing::all_close(gpu_loss.to(Device::cpu()), cpu_loss));
  cpu_loss.backward();
  gpu_loss.backward();
  EXPECT_TRUE(tessel::testing::all_close(gpu_logits.grad().to(Device::cpu()), cpu_logits.grad()));

  // gather_shards gathers on the group's device and returns on the shard's.
  const Tensor shard = randn({3, 4});
  EXPECT_TRUE(bitwise_equal(gather_shards(shard, 1, *tp_group(gpu_group())), shard));
  EXPECT_EQ(gather_shards(shard.to(kGpu), 0, *tp_group(cpu_group())).device(), kGpu);
}

TEST_F(TensorParallelGpu, ACpuGroupForGpuTensorsIsAClearError) {
  const Tensor x = ones({2, 4}).to(kGpu);
  EXPECT_TRUE(throws_error([&] { reduce_from_tp(x, cpu_group()); },
                           "reduce_from_tp: the tensor-parallel group 'world' moves tensors on cpu "
                           "but the input is on cuda:0"));
}

}  // namespace
}  // namespace tessel::parallel
