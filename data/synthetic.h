// Synthetic data for benchmarks, generated deterministically from a seed: random images with
// random class labels, and random masked-language-model batches shaped like BERT pre-training's.
//   auto images = synthetic_images(SyntheticImageOptions().count(512).seed(1));  // (512,3,32,32)
//   TokenBatch batch = synthetic_token_batch(SyntheticTokenOptions().batch_size(8), /*step=*/0);
#pragma once

#include <cstdint>
#include <memory>

#include "core/error.h"
#include "core/tensor.h"
#include "data/dataset.h"

namespace tessel::data {

struct SyntheticImageOptions {
  int64_t count_ = 1024;
  int64_t channels_ = 3;
  int64_t height_ = 32;
  int64_t width_ = 32;
  int64_t num_classes_ = 10;
  uint64_t seed_ = 0;

  SyntheticImageOptions& count(int64_t value) {
    TESSEL_CHECK(value >= 0, "SyntheticImageOptions: count must be >= 0, got ", value);
    count_ = value;
    return *this;
  }
  // (C, H, W) of every image.
  SyntheticImageOptions& image(int64_t channels, int64_t height, int64_t width) {
    TESSEL_CHECK(channels > 0 && height > 0 && width > 0,
                 "SyntheticImageOptions: image sizes must be positive, got (", channels, ", ",
                 height, ", ", width, ")");
    channels_ = channels;
    height_ = height;
    width_ = width;
    return *this;
  }
  SyntheticImageOptions& num_classes(int64_t value) {
    TESSEL_CHECK(value > 0, "SyntheticImageOptions: num_classes must be positive, got ", value);
    num_classes_ = value;
    return *this;
  }
  SyntheticImageOptions& seed(uint64_t value) {
    seed_ = value;
    return *this;
  }
};

// (count, C, H, W) f32 standard-normal pixels (what normalised images look like) and (count) i64
// labels uniform in [0, num_classes). Example i depends only on (seed, i), so a smaller count
// gives a prefix of a larger one.
std::shared_ptr<ImageDataset> synthetic_images(const SyntheticImageOptions& options);

// The special ids default to those VocabBuilder writes first: [PAD] 0, [UNK] 1, [CLS] 2,
// [SEP] 3, [MASK] 4; ordinary tokens are drawn from [first_token_id, vocab_size).
struct SyntheticTokenOptions {
  int64_t batch_size_ = 8;
  int64_t seq_len_ = 128;
  int64_t min_length_ = -1;  // -1: every sequence fills seq_len (no padding)
  int64_t vocab_size_ = 30522;
  double mask_prob_ = 0.15;
  int64_t pad_id_ = 0;
  int64_t cls_id_ = 2;
  int64_t sep_id_ = 3;
  int64_t mask_id_ = 4;
  int64_t first_token_id_ = 5;
  uint64_t seed_ = 0;

  SyntheticTokenOptions& batch_size(int64_t value) {
    TESSEL_CHECK(value > 0, "SyntheticTokenOptions: batch_size must be positive, got ", value);
    batch_size_ = value;
    return *this;
  }
  // At least 5: [CLS] a [SEP] b [SEP].
  SyntheticTokenOptions& seq_len(int64_t value) {
    TESSEL_CHECK(value >= 5, "SyntheticTokenOptions: seq_len must be >= 5, got ", value);
    seq_len_ = value;
    return *this;
  }
  // Sequence lengths uniform in [min_length, seq_len], padded to seq_len; -1 for no padding.
  SyntheticTokenOptions& min_length(int64_t value) {
    TESSEL_CHECK(value == -1 || value >= 5, "SyntheticTokenOptions: min_length must be -1 or >= 5",
                 ", got ", value);
    min_length_ = value;
    return *this;
  }
  SyntheticTokenOptions& vocab_size(int64_t value) {
    vocab_size_ = value;
    return *this;
  }
  SyntheticTokenOptions& mask_prob(double value) {
    TESSEL_CHECK(value > 0.0 && value <= 1.0,
                 "SyntheticTokenOptions: mask_prob must be in (0, 1], got ", value);
    mask_prob_ = value;
    return *this;
  }
  // [PAD] [CLS] [SEP] [MASK] ids and the first ordinary token id.
  SyntheticTokenOptions& special_ids(int64_t pad, int64_t cls, int64_t sep, int64_t mask,
                                     int64_t first_token) {
    pad_id_ = pad;
    cls_id_ = cls;
    sep_id_ = sep;
    mask_id_ = mask;
    first_token_id_ = first_token;
    return *this;
  }
  SyntheticTokenOptions& seed(uint64_t value) {
    seed_ = value;
    return *this;
  }
};

// The tensors of a masked-LM / next-sentence batch; the fields and meanings of text::MlmBatch
// (text/mlm.h), so code written for one takes the other.
struct TokenBatch {
  Tensor input_ids;       // (N,T) i64: [CLS] A [SEP] B [SEP] [PAD]..., masks applied
  Tensor token_type_ids;  // (N,T) i64: 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding
  Tensor attention_mask;  // (N,T) i64: 1 on tokens, 0 on padding
  Tensor mlm_labels;      // (N,T) i64: the original token where predicted, -100 elsewhere
  Tensor nsp_labels;      // (N) i64: 0 or 1 at random
};

// Batch number `step`: its examples are step * batch_size + i, each depending only on (seed,
// that number). Each sequence has a random length (seq_len without min_length) and a random
// split into A and B; round(mask_prob * ordinary tokens) positions (at least 1) are predicted,
// of which 80% become [MASK], 10% a random token and 10% stay, as in BERT. Throws
// tessel::Error when the ids do not fit vocab_size.
TokenBatch synthetic_token_batch(const SyntheticTokenOptions& options, int64_t step = 0);

}  // namespace tessel::data
