// One SGD training step of whole models on CUDA against the same step on CPU, from the same
// weights and batch: ResNet-18 with the small-image stem and BERT tiny (dropout on: the Philox
// stream is the same on both devices). Losses, parameters and buffers agree to the closeness rule's
// whole-model tolerance (rtol 1e-4).
#include <functional>
#include <memory>
#include <string>

#include "core/autograd.h"
#include "core/rng.h"
#include "cuda/runtime.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "tests/gpu_skip.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;

constexpr double kModelRtol = 1e-4;

// The loss of one forward pass of `model` on `device` (the batch is moved there).
using StepLoss = std::function<Tensor(nn::Module& model, Device device)>;

// Builds the model twice from one seed (identical weights), moves one copy to the GPU, runs one
// step on each device and compares the losses, every parameter and every buffer.
void expect_same_step(const std::function<std::shared_ptr<nn::Module>()>& build,
                      const StepLoss& step_loss) {
  manual_seed(2024);
  std::shared_ptr<nn::Module> cpu_model = build();
  manual_seed(2024);
  std::shared_ptr<nn::Module> gpu_model = build();
  gpu_model->to(Device::cuda(0));

  Tensor losses[2];
  std::shared_ptr<nn::Module> models[2] = {cpu_model, gpu_model};
  const Device devices[2] = {Device::cpu(), Device::cuda(0)};
  for (int k = 0; k < 2; ++k) {
    models[k]->train();
    optim::SGD sgd(models[k]->named_parameters(), optim::SGDOptions(0.05).momentum(0.9));
    manual_seed(7);  // the same dropout masks on both devices
    Tensor loss = step_loss(*models[k], devices[k]);
    loss.backward();
    sgd.step();
    losses[k] = loss.detach();
  }
  EXPECT_TRUE(losses[1].device().is_cuda());
  EXPECT_TRUE(all_close(losses[1], losses[0], kModelRtol)) << "loss";
  auto cpu_parameters = cpu_model->named_parameters();
  auto gpu_parameters = gpu_model->named_parameters();
  ASSERT_EQ(cpu_parameters.size(), gpu_parameters.size());
  for (size_t i = 0; i < cpu_parameters.size(); ++i) {
    EXPECT_TRUE(all_close(gpu_parameters[i].second, cpu_parameters[i].second, kModelRtol, 1e-6))
        << cpu_parameters[i].first;
  }
  auto cpu_buffers = cpu_model->named_buffers();
  auto gpu_buffers = gpu_model->named_buffers();
  ASSERT_EQ(cpu_buffers.size(), gpu_buffers.size());
  for (size_t i = 0; i < cpu_buffers.size(); ++i) {
    EXPECT_TRUE(all_close(gpu_buffers[i].second, cpu_buffers[i].second, kModelRtol, 1e-6))
        << cpu_buffers[i].first;
  }
}

TEST(CudaModelStep, ResNet18SmallStemMatchesCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  manual_seed(11);
  const Tensor images = randn({4, 1, 16, 16});
  const Tensor labels = randint(0, 10, {4});
  expect_same_step(
      [] {
        return models::resnet18(
            models::ResNetOptions().num_classes(10).in_channels(1).small_image_stem(true));
      },
      [&](nn::Module& model, Device device) {
        return cross_entropy(model.forward(images.to(device)), labels.to(device));
      });
}

TEST(CudaModelStep, BertTinyMatchesCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  constexpr int64_t kVocab = 120;
  manual_seed(12);
  const Tensor input_ids = randint(0, kVocab, {2, 16});
  // Labels at about a sixth of the positions, -100 (ignored) elsewhere.
  const Tensor masked = lt(rand({2, 16}), full({}, 1.0 / 6));
  const Tensor mlm_labels = where(masked, input_ids, full({}, -100.0, DType::kInt64));
  const Tensor nsp_labels = randint(0, 2, {2});
  expect_same_step(
      [] {
        return std::make_shared<models::BertForPreTraining>(
            models::BertConfig::tiny().vocab_size(kVocab).max_position_embeddings(32));
      },
      [&](nn::Module& model, Device device) {
        auto& pretraining = dynamic_cast<models::BertForPreTraining&>(model);
        models::BertPreTrainingOutput output = pretraining.forward(input_ids.to(device));
        return models::bert_pretraining_loss(output, mlm_labels.to(device), nsp_labels.to(device))
            .total;
      });
}

}  // namespace
}  // namespace tessel
