// VocabBuilder: a WordPiece vocabulary from a corpus, by frequency (byte-pair-style merges of
// the most frequent adjacent pieces), written as vocab.txt for WordPiece::from_file.
//   VocabBuilder builder(VocabBuilderOptions().vocab_size(8000));
//   for (auto& text : corpus.texts()) builder.add_text(text);
//   write_vocab(builder.build(), "vocab.txt");
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/arg.h"
#include "text/basic_tokenizer.h"

namespace tessel::text {

class VocabBuilderOptions {
 public:
  // Upper bound on the number of tokens; the result may be smaller when merges run out.
  TESSEL_ARG(int64_t, vocab_size) = 8000;
  // A pair of pieces seen fewer times than this is never merged.
  TESSEL_ARG(int64_t, min_pair_count) = 2;
  // Must match the options of the WordPiece that will use the vocab.
  TESSEL_ARG(BasicTokenizerOptions, basic);
};

// The method, all counts weighted by word frequency:
//  1. count the words that BasicTokenizer makes of the text (words over kMaxWordChars
//     characters are skipped: WordPiece turns them into [UNK] anyway);
//  2. the vocab starts with [PAD] [UNK] [CLS] [SEP] [MASK], then every character seen, as a
//     word start and as a "##" continuation (so any text made of seen characters encodes without
//     [UNK]), most frequent first;
//  3. each word is a sequence of pieces, one per character; repeatedly the most frequent pair of
//     adjacent pieces is merged into a new token ("th" + "##e" -> "the"), until vocab_size
//     tokens or no pair is seen min_pair_count times. Frequent words thus become single tokens
//     and frequent stems and endings ("##ing") become pieces. Ties go to the pair whose pieces
//     came first in the vocab, so the result depends only on the word counts.
class VocabBuilder {
 public:
  explicit VocabBuilder(VocabBuilderOptions options = {});
  void add_text(const std::string& text);
  int64_t num_words() const { return total_words_; }  // running words, not distinct ones
  // Tokens in id order. Throws tessel::Error when no words were added, or when vocab_size is
  // below the specials plus the two forms of every character.
  std::vector<std::string> build() const;

 private:
  VocabBuilderOptions options_;
  BasicTokenizer basic_;
  std::unordered_map<std::u32string, int64_t> word_counts_;
  int64_t total_words_ = 0;
};

// Writes one token per line. Throws tessel::Error naming `path` when it cannot be written.
void write_vocab(const std::vector<std::string>& tokens, const std::string& path);

}  // namespace tessel::text
