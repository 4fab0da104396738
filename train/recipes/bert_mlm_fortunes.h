// Recipe bert_mlm_fortunes: BERT pre-training (masked LM + next-sentence prediction) on Debian's
// fortunes, with a WordPiece vocabulary built from the training part and cached in --work_dir;
// evaluates held-out masked-LM loss and accuracy against the unigram baseline.
//   ./tessel train --recipe=bert_mlm_fortunes          # BERT mini, 2000-piece vocab
#pragma once

#include <string>

#include "text/corpus.h"
#include "text/wordpiece.h"
#include "train/recipes/recipe.h"

namespace tessel::train {

Recipe bert_mlm_fortunes_recipe();

// The WordPiece vocabulary of at most `vocab_size` tokens built from `corpus` by the vocab
// builder, cached as <work_dir>/vocab-<vocab_size>-<fingerprint of the text>.txt: built and
// written (atomically) the first time, read afterwards. Writes one line to `log` either way.
text::WordPiece cached_vocab(const text::Corpus& corpus, int64_t vocab_size,
                             const std::string& work_dir, std::ostream& log);

// $HOME/.cache/tessel (or /tmp/tessel without HOME) joined with `name`, unless `work_dir` is set.
std::string work_dir_for(const std::string& work_dir, const std::string& name);

}  // namespace tessel::train
