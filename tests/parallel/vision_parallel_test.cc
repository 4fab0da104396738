// Tensor parallelism for ResNet and ShuffleNet over a tp group of every rank, against one process:
// the channel-split convolution gives conv2d's output and gradients; the tensor-parallel
// classifier (batch-split trunk, class-split classifier) gives the loss and gradients of the
// full model run on each rank's rows one after another (batch norm sees the same rows).
#include "parallel/vision_parallel.h"

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/autograd.h"
#include "core/rng.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "models/vision_parallel.h"
#include "ops/ops.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using models::TensorParallelClassifier;
using tessel::testing::all_close;
using tessel::testing::throws_error;
using testing::MpiTest;

class VisionParallel : public MpiTest {
 protected:
  static int64_t group() {
    static int64_t id = register_tp_group(shared_world());
    return id;
  }
};

TEST_F(VisionParallel, ChannelParallelConvMatchesConv2d) {
  manual_seed(3);
  nn::Conv2d full(nn::Conv2dOptions(3, 4 * size(), 3).padding(1).stride(2));
  full.to(DType::kFloat64);
  ChannelParallelConv2d split(full, group());
  const Tensor x = randn({2, 3, 7, 7}, DType::kFloat64).set_requires_grad(true);
  const Tensor x_copy = clone(x.detach()).set_requires_grad(true);
  const Tensor r = randn({2, 4 * size(), 4, 4}, DType::kFloat64);

  const Tensor expected = full.forward(x);
  sum(mul(expected, r)).backward();
  const Tensor actual = split.forward(x_copy);
  EXPECT_TRUE(all_close(actual, expected));
  sum(mul(actual, r)).backward();
  EXPECT_TRUE(all_close(x_copy.grad(), x.grad()));
  const int64_t local = 4;
  EXPECT_TRUE(all_close(split.weight.grad(), narrow(full.weight.grad(), 0, rank() * local, local)));
  EXPECT_TRUE(all_close(split.bias.grad(), narrow(full.bias.grad(), 0, rank() * local, local)));
}

void check_classifier(const std::function<std::shared_ptr<nn::Module>()>& make, int64_t group,
                      int rank, int size) {
  manual_seed(11);
  auto reference = make();
  reference->to(DType::kFloat64);
  manual_seed(11);
  auto full = make();
  full->to(DType::kFloat64);
  TensorParallelClassifier split(full, group);

  manual_seed(12);  // the same batch on every rank
  const int64_t rows = 2 * size;
  const Tensor images = randn({rows, 3, 16, 16}, DType::kFloat64);
  const Tensor labels = randint(0, 2 * size, {rows});

  // One process: each rank's rows through the full model in turn, one mean over every row.
  std::vector<Tensor> parts;
  for (int r = 0; r < size; ++r) parts.push_back(reference->forward(narrow(images, 0, 2 * r, 2)));
  const Tensor expected_loss = cross_entropy(cat(parts, 0), labels);
  expected_loss.backward();

  const Tensor logits = split.forward(images);
  ASSERT_EQ(logits.size(1), 2);
  const Tensor loss = split.loss(logits, labels);
  loss.backward();
  split.reduce_trunk_gradients();
  EXPECT_TRUE(all_close(loss, expected_loss, 1e-10, 1e-12));
  EXPECT_TRUE(all_close(split.gather_logits(logits), cat(parts, 0).detach(), 1e-10, 1e-12));

  std::map<std::string, Tensor> expected;
  for (const auto& [name, p] : reference->named_parameters()) expected[name] = p.grad();
  for (const auto& [name, p] : split.named_parameters()) {
    ASSERT_TRUE(expected.count(name)) << name;
    Tensor want = expected[name];
    if (name.rfind("fc.", 0) == 0) want = narrow(want, 0, rank * 2, 2);
    EXPECT_TRUE(all_close(p.grad(), want, 1e-8, 1e-10)) << name;
  }
}

TEST_F(VisionParallel, ResNetMatchesOneProcessOverEachRanksRows) {
  check_classifier(
      [&] {
        return models::resnet18(
            models::ResNetOptions().num_classes(2 * size()).small_image_stem(true));
      },
      group(), rank(), size());
}

TEST_F(VisionParallel, ShuffleNetMatchesOneProcessOverEachRanksRows) {
  check_classifier(
      [&] {
        return models::shufflenet_v2_x0_5(
            models::ShuffleNetV2Options().num_classes(2 * size()).small_image_stem(true));
      },
      group(), rank(), size());
}

TEST_F(VisionParallel, ShuffleNetWithChannelSplitConv5MatchesOneProcess) {
  // The trunk on each rank's rows in turn, then conv5 (and its batch norm) over every row.
  auto make = [&] {
    return models::shufflenet_v2_x0_5(
        models::ShuffleNetV2Options().num_classes(3).small_image_stem(true));
  };
  manual_seed(21);
  auto reference = make();
  reference->to(DType::kFloat64);
  manual_seed(21);
  auto full = make();
  full->to(DType::kFloat64);
  TensorParallelClassifier split(full, group(), /*split_widest_conv=*/true);

  manual_seed(22);
  const int64_t rows = 2 * size();
  const Tensor images = randn({rows, 3, 16, 16}, DType::kFloat64);
  const Tensor labels = randint(0, 3, {rows});
  std::vector<Tensor> parts;
  for (int r = 0; r < size(); ++r) {
    Tensor out =
        reference->maxpool->forward(reference->conv1->forward(narrow(images, 0, 2 * r, 2)));
    parts.push_back(
        reference->stage4->forward(reference->stage3->forward(reference->stage2->forward(out))));
  }
  const Tensor head = reference->conv5->forward(cat(parts, 0));
  const Tensor expected_logits = reference->fc->forward(mean(head, {2, 3}));
  const Tensor expected_loss = cross_entropy(expected_logits, labels);
  expected_loss.backward();

  const Tensor logits = split.forward(images);
  const Tensor loss = split.loss(logits, labels);
  loss.backward();
  split.reduce_trunk_gradients();
  EXPECT_TRUE(all_close(logits, expected_logits.detach(), 1e-10, 1e-12));
  EXPECT_TRUE(all_close(loss, expected_loss, 1e-10, 1e-12));

  std::map<std::string, Tensor> expected;
  for (const auto& [name, p] : reference->named_parameters()) expected[name] = p.grad();
  const int64_t local = 1024 / size();
  for (const auto& [name, p] : split.named_parameters()) {
    ASSERT_TRUE(expected.count(name)) << name;
    Tensor want = expected[name];
    if (name.rfind("conv5.", 0) == 0) want = narrow(want, 0, rank() * local, local);
    if (name == "fc.weight") want = narrow(want, 1, rank() * local, local);
    EXPECT_TRUE(all_close(p.grad(), want, 1e-8, 1e-10)) << name;
  }
  // gather_into_full_model puts every rank's channels (weights and running statistics) back into
  // the full model.
  split.gather_into_full_model();
  auto& norm = *full->conv5->at<nn::BatchNorm2d>(1);
  EXPECT_TRUE(all_close(narrow(full->conv5->at<nn::Conv2d>(0)->weight, 0, rank() * local, local),
                        split.split_conv->weight));
  EXPECT_TRUE(all_close(narrow(norm.running_mean, 0, rank() * local, local),
                        split.split_norm->running_mean));
  EXPECT_TRUE(
      all_close(narrow(norm.running_var, 0, rank() * local, local), split.split_norm->running_var));
  EXPECT_TRUE(all_close(narrow(full->fc->weight, 1, rank() * local, local), split.row_fc->weight));
  EXPECT_TRUE(all_close(full->fc->bias, split.row_fc->bias));
}

TEST_F(VisionParallel, BadShapesAreClearErrors) {
  auto full = models::resnet18(models::ResNetOptions().num_classes(2 * size() + 1));
  EXPECT_TRUE(throws_error([&] { TensorParallelClassifier split(full, group()); },
                           "must be a multiple of the tensor parallel size"));
  auto even = models::resnet18(models::ResNetOptions().num_classes(2 * size()));
  TensorParallelClassifier split(even, group());
  EXPECT_TRUE(throws_error(
      [&] {
        split.forward(randn({size() + 1, 3, 16, 16}));
      },
      "must be a multiple of the tensor parallel size"));
  EXPECT_TRUE(throws_error([&] { TensorParallelClassifier bad(even, group(), true); },
                           "split_widest_conv splits ShuffleNet"));
  auto linear = std::make_shared<nn::Linear>(3, 4);
  EXPECT_TRUE(throws_error([&] { TensorParallelClassifier bad(linear, group()); },
                           "expected a ResNet or a ShuffleNetV2"));
}

}  // namespace
}  // namespace tessel::parallel
