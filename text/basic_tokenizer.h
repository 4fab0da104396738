// BasicTokenizer: BERT's first tokenisation pass over UTF-8 text (clean, lower-case, strip
// accents, split on whitespace and punctuation, CJK characters as tokens of their own).
//   BasicTokenizer basic;  basic.tokenize("Héllo, World!")  // {"hello", ",", "world", "!"}
#pragma once

#include <string>
#include <vector>

namespace tessel::text {

// UTF-8 <-> code points. Invalid bytes (stray continuation bytes, truncated or overlong
// sequences, surrogates, values above U+10FFFF) are dropped, as BERT's reader drops them.
std::u32string decode_utf8(const std::string& text);
std::string encode_utf8(const std::u32string& code_points);
void append_utf8(std::string& out, char32_t code_point);

// Character classes, following BERT's tokenization.py where it relies on Unicode categories.
// Whitespace: space, \t \n \r \v \f, U+0085, U+2028, U+2029 and category Zs. (BERT drops \v, \f
// and U+0085 as control characters, which glues the words around them; here they separate.)
bool is_whitespace(char32_t c);
// Control: category Cc (other than whitespace), Cf and Co (private use). Unassigned code points
// are kept, unlike BERT, which would need the full Unicode database to tell them apart.
bool is_control(char32_t c);
// Punctuation: every non-letter, non-digit printable ASCII character (so $ + < = > ^ ` | ~
// too, as in BERT) and every code point of Unicode 14 category P*.
bool is_punctuation(char32_t c);
// CJK Unified Ideographs (and extensions, compatibility ideographs), BERT's _is_chinese_char.
// Hiragana, Katakana and Hangul are not in it: they stay inside words, as in BERT.
bool is_cjk(char32_t c);
// Simple lower-casing for ASCII, Latin-1 Supplement, Latin Extended-A, the regular case pairs
// of Latin Extended-B, Greek (not Greek Extended: those capitals are lower-cased through their
// base letter when accents are stripped), Cyrillic, Armenian, Latin Extended Additional and the
// full-width Latin letters; characters of other scripts are returned unchanged.
char32_t to_lower(char32_t c);
// Accent stripping (BERT's NFD-then-drop-marks): a letter of Latin-1 Supplement, Latin
// Extended-A/B, Greek, Cyrillic, Latin Extended Additional or Greek Extended whose canonical
// decomposition is a base letter plus combining marks becomes that base letter (é -> e,
// ё -> е, ệ -> e, ά -> α; Ł and ø have no decomposition and stay), and every non-spacing mark
// (category Mn) is dropped, so text in NFD form loses its accents in any script. Precomposed
// letters of other blocks keep their accents (kana with voicing marks: が stays, BERT gives か),
// and Hangul syllables stay whole (BERT splits them into jamo). Returns 0 for a code point that
// should be dropped.
char32_t strip_accent(char32_t c);

struct BasicTokenizerOptions {
  bool lower_case = true;
  bool strip_accents = true;
  bool split_cjk = true;  // each CJK ideograph becomes a token of its own
};

// Stateless after construction; tokenize may be called from several threads.
class BasicTokenizer {
 public:
  explicit BasicTokenizer(BasicTokenizerOptions options = {}) : options_(options) {}
  // Words and punctuation marks of `text`, each as UTF-8.
  std::vector<std::string> tokenize(const std::string& text) const;
  // The same, as code points (WordPiece works on characters).
  std::vector<std::u32string> tokenize_code_points(const std::string& text) const;
  const BasicTokenizerOptions& options() const { return options_; }

 private:
  BasicTokenizerOptions options_;
};

}  // namespace tessel::text
