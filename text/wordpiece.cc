#include "text/wordpiece.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tessel::text {

WordPiece WordPiece::from_file(const std::string& path, BasicTokenizerOptions options) {
  std::ifstream in(path, std::ios::binary);
  TESSEL_CHECK(in.good(), "WordPiece: cannot open vocab file '", path,
               "' (expected vocab.txt with one token per line)");
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(line);
  }
  TESSEL_CHECK(!in.bad(), "WordPiece: error while reading vocab file '", path, "'");
  const bool all_blank =
      std::all_of(tokens.begin(), tokens.end(), [](const std::string& t) { return t.empty(); });
  TESSEL_CHECK(!all_blank, "WordPiece: vocab file '", path,
               "' is empty (expected one token per line, id = line number)");
  return WordPiece(std::move(tokens), options, "vocab file '" + path + "'");
}

WordPiece::WordPiece(std::vector<std::string> tokens, BasicTokenizerOptions options,
                     const std::string& source)
    : tokens_(std::move(tokens)), basic_(options) {
  TESSEL_CHECK(!tokens_.empty(), "WordPiece: ", source, " is empty");
  ids_.reserve(tokens_.size());
  special_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& token = tokens_[id];
    if (token.empty()) continue;  // a blank line keeps its id but matches nothing
    auto [it, inserted] = ids_.emplace(token, static_cast<int64_t>(id));
    TESSEL_CHECK(inserted, "WordPiece: ", source, " repeats token '", token, "' on lines ",
                 it->second + 1, " and ", id + 1);
    special_[id] = token.size() > 2 && token.front() == '[' && token.back() == ']';
  }
  std::vector<std::string> missing;
  for (const std::string& special : special_tokens()) {
    if (!contains(special)) missing.push_back(special);
  }
  if (!missing.empty()) {
    std::ostringstream names;
    for (size_t i = 0; i < missing.size(); ++i) names << (i ? " " : "") << missing[i];
    TESSEL_FAIL("WordPiece: ", source, " lacks the special token(s) ", names.str(),
                "; a vocab must contain [PAD] [UNK] [CLS] [SEP] [MASK]");
  }
  pad_id_ = find("[PAD]");
  unk_id_ = find("[UNK]");
  cls_id_ = find("[CLS]");
  sep_id_ = find("[SEP]");
  mask_id_ = find("[MASK]");
}

int64_t WordPiece::find(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

int64_t WordPiece::token_to_id(const std::string& token) const {
  const int64_t id = find(token);
  TESSEL_CHECK(id >= 0, "WordPiece: token '", token, "' is not in the vocab");
  return id;
}

const std::string& WordPiece::id_to_token(int64_t id) const {
  TESSEL_CHECK(id >= 0 && id < size(), "WordPiece: id ", id, " is outside the vocab [0, ", size(),
               ")");
  return tokens_[id];
}

bool WordPiece::is_special(int64_t id) const {
  TESSEL_CHECK(id >= 0 && id < size(), "WordPiece: id ", id, " is outside the vocab [0, ", size(),
               ")");
  return special_[id];
}

std::vector<std::string> WordPiece::split_word(const std::u32string& word) const {
  if (static_cast<int64_t>(word.size()) > kMaxWordChars) return {"[UNK]"};
  // Byte offset of each character in the UTF-8 form, so pieces are plain substrings.
  std::string utf8;
  std::vector<size_t> offsets;
  offsets.reserve(word.size() + 1);
  for (char32_t c : word) {
    offsets.push_back(utf8.size());
    append_utf8(utf8, c);
  }
  offsets.push_back(utf8.size());

  std::vector<std::string> pieces;
  std::string candidate;
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    bool found = false;
    // Longest match first: shrink the piece one character at a time.
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(utf8, offsets[start], offsets[end] - offsets[start]);
      if (ids_.count(candidate)) {
        found = true;
        break;
      }
    }
    if (!found) return {"[UNK]"};
    pieces.push_back(candidate);
    start = end;
  }
  return pieces;
}

std::vector<std::string> WordPiece::tokenize(const std::string& text) const {
  std::vector<std::string> pieces;
  for (const auto& word : basic_.tokenize_code_points(text)) {
    for (auto& piece : split_word(word)) pieces.push_back(std::move(piece));
  }
  return pieces;
}

std::vector<int64_t> WordPiece::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const auto& word : basic_.tokenize_code_points(text)) {
    for (const auto& piece : split_word(word)) ids.push_back(find(piece));
  }
  return ids;
}

std::string WordPiece::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::string text;
  bool after_word = false;  // the last token written was a word piece, not a special
  for (int64_t id : ids) {
    const std::string& token = id_to_token(id);
    if (skip_special && special_[id]) continue;
    const bool continuation = token.size() > 2 && token.compare(0, 2, "##") == 0;
    if (continuation && after_word) {
      text.append(token, 2, std::string::npos);
    } else {
      if (!text.empty()) text.push_back(' ');
      text.append(token);
    }
    after_word = !special_[id];
  }
  return text;
}

}  // namespace tessel::text
