#include "text/wordpiece.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel::text {
namespace {

using Tokens = std::vector<std::string>;
using tessel::testing::throws_error;

std::vector<std::string> small_vocab() {
  return {"[PAD]", "[UNK]",  "[CLS]", "[SEP]", "[MASK]", "un",   "##aff", "##able",
          "want",  "##want", "##ed",  "wa",    "un",     "runn", "##ing", ",",
          "low",   "lowest", "##est", "a",     "##a",    "ete"};
}

std::vector<std::string> unique_small_vocab() {
  auto tokens = small_vocab();
  tokens[12] = "r";  // small_vocab repeats "un" on purpose for the duplicate test
  return tokens;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return (std::filesystem::path(dir ? dir : std::filesystem::temp_directory_path().c_str()) / name)
      .string();
}

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

TEST(WordPiece, SplitsGreedilyLongestMatchFirst) {
  WordPiece wp(unique_small_vocab());
  EXPECT_EQ(wp.tokenize("unaffable"), (Tokens{"un", "##aff", "##able"}));
  EXPECT_EQ(wp.tokenize("unwanted running"), (Tokens{"un", "##want", "##ed", "runn", "##ing"}));
  // Longest first: "lowest" is one token although "low" + "##est" also matches.
  EXPECT_EQ(wp.tokenize("lowest"), (Tokens{"lowest"}));
  EXPECT_EQ(wp.tokenize("want,wa"), (Tokens{"want", ",", "wa"}));
  // Basic tokenisation runs first: case and accents.
  EXPECT_EQ(wp.tokenize("UNAFFABLE"), (Tokens{"un", "##aff", "##able"}));
  EXPECT_EQ(wp.tokenize("aaa"), (Tokens{"a", "##a", "##a"}));
}

TEST(WordPiece, EncodesToLineNumbers) {
  WordPiece wp(unique_small_vocab());
  EXPECT_EQ(wp.encode("unaffable"), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(wp.pad_id(), 0);
  EXPECT_EQ(wp.unk_id(), 1);
  EXPECT_EQ(wp.cls_id(), 2);
  EXPECT_EQ(wp.sep_id(), 3);
  EXPECT_EQ(wp.mask_id(), 4);
  EXPECT_EQ(wp.token_to_id("##ing"), 14);
  EXPECT_EQ(wp.id_to_token(14), "##ing");
  EXPECT_TRUE(wp.is_special(4));
  EXPECT_FALSE(wp.is_special(5));
}

TEST(WordPiece, UnknownCharacterMakesTheWholeWordUnk) {
  WordPiece wp(unique_small_vocab());
  // "unaffablx": no piece covers the final "x", so the word (not only the piece) is [UNK].
  EXPECT_EQ(wp.tokenize("unaffablx want"), (Tokens{"[UNK]", "want"}));
  EXPECT_EQ(wp.tokenize("\u4E2D"), (Tokens{"[UNK]"}));
  EXPECT_EQ(wp.encode("zzz"), (std::vector<int64_t>{wp.unk_id()}));
}

TEST(WordPiece, WordsOverTwoHundredCharactersAreUnk) {
  WordPiece wp(unique_small_vocab());
  const std::string at_limit(kMaxWordChars, 'a');
  EXPECT_EQ(wp.tokenize(at_limit).size(), static_cast<size_t>(kMaxWordChars));
  EXPECT_EQ(wp.tokenize(at_limit + "a"), (Tokens{"[UNK]"}));
  // Characters, not bytes: 150 two-byte characters is a word of 150.
  WordPiece accents({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u00F8", "##\u00F8"});
  std::string word;
  for (int i = 0; i < 150; ++i) word += "\u00F8";
  EXPECT_EQ(accents.tokenize(word).size(), 150u);
}

TEST(WordPiece, DecodeGluesContinuationPiecesAndRoundTrips) {
  WordPiece wp(unique_small_vocab());
  const std::string text = "Unaffable, unwanted RUNNING lowest \u00C9t\u00E9";
  const std::vector<int64_t> ids = wp.encode(text);
  const std::string decoded = wp.decode(ids);
  EXPECT_EQ(decoded, "unaffable , unwanted running lowest ete");
  EXPECT_EQ(wp.basic_tokenizer().tokenize(decoded), wp.basic_tokenizer().tokenize(text));
  EXPECT_EQ(wp.encode(decoded), ids);
  EXPECT_EQ(wp.decode({2, 5, 6, 3, 0, 0}), "[CLS] unaff [SEP] [PAD] [PAD]");
  EXPECT_EQ(wp.decode({2, 5, 6, 3, 0, 0}, /*skip_special=*/true), "unaff");
  // A continuation after a special token keeps its "##" rather than gluing onto [MASK].
  EXPECT_EQ(wp.decode({5, 4, 7, 14}), "un [MASK] ##ableing");
  EXPECT_TRUE(throws_error([&] { wp.decode({99}); }, "outside the vocab"));
}

TEST(WordPiece, LoadsVocabFileWithIdsByLineNumber) {
  const std::string path = temp_path("vocab_ok.txt");
  std::string contents;
  for (const auto& token : unique_small_vocab()) contents += token + "\r\n";
  write_file(path, contents);
  WordPiece wp = WordPiece::from_file(path);
  EXPECT_EQ(wp.size(), static_cast<int64_t>(unique_small_vocab().size()));
  EXPECT_EQ(wp.encode("unaffable"), (std::vector<int64_t>{5, 6, 7}));
}

TEST(WordPiece, MissingSpecialTokensNameTheFileAndTheTokens) {
  const std::string path = temp_path("vocab_no_specials.txt");
  write_file(path, "[PAD]\n[UNK]\n[SEP]\nhello\n");
  EXPECT_TRUE(throws_error([&] { WordPiece::from_file(path); }, path));
  EXPECT_TRUE(throws_error([&] { WordPiece::from_file(path); }, "[CLS] [MASK]"));
  EXPECT_TRUE(throws_error([] { WordPiece({"a", "b"}); }, "[PAD] [UNK] [CLS] [SEP] [MASK]"));
}

TEST(WordPiece, MissingOrEmptyVocabFileIsAClearError) {
  const std::string missing = temp_path("no_such_vocab.txt");
  EXPECT_TRUE(throws_error([&] { WordPiece::from_file(missing); }, "cannot open vocab file"));
  EXPECT_TRUE(throws_error([&] { WordPiece::from_file(missing); }, missing));
  const std::string empty = temp_path("vocab_empty.txt");
  write_file(empty, "");
  EXPECT_TRUE(throws_error([&] { WordPiece::from_file(empty); }, "is empty"));
  write_file(empty, "\n\n");
  EXPECT_TRUE(throws_error([&] { WordPiece::from_file(empty); }, "is empty"));
  EXPECT_TRUE(throws_error([] { WordPiece(std::vector<std::string>{}); }, "is empty"));
}

TEST(WordPiece, RepeatedTokenIsAnError) {
  EXPECT_TRUE(
      throws_error([] { WordPiece{small_vocab()}; }, "repeats token 'un' on lines 6 and 13"));
}

TEST(WordPiece, UnknownTokenLookupIsAnError) {
  WordPiece wp(unique_small_vocab());
  EXPECT_TRUE(throws_error([&] { wp.token_to_id("zebra"); }, "'zebra' is not in the vocab"));
  EXPECT_TRUE(throws_error([&] { wp.id_to_token(-1); }, "outside the vocab"));
}

}  // namespace
}  // namespace tessel::text
