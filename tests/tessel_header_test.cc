// The umbrella header tessel.h: this program depends on //:tessel alone and trains a small model
// with what a libtorch user reaches for (tensors and methods, guards, nn, optim, a DataLoader in
// a range-for, a checkpoint, printing, run_main). Exit code 0 when everything behaved.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "tessel.h"

namespace {

using namespace tessel;

int train_and_check(int, char**) {
  manual_seed(0);
  // Points inside the unit circle are class 1.
  Tensor points = randn({256, 1, 1, 2});
  Tensor labels = (points.pow(2).sum({1, 2, 3}) < 1.0).to(DType::kInt64);
  auto dataset = std::make_shared<data::ImageDataset>(points, labels, 2);
  data::DataLoader loader(dataset, data::DataLoaderOptions().batch_size(32).seed(1));

  nn::Sequential model(nn::Flatten(), nn::Linear(2, 32), nn::ReLU(), nn::Linear(32, 2));
  optim::Adam optimizer(model.parameters(), optim::AdamOptions(0.02));
  double first_loss = 0, last_loss = 0;
  for (int64_t epoch = 0; epoch < 15; ++epoch) {
    double total = 0;
    for (data::Batch& batch : loader.epoch(epoch)) {
      Tensor loss = cross_entropy(model(batch.inputs), batch.targets);
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
      total += loss.item<double>();
    }
    if (epoch == 0) first_loss = total;
    last_loss = total;
  }
  TESSEL_CHECK(last_loss < 0.6 * first_loss, "the loss did not go down: ", first_loss, " -> ",
               last_loss);

  {
    InferenceMode inference;
    Tensor logits = model(points);
    TESSEL_CHECK(!logits.requires_grad(), "InferenceMode recorded a graph");
    const double accuracy = (logits.argmax(1) == labels).to(DType::kFloat32).mean().item<double>();
    TESSEL_CHECK(accuracy > 0.8, "accuracy ", accuracy);
  }
  {
    NoGradGuard no_grad;
    Tensor weight = model.at<nn::Linear>(1)->weight;
    Tensor before = weight.clone();
    weight *= 1.0;  // in place on a parameter: allowed without gradient recording
    TESSEL_CHECK((weight == before).to(DType::kInt64).sum().item<int64_t>() == weight.numel(),
                 "weight *= 1 changed the weight");
  }

  // A checkpoint round trip.
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/tessel_header_test_ckpt";
  train::save_checkpoint(dir, 15, model, optimizer);
  nn::Sequential restored(nn::Flatten(), nn::Linear(2, 32), nn::ReLU(), nn::Linear(32, 2));
  optim::Adam restored_optimizer(restored.parameters(), optim::AdamOptions(0.02));
  TESSEL_CHECK(train::load_latest_checkpoint(dir, restored, restored_optimizer) == 15,
               "wrong checkpoint step");
  TESSEL_CHECK(restored(points).eq(model(points)).to(DType::kInt64).min().item<int64_t>() == 1,
               "the restored model differs");

  std::ostringstream printed;
  printed << model << "\n" << tensor({1, 2}, {2});
  TESSEL_CHECK(printed.str().find("(1): Linear(in_features=2, out_features=32, bias=True)") !=
                       std::string::npos &&
                   printed.str().find("tensor([1.0000, 2.0000], shape=[2]") != std::string::npos,
               "unexpected printout:\n", printed.str());
  std::cout << "tessel.h: trained, checkpointed and printed; loss " << first_loss << " -> "
            << last_loss << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return tessel::run_main(argc, argv, train_and_check); }
