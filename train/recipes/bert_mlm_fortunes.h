// Recipe bert_mlm_fortunes: BERT pre-training (masked LM + next-sentence prediction) on Debian's
// fortunes, with a WordPiece vocabulary built from the training part and cached in --work_dir;
// evaluates held-out masked-LM loss and accuracy against the unigram baseline.
//   ./tessel train --recipe=bert_mlm_fortunes          # BERT mini, 2000-piece vocab
#pragma once

#include "train/recipes/recipe.h"

namespace tessel::train {

Recipe bert_mlm_fortunes_recipe();

}  // namespace tessel::train
