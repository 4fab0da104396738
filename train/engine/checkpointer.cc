#include "train/engine/checkpointer.h"

#include <filesystem>
#include <optional>
#include <vector>

#include "core/error.h"
#include "parallel/tensor_parallel.h"

namespace tessel::train {
namespace {

double find_value(const NamedScalars& values, const std::string& name, double fallback) {
  for (const auto& [key, value] : values)
    if (key == name) return value;
  return fallback;
}

}  // namespace

Checkpointer::Checkpointer(const TrainConfig& config, const RunLayout& layout,
                           const TrainingPlan& plan, nn::Module& model, optim::Optimizer& optimizer,
                           optim::LRScheduler* scheduler, StatusLog& status)
    : config_(config),
      layout_(layout),
      plan_(plan),
      model_(model),
      optimizer_(optimizer),
      scheduler_(scheduler),
      status_(status),
      sharding_(checkpoint_sharding(layout, model)) {}

int64_t Checkpointer::resume() {
  if (!config_.resume) return 0;
  std::ostream& log = status_.log();
  const std::string path = resolve_resume_path(config_);
  NamedScalars extra;
  // Each rank takes back its own RNG state (ranks draw different amounts: dropout on their own
  // shard) when the checkpoint was saved in this layout.
  CheckpointRank this_rank;
  this_rank.rank = layout_.distributed() ? layout_.world->rank() : 0;
  this_rank.ranks = layout_.distributed() ? layout_.world->size() : 1;
  this_rank.layout = layout_.layout();
  const int64_t step = load_checkpoint(path, model_, optimizer_, scheduler_, &extra,
                                       sharding_ ? &*sharding_ : nullptr, &this_rank);
  if (!this_rank.own_rng)
    log << "note: the checkpoint was saved by " << this_rank.saved_ranks << " rank(s)"
        << (this_rank.saved_layout.empty() ? "" : " as " + this_rank.saved_layout)
        << ", this run has " << this_rank.ranks
        << (this_rank.layout.empty() ? "" : " as " + this_rank.layout)
        << ": every rank continues from rank 0's random-number state, so dropout does not "
           "replay bit for bit (an exact resume needs the same --dp and --tp)"
        << std::endl;
  const double saved_batches = find_value(extra, "batches_per_epoch", -1);
  const double saved_seed = find_value(extra, "seed", -1);
  TESSEL_CHECK(saved_batches == static_cast<double>(plan_.batches_per_epoch) &&
                   saved_seed == static_cast<double>(config_.seed),
               "--resume: checkpoint '", path, "' was trained with ", saved_batches,
               " batches per epoch and --seed=", saved_seed, ", this run has ",
               plan_.batches_per_epoch, " and --seed=", config_.seed,
               ": resume with the same --data, --batch_size and --seed");
  const double saved_total = find_value(extra, "planned_steps", -1);
  if (saved_total != static_cast<double>(plan_.total_steps))
    log << "note: the checkpoint's run planned " << saved_total << " steps, this one "
        << plan_.total_steps << " (--epochs differs): the schedule continues with the new length"
        << std::endl;
  log << "resumed from " << path << " at step " << step << std::endl;
  saved_step_ = step;  // that state is on disk already
  resumed_from_ = step;
  return step;
}

void Checkpointer::maybe_save(int64_t step) {
  if (config_.checkpoint_every > 0 && step % config_.checkpoint_every == 0) save(step);
}

void Checkpointer::save(int64_t step) {
  if (config_.checkpoint_dir.empty() || saved_step_ == step) return;
  saved_step_ = step;
  // Every rank's RNG state goes to the checkpoint, so that each resumes its own stream.
  const std::vector<RngState> rank_rngs = layout_.gather_rng_states();
  // An optimizer whose state is spread over the ranks (--zero) gathers it on every rank.
  std::optional<optim::NamedTensors> gathered;
  if (optimizer_.collective_state()) gathered = optimizer_.state_tensors();
  // The first data-parallel replica's tensor-parallel ranks gather the split tensors.
  if (!layout_.is_main() && !(sharding_ && layout_.dp_rank == 0)) {
    if (layout_.distributed()) layout_.world->barrier();
    return;
  }
  const NamedScalars extra = {{"batches_per_epoch", static_cast<double>(plan_.batches_per_epoch)},
                              {"seed", static_cast<double>(config_.seed)},
                              {"planned_steps", static_cast<double>(plan_.total_steps)}};
  CheckpointContents contents =
      capture_checkpoint(step, model_, optimizer_, scheduler_, extra,
                         sharding_ ? &*sharding_ : nullptr, gathered ? &*gathered : nullptr);
  contents.rank_rngs = rank_rngs;
  contents.rank_layout = layout_.layout();
  if (layout_.is_main()) {
    last_saved_ = write_checkpoint(config_.checkpoint_dir, contents);
    status_.checkpoint(last_saved_);
  }
  // Every rank goes on once the checkpoint is on disk (a later --resume may read it at once).
  if (layout_.distributed()) layout_.world->barrier();
}

std::string resolve_resume_path(const TrainConfig& config) {
  TESSEL_CHECK(config.resume.has_value(), "resolve_resume_path: the config does not resume");
  namespace fs = std::filesystem;
  if (config.resume->empty()) {
    TESSEL_CHECK(!config.checkpoint_dir.empty(),
                 "--resume without a value resumes from --checkpoint_dir, which is not set (or "
                 "pass --resume=PATH)");
    const std::string latest = latest_checkpoint(config.checkpoint_dir);
    TESSEL_CHECK(!latest.empty(), "--resume: no checkpoint in '", config.checkpoint_dir,
                 "' (no complete checkpoint named by ", config.checkpoint_dir, "/latest)");
    return latest;
  }
  const std::string& path = *config.resume;
  TESSEL_CHECK(fs::exists(path), "--resume: '", path, "' does not exist");
  if (fs::exists(fs::path(path) / "latest")) {
    const std::string latest = latest_checkpoint(path);
    TESSEL_CHECK(!latest.empty(), "--resume: '", path, "/latest' names no complete checkpoint");
    return latest;
  }
  return path;
}

std::optional<CheckpointSharding> checkpoint_sharding(const RunLayout& layout, nn::Module& model) {
  if (layout.tp == 1) return std::nullopt;
  CheckpointSharding sharding;
  sharding.split_dims = parallel::tensor_parallel_split_dims(model);
  sharding.parts = layout.tp;
  sharding.part = layout.tp_group->rank();
  std::shared_ptr<parallel::Communicator> group = layout.tp_group;
  sharding.gather = [group](const Tensor& local, int64_t dim) {
    return parallel::gather_shards(local, dim, *group);
  };
  if (const auto* split = dynamic_cast<const parallel::SplitParameters*>(&model)) {
    for (const auto& [name, dim] : sharding.split_dims) {
      const std::pair<int, int> part = split->split_part(name);
      if (part.first > 0) sharding.other_parts[name] = part;
    }
    sharding.gather_other = [split](const std::string& name, const Tensor& local) {
      return split->gather_split(name, local);
    };
  }
  return sharding;
}

}  // namespace tessel::train
