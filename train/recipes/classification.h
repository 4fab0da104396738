// The training loop shared by image-classification recipes: cross-entropy steps over a
// DataLoader, a status line every log_every steps, test accuracy after every epoch (and every
// eval_every steps), metrics as JSON lines, and `test accuracy: 0.xxxx` at the end.
//   RecipeResult result = train_classifier(*model, adam, loader, *test_set, config, std::cout);
#pragma once

#include <ostream>

#include "models/nn/module.h"
#include "train/data/data_loader.h"
#include "train/data/dataset.h"
#include "train/optim/optimizer.h"
#include "train/recipes/recipe.h"

namespace tessel::train {

struct EvalResult {
  double accuracy = 0;
  double loss = 0;  // mean cross-entropy
  int64_t examples = 0;
};

// Accuracy and mean loss of `model` (in eval mode, no autograd) over every example of `dataset`.
// The model is back in training mode afterwards.
EvalResult evaluate_classifier(nn::Module& model, const data::Dataset& dataset,
                               int64_t batch_size = 1000);

// Trains for config.epochs epochs (or until config.steps steps); `config` must be resolved.
RecipeResult train_classifier(nn::Module& model, optim::Optimizer& optimizer,
                              data::DataLoader& train_loader, const data::Dataset& test_set,
                              const TrainConfig& config, std::ostream& log);

// "12.3 MiB": bytes for status lines.
std::string format_bytes(int64_t bytes);

}  // namespace tessel::train
