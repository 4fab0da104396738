// A small network learns which points lie inside the unit circle (the example in README.md).
#include <cstdio>

#include "core/rng.h"
#include "models/nn/nn.h"
#include "ops/ops.h"
#include "train/optim/optim.h"

using namespace tessel;

int main() {
  manual_seed(0);
  Tensor points = randn({512, 2});
  Tensor inside = to_dtype(lt(sum(points * points, {1}), ones({512})), DType::kInt64);

  nn::Sequential model{std::make_shared<nn::Linear>(2, 32), std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Linear>(32, 2)};
  optim::Adam optimizer(model.parameters(), optim::AdamOptions(0.01));

  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = cross_entropy(model(points), inside);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    last_loss = loss.item<double>();
    if (step == 0) first_loss = last_loss;
    if (step % 50 == 0) std::printf("step %3d  loss %.4f\n", step, last_loss);
  }
  std::printf("loss %.4f -> %.4f\n", first_loss, last_loss);
  return last_loss < 0.5 * first_loss ? 0 : 1;  // as a test: the loss must have gone down
}
