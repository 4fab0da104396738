// vocab.txt files: WordPiece::from_file must build a vocabulary (one token per line, ids in line
// order) or throw tessel::Error; a vocabulary it builds must then tokenize any text, including
// the file's own bytes, into ids that decode.
#include <string>
#include <vector>

#include "fuzz/harness.h"
#include "text/wordpiece.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  const std::string bytes = fuzz::as_string(data, size);
  const std::string path = fuzz::write_scratch_file("vocab.txt", bytes);
  fuzz::expect_only_tessel_errors([&] {
    const text::WordPiece vocab = text::WordPiece::from_file(path);
    for (int64_t id = 0; id < vocab.size(); ++id) {
      const std::string& token = vocab.id_to_token(id);
      if (!token.empty())
        TESSEL_FUZZ_CHECK(vocab.token_to_id(token) == id, "token '", token, "' maps to id ",
                          vocab.token_to_id(token), ", not its line ", id);
    }
    for (const std::string& text : {bytes, std::string("Hello, world! unaffable ##ing [MASK]")}) {
      const std::vector<int64_t> ids = vocab.encode(text);
      for (int64_t id : ids) TESSEL_FUZZ_CHECK(id >= 0 && id < vocab.size(), "id ", id);
      vocab.decode(ids);
      vocab.decode(ids, /*skip_special=*/true);
    }
  });
  return 0;
}
