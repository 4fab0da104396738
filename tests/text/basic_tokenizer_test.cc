#include "text/basic_tokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessel::text {
namespace {

using Tokens = std::vector<std::string>;

TEST(BasicTokenizer, SplitsOnWhitespaceAndPunctuation) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("Hello, world!"), (Tokens{"hello", ",", "world", "!"}));
  EXPECT_EQ(basic.tokenize("don't stop-now"), (Tokens{"don", "'", "t", "stop", "-", "now"}));
  EXPECT_EQ(basic.tokenize("a$b+c~d"), (Tokens{"a", "$", "b", "+", "c", "~", "d"}));
  EXPECT_EQ(basic.tokenize("...!?"), (Tokens{".", ".", ".", "!", "?"}));
}

TEST(BasicTokenizer, SplitsOnUnicodePunctuation) {
  BasicTokenizer basic;
  // Curly quotes, em dash, ellipsis, inverted question mark, guillemets, CJK full stop.
  EXPECT_EQ(basic.tokenize("\u201Cyes\u201D\u2014no\u2026"),
            (Tokens{"\u201C", "yes", "\u201D", "\u2014", "no", "\u2026"}));
  EXPECT_EQ(basic.tokenize("\u00BFqu\u00E9?"), (Tokens{"\u00BF", "que", "?"}));
  EXPECT_EQ(basic.tokenize("\u00ABoui\u00BB"), (Tokens{"\u00AB", "oui", "\u00BB"}));
  // Symbols outside category P stay inside words, as in BERT.
  EXPECT_EQ(basic.tokenize("\u00A9acme"), (Tokens{"\u00A9acme"}));
}

TEST(BasicTokenizer, LowerCasesWhenAsked) {
  EXPECT_EQ(BasicTokenizer().tokenize("HeLLo WORLD"), (Tokens{"hello", "world"}));
  BasicTokenizerOptions cased;
  cased.lower_case = false;
  EXPECT_EQ(BasicTokenizer(cased).tokenize("HeLLo WORLD"), (Tokens{"HeLLo", "WORLD"}));
  // Greek and Cyrillic capitals too.
  EXPECT_EQ(BasicTokenizer().tokenize("\u0391\u0392\u0393 \u041C\u0418\u0420"),
            (Tokens{"\u03B1\u03B2\u03B3", "\u043C\u0438\u0440"}));
}

TEST(BasicTokenizer, StripsAccentsLikeNfdThenDropMarks) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("H\u00E9llo na\u00EFve \u00C5ngstr\u00F6m"),
            (Tokens{"hello", "naive", "angstrom"}));
  // Latin Extended-A: Č Ł ő; Ł has no decomposition and keeps its stroke (lower-cased).
  EXPECT_EQ(basic.tokenize("\u010Ce\u0141\u0151"), (Tokens{"ce\u0142o"}));
  // Already decomposed: e + combining acute.
  EXPECT_EQ(basic.tokenize("cafe\u0301"), (Tokens{"cafe"}));
  // Letters without a decomposition stay: ß, ø, æ.
  EXPECT_EQ(basic.tokenize("stra\u00DFe \u00F8l \u00E6"),
            (Tokens{"stra\u00DFe", "\u00F8l", "\u00E6"}));
  // Other scripts with decompositions: Russian, Greek (and Greek Extended capitals), Vietnamese.
  EXPECT_EQ(basic.tokenize("\u0401\u0416 \u0386\u0398\u0397\u039D\u0391 \u1F08 Vi\u1EC7t"),
            (Tokens{"\u0435\u0436", "\u03B1\u03B8\u03B7\u03BD\u03B1", "\u03B1", "viet"}));
  BasicTokenizerOptions keep;
  keep.strip_accents = false;
  EXPECT_EQ(BasicTokenizer(keep).tokenize("H\u00C9llo"), (Tokens{"h\u00E9llo"}));
}

TEST(BasicTokenizer, NormalisesWhitespaceAndDropsControlCharacters) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("  a\t\tb\r\nc\u00A0d\u3000e\u2028f  "),
            (Tokens{"a", "b", "c", "d", "e", "f"}));
  // NUL, BEL, DEL, a C1 control, zero-width space, soft hyphen and BOM vanish without
  // splitting the word.
  EXPECT_EQ(basic.tokenize(std::string("ab\0c", 4) + "\x07" + "d\x7F" + "e\u0085f"),
            (Tokens{"abcde", "f"}));
  EXPECT_EQ(basic.tokenize("wo\u200Brd\u00ADs\uFEFF"), (Tokens{"words"}));
  EXPECT_TRUE(basic.tokenize("").empty());
  EXPECT_TRUE(basic.tokenize(" \t\n ").empty());
}

TEST(BasicTokenizer, CjkCharactersAreTokensOfTheirOwn) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("ab\u4E2D\u6587cd"), (Tokens{"ab", "\u4E2D", "\u6587", "cd"}));
  BasicTokenizerOptions no_cjk;
  no_cjk.split_cjk = false;
  EXPECT_EQ(BasicTokenizer(no_cjk).tokenize("ab\u4E2D\u6587cd"), (Tokens{"ab\u4E2D\u6587cd"}));
}

TEST(BasicTokenizer, DropsInvalidUtf8Bytes) {
  BasicTokenizer basic;
  // A stray continuation byte, a truncated sequence and an overlong encoding of '/'.
  EXPECT_EQ(basic.tokenize("a\x80"
                           "b \xE2\x82 c \xC0\xAF"
                           "d"),
            (Tokens{"ab", "c", "d"}));
}

TEST(Utf8, RoundTripsEveryPlane) {
  const std::u32string code_points = {U'a', 0xE9, 0x20AC, 0x4E2D, 0x1F600, 0x10FFFF};
  EXPECT_EQ(decode_utf8(encode_utf8(code_points)), code_points);
  EXPECT_EQ(encode_utf8({0x20AC}), "\xE2\x82\xAC");
}

TEST(CharacterClasses, MatchBertDefinitions) {
  EXPECT_TRUE(is_punctuation('`'));
  EXPECT_TRUE(is_punctuation('^'));
  EXPECT_FALSE(is_punctuation('a'));
  EXPECT_FALSE(is_punctuation('5'));
  EXPECT_TRUE(is_punctuation(0x3002));   // 。
  EXPECT_FALSE(is_punctuation(0x20AC));  // € is a symbol
  EXPECT_TRUE(is_whitespace(0x2003));
  EXPECT_FALSE(is_whitespace('x'));
  EXPECT_TRUE(is_control(0x1F));
  EXPECT_FALSE(is_control('\n'));
  EXPECT_TRUE(is_control(0xE000));  // private use
  EXPECT_TRUE(is_cjk(0x4E00));
  EXPECT_FALSE(is_cjk(0x3042));  // Hiragana stays in words
  EXPECT_EQ(to_lower(0x178), 0xFFu);
  EXPECT_EQ(to_lower(0x130), static_cast<char32_t>('i'));
  EXPECT_EQ(strip_accent(0x1E9), static_cast<char32_t>('k'));      // ǩ
  EXPECT_EQ(strip_accent(0x451), static_cast<char32_t>(0x435));    // ё -> е
  EXPECT_EQ(strip_accent(0x1EC7), static_cast<char32_t>('e'));     // ệ
  EXPECT_EQ(strip_accent(0x0E48), static_cast<char32_t>(0));       // a Thai tone mark (Mn)
  EXPECT_EQ(strip_accent(0x304C), static_cast<char32_t>(0x304C));  // が: kept, documented
  EXPECT_EQ(strip_accent(0xAC00), static_cast<char32_t>(0xAC00));  // Hangul stays whole
}

}  // namespace
}  // namespace tessel::text
