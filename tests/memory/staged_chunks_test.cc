// Ops whose operands do not fit on the device beside each other, under a policy that splits: the
// dispatcher keeps some operands on host and runs the op over chunks of the batch, copying each
// chunk's part in and out (batch norm in passes: sums, centred squares, output). The results are
// those of the whole op, bit for bit; without splitting the same budget runs out of memory.
#include <vector>

#include "core/op.h"
#include "core/rng.h"
#include "gtest/gtest.h"
#include "memory/memory.h"
#include "ops/conv.h"
#include "ops/index.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/ops.h"
#include "ops/reduce.h"
#include "tests/testing.h"

namespace tessel::memory {
namespace {

constexpr size_t kMiB = 1 << 20;
// 4 MiB of f32, as many channels as entries in the batch: per-channel outputs are never cut.
const Shape kShape{16, 16, 64, 64};
const Attrs kTraining{{"momentum", 0.1}, {"eps", 1e-5}};

// The split policy within `bytes`, costs estimated (the same decisions on any machine).
MemoryOptions split_within(size_t bytes) {
  return MemoryOptions().budget(bytes).policy(Policy::kSplit).cost_source(CostSource::kEstimated);
}

struct Inputs {
  Tensor x, weight, bias, running_mean, running_var, grad;
};

// The same values on every call (made on the allocator installed now); the upstream gradient
// only when asked for.
Inputs make_inputs(bool with_grad = true) {
  manual_seed(3);
  Inputs in;
  in.x = randn(kShape);
  in.weight = randn({16});
  in.bias = randn({16});
  in.running_mean = zeros({16});
  in.running_var = ones({16});
  if (with_grad) in.grad = randn(kShape);
  return in;
}

std::vector<Tensor> forward(const Inputs& in) {
  return dispatch(ops::batch_norm, {in.x, in.weight, in.bias, in.running_mean, in.running_var},
                  kTraining);
}

std::vector<Tensor> backward(const Inputs& in, const std::vector<Tensor>& outputs) {
  return dispatch(ops::batch_norm_backward, {in.grad, in.x, in.weight, outputs[1], outputs[2]},
                  Attrs{{"training", true}});
}

// Copies to plain memory (the budgeted scope ends before the comparison).
std::vector<Tensor> to_plain(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> result;
  for (const Tensor& tensor : tensors) result.push_back(tensor.clone());
  return result;
}

void expect_bitwise(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t k = 0; k < actual.size(); ++k)
    EXPECT_TRUE(testing::bitwise_equal(actual[k], expected[k])) << "tensor " << k;
}

TEST(StagedChunks, BatchNormForwardWithItsOutputOnHostEqualsTheWholeOp) {
  Inputs reference = make_inputs(/*with_grad=*/false);
  const std::vector<Tensor> expected = forward(reference);
  std::vector<Tensor> actual, statistics;
  int64_t splits = 0, copied_out = 0;
  {
    // x and y (4 MiB each) do not fit in 6 MiB together.
    MemoryScope scope(split_within(6 * kMiB));
    Inputs in = make_inputs(/*with_grad=*/false);
    actual = to_plain(forward(in));
    statistics = to_plain({in.running_mean, in.running_var});
    splits = scope.allocator().policy_counters().splits;
    copied_out = scope.allocator().policy_counters().swapped_out_bytes;
    EXPECT_LE(scope.allocator().memory_stats().base.peak_allocated_bytes,
              static_cast<int64_t>(6 * kMiB));
  }
  expect_bitwise(actual, expected);
  // The running statistics moved once, as by the whole op.
  expect_bitwise(statistics, {reference.running_mean, reference.running_var});
  EXPECT_GT(splits, 0);
  EXPECT_GE(copied_out, static_cast<int64_t>(4 * kMiB));
}

TEST(StagedChunks, BatchNormBackwardWithAnOperandOnHostEqualsTheWholeOp) {
  Inputs reference = make_inputs();
  const std::vector<Tensor> expected = backward(reference, forward(reference));
  std::vector<Tensor> actual;
  int64_t splits = 0;
  {
    // grad, x and grad_x (4 MiB each) do not fit in 10 MiB together.
    MemoryScope scope(split_within(10 * kMiB));
    Inputs in = make_inputs();
    const std::vector<Tensor> outputs = forward(in);
    actual = to_plain(backward(in, outputs));
    splits = scope.allocator().policy_counters().splits;
  }
  expect_bitwise(actual, expected);
  EXPECT_GT(splits, 0);
}

// A weight's gradient sums over the batch: over chunks, each chunk's sum is added in (closeness
// rule: the order of the additions differs from the whole op's).
TEST(StagedChunks, AWeightGradientSumsOverChunksOfTheBatch) {
  auto weight_gradient = [] {
    manual_seed(5);
    Tensor grad = randn(kShape), x = randn(kShape);
    return dispatch(ops::conv2d_backward_weight, {grad, x},
                    Attrs{{"weight_size", std::vector<int64_t>{16, 16, 3, 3}},
                          {"stride", std::vector<int64_t>{1, 1}},
                          {"padding", std::vector<int64_t>{1, 1}},
                          {"dilation", std::vector<int64_t>{1, 1}},
                          {"groups", int64_t{1}}})[0];
  };
  const Tensor expected = weight_gradient();
  Tensor actual;
  int64_t splits = 0;
  {
    // grad and x (4 MiB each) fit, their im2col columns beside them do not.
    MemoryScope scope(split_within(9 * kMiB));
    actual = weight_gradient().clone();
    splits = scope.allocator().policy_counters().splits;
  }
  EXPECT_GT(splits, 0);
  EXPECT_TRUE(testing::all_close(actual, expected, 1e-4, 1e-5));
}

// A loss over many rows of classes: forward (the mean over kept targets summed over chunks) and
// backward (the kept targets counted in a first pass) bit for bit as the whole ops, some targets
// ignored, with label smoothing; and nll_loss over the log-probabilities.
TEST(StagedChunks, CrossEntropyOverChunksOfRowsEqualsTheWholeOp) {
  const Attrs attrs{{"ignore_index", int64_t{-100}},
                    {"reduction", std::string("mean")},
                    {"label_smoothing", 0.1}};
  auto loss_and_gradient = [&] {
    manual_seed(7);
    Tensor logits = randn({2048, 512});  // 4 MiB, as its log-probabilities and gradient
    std::vector<int64_t> classes(2048);
    for (int64_t row = 0; row < 2048; ++row) classes[row] = row % 7 == 0 ? -100 : row * 37 % 512;
    Tensor target = from_vector(classes, {2048});
    std::vector<Tensor> outputs = dispatch(ops::cross_entropy, {logits, target}, attrs);
    Tensor grad = dispatch(ops::cross_entropy_backward, {ones({}), outputs[1], target}, attrs)[0];
    Tensor nll =
        dispatch(ops::nll_loss, {outputs[1], target},
                 Attrs{{"ignore_index", int64_t{-100}}, {"reduction", std::string("sum")}})[0];
    return std::vector<Tensor>{outputs[0], outputs[1], grad, nll};
  };
  const std::vector<Tensor> expected = loss_and_gradient();
  MemoryScope scope(split_within(6 * kMiB));
  // Compared within the budget: each result comes back from host as it is read.
  expect_bitwise(loss_and_gradient(), expected);
  EXPECT_GE(scope.allocator().policy_counters().splits, 2);
}

// Softmax splits along the batch when it runs over another dimension, never over the batch.
TEST(StagedChunks, SoftmaxOverRowsSplitsAlongTheBatchButNotOverIt) {
  auto softmax_of = [](int64_t dim) {
    manual_seed(9);
    return softmax(randn(kShape), dim);
  };
  const Tensor expected = softmax_of(-1);
  MemoryScope scope(split_within(6 * kMiB));
  EXPECT_TRUE(testing::bitwise_equal(softmax_of(-1), expected));
  EXPECT_GT(scope.allocator().policy_counters().splits, 0);
  EXPECT_THROW(softmax_of(0), OutOfMemory);
}

// An embedding table's gradient sums the rows of its indices: over chunks of them, each adds
// its rows in, every entry in the order of one call.
TEST(StagedChunks, AnEmbeddingGradientSumsOverChunksOfItsIndices) {
  auto table_gradient = [] {
    manual_seed(13);
    Tensor grad = randn({4096, 256});  // 4 MiB
    Tensor indices = randint(0, 1024, {4096});
    return dispatch(ops::embedding_backward, {grad, indices},
                    Attrs{{"num_weights", int64_t{1024}}})[0];  // 1 MiB
  };
  const Tensor expected = table_gradient();
  MemoryScope scope(split_within(4608 * 1024));
  EXPECT_TRUE(testing::bitwise_equal(table_gradient(), expected));
  EXPECT_GT(scope.allocator().policy_counters().splits, 0);
}

// Layer norm's backward: rows independent, the weight's and bias's gradients summed over the
// chunks row after row as in one call.
TEST(StagedChunks, LayerNormBackwardOverChunksOfRowsEqualsTheWholeOp) {
  const Attrs attrs{{"normalized_shape", std::vector<int64_t>{128}}, {"eps", 1e-5}};
  auto gradients = [&] {
    manual_seed(17);
    Tensor x = randn({64, 128, 128});  // 4 MiB, as its gradient and the incoming one
    Tensor weight = randn({128}), bias = randn({128});
    std::vector<Tensor> outputs = dispatch(ops::layer_norm, {x, weight, bias}, attrs);
    Tensor grad = randn({64, 128, 128});
    return dispatch(ops::layer_norm_backward, {grad, x, outputs[1], outputs[2], weight}, attrs);
  };
  const std::vector<Tensor> expected = gradients();
  MemoryScope scope(split_within(10 * kMiB));
  expect_bitwise(gradients(), expected);
  EXPECT_GT(scope.allocator().policy_counters().splits, 0);
}

TEST(StagedChunks, WithoutSplittingTheSameBudgetRunsOutOfMemory) {
  MemoryScope scope(
      MemoryOptions().budget(6 * kMiB).policy(Policy::kDtr).cost_source(CostSource::kEstimated));
  Inputs in = make_inputs(/*with_grad=*/false);
  EXPECT_THROW(forward(in), OutOfMemory);
}

}  // namespace
}  // namespace tessel::memory
