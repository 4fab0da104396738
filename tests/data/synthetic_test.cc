#include "data/synthetic.h"

#include <cmath>
#include <set>
#include <vector>

#include "data/data_loader.h"
#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel::data {
namespace {

using testing::throws_error;

TEST(SyntheticImages, ShapesDtypesAndLabelRange) {
  auto dataset =
      synthetic_images(SyntheticImageOptions().count(300).image(1, 28, 20).num_classes(7).seed(3));
  EXPECT_EQ(dataset->size(), 300);
  EXPECT_EQ(dataset->images().sizes(), (Shape{300, 1, 28, 20}));
  EXPECT_EQ(dataset->images().dtype(), DType::kFloat32);
  EXPECT_EQ(dataset->labels().dtype(), DType::kInt64);
  EXPECT_EQ(dataset->num_classes(), 7);
  std::set<int64_t> classes;
  for (int64_t label : dataset->labels().to_vector<int64_t>()) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 7);
    classes.insert(label);
  }
  EXPECT_EQ(classes.size(), 7u);
}

TEST(SyntheticImages, PixelsAreStandardNormal) {
  auto pixels = synthetic_images(SyntheticImageOptions().count(64).seed(1))->images();
  EXPECT_EQ(pixels.sizes(), (Shape{64, 3, 32, 32}));
  double sum = 0, sum_squares = 0;
  const auto values = pixels.to_vector<float>();
  for (float value : values) {
    ASSERT_TRUE(std::isfinite(value));
    sum += value;
    sum_squares += double(value) * value;
  }
  const double mean = sum / values.size();
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sum_squares / values.size() - mean * mean), 1.0, 0.02);
}

TEST(SyntheticImages, DeterministicFromTheSeedAndEachExampleFromItsIndex) {
  auto options = SyntheticImageOptions().count(40).image(3, 8, 8).seed(9);
  auto first = synthetic_images(options);
  auto again = synthetic_images(options);
  EXPECT_EQ(first->images().to_vector<float>(), again->images().to_vector<float>());
  EXPECT_EQ(first->labels().to_vector<int64_t>(), again->labels().to_vector<int64_t>());
  auto other_seed = synthetic_images(SyntheticImageOptions(options).seed(10));
  EXPECT_NE(first->images().to_vector<float>(), other_seed->images().to_vector<float>());
  // A smaller count is a prefix of a larger one (whatever the threads did).
  auto prefix = synthetic_images(SyntheticImageOptions(options).count(13));
  auto values = first->images().to_vector<float>();
  EXPECT_EQ(prefix->images().to_vector<float>(),
            std::vector<float>(values.begin(), values.begin() + 13 * 192));
  auto labels = first->labels().to_vector<int64_t>();
  EXPECT_EQ(prefix->labels().to_vector<int64_t>(),
            std::vector<int64_t>(labels.begin(), labels.begin() + 13));
}

TEST(SyntheticImages, WorksWithTheLoader) {
  DataLoader loader(synthetic_images(SyntheticImageOptions().count(10).image(3, 4, 4)),
                    DataLoaderOptions().batch_size(4));
  loader.start_epoch(0);
  auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->inputs.sizes(), (Shape{4, 3, 4, 4}));
  EXPECT_TRUE(throws_error([] { SyntheticImageOptions().image(3, 0, 4); },
                           "image sizes must be positive, got (3, 0, 4)"));
  EXPECT_TRUE(
      throws_error([] { SyntheticImageOptions().num_classes(0); }, "num_classes must be positive"));
}

// Row `row` of an (N,T) i64 tensor's values.
std::vector<int64_t> row_of(const std::vector<int64_t>& values, int64_t row, int64_t length) {
  return std::vector<int64_t>(values.begin() + row * length, values.begin() + (row + 1) * length);
}

TEST(SyntheticTokens, BatchIsShapedLikeAnMlmBatch) {
  const int64_t rows = 6, length = 16;
  TokenBatch batch = synthetic_token_batch(
      SyntheticTokenOptions().batch_size(rows).seq_len(length).vocab_size(50).seed(2));
  for (const Tensor* tensor :
       {&batch.input_ids, &batch.token_type_ids, &batch.attention_mask, &batch.mlm_labels}) {
    EXPECT_EQ(tensor->sizes(), (Shape{rows, length}));
    EXPECT_EQ(tensor->dtype(), DType::kInt64);
  }
  EXPECT_EQ(batch.nsp_labels.sizes(), (Shape{rows}));
  EXPECT_EQ(batch.nsp_labels.dtype(), DType::kInt64);

  const auto ids = batch.input_ids.to_vector<int64_t>();
  const auto types = batch.token_type_ids.to_vector<int64_t>();
  const auto mask = batch.attention_mask.to_vector<int64_t>();
  const auto labels = batch.mlm_labels.to_vector<int64_t>();
  for (int64_t row = 0; row < rows; ++row) {
    const auto row_ids = row_of(ids, row, length);
    const auto row_types = row_of(types, row, length);
    const auto row_labels = row_of(labels, row, length);
    EXPECT_EQ(row_of(mask, row, length), std::vector<int64_t>(length, 1));  // no padding
    EXPECT_EQ(row_ids[0], 2);                                               // [CLS]
    EXPECT_EQ(row_ids[length - 1], 3);                                      // [SEP]
    int64_t separators = 0, first_sep = -1, predicted = 0;
    for (int64_t t = 0; t < length; ++t) {
      if (row_ids[t] == 3) {
        ++separators;
        if (first_sep < 0) first_sep = t;
      }
      EXPECT_EQ(row_types[t], first_sep >= 0 && t > first_sep ? 1 : 0) << row << " " << t;
      ASSERT_GE(row_ids[t], 0);
      ASSERT_LT(row_ids[t], 50);
      if (row_labels[t] != -100) {
        ++predicted;
        EXPECT_GE(row_labels[t], 5) << "only ordinary tokens are predicted";
        EXPECT_TRUE(row_ids[t] == 4 || row_ids[t] >= 5);
      } else {
        EXPECT_NE(row_ids[t], 4) << "[MASK] only where predicted";
      }
    }
    EXPECT_EQ(separators, 2);
    EXPECT_GE(first_sep, 2);  // A holds at least one token
    EXPECT_LE(first_sep, length - 3);
    EXPECT_EQ(predicted, 2);  // round(0.15 * 13)
  }
}

TEST(SyntheticTokens, AboutFifteenPercentPredictedMostlyAsMask) {
  int64_t positions = 0, predicted = 0, masked = 0, unchanged = 0;
  std::set<int64_t> nsp;
  for (int64_t step = 0; step < 20; ++step) {
    TokenBatch batch = synthetic_token_batch(SyntheticTokenOptions().batch_size(8).seed(5), step);
    const auto ids = batch.input_ids.to_vector<int64_t>();
    const auto labels = batch.mlm_labels.to_vector<int64_t>();
    for (size_t i = 0; i < ids.size(); ++i) {
      ++positions;
      if (labels[i] == -100) continue;
      ++predicted;
      masked += ids[i] == 4;
      unchanged += ids[i] == labels[i];
    }
    for (int64_t label : batch.nsp_labels.to_vector<int64_t>()) nsp.insert(label);
  }
  EXPECT_NEAR(static_cast<double>(predicted) / positions, 0.15, 0.01);
  EXPECT_NEAR(static_cast<double>(masked) / predicted, 0.8, 0.03);
  EXPECT_NEAR(static_cast<double>(unchanged) / predicted, 0.1, 0.03);
  EXPECT_EQ(nsp, (std::set<int64_t>{0, 1}));
}

TEST(SyntheticTokens, MinLengthPadsShorterSequences) {
  const int64_t length = 32;
  TokenBatch batch = synthetic_token_batch(
      SyntheticTokenOptions().batch_size(50).seq_len(length).min_length(8).vocab_size(100));
  const auto ids = batch.input_ids.to_vector<int64_t>();
  const auto mask = batch.attention_mask.to_vector<int64_t>();
  const auto types = batch.token_type_ids.to_vector<int64_t>();
  const auto labels = batch.mlm_labels.to_vector<int64_t>();
  std::set<int64_t> lengths;
  for (int64_t row = 0; row < 50; ++row) {
    int64_t tokens = 0;
    while (tokens < length && mask[row * length + tokens] == 1) ++tokens;
    ASSERT_GE(tokens, 8);
    lengths.insert(tokens);
    EXPECT_EQ(ids[row * length + tokens - 1], 3);  // the last token is [SEP]
    for (int64_t t = tokens; t < length; ++t) {
      const int64_t i = row * length + t;
      EXPECT_EQ(mask[i], 0);
      EXPECT_EQ(ids[i], 0);  // [PAD]
      EXPECT_EQ(types[i], 0);
      EXPECT_EQ(labels[i], -100);
    }
  }
  EXPECT_GT(lengths.size(), 5u);
}

TEST(SyntheticTokens, DeterministicAndEachExampleDependsOnlyOnItsNumber) {
  auto options = SyntheticTokenOptions().batch_size(4).seq_len(24).vocab_size(200).seed(8);
  const TokenBatch first = synthetic_token_batch(options, 1);
  const TokenBatch again = synthetic_token_batch(options, 1);
  EXPECT_EQ(first.input_ids.to_vector<int64_t>(), again.input_ids.to_vector<int64_t>());
  EXPECT_EQ(first.mlm_labels.to_vector<int64_t>(), again.mlm_labels.to_vector<int64_t>());
  EXPECT_NE(first.input_ids.to_vector<int64_t>(),
            synthetic_token_batch(options, 2).input_ids.to_vector<int64_t>());
  EXPECT_NE(first.input_ids.to_vector<int64_t>(),
            synthetic_token_batch(SyntheticTokenOptions(options).seed(9), 1)
                .input_ids.to_vector<int64_t>());
  // Step 1 of batches of 4 holds examples 4..7: rows 4..7 of step 0 of batches of 8.
  const TokenBatch double_batch =
      synthetic_token_batch(SyntheticTokenOptions(options).batch_size(8), 0);
  const auto wide = double_batch.input_ids.to_vector<int64_t>();
  EXPECT_EQ(first.input_ids.to_vector<int64_t>(),
            std::vector<int64_t>(wide.begin() + 4 * 24, wide.end()));
  const auto wide_nsp = double_batch.nsp_labels.to_vector<int64_t>();
  EXPECT_EQ(first.nsp_labels.to_vector<int64_t>(),
            std::vector<int64_t>(wide_nsp.begin() + 4, wide_nsp.end()));
}

TEST(SyntheticTokens, BadOptionsAreClearErrors) {
  EXPECT_TRUE(throws_error([] { SyntheticTokenOptions().seq_len(4); }, "seq_len must be >= 5"));
  EXPECT_TRUE(
      throws_error([] { SyntheticTokenOptions().mask_prob(0.0); }, "mask_prob must be in (0, 1]"));
  EXPECT_TRUE(
      throws_error([] { synthetic_token_batch(SyntheticTokenOptions().seq_len(8).min_length(9)); },
                   "min_length 9 is above seq_len 8"));
  EXPECT_TRUE(throws_error([] { synthetic_token_batch(SyntheticTokenOptions().vocab_size(5)); },
                           "first_token_id 5 leaves no ordinary tokens in a vocabulary of 5"));
  EXPECT_TRUE(throws_error([] { synthetic_token_batch(SyntheticTokenOptions().vocab_size(3)); },
                           "special id 3 is outside the vocabulary of 3"));
}

}  // namespace
}  // namespace tessel::data
