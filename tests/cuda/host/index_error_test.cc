// The record of a bad index found on a GPU: which values the device check accepts, and the
// message the next synchronisation point raises (the CPU kernels' wording, the op, the bad index
// and the valid range).
#include "cuda/index_error.h"

#include <string>

#include "gtest/gtest.h"

namespace tessel::cuda {
namespace {

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

TEST(IndexError, ValidIndicesAreInRangeOrTheLossesIgnoreIndex) {
  const IndexError table{IndexOp::kEmbedding, 0, 4};
  EXPECT_TRUE(index_is_valid(table, 0));
  EXPECT_TRUE(index_is_valid(table, 3));
  EXPECT_FALSE(index_is_valid(table, 4));
  EXPECT_FALSE(index_is_valid(table, -1));
  const IndexError gather{IndexOp::kGather, 1, 3, /*ignore_index=*/-1};
  EXPECT_FALSE(index_is_valid(gather, -1));  // only the losses have an ignore_index
  const IndexError targets{IndexOp::kCrossEntropy, 0, 3, -100};
  EXPECT_TRUE(index_is_valid(targets, -100));
  EXPECT_TRUE(index_is_valid(targets, 2));
  EXPECT_FALSE(index_is_valid(targets, 3));
  EXPECT_FALSE(index_is_valid(targets, -1));
  const IndexError empty{IndexOp::kIndexSelect, 0, 0};
  EXPECT_FALSE(index_is_valid(empty, 0));
}

TEST(IndexError, TheMessageNamesTheOpTheBadIndexAndTheValidRange) {
  IndexError error{IndexOp::kEmbedding, 0, 4};
  error.value = 7;
  error.position = 1;
  const std::string embedding = index_error_message(error, 0);
  EXPECT_TRUE(contains(embedding,
                       "embedding: index 7 is out of range for an embedding table of size 4 "
                       "(valid: 0..3; found on cuda:0"))
      << embedding;
  EXPECT_TRUE(contains(embedding, "reported at the next synchronisation point")) << embedding;

  error = {IndexOp::kIndexSelect, 1, 5};
  error.value = -2;
  EXPECT_TRUE(contains(index_error_message(error, 2),
                       "index_select: index -2 is out of range for dimension 1 of size 5 "
                       "(valid: 0..4; found on cuda:2"));
  error.op = IndexOp::kGather;
  EXPECT_TRUE(contains(index_error_message(error, 2),
                       "gather: index -2 is out of range for "
                       "dimension 1 of size 5"));
}

TEST(IndexError, TargetMessagesAreTheCpuLossesOnes) {
  IndexError error{IndexOp::kCrossEntropy, 0, 3, -100};
  error.value = 5;
  error.position = 1;
  EXPECT_TRUE(contains(index_error_message(error, 0),
                       "cross_entropy: target 5 (at flat index 1) is out of range for 3 classes; "
                       "expected 0..2 or ignore_index -100"));
  error.op = IndexOp::kNllLoss;
  EXPECT_TRUE(contains(index_error_message(error, 0), "nll_loss: target 5 (at flat index 1)"));
}

TEST(IndexError, AnEmptyRangeSaysNoIndexIsValid) {
  IndexError error{IndexOp::kIndexSelect, 0, 0};
  error.value = 0;
  EXPECT_TRUE(contains(index_error_message(error, 0),
                       "index_select: index 0 is out of range for dimension 0 of size 0 "
                       "(valid: none;"));
}

}  // namespace
}  // namespace tessel::cuda
