// Masked-language-model and next-sentence-prediction examples for BERT pre-training, batched as
// i64 tensors, plus the unigram baseline a trained model must beat on the masked tokens.
//   MlmDataset data(tokenize_corpus(split.train, vocab), vocab, MlmOptions().seed(1));
//   MlmBatch batch = data.batch({0, 1, 2, 3}, /*epoch=*/0);  // input_ids (4,128), ...
#pragma once

#include <cstdint>
#include <vector>

#include "core/arg.h"
#include "core/tensor.h"
#include "text/corpus.h"
#include "text/wordpiece.h"

namespace tessel::text {

// A document's segments as token ids (no [CLS]/[SEP]).
using TokenizedDocument = std::vector<std::vector<int64_t>>;

// Encodes every segment; segments without tokens and documents without segments are dropped.
std::vector<TokenizedDocument> tokenize_corpus(const Corpus& corpus, const WordPiece& vocab);

// Label at positions that are not predicted (PyTorch's cross-entropy ignore_index).
constexpr int64_t kIgnoreLabel = -100;

class MlmOptions {
 public:
  // max_predictions, or 20 * max_seq / 128 (at least 1) when it is -1.
  int64_t predictions_per_sequence() const;

  TESSEL_ARG(int64_t, max_seq) = 128;
  // -1: 20 per 128 tokens of max_seq, as BERT.
  TESSEL_ARG(int64_t, max_predictions) = -1;
  TESSEL_ARG(double, mask_prob) = 0.15;
  // Of the chosen tokens, the share replaced by [MASK].
  TESSEL_ARG(double, mask_token_prob) = 0.8;
  // Of the chosen tokens, the share replaced by a random non-special token; the rest stay.
  TESSEL_ARG(double, random_token_prob) = 0.1;
  TESSEL_ARG(double, random_next_prob) = 0.5;
  // BERT's: how often a pair aims for a random length shorter than max_seq.
  TESSEL_ARG(double, short_seq_prob) = 0.1;
  TESSEL_ARG(uint64_t, seed) = 0;
};

// One packed sequence: [CLS] A [SEP] B [SEP] then [PAD] up to max_seq.
struct MlmExample {
  std::vector<int64_t> input_ids;       // (T) with masks applied
  std::vector<int64_t> token_type_ids;  // (T) 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding
  std::vector<int64_t> attention_mask;  // (T) 1 on tokens, 0 on padding
  std::vector<int64_t> mlm_labels;      // (T) original id where predicted, kIgnoreLabel elsewhere
  int64_t nsp_label = 0;                // 0: B follows A in its document, 1: B is random
};

struct MlmBatch {
  Tensor input_ids;       // (N,T) i64
  Tensor token_type_ids;  // (N,T) i64
  Tensor attention_mask;  // (N,T) i64
  Tensor mlm_labels;      // (N,T) i64
  Tensor nsp_labels;      // (N) i64
};

// Stacks examples of equal length into i64 tensors. Throws on an empty list or unequal lengths.
MlmBatch collate(const std::vector<MlmExample>& examples);

// Segment A and B of one example before masking.
struct SentencePair {
  std::vector<int64_t> a;
  std::vector<int64_t> b;
  bool random_next = false;
};

// Random numbers: Philox 4x32-10 (core/rng.h) keyed by a hash of (seed, purpose, epoch, index),
// so each example's numbers depend only on those, whatever the order or thread it is made in.
//
// Pairs (BERT's create_instances_from_document): segments of a document are gathered until they
// reach the target length (max_seq - 3, or with short_seq_prob a random shorter one); A is a
// random-length prefix of them; with random_next_prob, B is a run of segments from a random
// start in another document (the unused segments of this one are put back), otherwise B is the
// rest of the gathered segments. Where only one segment was gathered, an actual-next pair splits
// it at a random token. The pair is trimmed to max_seq - 3 tokens from the longer side, at the
// front or the back at random. A single one-token document with no neighbour is skipped.
//
// Masking (BERT's create_masked_lm_predictions): candidates are the positions of non-special
// tokens (so not [CLS] [SEP] [PAD] [UNK] [MASK]); round(mask_prob * candidates) of them (at
// least 1, at most predictions_per_sequence()) are chosen at random; each becomes [MASK] with
// mask_token_prob, a uniformly drawn non-special token with random_token_prob, else stays.
class MlmDataset {
 public:
  // Pairs segments once, from options.seed. Throws tessel::Error on bad options, or when the
  // documents hold no tokens (e.g. an empty corpus).
  MlmDataset(const std::vector<TokenizedDocument>& documents, const WordPiece& vocab,
             MlmOptions options = {});

  int64_t size() const { return static_cast<int64_t>(pairs_.size()); }
  const std::vector<SentencePair>& pairs() const { return pairs_; }
  const MlmOptions& options() const { return options_; }
  // The masked example for pair `index`; a new `epoch` draws new masks (dynamic masking).
  MlmExample example(int64_t index, int64_t epoch = 0) const;
  MlmBatch batch(const std::vector<int64_t>& indices, int64_t epoch = 0) const;

 private:
  void make_pairs(const std::vector<TokenizedDocument>& all_documents);

  MlmOptions options_;
  std::vector<SentencePair> pairs_;
  std::vector<bool> special_;               // by token id
  std::vector<int64_t> random_candidates_;  // non-special ids
  int64_t vocab_size_;
  int64_t cls_id_, sep_id_, pad_id_, mask_id_;
};

// The unigram baseline: predict every masked token by its frequency in the training text,
// p(t) = (count(t) + 1) / (total + vocab_size), counts over the non-special tokens of the
// training documents (add-one, so a token unseen in training costs finite nats).
class UnigramBaseline {
 public:
  UnigramBaseline(const std::vector<TokenizedDocument>& train, const WordPiece& vocab);
  // -log p(id), in nats.
  double nats(int64_t id) const;
  // Mean -log p(label) over the positions whose label is not kIgnoreLabel; NaN when there is
  // none. Every example of `held_out` at `epoch`, or one batch's (N,T) mlm_labels.
  double cross_entropy(const MlmDataset& held_out, int64_t epoch = 0) const;
  double cross_entropy(const Tensor& mlm_labels) const;
  int64_t total_tokens() const { return total_; }

 private:
  std::vector<int64_t> counts_;
  int64_t total_ = 0;
};

}  // namespace tessel::text
