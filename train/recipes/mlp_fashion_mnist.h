// Recipe mlp_fashion_mnist: an MLP 784-256-128-10 with ReLU trained with Adam on
// Fashion-MNIST (60,000 training images), evaluated on its 10,000 test images.
//   ./tessel train --epochs=3 --batch_size=128    # about 88% test accuracy
#pragma once

#include <memory>

#include "nn/container.h"
#include "train/recipes/recipe.h"

namespace tessel::train {

Recipe mlp_fashion_mnist_recipe();

// Flatten, then Linear+ReLU for each hidden size, then a Linear to `classes` outputs.
std::shared_ptr<nn::Sequential> make_mlp(int64_t inputs, const std::vector<int64_t>& hidden,
                                         int64_t classes);

}  // namespace tessel::train
