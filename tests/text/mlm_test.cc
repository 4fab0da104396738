#include "text/mlm.h"

#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing.h"
#include "text/vocab_builder.h"

namespace tessel::text {
namespace {

using tessel::testing::bitwise_equal;
using tessel::testing::throws_error;

constexpr int64_t kSpecials = 5;
constexpr int64_t kIdsPerDocument = 20;

// Specials then "w0".."w{n-1}".
WordPiece numbered_vocab(int64_t words) {
  std::vector<std::string> tokens = special_tokens();
  for (int64_t i = 0; i < words; ++i) tokens.push_back("w" + std::to_string(i));
  return WordPiece(tokens);
}

// Document d uses only ids in [5 + 20d, 5 + 20d + 20), so a token tells its document.
std::vector<TokenizedDocument> synthetic_documents(int64_t count, int64_t segments,
                                                   int64_t segment_length) {
  std::vector<TokenizedDocument> documents(count);
  for (int64_t d = 0; d < count; ++d) {
    for (int64_t s = 0; s < segments; ++s) {
      std::vector<int64_t> segment;
      for (int64_t t = 0; t < segment_length; ++t) {
        segment.push_back(kSpecials + d * kIdsPerDocument + (s * 7 + t * 3) % kIdsPerDocument);
      }
      documents[d].push_back(segment);
    }
  }
  return documents;
}

int64_t document_of(int64_t id) { return (id - kSpecials) / kIdsPerDocument; }

std::vector<int64_t> all_indices(const MlmDataset& data) {
  std::vector<int64_t> indices(data.size());
  std::iota(indices.begin(), indices.end(), 0);
  return indices;
}

TEST(MlmDataset, PacksClsASepBSepWithTypesMaskAndPadding) {
  const WordPiece vocab = numbered_vocab(200 * kIdsPerDocument);
  const MlmDataset data(synthetic_documents(200, 6, 9), vocab, MlmOptions().max_seq(64).seed(3));
  ASSERT_GT(data.size(), 100);
  for (int64_t index = 0; index < data.size(); ++index) {
    const SentencePair& pair = data.pairs()[index];
    const MlmExample example = data.example(index);
    ASSERT_FALSE(pair.a.empty());
    ASSERT_FALSE(pair.b.empty());
    ASSERT_LE(static_cast<int64_t>(pair.a.size() + pair.b.size()), 64 - 3);
    // Undo the masks with the labels, then compare with the expected layout.
    std::vector<int64_t> original = example.input_ids;
    for (size_t t = 0; t < original.size(); ++t) {
      if (example.mlm_labels[t] != kIgnoreLabel) original[t] = example.mlm_labels[t];
    }
    std::vector<int64_t> expected = {vocab.cls_id()};
    expected.insert(expected.end(), pair.a.begin(), pair.a.end());
    expected.push_back(vocab.sep_id());
    const size_t b_start = expected.size();
    expected.insert(expected.end(), pair.b.begin(), pair.b.end());
    expected.push_back(vocab.sep_id());
    const size_t used = expected.size();
    expected.resize(64, vocab.pad_id());
    ASSERT_EQ(original, expected);
    for (size_t t = 0; t < 64; ++t) {
      ASSERT_EQ(example.attention_mask[t], t < used ? 1 : 0);
      ASSERT_EQ(example.token_type_ids[t], (t >= b_start && t < used) ? 1 : 0);
    }
    ASSERT_EQ(example.nsp_label, pair.random_next ? 1 : 0);
  }
}

TEST(MlmDataset, BatchIsI64TensorsReadyForBert) {
  const WordPiece vocab = numbered_vocab(50 * kIdsPerDocument);
  const MlmDataset data(synthetic_documents(50, 4, 10), vocab);
  const MlmBatch batch = data.batch({0, 1, 2});
  for (const Tensor* tensor :
       {&batch.input_ids, &batch.token_type_ids, &batch.attention_mask, &batch.mlm_labels}) {
    EXPECT_EQ(tensor->sizes(), (Shape{3, 128}));
    EXPECT_EQ(tensor->dtype(), DType::kInt64);
  }
  EXPECT_EQ(batch.nsp_labels.sizes(), (Shape{3}));
  EXPECT_EQ(batch.nsp_labels.dtype(), DType::kInt64);
  const MlmExample second = data.example(1);
  const auto ids = batch.input_ids.to_vector<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(ids.begin() + 128, ids.begin() + 256), second.input_ids);
  EXPECT_EQ(batch.nsp_labels.to_vector<int64_t>()[1], second.nsp_label);
}

TEST(MlmDataset, MasksFifteenPercentSplitEightyTenTen) {
  const WordPiece vocab = numbered_vocab(400 * kIdsPerDocument);
  const MlmDataset data(synthetic_documents(400, 12, 23), vocab,
                        MlmOptions().max_predictions(128).seed(11));
  int64_t candidates = 0, predicted = 0, masked = 0, unchanged = 0, replaced = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int64_t index = 0; index < data.size(); ++index) {
      const MlmExample example = data.example(index, epoch);
      for (size_t t = 0; t < example.input_ids.size(); ++t) {
        const int64_t label = example.mlm_labels[t];
        const int64_t id = example.input_ids[t];
        if (label == kIgnoreLabel) {
          if (id >= kSpecials) ++candidates;
          continue;
        }
        ++candidates;
        ++predicted;
        ASSERT_GE(label, kSpecials) << "a special token was chosen for prediction";
        if (id == vocab.mask_id()) {
          ++masked;
        } else if (id == label) {
          ++unchanged;
        } else {
          ASSERT_FALSE(vocab.is_special(id)) << "random replacements are never special";
          ++replaced;
        }
      }
    }
  }
  ASSERT_GT(predicted, 20000);
  EXPECT_NEAR(static_cast<double>(predicted) / candidates, 0.15, 0.01);
  EXPECT_NEAR(static_cast<double>(masked) / predicted, 0.8, 0.01);
  EXPECT_NEAR(static_cast<double>(unchanged) / predicted, 0.1, 0.01);
  EXPECT_NEAR(static_cast<double>(replaced) / predicted, 0.1, 0.01);
}

TEST(MlmDataset, RespectsMaxPredictions) {
  const WordPiece vocab = numbered_vocab(100 * kIdsPerDocument);
  EXPECT_EQ(MlmOptions().predictions_per_sequence(), 20);
  EXPECT_EQ(MlmOptions().max_seq(512).predictions_per_sequence(), 80);
  EXPECT_EQ(MlmOptions().max_seq(8).predictions_per_sequence(), 1);
  // Half the tokens wanted, but at most 20 (the default for 128) or 7.
  for (int64_t cap : {-1, 7}) {
    const MlmDataset data(synthetic_documents(100, 10, 30), vocab,
                          MlmOptions().mask_prob(0.5).max_predictions(cap));
    const int64_t limit = cap == -1 ? 20 : cap;
    int64_t at_limit = 0;
    for (int64_t index = 0; index < data.size(); ++index) {
      const auto labels = data.example(index).mlm_labels;
      const int64_t count = std::count_if(labels.begin(), labels.end(),
                                          [](int64_t label) { return label != kIgnoreLabel; });
      ASSERT_LE(count, limit);
      at_limit += count == limit;
    }
    EXPECT_GT(at_limit, data.size() / 2);
  }
}

TEST(MlmDataset, NextSentenceIsHalfActualHalfRandom) {
  const int64_t documents = 1000;
  const WordPiece vocab = numbered_vocab(documents * kIdsPerDocument);
  const MlmDataset data(synthetic_documents(documents, 8, 12), vocab, MlmOptions().seed(5));
  int64_t random_next = 0;
  for (int64_t index = 0; index < data.size(); ++index) {
    const SentencePair& pair = data.pairs()[index];
    const int64_t a_document = document_of(pair.a.front());
    for (int64_t id : pair.a) ASSERT_EQ(document_of(id), a_document);
    for (int64_t id : pair.b) {
      // An actual next segment comes from A's document, a random one from another.
      if (pair.random_next) {
        ASSERT_NE(document_of(id), a_document);
      } else {
        ASSERT_EQ(document_of(id), a_document);
      }
    }
    random_next += pair.random_next;
  }
  ASSERT_GT(data.size(), 1000);
  EXPECT_NEAR(static_cast<double>(random_next) / data.size(), 0.5, 0.04);
  const MlmBatch batch = data.batch(all_indices(data));
  const auto labels = batch.nsp_labels.to_vector<int64_t>();
  EXPECT_EQ(std::accumulate(labels.begin(), labels.end(), int64_t{0}), random_next);
}

TEST(MlmDataset, SingleSegmentDocumentsStillGiveActualNextPairs) {
  const WordPiece vocab = numbered_vocab(500 * kIdsPerDocument);
  const MlmDataset data(synthetic_documents(500, 1, 10), vocab, MlmOptions().seed(9));
  int64_t random_next = 0;
  for (const auto& pair : data.pairs()) random_next += pair.random_next;
  EXPECT_NEAR(static_cast<double>(random_next) / data.size(), 0.5, 0.07);
}

TEST(MlmDataset, IsDeterministicGivenTheSeed) {
  const WordPiece vocab = numbered_vocab(100 * kIdsPerDocument);
  const auto documents = synthetic_documents(100, 6, 11);
  const MlmDataset first(documents, vocab, MlmOptions().seed(42));
  const MlmDataset second(documents, vocab, MlmOptions().seed(42));
  const MlmDataset other_seed(documents, vocab, MlmOptions().seed(43));
  const auto indices = all_indices(first);
  const MlmBatch a = first.batch(indices), b = second.batch(indices);
  EXPECT_TRUE(bitwise_equal(a.input_ids, b.input_ids));
  EXPECT_TRUE(bitwise_equal(a.token_type_ids, b.token_type_ids));
  EXPECT_TRUE(bitwise_equal(a.attention_mask, b.attention_mask));
  EXPECT_TRUE(bitwise_equal(a.mlm_labels, b.mlm_labels));
  EXPECT_TRUE(bitwise_equal(a.nsp_labels, b.nsp_labels));
  // An example does not depend on which others were made before it.
  EXPECT_EQ(first.batch({7}).mlm_labels.to_vector<int64_t>(), first.example(7).mlm_labels);
  const auto two = second.batch({3, 7}).input_ids.to_vector<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(two.begin() + 128, two.end()), first.example(7).input_ids);
  // Another seed pairs and masks differently; another epoch masks the same pairs differently.
  EXPECT_NE(other_seed.batch({0, 1, 2, 3}).mlm_labels.to_vector<int64_t>(),
            first.batch({0, 1, 2, 3}).mlm_labels.to_vector<int64_t>());
  const MlmBatch next_epoch = first.batch(indices, /*epoch=*/1);
  EXPECT_NE(next_epoch.mlm_labels.to_vector<int64_t>(), a.mlm_labels.to_vector<int64_t>());
  EXPECT_TRUE(bitwise_equal(next_epoch.attention_mask, a.attention_mask));
  EXPECT_TRUE(bitwise_equal(next_epoch.nsp_labels, a.nsp_labels));
}

TEST(MlmDataset, BadInputsAreClearErrors) {
  const WordPiece vocab = numbered_vocab(100);
  EXPECT_TRUE(throws_error([&] { MlmDataset({}, vocab); }, "hold no tokens"));
  EXPECT_TRUE(throws_error([&] { MlmDataset({{{}, {}}}, vocab); }, "hold no tokens"));
  const auto documents = synthetic_documents(3, 2, 4);
  EXPECT_TRUE(throws_error([&] { MlmDataset(documents, vocab, MlmOptions().max_seq(4)); },
                           "max_seq must be at least 5"));
  EXPECT_TRUE(throws_error([&] { MlmDataset(documents, vocab, MlmOptions().mask_prob(1.5)); },
                           "mask_prob must be in [0, 1]"));
  EXPECT_TRUE(throws_error(
      [&] {
        MlmDataset(documents, vocab, MlmOptions().mask_token_prob(0.8).random_token_prob(0.3));
      },
      "mask_token_prob + random_token_prob must be <= 1"));
  EXPECT_TRUE(throws_error([&] { MlmDataset(documents, vocab, MlmOptions().max_predictions(0)); },
                           "max_predictions must be >= 1"));
  EXPECT_TRUE(throws_error([&] { MlmDataset({{{100000}}}, vocab); }, "outside the vocab"));
  const MlmDataset data(documents, vocab);
  EXPECT_TRUE(throws_error([&] { data.example(data.size()); }, "outside [0, "));
  EXPECT_TRUE(throws_error([&] { data.batch({}); }, "no indices"));
  EXPECT_TRUE(throws_error([] { collate({}); }, "no examples"));
}

TEST(UnigramBaseline, IsTheAddOneFrequencyCrossEntropy) {
  const WordPiece vocab = numbered_vocab(5);  // ids 5..9
  // Training counts: id 5 x3, id 6 x1; [UNK] (id 1) is not counted.
  const std::vector<TokenizedDocument> train = {{{5, 5, 6}, {5, 1}}};
  const UnigramBaseline unigram(train, vocab);
  EXPECT_EQ(unigram.total_tokens(), 4);
  const double denominator = 4 + 10;
  EXPECT_DOUBLE_EQ(unigram.nats(5), -std::log(4 / denominator));
  EXPECT_DOUBLE_EQ(unigram.nats(9), -std::log(1 / denominator));
  const Tensor labels = from_vector<int64_t>({-100, 5, -100, 6, 9, -100}, {2, 3});
  EXPECT_DOUBLE_EQ(unigram.cross_entropy(labels),
                   (unigram.nats(5) + unigram.nats(6) + unigram.nats(9)) / 3);
  EXPECT_TRUE(std::isnan(unigram.cross_entropy(from_vector<int64_t>({-100}, {1, 1}))));
}

TEST(UnigramBaseline, ScoresHeldOutMaskedPositions) {
  const WordPiece vocab = numbered_vocab(100 * kIdsPerDocument);
  const auto documents = synthetic_documents(100, 6, 11);
  const UnigramBaseline unigram(
      std::vector<TokenizedDocument>(documents.begin(), documents.begin() + 80), vocab);
  const MlmDataset held_out(std::vector<TokenizedDocument>(documents.begin() + 80, documents.end()),
                            vocab);
  // Held-out documents use ids never seen in training: each costs log(total + V) nats.
  EXPECT_NEAR(unigram.cross_entropy(held_out),
              std::log(static_cast<double>(unigram.total_tokens() + vocab.size())), 1e-9);
  const MlmBatch batch = held_out.batch(all_indices(held_out));
  EXPECT_NEAR(unigram.cross_entropy(batch.mlm_labels), unigram.cross_entropy(held_out), 1e-9);
}

// The whole pipeline on a small fortune-format text: corpus, vocab, tokens, examples, baseline.
TEST(MlmPipeline, RunsFromTextToBatchesAndBaseline) {
  std::string text;
  const std::vector<std::string> sentences = {
      "The early bird gets the worm.",
      "A penny saved is a penny earned.",
      "Time flies like an arrow; fruit flies like a banana.",
      "All that glitters is not gold.",
      "Birds of a feather flock together.",
      "Actions speak louder than words."};
  for (int entry = 0; entry < 200; ++entry) {
    text += sentences[entry % sentences.size()] + "\n" +
            sentences[(entry * 7 + 1) % sentences.size()] + "\n%\n";
  }
  const Corpus corpus(Corpus::parse(text, "memory"));
  ASSERT_EQ(corpus.size(), 200);
  const CorpusSplit split = corpus.split(20);
  VocabBuilder builder(VocabBuilderOptions().vocab_size(150));
  for (const auto& document_text : split.train.texts()) builder.add_text(document_text);
  const WordPiece vocab(builder.build());
  const auto train_tokens = tokenize_corpus(split.train, vocab);
  const auto held_out_tokens = tokenize_corpus(split.held_out, vocab);
  ASSERT_EQ(train_tokens.size(), 190u);
  for (const auto& document : train_tokens) {
    for (const auto& segment : document) {
      ASSERT_EQ(std::count(segment.begin(), segment.end(), vocab.unk_id()), 0);
    }
  }
  const MlmDataset held_out(held_out_tokens, vocab, MlmOptions().max_seq(32).seed(1));
  const UnigramBaseline unigram(train_tokens, vocab);
  const double nats = unigram.cross_entropy(held_out);
  EXPECT_GT(nats, 0.5);
  EXPECT_LT(nats, std::log(static_cast<double>(vocab.size())));
}

TEST(MlmPipeline, FortunesGiveAUsableDataSetWhenInstalled) {
  if (!std::filesystem::is_directory(kFortunesDir)) GTEST_SKIP() << kFortunesDir << " missing";
  const CorpusSplit split = Corpus::load_fortunes().split();
  VocabBuilder builder(VocabBuilderOptions().vocab_size(8000));
  for (const auto& document_text : split.train.texts()) builder.add_text(document_text);
  const WordPiece vocab(builder.build());
  EXPECT_EQ(vocab.size(), 8000);
  const auto train_tokens = tokenize_corpus(split.train, vocab);
  const auto held_out_tokens = tokenize_corpus(split.held_out, vocab);
  const MlmDataset held_out(held_out_tokens, vocab, MlmOptions().seed(1));
  const MlmDataset train(train_tokens, vocab, MlmOptions().seed(1));
  EXPECT_GT(train.size(), 10000);
  const UnigramBaseline unigram(train_tokens, vocab);
  const double nats = unigram.cross_entropy(held_out);
  std::printf("fortunes: %lld train pairs, %lld held-out pairs, unigram baseline %.3f nats\n",
              static_cast<long long>(train.size()), static_cast<long long>(held_out.size()), nats);
  EXPECT_GT(nats, 4.0);
  EXPECT_LT(nats, 9.0);
}

}  // namespace
}  // namespace tessel::text
