#include "models/simulate.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "core/error.h"
#include "core/rng.h"
#include "memory/sim/simulator.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "models/trace.h"
#include "ops/ops.h"
#include "optim/sgd.h"

namespace tessel::models {

namespace {

Tensor meta_tensor(const Shape& sizes, DType dtype) {
  return empty(sizes, TensorOptions(dtype).device(Device::meta()));
}

// A zoo model on meta and the loss of one batch (inputs without values: only shapes matter).
struct MetaTrainer {
  std::shared_ptr<nn::Module> model;
  std::function<Tensor()> loss;
};

MetaTrainer make_meta_trainer(const planner::ModelSpec& spec) {
  const std::vector<std::string> names = known_models();
  TESSEL_CHECK(std::find(names.begin(), names.end(), spec.name) != names.end(),
               "simulate_remat_overhead: unknown model '", spec.name, "'");
  TESSEL_CHECK(spec.batch >= 1, "simulate_remat_overhead: batch must be at least 1");
  manual_seed(0);
  MetaTrainer trainer;
  const int64_t batch = spec.batch;
  if (planner::is_bert(spec.name)) {
    auto bert = std::make_shared<BertForPreTraining>(BertConfig::by_name(spec.name.substr(5)));
    bert->to(Device::meta());
    trainer.model = bert;
    Tensor ids = meta_tensor({batch, spec.seq}, DType::kInt64);
    Tensor types = meta_tensor({batch, spec.seq}, DType::kInt64);
    Tensor mask = meta_tensor({batch, spec.seq}, DType::kInt64);
    Tensor mlm_labels = meta_tensor({batch, spec.seq}, DType::kInt64);
    Tensor nsp_labels = meta_tensor({batch}, DType::kInt64);
    trainer.loss = [=] {
      return bert_pretraining_loss(bert->forward(ids, types, mask, MlmOutput::kHeadInput),
                                   mlm_labels, nsp_labels)
          .total;
    };
    return trainer;
  }
  trainer.model = make_vision_model(spec);
  trainer.model->to(Device::meta());
  Tensor images =
      meta_tensor({batch, spec.in_channels, spec.image_size, spec.image_size}, DType::kFloat32);
  Tensor labels = meta_tensor({batch}, DType::kInt64);
  auto model = trainer.model;
  trainer.loss = [=] { return cross_entropy(model->forward(images), labels); };
  return trainer;
}

}  // namespace

// Steps under a budget before the timed ones.
constexpr int kSettlingSteps = 5;

RematOverhead simulate_remat_overhead(const planner::ModelSpec& spec,
                                      const planner::DeviceProfile& profile,
                                      const std::vector<double>& fractions, memory::Policy policy) {
  memory::sim::Simulation simulation(planner::simulated_device(profile));
  const auto meta = memory::MemoryOptions().device(Device::meta());
  memory::MemoryScope unconstrained(meta);
  MetaTrainer trainer = make_meta_trainer(spec);
  optim::SGD sgd(trainer.model->parameters(), optim::SGDOptions(0.01).momentum(0.9));
  RematOverhead result;
  // One step, timed from its start; the forward part too when asked.
  auto step = [&](double* forward_seconds) {
    const double start = simulation.now();
    sgd.zero_grad();
    Tensor loss = trainer.loss();
    if (forward_seconds) *forward_seconds = simulation.now() - start;
    loss.backward();
    sgd.step();
    return simulation.now() - start;
  };
  step(nullptr);  // gradients and momentum exist from here on
  result.step_seconds = step(&result.forward_seconds);
  result.peak_bytes =
      static_cast<double>(unconstrained.allocator().memory_stats().base.peak_allocated_bytes);
  std::vector<Tensor> held = sgd.held_tensors();
  for (const Tensor& buffer : trainer.model->buffers()) held.push_back(buffer);
  const size_t fixed = memory::held_bytes(held);
  result.fixed_bytes = static_cast<double>(fixed);
  for (double fraction : fractions) {
    TESSEL_CHECK(fraction > 0 && fraction <= 1,
                 "simulate_remat_overhead: fractions must be in "
                 "(0, 1], got ",
                 fraction);
    if (fraction >= 1) continue;
    const size_t budget =
        memory::activation_budget(fixed, static_cast<size_t>(result.peak_bytes), fraction);
    try {
      memory::MemoryScope limited(
          memory::MemoryOptions(meta).budget(budget).policy(policy).host_bandwidth(
              simulation.host_bandwidth()));
      memory::move_to_current_allocator(held);
      // The first steps under the budget settle what stays resident, and auto tries its two
      // ways in them (memory/residency_manager.h); then the median of three.
      for (int i = 0; i < kSettlingSteps; ++i) step(nullptr);
      std::vector<double> timed;
      for (int i = 0; i < 3; ++i) timed.push_back(step(nullptr));
      std::sort(timed.begin(), timed.end());
      const double seconds = timed[1];
      result.slowdown[fraction] = seconds / result.step_seconds;
      result.k[fraction] =
          (seconds - result.step_seconds) / ((1 - fraction) * result.forward_seconds);
    } catch (const OutOfMemory& error) {
      const std::string& message = error.message();
      result.failed[fraction] = message.substr(0, message.find('\n'));
    }
  }
  return result;
}

}  // namespace tessel::models
