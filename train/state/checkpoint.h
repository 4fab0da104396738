// Training checkpoints: model state_dict, optimizer and schedule state, RNG state and step,
// written atomically so that a crash mid-save never loses the previous checkpoint.
//   save_checkpoint("ckpt", step, *net, sgd, &schedule);  load_latest_checkpoint("ckpt", ...);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/module.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace tessel::train {

using NamedScalars = optim::NamedScalars;

// Layout under `dir`:
//   step_<N>/model.safetensors        the module's state_dict (parameters and buffers)
//   step_<N>/train_state.safetensors  optimizer state tensors ("optimizer.<name>.<key>"); in
//                                     __metadata__, as exact text: the step, the RNG state, the
//                                     optimizer's and scheduler's scalars, the extra scalars;
//                                     under several ranks also every rank's RNG state
//                                     ("rng.rank.<r>.seed" / ".offset"), their count
//                                     ("rng.ranks") and layout ("rng.layout")
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

// A model split over ranks (tensor parallelism): which of its tensors are split, along which dim,
// and how to gather one. Checkpoints then hold whole tensors, as a one-process run saves them, so
// a run resumes with the same split or another one (a tp = 2 checkpoint loads into tp = 1).
struct CheckpointSharding {
  // state_dict names of the split tensors -> the dim split; optimizer state follows its
  // parameter. Tensors not listed are the same on every rank.
  std::map<std::string, int64_t> split_dims;
  int parts = 1;  // ranks sharing each split tensor, in equal parts in rank order
  int part = 0;   // this rank's part
  // The whole tensor from every part's `local` (a collective over the ranks sharing it).
  std::function<Tensor(const Tensor& local, int64_t dim)> gather;
  // Split tensors cut in other parts than `parts` (a plan's grid over part of the ranks): by
  // name, their part count and this rank's part, and how they are gathered whole.
  std::map<std::string, std::pair<int, int>> other_parts;
  std::function<Tensor(const std::string& name, const Tensor& local)> gather_other;
};

// Everything a checkpoint holds, split tensors gathered whole.
struct CheckpointContents {
  int64_t step = 0;
  nn::NamedTensors model;  // state_dict
  std::string optimizer_name;
  optim::NamedTensors optimizer_tensors;
  NamedScalars optimizer_scalars;
  std::string scheduler_name;  // "" without a scheduler
  NamedScalars scheduler_scalars;
  NamedScalars extra;
  RngState rng;  // rank 0's
  // Under several ranks, which draw different amounts of random numbers (dropout on their own
  // data-parallel shard): every rank's RNG state in rank order (rank_rngs[0] == rng) and the
  // layout they ran in ("dp=2,tp=1"). Empty in a one-process run.
  std::vector<RngState> rank_rngs;
  std::string rank_layout;
};

// Which RNG state a rank resumes with. In: this rank, the rank count and the layout. Out: whether
// it got its own saved state back. A rank gets the state it saved when the checkpoint was written
// by the same number of ranks in the same layout (an exact resume); otherwise, or for a
// checkpoint saved without per-rank states, every rank continues from rank 0's state, as a fresh
// start seeds every rank alike: the run goes on deterministically, but its random numbers are not
// the ones an uninterrupted run would have drawn.
struct CheckpointRank {
  int rank = 0;
  int ranks = 1;
  std::string layout;  // "" for one process
  // Set by load_checkpoint.
  bool own_rng = false;
  int saved_ranks = 1;
  std::string saved_layout;
};

// The state at training step `step` (>= 0), checked as save_checkpoint does. With `sharding`, a
// collective: every rank that holds a part calls it; one of them then writes the result. Tensors
// on a GPU are copied to the host, so the contents hold CPU tensors only. `optimizer_state`:
// optimizer.state_tensors() when already gathered, which an optimizer with collective_state()
// needs (every rank gathers, one captures).
CheckpointContents capture_checkpoint(int64_t step, const nn::Module& module,
                                      const optim::Optimizer& optimizer,
                                      const optim::LRScheduler* scheduler = nullptr,
                                      const NamedScalars& extra = {},
                                      const CheckpointSharding* sharding = nullptr,
                                      const optim::NamedTensors* optimizer_state = nullptr);

// Writes `contents` as the checkpoint of its step and returns the folder ("<dir>/step_<N>").
std::string write_checkpoint(const std::string& dir, const CheckpointContents& contents,
                             const CheckpointOptions& options = {});

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
// checkpoint must hold one of the same kind) and the global RNG, and returns its step. Values
// are copied into the module's and optimizer's tensors on whatever device those live (a
// checkpoint saved on a GPU loads on CPU and the other way round). The extra
// scalars go to `extra` when given. Throws tessel::Error naming the file and the problem on a
// missing folder or file, a truncated or corrupt file, or a checkpoint of another model or
// optimizer; on an error the module, optimizer, scheduler and RNG are left unchanged. With
// `sharding`, `module` and `optimizer` receive this rank's part of each split tensor. With
// `rank`, the global RNG gets the state CheckpointRank describes (rank 0's without).
int64_t load_checkpoint(const std::string& path, nn::Module& module, optim::Optimizer& optimizer,
                        optim::LRScheduler* scheduler = nullptr, NamedScalars* extra = nullptr,
                        const CheckpointSharding* sharding = nullptr,
                        CheckpointRank* rank = nullptr);

// The same for the checkpoint that `<dir>/latest` names.
int64_t load_latest_checkpoint(const std::string& dir, nn::Module& module,
                               optim::Optimizer& optimizer, optim::LRScheduler* scheduler = nullptr,
                               NamedScalars* extra = nullptr);

// The folder of the newest complete checkpoint under `dir`, or "" when there is none (no `dir`
// or no `latest` yet), to decide between starting and resuming.
std::string latest_checkpoint(const std::string& dir);

}  // namespace tessel::train
