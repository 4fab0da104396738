// The start of a run, as every recipe makes it: threads, seed and the header line; the device it
// trains on (--device), with the moves of models and batches onto it; the optimizer --optimizer
// names.
//   begin_run(config, log);  // sets threads and the RNG seed, prints "recipe NAME: ..."
//   const Device device = training_device(config);  model->to(device);  // before the optimizer
//   auto optimizer = make_optimizer(config, model->named_parameters(), {});
//   Tensor inputs = to_training_device(batch->inputs, device);
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "train/engine/config.h"

namespace tessel::train {

// Sets the intra-op thread count (config.threads, when > 0) and seeds the global RNG with
// config.seed, then writes one line naming the recipe and its settings.
void begin_run(const TrainConfig& config, std::ostream& log);

// The device `text` names for training (Device::parse: cpu, cuda, cuda:N). A tessel::Error for
// text Device::parse refuses and for the meta device (shapes only: it cannot train); the message
// does not name the flag, so the CLI and resolve_config can each put it in front.
Device parse_training_device(const std::string& text);
// parse_training_device(config.device), its errors starting with "--device: ".
Device training_device(const TrainConfig& config);

// Makes sure `device` can hold tensors before any data is read or any step runs: allocates one
// element there and reads it back. A tessel::Error "--device=TEXT: ..." with the reason otherwise
// (a binary built without --config=cuda, no GPU, an index past the GPUs). Nothing to do on CPU.
void check_training_device(const TrainConfig& config);

// `x` on `device`: `x` itself when it is there already (the CPU path copies nothing); a
// non-blocking copy to a GPU (the step's kernels wait for it on the device, the host goes on).
Tensor to_training_device(const Tensor& x, Device device);

// Where `module`'s parameters live (the first one's device; CPU for a module without any).
Device module_device(const nn::Module& module);

// The optimizer --optimizer names, at --lr: SGD with momentum 0.9, Adam, or AdamW with
// `adamw_options`' weight decay and eps.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& config,
                                                 const optim::NamedTensors& parameters,
                                                 const optim::AdamWOptions& adamw_options);

}  // namespace tessel::train
