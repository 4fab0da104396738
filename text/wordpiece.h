// WordPiece: BERT's sub-word tokenizer over a vocab.txt (one token per line, id = line number):
// basic tokenisation, then greedy longest-match-first pieces, continuations prefixed "##".
//   WordPiece wp = WordPiece::from_file("vocab.txt");
//   std::vector<int64_t> ids = wp.encode("unaffable");  // ids of {"un", "##aff", "##able"}
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/basic_tokenizer.h"

namespace tessel::text {

// The special tokens every vocabulary must hold, in the order VocabBuilder writes them.
inline const std::vector<std::string>& special_tokens() {
  static const std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  return tokens;
}

// A word longer than this many characters (code points) becomes [UNK], as in BERT.
constexpr int64_t kMaxWordChars = 200;

// Read-only after construction: encode/decode may be called from several threads.
class WordPiece {
 public:
  // Reads `path`; throws tessel::Error naming the file when it is missing or unreadable, empty,
  // repeats a token, or lacks any of [PAD] [UNK] [CLS] [SEP] [MASK].
  static WordPiece from_file(const std::string& path, BasicTokenizerOptions options = {});
  // From tokens in id order; `source` names them in error messages.
  explicit WordPiece(std::vector<std::string> tokens, BasicTokenizerOptions options = {},
                     const std::string& source = "in-memory vocab");

  // Text -> pieces -> ids. No [CLS]/[SEP] are added.
  std::vector<std::string> tokenize(const std::string& text) const;
  std::vector<int64_t> encode(const std::string& text) const;
  // One basic token (already cleaned and lower-cased) -> its pieces, or {"[UNK]"} when a
  // character has no piece or the word is over kMaxWordChars characters.
  std::vector<std::string> split_word(const std::u32string& word) const;
  // Ids -> text: "##" pieces join the word piece before them (not a special token such as
  // [MASK]: there they keep their "##"), other tokens are separated by one space. So
  // basic.tokenize(decode(encode(t))) == basic.tokenize(t) when no [UNK] came up. `skip_special`
  // leaves out [PAD] [UNK] [CLS] [SEP] [MASK] and other bracketed tokens.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  bool contains(const std::string& token) const { return ids_.count(token) != 0; }
  // Throws tessel::Error when the token is not in the vocab.
  int64_t token_to_id(const std::string& token) const;
  // Throws tessel::Error when `id` is outside [0, size()).
  const std::string& id_to_token(int64_t id) const;
  // Special: the five above and any other token written in brackets, like BERT's [unused0].
  bool is_special(int64_t id) const;
  const std::vector<std::string>& tokens() const { return tokens_; }
  const BasicTokenizer& basic_tokenizer() const { return basic_; }

  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  int64_t cls_id() const { return cls_id_; }
  int64_t sep_id() const { return sep_id_; }
  int64_t mask_id() const { return mask_id_; }

 private:
  int64_t find(const std::string& token) const;  // -1 when absent

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
  std::vector<bool> special_;
  BasicTokenizer basic_;
  int64_t pad_id_ = -1, unk_id_ = -1, cls_id_ = -1, sep_id_ = -1, mask_id_ = -1;
};

}  // namespace tessel::text
