#include "train/recipes/recipe_util.h"

#include "core/parallel.h"
#include "core/rng.h"

namespace tessel::train {

void begin_run(const TrainConfig& config, std::ostream& log) {
  if (config.threads > 0) set_num_threads(config.threads);
  manual_seed(config.seed);
  log << "recipe " << config.recipe << ": model " << *config.model << ", data " << *config.data
      << ", batch " << *config.batch_size << ", lr " << *config.lr << ", epochs " << *config.epochs
      << (config.steps > 0 ? ", steps " + std::to_string(config.steps) : std::string()) << ", seed "
      << config.seed << ", threads " << get_num_threads() << std::endl;
}

}  // namespace tessel::train
