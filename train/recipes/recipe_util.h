// Small pieces every recipe shares: the start of a run (threads, seed, the header line).
//   begin_run(config, log);  // sets threads and the RNG seed, prints "recipe NAME: ..."
#pragma once

#include <ostream>

#include "train/recipes/recipe.h"

namespace tessel::train {

// Sets the intra-op thread count (config.threads, when > 0) and seeds the global RNG with
// config.seed, then writes one line naming the recipe and its settings.
void begin_run(const TrainConfig& config, std::ostream& log);

}  // namespace tessel::train
