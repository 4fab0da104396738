// The ops whose chunks are not independent (batch statistics, losses, sums over the batch) on a
// GPU under a policy that splits: their operands do not fit on the device beside each other, so
// the dispatcher keeps some on host and runs the op over chunks of the batch, the CUDA kernel
// keeping its running sums on host between chunks. The results are those of the whole op on the
// same GPU within the closeness rule (a chunk's sums are combined in another order).
#include <vector>

#include "core/op.h"
#include "core/rng.h"
#include "cuda/runtime.h"
#include "gtest/gtest.h"
#include "memory/memory.h"
#include "ops/conv.h"
#include "ops/index.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/ops.h"
#include "tests/gpu_skip.h"
#include "tests/testing.h"

namespace tessel::memory {
namespace {

constexpr size_t kMiB = 1 << 20;
// 4 MiB of f32, as many channels as entries in the batch: per-channel outputs are never cut.
const Shape kShape{16, 16, 64, 64};

Device gpu() { return Device::cuda(0); }

// The split policy on the GPU within `bytes`.
MemoryOptions split_within(size_t bytes) {
  return MemoryOptions().device(gpu()).budget(bytes).policy(Policy::kSplit);
}

// Seeded random values on the GPU (made on the allocator installed now).
Tensor gpu_randn(const Shape& sizes) { return randn(sizes).to(gpu()); }

std::vector<Tensor> to_cpu(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> result;
  for (const Tensor& tensor : tensors) result.push_back(tensor.to(Device::cpu()));
  return result;
}

void expect_close(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t k = 0; k < actual.size(); ++k)
    EXPECT_TRUE(testing::all_close(actual[k], expected[k], 1e-5, 1e-6)) << "tensor " << k;
}

// Runs `compute` (returning tensors on the GPU) without a budget, then within `bytes` under
// `split`: the same values, and at least one op ran over chunks.
template <typename Compute>
void expect_split_like_whole(size_t bytes, const Compute& compute) {
  const std::vector<Tensor> expected = to_cpu(compute());
  std::vector<Tensor> actual;
  int64_t splits = 0;
  {
    MemoryScope scope(split_within(bytes));
    actual = to_cpu(compute());
    splits = scope.allocator().policy_counters().splits;
  }
  expect_close(actual, expected);
  EXPECT_GT(splits, 0);
}

struct BatchNormRun {
  Tensor x, weight;
  std::vector<Tensor> outputs, running;  // y, saved mean, saved invstd; running mean and var
};

BatchNormRun batch_norm_forward() {
  manual_seed(3);
  BatchNormRun run;
  run.x = gpu_randn(kShape);
  run.weight = gpu_randn({16});
  Tensor bias = gpu_randn({16});
  run.running = {zeros({16}).to(gpu()), ones({16}).to(gpu())};
  run.outputs = dispatch(ops::batch_norm, {run.x, run.weight, bias, run.running[0], run.running[1]},
                         Attrs{{"momentum", 0.1}, {"eps", 1e-5}});
  return run;
}

TEST(CudaChunkPasses, BatchNormForwardAndBackwardOverChunksEqualTheWholeOps) {
  TESSEL_SKIP_IF_NO_GPU();
  // x and y (4 MiB each) do not fit in 6 MiB together; the running statistics move once.
  expect_split_like_whole(6 * kMiB, [] {
    BatchNormRun run = batch_norm_forward();
    run.outputs.insert(run.outputs.end(), run.running.begin(), run.running.end());
    return run.outputs;
  });
  // grad, x and grad_x (4 MiB each) do not fit in 10 MiB together.
  expect_split_like_whole(10 * kMiB, [] {
    const BatchNormRun run = batch_norm_forward();
    Tensor grad = gpu_randn(kShape);
    return dispatch(ops::batch_norm_backward,
                    {grad, run.x, run.weight, run.outputs[1], run.outputs[2]},
                    Attrs{{"training", true}});
  });
}

// A weight's gradient sums over the batch: chunks after the first add theirs into the output.
TEST(CudaChunkPasses, AWeightGradientSumsOverChunksOfTheBatch) {
  TESSEL_SKIP_IF_NO_GPU();
  // grad and x (4 MiB each) do not fit in 6 MiB together.
  expect_split_like_whole(6 * kMiB, [] {
    manual_seed(5);
    Tensor grad = gpu_randn(kShape), x = gpu_randn(kShape);
    return dispatch(ops::conv2d_backward_weight, {grad, x},
                    Attrs{{"weight_size", std::vector<int64_t>{16, 16, 3, 3}},
                          {"stride", std::vector<int64_t>{1, 1}},
                          {"padding", std::vector<int64_t>{1, 1}},
                          {"dilation", std::vector<int64_t>{1, 1}},
                          {"groups", int64_t{1}}});
  });
}

// Cross-entropy over chunks of rows (the mean over kept targets summed over chunks, the backward
// counting kept targets first), some targets ignored, with label smoothing; nll_loss summed, and
// an unreduced backward reading each chunk's part of the incoming gradient.
TEST(CudaChunkPasses, LossesOverChunksOfRowsEqualTheWholeOps) {
  TESSEL_SKIP_IF_NO_GPU();
  for (const char* reduction : {"mean", "none"}) {
    SCOPED_TRACE(reduction);
    const Attrs attrs{{"ignore_index", int64_t{-100}},
                      {"reduction", std::string(reduction)},
                      {"label_smoothing", 0.1}};
    expect_split_like_whole(6 * kMiB, [&] {
      manual_seed(7);
      Tensor logits = gpu_randn({2048, 512});  // 4 MiB, as its log-probabilities and gradient
      std::vector<int64_t> classes(2048);
      for (int64_t row = 0; row < 2048; ++row) classes[row] = row % 7 == 0 ? -100 : row * 37 % 512;
      Tensor target = from_vector(classes, {2048}).to(gpu());
      std::vector<Tensor> outputs = dispatch(ops::cross_entropy, {logits, target}, attrs);
      Tensor grad_loss = std::string(reduction) == "none" ? gpu_randn({2048}) : ones({}).to(gpu());
      Tensor grad =
          dispatch(ops::cross_entropy_backward, {grad_loss, outputs[1], target}, attrs)[0];
      Tensor nll =
          dispatch(ops::nll_loss, {outputs[1], target},
                   Attrs{{"ignore_index", int64_t{-100}}, {"reduction", std::string("sum")}})[0];
      return std::vector<Tensor>{outputs[0], outputs[1], grad, nll};
    });
  }
}

// An embedding table's gradient: each chunk of the indices adds its rows to the table.
TEST(CudaChunkPasses, AnEmbeddingGradientSumsOverChunksOfItsIndices) {
  TESSEL_SKIP_IF_NO_GPU();
  expect_split_like_whole(4608 * 1024, [] {
    manual_seed(13);
    Tensor grad = gpu_randn({4096, 256});  // 4 MiB
    Tensor indices = randint(0, 1024, {4096}).to(gpu());
    return dispatch(ops::embedding_backward, {grad, indices},
                    Attrs{{"num_weights", int64_t{1024}}});  // 1 MiB
  });
}

// Layer norm's backward: rows independent, the weight's and bias's gradients summed over chunks.
TEST(CudaChunkPasses, LayerNormBackwardOverChunksOfRowsEqualsTheWholeOp) {
  TESSEL_SKIP_IF_NO_GPU();
  const Attrs attrs{{"normalized_shape", std::vector<int64_t>{128}}, {"eps", 1e-5}};
  expect_split_like_whole(10 * kMiB, [&] {
    manual_seed(17);
    Tensor x = gpu_randn({64, 128, 128});  // 4 MiB, as its gradient and the incoming one
    Tensor weight = gpu_randn({128}), bias = gpu_randn({128});
    std::vector<Tensor> outputs = dispatch(ops::layer_norm, {x, weight, bias}, attrs);
    Tensor grad = gpu_randn({64, 128, 128});
    return dispatch(ops::layer_norm_backward, {grad, x, outputs[1], outputs[2], weight}, attrs);
  });
}

}  // namespace
}  // namespace tessel::memory
