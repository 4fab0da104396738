#include "train/recipes/recipe_util.h"

#include "core/error.h"
#include "core/rng.h"
#include "core/threading.h"
#include "ops/ops.h"
#include "ops/transfer.h"

namespace tessel::train {

void begin_run(const TrainConfig& config, std::ostream& log) {
  if (config.threads > 0) set_num_threads(config.threads);
  manual_seed(config.seed);
  log << "recipe " << config.recipe << ": model " << *config.model << ", data " << *config.data
      << ", batch " << *config.batch_size << ", lr " << *config.lr << ", epochs " << *config.epochs
      << (config.steps > 0 ? ", steps " + std::to_string(config.steps) : std::string()) << ", seed "
      << config.seed << ", threads " << get_num_threads() << ", device "
      << training_device(config).str() << std::endl;
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

}  // namespace tessel::train
