#include "text/mlm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/rng.h"
#include "core/threading.h"

namespace tessel::text {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

enum class Purpose : uint64_t { kPairing = 1, kMasking = 2 };

// A sequential stream of Philox numbers under a key hashed from (seed, purpose, epoch, index).
class RandomStream {
 public:
  RandomStream(uint64_t seed, Purpose purpose, uint64_t epoch, uint64_t index)
      : key_(splitmix64(splitmix64(splitmix64(seed ^ static_cast<uint64_t>(purpose)) ^ epoch) ^
                        index)) {}

  uint32_t next_u32() {
    if (used_ == 4) {
      block_ = philox4x32(key_, counter_++);
      used_ = 0;
    }
    return block_[used_++];
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() {
    const uint64_t high = next_u32(), low = next_u32();
    return static_cast<double>((high << 21) ^ (low >> 11)) * 0x1.0p-53;
  }
  // Uniform in [0, n), n > 0 (64 random bits, so the modulo bias is negligible).
  int64_t below(int64_t n) {
    const uint64_t high = next_u32(), low = next_u32();
    return static_cast<int64_t>(((high << 32) | low) % static_cast<uint64_t>(n));
  }
  // Uniform in [low, high].
  int64_t between(int64_t low, int64_t high) { return low + below(high - low + 1); }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

void append_segments(std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& segments,
                     size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i)
    out.insert(out.end(), segments[i].begin(), segments[i].end());
}

// BERT's truncate_seq_pair: trims the longer side, at the front or the back at random.
void truncate_pair(std::vector<int64_t>& a, std::vector<int64_t>& b, int64_t max_tokens,
                   RandomStream& random) {
  while (static_cast<int64_t>(a.size() + b.size()) > max_tokens) {
    auto& longer = a.size() > b.size() ? a : b;
    if (random.uniform() < 0.5) {
      longer.erase(longer.begin());
    } else {
      longer.pop_back();
    }
  }
}

void check_probability(double value, const char* name) {
  TESSEL_CHECK(value >= 0.0 && value <= 1.0, "MlmOptions: ", name, " must be in [0, 1], got ",
               value);
}

}  // namespace

std::vector<TokenizedDocument> tokenize_corpus(const Corpus& corpus, const WordPiece& vocab) {
  std::vector<TokenizedDocument> tokenized(corpus.size());
  parallel_for(0, corpus.size(), 64, [&](int64_t begin, int64_t end) {
    for (int64_t d = begin; d < end; ++d) {
      for (const auto& segment : corpus[d].segments) {
        std::vector<int64_t> ids = vocab.encode(segment);
        if (!ids.empty()) tokenized[d].push_back(std::move(ids));
      }
    }
  });
  tokenized.erase(std::remove_if(tokenized.begin(), tokenized.end(),
                                 [](const TokenizedDocument& d) { return d.empty(); }),
                  tokenized.end());
  return tokenized;
}

int64_t MlmOptions::predictions_per_sequence() const {
  if (max_predictions_ >= 0) return max_predictions_;
  return std::max<int64_t>(1, max_seq_ * 20 / 128);
}

MlmBatch collate(const std::vector<MlmExample>& examples) {
  TESSEL_CHECK(!examples.empty(), "collate: no examples");
  const int64_t count = static_cast<int64_t>(examples.size());
  const int64_t length = static_cast<int64_t>(examples[0].input_ids.size());
  std::vector<int64_t> input_ids, token_type_ids, attention_mask, mlm_labels, nsp_labels;
  for (auto* field : {&input_ids, &token_type_ids, &attention_mask, &mlm_labels}) {
    field->reserve(count * length);
  }
  for (int64_t i = 0; i < count; ++i) {
    const MlmExample& example = examples[i];
    const bool same_length = static_cast<int64_t>(example.input_ids.size()) == length &&
                             static_cast<int64_t>(example.token_type_ids.size()) == length &&
                             static_cast<int64_t>(example.attention_mask.size()) == length &&
                             static_cast<int64_t>(example.mlm_labels.size()) == length;
    TESSEL_CHECK(same_length, "collate: example ", i, " has fields of length ",
                 example.input_ids.size(), "/", example.token_type_ids.size(), "/",
                 example.attention_mask.size(), "/", example.mlm_labels.size(),
                 " but example 0 has length ", length);
    input_ids.insert(input_ids.end(), example.input_ids.begin(), example.input_ids.end());
    token_type_ids.insert(token_type_ids.end(), example.token_type_ids.begin(),
                          example.token_type_ids.end());
    attention_mask.insert(attention_mask.end(), example.attention_mask.begin(),
                          example.attention_mask.end());
    mlm_labels.insert(mlm_labels.end(), example.mlm_labels.begin(), example.mlm_labels.end());
    nsp_labels.push_back(example.nsp_label);
  }
  return {from_vector(input_ids, {count, length}), from_vector(token_type_ids, {count, length}),
          from_vector(attention_mask, {count, length}), from_vector(mlm_labels, {count, length}),
          from_vector(nsp_labels, {count})};
}

MlmDataset::MlmDataset(const std::vector<TokenizedDocument>& documents, const WordPiece& vocab,
                       MlmOptions options)
    : options_(options),
      vocab_size_(vocab.size()),
      cls_id_(vocab.cls_id()),
      sep_id_(vocab.sep_id()),
      pad_id_(vocab.pad_id()),
      mask_id_(vocab.mask_id()) {
  TESSEL_CHECK(options_.max_seq() >= 5, "MlmOptions: max_seq must be at least 5 ([CLS] A [SEP] B ",
               "[SEP] with one token each), got ", options_.max_seq());
  TESSEL_CHECK(options_.max_predictions() == -1 || options_.max_predictions() >= 1,
               "MlmOptions: max_predictions must be >= 1 (or -1 for 20 per 128 tokens), got ",
               options_.max_predictions());
  check_probability(options_.mask_prob(), "mask_prob");
  check_probability(options_.mask_token_prob(), "mask_token_prob");
  check_probability(options_.random_token_prob(), "random_token_prob");
  check_probability(options_.random_next_prob(), "random_next_prob");
  check_probability(options_.short_seq_prob(), "short_seq_prob");
  TESSEL_CHECK(options_.mask_token_prob() + options_.random_token_prob() <= 1.0 + 1e-12,
               "MlmOptions: mask_token_prob + random_token_prob must be <= 1, got ",
               options_.mask_token_prob(), " + ", options_.random_token_prob());

  special_.resize(vocab_size_);
  for (int64_t id = 0; id < vocab_size_; ++id) {
    special_[id] = vocab.is_special(id);
    if (!special_[id]) random_candidates_.push_back(id);
  }
  TESSEL_CHECK(!random_candidates_.empty(), "MlmDataset: the vocab has only special tokens");

  int64_t tokens = 0;
  for (const auto& document : documents) {
    for (const auto& segment : document) {
      for (int64_t id : segment) {
        TESSEL_CHECK(id >= 0 && id < vocab_size_, "MlmDataset: token id ", id,
                     " is outside the vocab [0, ", vocab_size_, ")");
      }
      tokens += static_cast<int64_t>(segment.size());
    }
  }
  TESSEL_CHECK(tokens > 0, "MlmDataset: the ", documents.size(),
               " documents hold no tokens (is the corpus empty?)");
  make_pairs(documents);
  TESSEL_CHECK(!pairs_.empty(), "MlmDataset: no sentence pair could be made from ",
               documents.size(), " document(s) of ", tokens, " token(s)");
}

void MlmDataset::make_pairs(const std::vector<TokenizedDocument>& all_documents) {
  // Without empty segments and documents, every segment and random document holds tokens.
  std::vector<TokenizedDocument> documents;
  for (const auto& document : all_documents) {
    TokenizedDocument kept;
    for (const auto& segment : document) {
      if (!segment.empty()) kept.push_back(segment);
    }
    if (!kept.empty()) documents.push_back(std::move(kept));
  }
  RandomStream random(options_.seed(), Purpose::kPairing, 0, 0);
  const int64_t max_tokens = options_.max_seq() - 3;
  const int64_t num_documents = static_cast<int64_t>(documents.size());
  for (int64_t d = 0; d < num_documents; ++d) {
    const TokenizedDocument& document = documents[d];
    int64_t target = max_tokens;
    if (random.uniform() < options_.short_seq_prob()) target = random.between(2, max_tokens);

    std::vector<std::vector<int64_t>> chunk;
    int64_t chunk_length = 0;
    for (size_t i = 0; i < document.size(); ++i) {
      chunk.push_back(document[i]);
      chunk_length += static_cast<int64_t>(document[i].size());
      if (i + 1 < document.size() && chunk_length < target) continue;

      SentencePair pair;
      // A random B needs another document; an actual B needs two segments or two tokens.
      const bool can_be_actual = chunk.size() >= 2 || chunk_length >= 2;
      pair.random_next =
          num_documents > 1 && (!can_be_actual || random.uniform() < options_.random_next_prob());
      const size_t a_end = chunk.size() >= 2 ? random.between(1, chunk.size() - 1) : 1;
      append_segments(pair.a, chunk, 0, a_end);
      if (pair.random_next) {
        const int64_t b_target = std::max<int64_t>(1, target - static_cast<int64_t>(pair.a.size()));
        // Another document: a draw among the others, so never this one.
        int64_t other = random.below(num_documents - 1);
        if (other >= d) ++other;
        const TokenizedDocument& random_document = documents[other];
        for (size_t j = random.below(random_document.size()); j < random_document.size(); ++j) {
          pair.b.insert(pair.b.end(), random_document[j].begin(), random_document[j].end());
          if (static_cast<int64_t>(pair.b.size()) >= b_target) break;
        }
        // The segments not used for A go back, to start the next chunk.
        i -= chunk.size() - a_end;
      } else if (chunk.size() >= 2) {
        append_segments(pair.b, chunk, a_end, chunk.size());
      } else if (chunk_length >= 2) {
        // One segment: its two halves, split at a random token, make an actual-next pair.
        const int64_t split = random.between(1, chunk_length - 1);
        pair.b.assign(pair.a.begin() + split, pair.a.end());
        pair.a.resize(split);
      }
      truncate_pair(pair.a, pair.b, max_tokens, random);
      if (!pair.a.empty() && !pair.b.empty()) pairs_.push_back(std::move(pair));
      chunk.clear();
      chunk_length = 0;
    }
  }
}

MlmExample MlmDataset::example(int64_t index, int64_t epoch) const {
  TESSEL_CHECK(index >= 0 && index < size(), "MlmDataset: example index ", index,
               " is outside [0, ", size(), ")");
  const SentencePair& pair = pairs_[index];
  const int64_t length = options_.max_seq();
  MlmExample example;
  example.input_ids.reserve(length);
  example.token_type_ids.reserve(length);
  example.input_ids.push_back(cls_id_);
  example.input_ids.insert(example.input_ids.end(), pair.a.begin(), pair.a.end());
  example.input_ids.push_back(sep_id_);
  example.token_type_ids.assign(example.input_ids.size(), 0);
  example.input_ids.insert(example.input_ids.end(), pair.b.begin(), pair.b.end());
  example.input_ids.push_back(sep_id_);
  example.token_type_ids.resize(example.input_ids.size(), 1);
  const int64_t used = static_cast<int64_t>(example.input_ids.size());
  example.attention_mask.assign(used, 1);
  example.attention_mask.resize(length, 0);
  example.input_ids.resize(length, pad_id_);
  example.token_type_ids.resize(length, 0);
  example.mlm_labels.assign(length, kIgnoreLabel);
  example.nsp_label = pair.random_next ? 1 : 0;

  std::vector<int64_t> candidates;
  for (int64_t position = 0; position < used; ++position) {
    if (!special_[example.input_ids[position]]) candidates.push_back(position);
  }
  if (candidates.empty()) return example;
  const int64_t num_candidates = static_cast<int64_t>(candidates.size());
  const int64_t wanted = std::max<int64_t>(1, std::llround(num_candidates * options_.mask_prob()));
  const int64_t to_predict =
      std::min({wanted, num_candidates, options_.predictions_per_sequence()});
  RandomStream random(options_.seed(), Purpose::kMasking, static_cast<uint64_t>(epoch),
                      static_cast<uint64_t>(index));
  const int64_t num_random = static_cast<int64_t>(random_candidates_.size());
  for (int64_t k = 0; k < to_predict; ++k) {
    // Partial Fisher-Yates: candidates[k] becomes a uniform draw from those not yet chosen.
    std::swap(candidates[k], candidates[k + random.below(num_candidates - k)]);
    const int64_t position = candidates[k];
    example.mlm_labels[position] = example.input_ids[position];
    const double choice = random.uniform();
    if (choice < options_.mask_token_prob()) {
      example.input_ids[position] = mask_id_;
    } else if (choice < options_.mask_token_prob() + options_.random_token_prob()) {
      example.input_ids[position] = random_candidates_[random.below(num_random)];
    }
  }
  return example;
}

MlmBatch MlmDataset::batch(const std::vector<int64_t>& indices, int64_t epoch) const {
  TESSEL_CHECK(!indices.empty(), "MlmDataset::batch: no indices");
  std::vector<MlmExample> examples;
  examples.reserve(indices.size());
  for (int64_t index : indices) examples.push_back(example(index, epoch));
  return collate(examples);
}

UnigramBaseline::UnigramBaseline(const std::vector<TokenizedDocument>& train,
                                 const WordPiece& vocab)
    : counts_(vocab.size(), 0) {
  const int64_t vocab_size = vocab.size();
  for (const auto& document : train) {
    for (const auto& segment : document) {
      for (int64_t id : segment) {
        TESSEL_CHECK(id >= 0 && id < vocab_size, "UnigramBaseline: token id ", id,
                     " is outside the vocab [0, ", vocab_size, ")");
        if (vocab.is_special(id)) continue;  // never a label: [UNK] and the like
        ++counts_[id];
        ++total_;
      }
    }
  }
}

double UnigramBaseline::nats(int64_t id) const {
  const int64_t vocab_size = static_cast<int64_t>(counts_.size());
  TESSEL_CHECK(id >= 0 && id < vocab_size, "UnigramBaseline: token id ", id,
               " is outside the vocab [0, ", vocab_size, ")");
  return -std::log(static_cast<double>(counts_[id] + 1) / static_cast<double>(total_ + vocab_size));
}

double UnigramBaseline::cross_entropy(const Tensor& mlm_labels) const {
  double sum = 0;
  int64_t count = 0;
  for (int64_t label : mlm_labels.to_vector<int64_t>()) {
    if (label == kIgnoreLabel) continue;
    sum += nats(label);
    ++count;
  }
  return count ? sum / count : std::numeric_limits<double>::quiet_NaN();
}

double UnigramBaseline::cross_entropy(const MlmDataset& held_out, int64_t epoch) const {
  double sum = 0;
  int64_t count = 0;
  for (int64_t index = 0; index < held_out.size(); ++index) {
    for (int64_t label : held_out.example(index, epoch).mlm_labels) {
      if (label == kIgnoreLabel) continue;
      sum += nats(label);
      ++count;
    }
  }
  return count ? sum / count : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace tessel::text
