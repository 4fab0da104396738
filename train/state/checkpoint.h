// Training checkpoints: model state_dict, optimizer and schedule state, RNG state and step,
// written atomically so that a crash mid-save never loses the previous checkpoint.
//   save_checkpoint("ckpt", step, *net, sgd, &schedule);  load_latest_checkpoint("ckpt", ...);
#pragma once

#include <cstdint>
#include <string>

#include "models/nn/module.h"
#include "train/optim/optimizer.h"
#include "train/state/lr_scheduler.h"

namespace tessel::train {

using NamedScalars = optim::NamedScalars;

// Layout under `dir`:
//   step_<N>/model.safetensors        the module's state_dict (parameters and buffers)
//   step_<N>/train_state.safetensors  optimizer state tensors ("optimizer.<name>.<key>"); in
//                                     __metadata__, as exact text: the step, the RNG state, the
//                                     optimizer's and scheduler's scalars, the extra scalars
//   latest                            "step_<N>": the newest complete checkpoint
// Every file is written to a temporary file in the same folder, flushed, fsynced and renamed
// over its final name, then the folder is fsynced; `latest` is replaced the same way only after
// both files are in place. So a crash leaves at worst stray temporary files (ignored, removed
// by the next save of that step), and `latest` always names a complete checkpoint.
struct CheckpointOptions {
  // Complete checkpoints to keep: after a save, older step_<M> folders (M < N) beyond the
  // newest keep_last (this one included) are deleted. 0 keeps every checkpoint.
  int keep_last = 3;
};

// Saves the state at training step `step` (>= 0) and returns the folder written
// ("<dir>/step_<N>"). `dir` is created when missing. `extra` holds any other numbers to restore
// (epoch, best accuracy...): names unique and non-empty. Saving a step that already exists
// replaces it.
std::string save_checkpoint(const std::string& dir, int64_t step, const nn::Module& module,
                            const optim::Optimizer& optimizer,
                            const optim::LRScheduler* scheduler = nullptr,
                            const NamedScalars& extra = {}, const CheckpointOptions& options = {});

// Restores the checkpoint folder `path` (a "<dir>/step_<N>") into `module` (strict: same keys
// and shapes), `optimizer` (the same kind, same parameter names), `scheduler` (when given; the
// checkpoint must hold one of the same kind) and the global RNG, and returns its step. The extra
// scalars go to `extra` when given. Throws tessel::Error naming the file and the problem on a
// missing folder or file, a truncated or corrupt file, or a checkpoint of another model or
// optimizer; on an error the module, optimizer, scheduler and RNG are left unchanged.
int64_t load_checkpoint(const std::string& path, nn::Module& module, optim::Optimizer& optimizer,
                        optim::LRScheduler* scheduler = nullptr, NamedScalars* extra = nullptr);

// The same for the checkpoint that `<dir>/latest` names.
int64_t load_latest_checkpoint(const std::string& dir, nn::Module& module,
                               optim::Optimizer& optimizer, optim::LRScheduler* scheduler = nullptr,
                               NamedScalars* extra = nullptr);

// The folder of the newest complete checkpoint under `dir`, or "" when there is none (no `dir`
// or no `latest` yet), to decide between starting and resuming.
std::string latest_checkpoint(const std::string& dir);

}  // namespace tessel::train
