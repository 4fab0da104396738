// Image classification on a dp x tp layout: the module the optimizer updates, the loss of one
// step, and evaluation. With dp > 1 the forward pass goes through DDP; with tp > 1 a
// models::TensorParallelClassifier splits the model. Gradient reductions finish inside
// loss.backward(), so a training loop reads as on one process:
//   ParallelClassifier classifier(parallel_classifier_model(layout, model), layout);
//   ClassifierLoss loss = classifier.loss(inputs, targets);  // this rank's rows of the batch
//   optimizer.zero_grad();  loss.value.backward();  optimizer.step();
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "core/tensor.h"
#include "data/dataset.h"
#include "nn/module.h"
#include "train/engine/run_layout.h"

namespace tessel::parallel {
class DistributedDataParallel;
class ParallelModule;
}  // namespace tessel::parallel
namespace tessel::models {
class TensorParallelClassifier;
}  // namespace tessel::models

namespace tessel::train {

class PlannedModule;  // planned_classifier_model's module

struct EvalResult {
  double accuracy = 0;
  double loss = 0;  // mean cross-entropy
  int64_t examples = 0;
};

// Accuracy and mean loss of `model` (in eval mode, no autograd) over every example of `dataset`,
// on the device of the model's parameters (batches are moved there). The model is back in
// training mode afterwards.
EvalResult evaluate_classifier(nn::Module& model, const data::Dataset& dataset, int64_t batch_size);

// `full` itself, or with tp > 1 a models::TensorParallelClassifier over it: batch-split trunk;
// ResNet's classifier split by classes; ShuffleNet's conv5 split by channels and its classifier
// by input features.
std::shared_ptr<nn::Module> parallel_classifier_model(const RunLayout& layout,
                                                      std::shared_ptr<nn::Module> full);

// Whether this run trains through its plan's own ops: --plan with a tensor-parallel group (a
// plan with per-op degrees lays every rank out as one: resolve_layout).
bool runs_planned_ops(const RunLayout& layout);

// Which part of every global batch this rank reads, as {index, count} of near-equal parts in
// rank order: its data-parallel shard, or under a plan with per-op degrees its part over the line
// of every rank (the rows its batch-split ops take).
std::pair<int64_t, int64_t> batch_part(const RunLayout& layout);

// Under --plan with a tensor-parallel group: `trained` (its whole parameters the same on every
// rank) runs the plan's ops as the planner priced them (parallel::ParallelModule, per-op degrees
// over one group of every rank; `input_shape`
// is the plan's global batch of images), and the module returned holds this rank's shards of its
// parameters and buffers under the model's names, for the optimizer, checkpoints (the split ones
// are gathered whole) and memory accounting; `evaluated`, a second model of the same
// architecture, gets the whole tensors before each evaluation. A collective call.
std::shared_ptr<nn::Module> planned_classifier_model(const RunLayout& layout,
                                                     std::shared_ptr<nn::Module> trained,
                                                     std::shared_ptr<nn::Module> evaluated,
                                                     const Shape& input_shape);

struct ClassifierLoss {
  Tensor value;     // what backward starts from (this rank's part of the global mean)
  double mean = 0;  // the global batch's mean cross-entropy, the same on every rank
};

class ParallelClassifier {
 public:
  // `model`: what the optimizer updates (parallel_classifier_model's or
  // planned_classifier_model's result, or any single-tensor classifier when tp == 1). Wraps it in
  // DDP over the dp group when dp > 1 (a plan's own ops reduce over dp themselves).
  ParallelClassifier(std::shared_ptr<nn::Module> model, const RunLayout& layout);
  ~ParallelClassifier();
  // Cross-entropy of `inputs` (this rank's rows of the global batch: a loader made with
  // DataLoaderOptions::shard(dp_rank, dp)), weighted so that the average over the dp group is
  // the global batch's mean. Its backward pass leaves every rank with the global batch's
  // gradients: DDP averages them over dp, and with tp > 1 the replicated trunk's are summed
  // over tp when backward ends.
  ClassifierLoss loss(const Tensor& inputs, const Tensor& targets);
  // Loss and accuracy over `dataset`: batches dealt round-robin to the dp ranks and summed.
  // Recipes pass their training batch, so evaluating needs no more memory than a training
  // step's forward and fits a memory budget that training fits.
  EvalResult evaluate(const data::Dataset& dataset, int64_t batch_size);

 private:
  std::shared_ptr<nn::Module> model_;
  const RunLayout& layout_;
  models::TensorParallelClassifier* tensor_parallel_ = nullptr;
  PlannedModule* planned_ = nullptr;
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
};

}  // namespace tessel::train
