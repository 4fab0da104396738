// BERT (Devlin et al.) with the module tree and parameter names of the public checkpoints
// (HuggingFace BertModel / BertForPreTraining): post-LN encoder, erf GELU, tied MLM decoder.
//   models::BertForPreTraining model(models::BertConfig::by_name("mini").vocab_size(1000));
//   auto [mlm_logits, nsp_logits] = model.forward(input_ids, token_type_ids, attention_mask);
// Tensor parallel (Megatron-LM's split): the same classes built for a tensor-parallel group
// (an id of parallel::register_tp_group) split the attention heads, the MLP and the vocabulary
// over its ranks, with the same module and parameter names:
//   auto shard = models::shard_bert(model, tp_group);  // this rank's part of `model`
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/arg.h"
#include "nn/nn.h"

namespace tessel::models {

// Hyperparameters with BERT's defaults: bert-base sizes, the bert-base-uncased vocabulary, 512
// positions, two segment types, dropout 0.1, LayerNorm eps 1e-12, init std 0.02.
class BertConfig {
 public:
  BertConfig() = default;

  // tiny (2 layers, hidden 128, 2 heads, intermediate 512), mini (4, 256, 4, 1024), small (4,
  // 512, 8, 2048), base (12, 768, 12, 3072), large (24, 1024, 16, 4096).
  static BertConfig tiny();
  static BertConfig mini();
  static BertConfig small();
  static BertConfig base();
  static BertConfig large();
  // One of the presets above by name; an error listing the known names otherwise.
  static BertConfig by_name(const std::string& name);
  static std::vector<std::string> known_names();
  // Both dropout probabilities (hidden and attention) at once.
  BertConfig& dropout(double p) { return hidden_dropout_prob(p).attention_probs_dropout_prob(p); }

  int64_t head_size() const { return hidden_size_ / num_attention_heads_; }

  // Throws a tessel::Error naming the first field out of range.
  void validate() const;

  TESSEL_ARG(int64_t, vocab_size) = 30522;
  TESSEL_ARG(int64_t, hidden_size) = 768;
  TESSEL_ARG(int64_t, num_hidden_layers) = 12;
  TESSEL_ARG(int64_t, num_attention_heads) = 12;
  TESSEL_ARG(int64_t, intermediate_size) = 3072;
  // "gelu" (erf form), "gelu_new" (tanh approximation) or "relu" (HuggingFace's names).
  TESSEL_ARG(std::string, hidden_act) = "gelu";
  TESSEL_ARG(double, hidden_dropout_prob) = 0.1;
  TESSEL_ARG(double, attention_probs_dropout_prob) = 0.1;
  TESSEL_ARG(int64_t, max_position_embeddings) = 512;
  TESSEL_ARG(int64_t, type_vocab_size) = 2;
  TESSEL_ARG(double, initializer_range) = 0.02;
  TESSEL_ARG(double, layer_norm_eps) = 1e-12;
};

// word + position + token type embeddings, then LayerNorm and dropout. With a tensor-parallel
// group (tp_group >= 0) the word table is split by vocabulary rows
// (parallel::VocabParallelEmbedding).
class BertEmbeddings : public nn::Module {
 public:
  explicit BertEmbeddings(const BertConfig& config, int64_t tp_group = -1);
  // input_ids (N, T) i64; token_type_ids (N, T) or undefined (all type 0) -> (N, T, hidden)
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids = Tensor());

  BertConfig config;
  std::shared_ptr<nn::Embedding> word_embeddings;
  std::shared_ptr<nn::Embedding> position_embeddings;
  std::shared_ptr<nn::Embedding> token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> norm;  // "LayerNorm"
};

// One post-LN encoder layer: self-attention (attention.self, attention.output) and the
// feed-forward block (intermediate, output), each followed by dropout, residual and LayerNorm.
// With a tensor-parallel group (tp_group >= 0) each rank holds heads / tp heads: query, key,
// value and intermediate are column parallel, the two output denses row parallel
// (parallel::make_linear), so a layer costs two all-reduces forward and two backward.
class BertLayer : public nn::Module {
 public:
  explicit BertLayer(const BertConfig& config, int64_t tp_group = -1);
  // hidden (N, T, hidden); attention_bias (N, 1, 1, T) added to the scores, or undefined.
  Tensor forward(const Tensor& hidden, const Tensor& attention_bias = Tensor());

  BertConfig config;
  int64_t tp_group;
  int64_t local_heads;                             // num_attention_heads / tp
  std::shared_ptr<nn::Linear> query, key, value;   // attention.self.*
  std::shared_ptr<nn::Linear> attention_dense;     // attention.output.dense
  std::shared_ptr<nn::LayerNorm> attention_norm;   // attention.output.LayerNorm
  std::shared_ptr<nn::Linear> intermediate_dense;  // intermediate.dense
  std::shared_ptr<nn::Linear> output_dense;        // output.dense
  std::shared_ptr<nn::LayerNorm> output_norm;      // output.LayerNorm

 private:
  Tensor self_attention(const Tensor& hidden, const Tensor& attention_bias);
};

struct BertModelOutput {
  Tensor sequence_output;  // (N, T, hidden): the last layer's hidden states
  Tensor pooled_output;    // (N, hidden): tanh(dense(first token))
};

// embeddings, encoder.layer.<i>, pooler.dense. Built for a tensor-parallel group, the embeddings
// and layers are split (see above) and the parameters are left for load_shards to fill: drawing
// them would only move the random stream.
class BertModel : public nn::Module {
 public:
  explicit BertModel(const BertConfig& config, int64_t tp_group = -1);
  // input_ids (N, T) i64 in [0, vocab_size); token_type_ids (N, T) i64 in [0, type_vocab_size)
  // or undefined (all zeros); attention_mask (N, T) of 1 (attend) / 0 (padding), any dtype, or
  // undefined (attend everywhere). T <= max_position_embeddings.
  BertModelOutput forward(const Tensor& input_ids, const Tensor& token_type_ids = Tensor(),
                          const Tensor& attention_mask = Tensor());
  // Re-draws every parameter the way BERT initialises: weights N(0, initializer_range), biases
  // zero, LayerNorm ones and zeros.
  void reset_parameters();

  BertConfig config;
  int64_t tp_group;
  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<nn::ModuleList> layers;  // encoder.layer, of BertLayer
  std::shared_ptr<nn::Linear> pooler_dense;

 private:
  void check_inputs(const Tensor& input_ids, const Tensor& token_type_ids,
                    const Tensor& attention_mask) const;
};

struct BertPreTrainingOutput {
  // (N, T, vocab_size), or (N, T, vocab_size / tp): this rank's columns. Undefined when forward
  // was asked for MlmOutput::kHeadInput.
  Tensor mlm_logits;
  Tensor nsp_logits;         // (N, 2): is-next, not-next
  int64_t vocab_group = -1;  // the tensor-parallel group mlm_logits is split over, or -1
  // The decoder's input (N, T, hidden) and the decoder itself: without mlm_logits,
  // bert_pretraining_loss scores these by linear_cross_entropy.
  Tensor mlm_hidden;
  Tensor decoder_weight, decoder_bias;
};

// What BertForPreTraining::forward makes of the MLM head. kLogits: the (N, T, vocab) logits, as
// the checkpoints' models do. kHeadInput: only the decoder's input, which bert_pretraining_loss
// scores in chunks of rows (linear_cross_entropy) so the logits never exist whole: with BERT's
// vocabulary of 30522 they and their log-probabilities are the largest tensors of a training
// step. A tensor-parallel model, whose logits are split over its group, always makes logits.
enum class MlmOutput { kLogits, kHeadInput };

struct BertPreTrainingLoss {
  Tensor total;  // mlm + nsp (mlm alone without NSP labels)
  Tensor mlm;    // mean cross-entropy over positions whose label is not -100
  Tensor nsp;    // mean cross-entropy over the batch; undefined without NSP labels
};

// bert (BertModel) and the pre-training heads: cls.predictions (transform.dense, GELU,
// transform.LayerNorm, then the decoder, whose weight is the word embedding table, plus
// cls.predictions.bias) and cls.seq_relationship. The tied table is one parameter, listed once
// under bert.embeddings.word_embeddings.weight; its gradient sums both uses. Built for a
// tensor-parallel group, the decoder and its bias are split by vocabulary rows with the table.
class BertForPreTraining : public nn::Module {
 public:
  explicit BertForPreTraining(const BertConfig& config, int64_t tp_group = -1);
  BertPreTrainingOutput forward(const Tensor& input_ids, const Tensor& token_type_ids = Tensor(),
                                const Tensor& attention_mask = Tensor(),
                                MlmOutput mlm_output = MlmOutput::kLogits);
  void reset_parameters();
  // The decoder's weight: the same tensor as bert->embeddings->word_embeddings->weight.
  const Tensor& decoder_weight() const { return bert->embeddings->word_embeddings->weight; }

  BertConfig config;
  int64_t tp_group;
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<nn::Linear> transform_dense;    // cls.predictions.transform.dense
  std::shared_ptr<nn::LayerNorm> transform_norm;  // cls.predictions.transform.LayerNorm
  Tensor decoder_bias;                            // cls.predictions.bias (vocab_size [/ tp])
  std::shared_ptr<nn::Linear> seq_relationship;   // cls.seq_relationship
};

// mlm_labels (N, T) i64: the original token at masked positions, -100 elsewhere.
// nsp_labels (N) i64 (0: B follows A, 1: random B), or undefined for an MLM-only loss.
// Logits split over a group are scored by parallel::vocab_parallel_cross_entropy (the same
// loss on every rank of the group).
BertPreTrainingLoss bert_pretraining_loss(const BertPreTrainingOutput& output,
                                          const Tensor& mlm_labels,
                                          const Tensor& nsp_labels = Tensor());

// This rank's part of `full` for the tensor-parallel group `tp_group`: a
// BertForPreTraining(full.config, tp_group) on full's device, in full's training mode, holding
// its slices of full's parameters (parallel::load_shards). A local call, no collective.
std::shared_ptr<BertForPreTraining> shard_bert(const BertForPreTraining& full, int64_t tp_group);

}  // namespace tessel::models
