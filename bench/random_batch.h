// A fixed random batch for benchmark training steps: BERT pre-training inputs (15% of positions
// predicted, the rest ignored as -100) or images with class labels.
//   RandomBatch batch = random_batch(bert ? &config : nullptr, rows, seq, image_size, classes);
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "models/bert.h"
#include "ops/ops.h"

namespace tessel::bench {

struct RandomBatch {
  Tensor images, labels;                            // vision
  Tensor ids, types, mask, mlm_labels, nsp_labels;  // BERT
};

// `bert` null: images (rows, 3, image_size, image_size) and labels in [0, classes).
inline RandomBatch random_batch(const models::BertConfig* bert, int64_t rows, int64_t seq,
                                int64_t image_size, int64_t classes) {
  RandomBatch batch;
  if (bert) {
    batch.ids = randint(0, bert->vocab_size(), {rows, seq});
    batch.types = zeros({rows, seq}, DType::kInt64);
    batch.mask = ones({rows, seq}, DType::kInt64);
    const Tensor ignored = ge(rand({rows, seq}), full({rows, seq}, 0.15));
    batch.mlm_labels = masked_fill(randint(0, bert->vocab_size(), {rows, seq}), ignored, -100);
    batch.nsp_labels = randint(0, 2, {rows});
  } else {
    batch.images = randn({rows, 3, image_size, image_size});
    batch.labels = randint(0, classes, {rows});
  }
  return batch;
}

}  // namespace tessel::bench
