// Text for the tokenizers, as arbitrary bytes (valid UTF-8 or not): UTF-8 decoding, BasicTokenizer
// and WordPiece over a fixed vocabulary, with and without lower-casing, accent stripping and CJK
// splitting. Ids must be in the vocabulary, and decode(encode(text)) must
// tokenize like the text itself when no [UNK] came up.
#include <algorithm>
#include <string>
#include <vector>

#include "fuzz/harness.h"
#include "text/wordpiece.h"

namespace tessel::fuzz {
namespace {

const std::vector<std::string>& vocab_tokens() {
  static const std::vector<std::string> tokens = {
      "[PAD]", "[UNK]", "[CLS]",  "[SEP]", "[MASK]", "[unused0]", "the",   "a",
      "un",    "##aff", "##able", "##ing", "##s",    "run",       "hello", "world",
      "!",     ",",     ".",      "#",     "##",     "é",         "##é",   "ß",
      "中",    "が",    "##が",   "ﬁ",     "x",      "##x",       "##y",   "y"};
  return tokens;
}

void check_text(const text::WordPiece& vocab, const std::string& input) {
  const std::vector<int64_t> ids = vocab.encode(input);
  const std::vector<std::string> pieces = vocab.tokenize(input);
  TESSEL_FUZZ_CHECK(ids.size() == pieces.size(), ids.size(), " ids for ", pieces.size(), " pieces");
  for (size_t i = 0; i < ids.size(); ++i) {
    TESSEL_FUZZ_CHECK(ids[i] >= 0 && ids[i] < vocab.size(), "id ", ids[i]);
    TESSEL_FUZZ_CHECK(vocab.id_to_token(ids[i]) == pieces[i], "id ", ids[i], " is not piece '",
                      pieces[i], "'");
  }
  const std::string decoded = vocab.decode(ids);
  vocab.decode(ids, /*skip_special=*/true);
  if (std::find(ids.begin(), ids.end(), vocab.unk_id()) == ids.end()) {
    const text::BasicTokenizer& basic = vocab.basic_tokenizer();
    TESSEL_FUZZ_CHECK(basic.tokenize(decoded) == basic.tokenize(input), "decoding gave '", decoded,
                      "', which tokenizes differently");
  }
}

}  // namespace
}  // namespace tessel::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  static const text::WordPiece bert_like(fuzz::vocab_tokens());
  static const text::WordPiece as_written(fuzz::vocab_tokens(),
                                          {/*lower_case=*/false, /*strip_accents=*/false,
                                           /*split_cjk=*/false});
  const std::string input = fuzz::as_string(data, size);
  fuzz::expect_only_tessel_errors([&] {
    // Decoding drops invalid bytes; what it returns is valid and survives a round trip.
    const std::u32string code_points = text::decode_utf8(input);
    TESSEL_FUZZ_CHECK(text::decode_utf8(text::encode_utf8(code_points)) == code_points,
                      "UTF-8 round trip changed the text");
    fuzz::check_text(bert_like, input);
    fuzz::check_text(as_written, input);
  });
  return 0;
}
