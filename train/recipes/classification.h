// Image classification on top of the shared training loop: cross-entropy steps over a
// DataLoader, test loss and accuracy after every epoch (and every eval_every steps), then
// `test accuracy: 0.xxxx` at the end; checkpoints and exact resume come with the loop.
//   RecipeResult result = train_classifier(*model, sgd, &schedule, loader, *test_set, config, log);
#pragma once

#include <ostream>

#include "data/data_loader.h"
#include "data/dataset.h"
#include "nn/module.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "train/recipes/recipe.h"
#include "train/recipes/training_loop.h"

namespace tessel::train {

struct EvalResult {
  double accuracy = 0;
  double loss = 0;  // mean cross-entropy
  int64_t examples = 0;
};

// Accuracy and mean loss of `model` (in eval mode, no autograd) over every example of `dataset`,
// on the device of the model's parameters (batches are moved there). The model is back in
// training mode afterwards.
EvalResult evaluate_classifier(nn::Module& model, const data::Dataset& dataset,
                               int64_t batch_size = 500);

// Trains for config.epochs epochs (or until config.steps steps); `config` must be resolved.
// `scheduler` (may be null) is stepped after every optimizer step. The model must be on
// config.device already (moved before the optimizer was made); every batch is moved there.
RecipeResult train_classifier(nn::Module& model, optim::Optimizer& optimizer,
                              optim::LRScheduler* scheduler, data::DataLoader& train_loader,
                              const data::Dataset& test_set, const TrainConfig& config,
                              std::ostream& log);

}  // namespace tessel::train
