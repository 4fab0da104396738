#include "train/engine/setup.h"

#include "core/error.h"
#include "core/rng.h"
#include "core/threading.h"
#include "ops/ops.h"
#include "ops/transfer.h"
#include "optim/sgd.h"

namespace tessel::train {

void begin_run(const TrainConfig& config, std::ostream& log) {
  if (config.threads > 0) set_num_threads(config.threads);
  manual_seed(config.seed);
  log << "recipe " << config.recipe << ": model " << *config.model << ", data " << *config.data
      << ", batch " << *config.batch_size << ", lr " << *config.lr << ", epochs " << *config.epochs
      << (config.steps > 0 ? ", steps " + std::to_string(config.steps) : std::string()) << ", seed "
      << config.seed << ", threads " << get_num_threads() << ", device "
      << training_device(config).str();
  if (config.dropout) log << ", dropout " << *config.dropout;
  log << std::endl;
}

Device parse_training_device(const std::string& text) {
  Device device;
  try {
    device = Device::parse(text);
  } catch (const Error&) {
    TESSEL_FAIL("unknown device '", text, "' (expected cpu, cuda or cuda:N)");
  }
  TESSEL_CHECK(!device.is_meta(), "the meta device holds shapes only and cannot train (it is for ",
               "planning, as //parallel:plan does); expected cpu, cuda or cuda:N");
  return device;
}

Device training_device(const TrainConfig& config) {
  try {
    return parse_training_device(config.device);
  } catch (const Error& error) {
    TESSEL_FAIL("--device: ", error.message());
  }
}

void check_training_device(const TrainConfig& config) {
  const Device device = training_device(config);
  if (device.is_cpu()) return;
  try {
    // A round trip through the device: its allocator, a transfer each way, a synchronisation.
    const Tensor probe = to_device(ones({1}), device);
    TESSEL_CHECK(probe.item<float>() == 1.0f, "a value copied to ", device.str(),
                 " and back came back changed");
  } catch (const Error& error) {
    TESSEL_FAIL("--device=", config.device, ": ", error.message());
  }
}

Tensor to_training_device(const Tensor& x, Device device) {
  if (!x.defined() || x.device() == device) return x;
  return to_device(x, device, /*non_blocking=*/device.is_cuda());
}

Device module_device(const nn::Module& module) {
  for (const Tensor& parameter : module.parameters()) return parameter.device();
  return Device::cpu();
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& config,
                                                 const optim::NamedTensors& parameters,
                                                 const optim::AdamWOptions& adamw_options) {
  const std::string& name = *config.optimizer;
  if (name == "sgd")
    return std::make_unique<optim::SGD>(parameters, optim::SGDOptions(*config.lr).momentum(0.9));
  if (name == "adam")
    return std::make_unique<optim::Adam>(parameters, optim::AdamOptions(*config.lr));
  TESSEL_CHECK(name == "adamw", "--optimizer: unknown optimizer '", name, "' (sgd, adam or adamw)");
  optim::AdamWOptions options = adamw_options;
  return std::make_unique<optim::AdamW>(parameters, options.lr(*config.lr));
}

}  // namespace tessel::train
