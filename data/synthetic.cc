#include "data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/threading.h"
#include "data/augment.h"

namespace tessel::data {
namespace {

// Keep the streams of each kind of synthetic data apart under one seed.
constexpr uint64_t kImagePurpose = 0x696d616765ull;  // "image"
constexpr uint64_t kTokenPurpose = 0x746f6b656eull;  // "token"
constexpr int64_t kIgnoreLabel = -100;

}  // namespace

std::shared_ptr<ImageDataset> synthetic_images(const SyntheticImageOptions& options) {
  const int64_t count = options.count_;
  const int64_t example_size = options.channels_ * options.height_ * options.width_;
  Tensor images =
      empty({count, options.channels_, options.height_, options.width_}, DType::kFloat32);
  Tensor labels = empty({count}, DType::kInt64);
  if (count > 0) {
    StorageAccess images_access(*images.storage());
    StorageAccess labels_access(*labels.storage());
    float* image_values = images.data_ptr<float>();
    int64_t* label_values = labels.data_ptr<int64_t>();
    const int64_t grain = std::max<int64_t>(1, 65536 / example_size);
    parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        KeyedRandom random{options.seed_, kImagePurpose, static_cast<uint64_t>(i)};
        label_values[i] = random.below(options.num_classes_);
        float* out = image_values + i * example_size;
        for (int64_t j = 0; j < example_size; ++j) out[j] = static_cast<float>(random.normal());
      }
    });
  }
  return std::make_shared<ImageDataset>(std::move(images), std::move(labels), options.num_classes_);
}

TokenBatch synthetic_token_batch(const SyntheticTokenOptions& options, int64_t step) {
  const int64_t rows = options.batch_size_, seq_len = options.seq_len_;
  const int64_t min_length = options.min_length_ < 0 ? seq_len : options.min_length_;
  TESSEL_CHECK(min_length <= seq_len, "synthetic_token_batch: min_length ", min_length,
               " is above seq_len ", seq_len);
  TESSEL_CHECK(step >= 0, "synthetic_token_batch: step must be >= 0, got ", step);
  for (int64_t id : {options.pad_id_, options.cls_id_, options.sep_id_, options.mask_id_})
    TESSEL_CHECK(id >= 0 && id < options.vocab_size_, "synthetic_token_batch: special id ", id,
                 " is outside the vocabulary of ", options.vocab_size_);
  TESSEL_CHECK(options.first_token_id_ >= 0 && options.first_token_id_ < options.vocab_size_,
               "synthetic_token_batch: first_token_id ", options.first_token_id_,
               " leaves no ordinary tokens in a vocabulary of ", options.vocab_size_);
  const int64_t ordinary_tokens = options.vocab_size_ - options.first_token_id_;

  const size_t total = static_cast<size_t>(rows * seq_len);
  std::vector<int64_t> input_ids(total, options.pad_id_), token_type_ids(total, 0),
      attention_mask(total, 0), mlm_labels(total, kIgnoreLabel), nsp_labels(rows);
  std::vector<int64_t> positions;
  for (int64_t row = 0; row < rows; ++row) {
    KeyedRandom random{options.seed_, kTokenPurpose, static_cast<uint64_t>(step * rows + row)};
    int64_t* ids = input_ids.data() + row * seq_len;
    int64_t* types = token_type_ids.data() + row * seq_len;
    int64_t* mask = attention_mask.data() + row * seq_len;
    int64_t* labels = mlm_labels.data() + row * seq_len;

    // [CLS] A [SEP] B [SEP]: `length` tokens, A and B at least one token each.
    const int64_t length = min_length + random.below(seq_len - min_length + 1);
    const int64_t words = length - 3;
    const int64_t a_length = 1 + random.below(words - 1);
    const int64_t second_sep = length - 1, first_sep = 1 + a_length;
    for (int64_t t = 0; t < length; ++t) {
      mask[t] = 1;
      types[t] = t > first_sep ? 1 : 0;
      ids[t] = options.first_token_id_ + random.below(ordinary_tokens);
    }
    ids[0] = options.cls_id_;
    ids[first_sep] = options.sep_id_;
    ids[second_sep] = options.sep_id_;
    nsp_labels[row] = random.below(2);

    // Predicted positions: a partial Fisher-Yates draw among the ordinary tokens.
    positions.clear();
    for (int64_t t = 1; t < second_sep; ++t)
      if (t != first_sep) positions.push_back(t);
    const auto predicted = std::clamp<int64_t>(std::llround(options.mask_prob_ * words), 1, words);
    for (int64_t k = 0; k < predicted; ++k) {
      std::swap(positions[k], positions[k + random.below(words - k)]);
      const int64_t t = positions[k];
      labels[t] = ids[t];
      const double choice = random.uniform();
      if (choice < 0.8)
        ids[t] = options.mask_id_;
      else if (choice < 0.9)
        ids[t] = options.first_token_id_ + random.below(ordinary_tokens);
    }
  }
  return TokenBatch{from_vector<int64_t>(input_ids, {rows, seq_len}),
                    from_vector<int64_t>(token_type_ids, {rows, seq_len}),
                    from_vector<int64_t>(attention_mask, {rows, seq_len}),
                    from_vector<int64_t>(mlm_labels, {rows, seq_len}),
                    from_vector<int64_t>(nsp_labels, {rows})};
}

}  // namespace tessel::data
