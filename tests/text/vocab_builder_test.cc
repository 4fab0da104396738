#include "text/vocab_builder.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing.h"
#include "text/wordpiece.h"

namespace tessel::text {
namespace {

using tessel::testing::throws_error;

const std::vector<std::string>& sample_texts() {
  static const std::vector<std::string> texts = {
      "The quick brown fox jumps over the lazy dog.",
      "The dog sleeps; the fox runs. Running foxes are quicker than sleeping dogs!",
      "Caf\u00E9 owners open early, the caf\u00E9 closes late.",
      "A jumping fox, a running dog, a sleeping cat \u2014 the usual.",
      "Unbelievable: the unhappy fox was unable to jump.",
      "\u4E2D\u6587 text and na\u00EFve words, with 42 numbers and $5 prices.",
  };
  return texts;
}

std::vector<std::string> build_sample(int64_t vocab_size) {
  VocabBuilder builder(VocabBuilderOptions().vocab_size(vocab_size));
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (const auto& text : sample_texts()) builder.add_text(text);
  }
  return builder.build();
}

TEST(VocabBuilder, StartsWithTheSpecialTokens) {
  const auto tokens = build_sample(200);
  ASSERT_GE(tokens.size(), 5u);
  EXPECT_EQ(std::vector<std::string>(tokens.begin(), tokens.begin() + 5), special_tokens());
  WordPiece wp(tokens);  // has every special
  EXPECT_EQ(wp.pad_id(), 0);
  EXPECT_EQ(wp.mask_id(), 4);
}

TEST(VocabBuilder, HoldsEveryCharacterInBothFormsAndNoDuplicates) {
  const auto tokens = build_sample(200);
  const std::set<std::string> unique(tokens.begin(), tokens.end());
  EXPECT_EQ(unique.size(), tokens.size());
  // Accents are stripped before counting: "caf\u00E9" adds "e", not "\u00E9".
  for (const char* c : {"t", "##t", "q", "##q", "\u2014", "##\u2014", "\u4E2D", "##\u4E2D", "$",
                        "##$", "4", "##2"}) {
    EXPECT_TRUE(unique.count(c)) << c;
  }
  EXPECT_FALSE(unique.count("\u00E9"));
}

TEST(VocabBuilder, EncodesItsCorpusWithoutUnk) {
  WordPiece wp(build_sample(200));
  for (const auto& text : sample_texts()) {
    const auto ids = wp.encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(std::count(ids.begin(), ids.end(), wp.unk_id()), 0) << text;
    EXPECT_EQ(wp.basic_tokenizer().tokenize(wp.decode(ids)), wp.basic_tokenizer().tokenize(text));
  }
  // New words made of seen characters are fine too, wherever the characters stand.
  const auto unseen = wp.encode("xofdog zyq");
  EXPECT_EQ(std::count(unseen.begin(), unseen.end(), wp.unk_id()), 0);
}

TEST(VocabBuilder, FrequentWordsBecomeSingleTokens) {
  WordPiece wp(build_sample(200));
  EXPECT_EQ(wp.tokenize("the fox"), (std::vector<std::string>{"the", "fox"}));
  // A bigger vocab never encodes the corpus in more pieces than a smaller one.
  WordPiece small(build_sample(120));
  size_t big_pieces = 0, small_pieces = 0;
  for (const auto& text : sample_texts()) {
    big_pieces += wp.encode(text).size();
    small_pieces += small.encode(text).size();
  }
  EXPECT_LT(big_pieces, small_pieces);
}

TEST(VocabBuilder, RespectsTheTargetSizeAndIsDeterministic) {
  EXPECT_EQ(build_sample(150).size(), 150u);
  EXPECT_EQ(build_sample(150), build_sample(150));
  // With a huge target it stops when no pair is seen twice.
  const auto all = build_sample(100000);
  EXPECT_LT(all.size(), 100000u);
  VocabBuilder once(VocabBuilderOptions().vocab_size(1000).min_pair_count(1000));
  once.add_text("abc abc");
  EXPECT_EQ(once.build().size(), 5u + 2 * 3);
}

TEST(VocabBuilder, WritesAVocabFileThatWordPieceLoads) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = (std::filesystem::path(dir ? dir : "/tmp") / "built_vocab.txt").string();
  const auto tokens = build_sample(180);
  write_vocab(tokens, path);
  WordPiece wp = WordPiece::from_file(path);
  EXPECT_EQ(wp.tokens(), tokens);
  EXPECT_TRUE(throws_error([&] { write_vocab(tokens, "/nonexistent-dir/vocab.txt"); },
                           "/nonexistent-dir/vocab.txt"));
}

TEST(VocabBuilder, BadInputsAreClearErrors) {
  EXPECT_TRUE(throws_error([] { VocabBuilder().build(); }, "no words were added"));
  VocabBuilder only_space;
  only_space.add_text(" \n\t ");
  EXPECT_TRUE(throws_error([&] { only_space.build(); }, "no words were added"));
  EXPECT_TRUE(throws_error([] { build_sample(20); }, "vocab_size 20 is too small"));
  EXPECT_TRUE(throws_error([] { VocabBuilder(VocabBuilderOptions().vocab_size(0)); },
                           "vocab_size must be positive"));
}

}  // namespace
}  // namespace tessel::text
