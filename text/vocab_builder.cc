#include "text/vocab_builder.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <queue>
#include <tuple>

#include "core/error.h"
#include "text/wordpiece.h"

namespace tessel::text {
namespace {

using PairKey = uint64_t;  // (left piece id << 32) | right piece id

PairKey pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}
int32_t left_of(PairKey key) { return static_cast<int32_t>(key >> 32); }
int32_t right_of(PairKey key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

struct WordPieces {
  std::vector<int32_t> pieces;
  int64_t count;
};

// Byte-pair merging over piece ids with pair counts kept up to date incrementally: a merge only
// touches the words that hold the pair.
class PairMerger {
 public:
  PairMerger(std::vector<WordPieces> words, std::vector<std::string>& tokens)
      : words_(std::move(words)), tokens_(tokens), merged_at_(words_.size(), -1) {
    for (size_t id = 0; id < tokens_.size(); ++id) token_ids_.emplace(tokens_[id], id);
    for (size_t w = 0; w < words_.size(); ++w) {
      const auto& pieces = words_[w].pieces;
      for (size_t i = 0; i + 1 < pieces.size(); ++i) {
        const PairKey key = pair_key(pieces[i], pieces[i + 1]);
        pair_counts_[key] += words_[w].count;
        words_with_pair_[key].push_back(static_cast<int32_t>(w));
      }
    }
    for (const auto& [key, count] : pair_counts_) heap_.push({count, ~key});
  }

  void run(int64_t vocab_size, int64_t min_pair_count) {
    int32_t merge_number = 0;
    while (static_cast<int64_t>(tokens_.size()) < vocab_size && !heap_.empty()) {
      auto [count, inverted_key] = heap_.top();
      heap_.pop();
      const PairKey key = ~inverted_key;
      auto current = pair_counts_.find(key);
      if (current == pair_counts_.end() || current->second != count) continue;  // stale entry
      if (count < min_pair_count) break;
      merge(key, merge_number++);
    }
  }

 private:
  void merge(PairKey key, int32_t merge_number) {
    const int32_t left = left_of(key), right = right_of(key);
    const std::string& right_token = tokens_[right];
    std::string merged = tokens_[left] + right_token.substr(2);  // drop the right's "##"
    auto [it, inserted] = token_ids_.emplace(merged, static_cast<int32_t>(tokens_.size()));
    if (inserted) tokens_.push_back(merged);
    const int32_t merged_id = it->second;

    std::vector<PairKey> touched;
    std::vector<int32_t> words = std::move(words_with_pair_[key]);
    words_with_pair_.erase(key);
    for (int32_t w : words) {
      if (merged_at_[w] == merge_number) continue;  // listed twice
      merged_at_[w] = merge_number;
      auto& pieces = words_[w].pieces;
      const int64_t count = words_[w].count;
      std::vector<int32_t> result;
      result.reserve(pieces.size());
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (i + 1 < pieces.size() && pieces[i] == left && pieces[i + 1] == right) {
          result.push_back(merged_id);
          ++i;
        } else {
          result.push_back(pieces[i]);
        }
      }
      if (result.size() == pieces.size()) continue;  // a stale listing: the pair is gone
      for (size_t i = 0; i + 1 < pieces.size(); ++i) {
        const PairKey old_key = pair_key(pieces[i], pieces[i + 1]);
        if ((pair_counts_[old_key] -= count) == 0) pair_counts_.erase(old_key);
        touched.push_back(old_key);
      }
      for (size_t i = 0; i + 1 < result.size(); ++i) {
        const PairKey new_key = pair_key(result[i], result[i + 1]);
        pair_counts_[new_key] += count;
        touched.push_back(new_key);
        if (result[i] == merged_id || result[i + 1] == merged_id) {
          words_with_pair_[new_key].push_back(w);
        }
      }
      pieces = std::move(result);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (PairKey touched_key : touched) {
      auto found = pair_counts_.find(touched_key);
      if (found != pair_counts_.end()) heap_.push({found->second, ~touched_key});
    }
  }

  std::vector<WordPieces> words_;
  std::vector<std::string>& tokens_;
  std::unordered_map<std::string, int32_t> token_ids_;
  std::unordered_map<PairKey, int64_t> pair_counts_;
  std::unordered_map<PairKey, std::vector<int32_t>> words_with_pair_;
  std::vector<int32_t> merged_at_;
  // Highest count first; among equal counts the smallest key (earliest pieces), via ~key.
  std::priority_queue<std::pair<int64_t, PairKey>> heap_;
};

}  // namespace

VocabBuilder::VocabBuilder(VocabBuilderOptions options)
    : options_(options), basic_(options.basic()) {
  TESSEL_CHECK(options_.vocab_size() > 0, "VocabBuilder: vocab_size must be positive, got ",
               options_.vocab_size());
  TESSEL_CHECK(options_.min_pair_count() >= 1, "VocabBuilder: min_pair_count must be >= 1, got ",
               options_.min_pair_count());
}

void VocabBuilder::add_text(const std::string& text) {
  for (auto& word : basic_.tokenize_code_points(text)) {
    if (static_cast<int64_t>(word.size()) > kMaxWordChars) continue;
    ++word_counts_[std::move(word)];
    ++total_words_;
  }
}

std::vector<std::string> VocabBuilder::build() const {
  TESSEL_CHECK(!word_counts_.empty(),
               "VocabBuilder: no words were added (is the corpus empty?); call add_text first");
  // Sorted words make the piece ids, hence the tie-breaks, independent of hash order.
  std::vector<std::pair<std::u32string, int64_t>> words(word_counts_.begin(), word_counts_.end());
  std::sort(words.begin(), words.end());

  std::map<char32_t, int64_t> char_counts;
  for (const auto& [word, count] : words) {
    for (char32_t c : word) char_counts[c] += count;
  }
  std::vector<std::pair<int64_t, char32_t>> by_frequency;
  for (const auto& [c, count] : char_counts) by_frequency.push_back({-count, c});
  std::sort(by_frequency.begin(), by_frequency.end());

  std::vector<std::string> tokens = special_tokens();
  const int64_t needed =
      static_cast<int64_t>(tokens.size()) + 2 * static_cast<int64_t>(by_frequency.size());
  TESSEL_CHECK(needed <= options_.vocab_size(), "VocabBuilder: vocab_size ", options_.vocab_size(),
               " is too small: the corpus has ", by_frequency.size(),
               " distinct characters, which with their ## forms and the ", tokens.size(),
               " special tokens need ", needed, " entries");
  std::unordered_map<char32_t, int32_t> start_id, continuation_id;
  for (const auto& entry : by_frequency) {
    start_id[entry.second] = static_cast<int32_t>(tokens.size());
    std::string token;
    append_utf8(token, entry.second);
    tokens.push_back(token);
  }
  for (const auto& entry : by_frequency) {
    continuation_id[entry.second] = static_cast<int32_t>(tokens.size());
    std::string token = "##";
    append_utf8(token, entry.second);
    tokens.push_back(token);
  }

  std::vector<WordPieces> word_pieces;
  word_pieces.reserve(words.size());
  for (const auto& [word, count] : words) {
    WordPieces entry{{}, count};
    entry.pieces.reserve(word.size());
    for (size_t i = 0; i < word.size(); ++i) {
      entry.pieces.push_back(i == 0 ? start_id[word[i]] : continuation_id[word[i]]);
    }
    word_pieces.push_back(std::move(entry));
  }
  PairMerger merger(std::move(word_pieces), tokens);
  merger.run(options_.vocab_size(), options_.min_pair_count());
  return tokens;
}

void write_vocab(const std::vector<std::string>& tokens, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TESSEL_CHECK(out.good(), "write_vocab: cannot open '", path, "' for writing");
  for (const auto& token : tokens) out << token << '\n';
  out.flush();
  TESSEL_CHECK(out.good(), "write_vocab: error while writing '", path, "'");
}

}  // namespace tessel::text
