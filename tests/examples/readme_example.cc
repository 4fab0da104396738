// A small network learns which points lie inside the unit circle (the example in README.md).
#include <cstdio>

#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/optim.h"

using namespace tessel;

int main() {
  manual_seed(0);
  Tensor points = randn({512, 2});
  Tensor inside = to_dtype(lt(sum(points * points, {1}), ones({512})), DType::kInt64);
  nn::Sequential model{std::make_shared<nn::Linear>(2, 32), std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Linear>(32, 2)};
  optim::Adam optimizer(model.parameters(), optim::AdamOptions(0.01));
  std::vector<double> losses;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = cross_entropy(model(points), inside);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  std::printf("loss %.4f -> %.4f\n", losses.front(), losses.back());
  return losses.back() < 0.5 * losses.front() ? 0 : 1;  // run as a test: the loss must halve
}
