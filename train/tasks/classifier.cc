#include "train/tasks/classifier.h"

#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "data/data_loader.h"
#include "models/shufflenet.h"
#include "models/vision_parallel.h"
#include "ops/ops.h"
#include "parallel/ddp.h"
#include "parallel/parallelize.h"
#include "parallel/tensor_parallel.h"
#include "train/engine/setup.h"
#include "train/tasks/planned_module.h"

namespace tessel::train {

EvalResult evaluate_classifier(nn::Module& model, const data::Dataset& dataset,
                               int64_t batch_size) {
  NoGradGuard no_grad;
  model.eval();
  const Device device = module_device(model);
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](auto*) {}),
                          data::DataLoaderOptions().batch_size(batch_size).shuffle(false));
  loader.start_epoch(0);
  EvalResult result;
  int64_t correct = 0;
  double loss_sum = 0;
  while (auto batch = loader.next()) {
    const Tensor logits = model(to_training_device(batch->inputs, device));
    loss_sum += cross_entropy(logits, to_training_device(batch->targets, device), -100, 0.0, "sum")
                    .item<double>();
    const auto predicted = argmax(logits, 1).to_vector<int64_t>();
    const auto targets = batch->targets.to_vector<int64_t>();
    for (size_t i = 0; i < targets.size(); ++i) correct += predicted[i] == targets[i];
    result.examples += static_cast<int64_t>(targets.size());
  }
  model.train();
  if (result.examples > 0) {
    result.accuracy = static_cast<double>(correct) / static_cast<double>(result.examples);
    result.loss = loss_sum / static_cast<double>(result.examples);
  }
  return result;
}

std::shared_ptr<nn::Module> parallel_classifier_model(const RunLayout& layout,
                                                      std::shared_ptr<nn::Module> full) {
  if (layout.tp == 1) return full;
  // ShuffleNet's widest convolution (conv5, to 1024 channels) splits by channels; ResNet keeps a
  // batch-split trunk and splits its classifier by classes.
  const bool shufflenet = dynamic_cast<models::ShuffleNetV2*>(full.get()) != nullptr;
  auto model = std::make_shared<models::TensorParallelClassifier>(
      std::move(full), layout.tp_group_id, /*split_widest_conv=*/shufflenet);
  model->to(layout.device);  // the split layers are made on the CPU; the trunk is there already
  return model;
}

bool runs_planned_ops(const RunLayout& layout) { return layout.plan && layout.tp > 1; }

std::pair<int64_t, int64_t> batch_part(const RunLayout& layout) {
  if (runs_planned_ops(layout) && runs_on_one_line(*layout.plan))
    return {layout.tp_rank, layout.tp};
  return {layout.dp_rank, layout.dp};
}

std::shared_ptr<nn::Module> planned_classifier_model(const RunLayout& layout,
                                                     std::shared_ptr<nn::Module> trained,
                                                     std::shared_ptr<nn::Module> evaluated,
                                                     const Shape& input_shape) {
  TESSEL_CHECK(runs_planned_ops(layout),
               "planned_classifier_model: the run has no plan with a tensor-parallel group");
  const planner::PlanFile& plan = *layout.plan;
  TESSEL_CHECK(input_shape.size() == 4 && input_shape[0] == plan.batch &&
                   input_shape[1] == plan.in_channels && input_shape[2] == plan.image_size &&
                   input_shape[3] == plan.image_size,
               "--plan: the plan was made for a batch of ", plan.batch, " images of ",
               plan.in_channels, "x", plan.image_size, "x", plan.image_size, ", this run trains ",
               shape_str(input_shape),
               ": make a plan for this batch (bazel run //parallel:plan -- --model=", plan.model,
               " --devices=", plan.devices, " --batch=", input_shape[0],
               " --in_channels=", input_shape[1], " --image_size=", input_shape[2],
               plan.small_image_stem ? " --small_image_stem" : "", " --out=FILE)");
  // Per-op degrees run over one group of every rank: the ops that split the batch read rows over
  // it too (batch_part).
  auto rows = runs_on_one_line(plan) ? layout.tp_device_group : layout.dp_device_group;
  auto parallel = std::make_shared<parallel::ParallelModule>(
      std::move(trained), plan.ops, rows, layout.tp_device_group,
      planner::ModuleTraceOptions(input_shape));
  parallel->set_per_rank_batch_norm(plan.batch_norm == "per_rank");
  return std::make_shared<PlannedModule>(std::move(parallel), std::move(evaluated));
}

ParallelClassifier::ParallelClassifier(std::shared_ptr<nn::Module> model, const RunLayout& layout)
    : model_(std::move(model)), layout_(layout) {
  tensor_parallel_ = dynamic_cast<models::TensorParallelClassifier*>(model_.get());
  planned_ = dynamic_cast<PlannedModule*>(model_.get());
  if (planned_) return;  // the plan's ops reduce over dp themselves
  TESSEL_CHECK(layout.tp == 1 || tensor_parallel_ != nullptr, "--tp=", layout.tp,
               ": this recipe's model has no tensor-parallel form (ResNet, "
               "ShuffleNet and BERT do); use --dp only");
  ddp_ = make_ddp(layout, *model_);
}

ParallelClassifier::~ParallelClassifier() = default;

ClassifierLoss ParallelClassifier::loss(const Tensor& inputs, const Tensor& targets) {
  if (planned_) {
    // The global batch's mean on every rank; each dp rank's share of it is divided by dp, so the
    // gradients summed over dp when backward ends are the global batch's.
    const Tensor loss = planned_->loss({inputs, targets});
    return {loss, loss.item<double>()};
  }
  if (!layout_.distributed()) {
    const Tensor loss = cross_entropy((*model_)(inputs), targets);
    return {loss, loss.item<double>()};
  }
  const Tensor logits = ddp_ ? ddp_->forward(inputs) : model_->forward(inputs);
  const Tensor loss =
      tensor_parallel_ ? tensor_parallel_->loss(logits, targets) : cross_entropy(logits, targets);
  std::vector<double> global;
  const Tensor weighted = weight_by_global_counts(layout_, {{loss, targets.numel()}}, &global)[0];
  if (tensor_parallel_ && weighted.requires_grad()) {
    // The loss's gradient is the first of the pass: queued now, the trunk's sum over tp runs
    // after every gradient has arrived, and after DDP's average over dp (finalize is free when
    // DDP's own end-of-backward callback comes later).
    models::TensorParallelClassifier* split = tensor_parallel_;
    parallel::DistributedDataParallel* ddp = ddp_.get();
    weighted.register_hook([split, ddp](const Tensor&) {
      queue_backward_callback([split, ddp] {
        if (ddp) ddp->finalize();
        split->reduce_trunk_gradients();
      });
      return Tensor();
    });
  }
  return {weighted, global[0]};
}

EvalResult ParallelClassifier::evaluate(const data::Dataset& dataset, int64_t batch_size) {
  if (!layout_.distributed()) return evaluate_classifier(*model_, dataset, batch_size);
  nn::Module* model = model_.get();
  if (planned_) model = &planned_->gathered();
  if (tensor_parallel_) {
    tensor_parallel_->gather_into_full_model();
    model = tensor_parallel_->full_model().get();
  }
  NoGradGuard no_grad;
  model->eval();
  const Device device = module_device(*model);
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](auto*) {}),
                          data::DataLoaderOptions().batch_size(batch_size).shuffle(false));
  loader.start_epoch(0);
  double loss_sum = 0, correct = 0, examples = 0;
  for (int64_t index = 0;; ++index) {
    auto batch = loader.next();
    if (!batch) break;
    if (index % layout_.dp != layout_.dp_rank) continue;
    const Tensor logits = (*model)(to_training_device(batch->inputs, device));
    loss_sum += cross_entropy(logits, to_training_device(batch->targets, device), -100, 0.0, "sum")
                    .item<double>();
    const auto predicted = argmax(logits, 1).to_vector<int64_t>();
    const auto labels = batch->targets.to_vector<int64_t>();
    for (size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i];
    examples += static_cast<double>(labels.size());
  }
  model_->train();
  model->train();
  const std::vector<double> sums = layout_.sum_over_dp({loss_sum, correct, examples});
  EvalResult result;
  result.examples = static_cast<int64_t>(sums[2]);
  if (sums[2] > 0) {
    result.loss = sums[0] / sums[2];
    result.accuracy = sums[1] / sums[2];
  }
  return result;
}

}  // namespace tessel::train
