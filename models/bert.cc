#include "models/bert.h"

#include <cmath>

#include "ops/ops.h"
#include "parallel/tensor_parallel.h"

namespace tessel::models {

namespace {

// HuggingFace's masked-position bias: added to the attention scores of padded keys, so their
// softmax weight underflows to exactly zero.
constexpr double kMaskedScoreBias = -10000.0;

Tensor activation(const Tensor& x, const std::string& name) {
  if (name == "gelu") return gelu(x, "none");
  if (name == "gelu_new") return gelu(x, "tanh");
  return relu(x);  // validate() admits only these three
}

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  return text;
}

// Checks that every id lies in [0, limit), naming the argument and the config field. Values
// cannot be read on the meta device (shape-only tracing), so the check is skipped there.
void check_id_range(const Tensor& ids, int64_t limit, const char* argument, const char* field) {
  if (ids.device().is_meta() || ids.numel() == 0) return;
  const int64_t low = min(ids).item<int64_t>();
  const int64_t high = max(ids).item<int64_t>();
  TESSEL_CHECK(low >= 0 && high < limit, "BertModel: ", argument, " must lie in [0, ", limit, ") (",
               field, "=", limit, "), got values from ", low, " to ", high);
}

// BERT's initialisation for every layer under `root`: weights N(0, std), biases zero,
// LayerNorm weight one and bias zero.
void init_bert_weights(nn::Module& root, double stddev) {
  for (auto& [name, module] : root.named_modules()) {
    if (auto* linear = dynamic_cast<nn::Linear*>(module)) {
      nn::init::normal_(linear->weight, 0.0, stddev);
      if (linear->bias.defined()) nn::init::zeros_(linear->bias);
    } else if (auto* embedding = dynamic_cast<nn::Embedding*>(module)) {
      nn::init::normal_(embedding->weight, 0.0, stddev);
    } else if (auto* norm = dynamic_cast<nn::LayerNorm*>(module)) {
      norm->reset_parameters();
    }
  }
}

std::shared_ptr<nn::LayerNorm> make_layer_norm(const BertConfig& config) {
  return std::make_shared<nn::LayerNorm>(
      nn::LayerNormOptions({config.hidden_size()}).eps(config.layer_norm_eps()));
}

// cls.predictions: holds the decoder's bias, split by vocabulary rows like the word table when
// the model is built for a tensor-parallel group.
class BertLMPredictionHead : public nn::Module, public parallel::SplitParameters {
 public:
  explicit BertLMPredictionHead(int64_t tp_group)
      : nn::Module("BertLMPredictionHead"), tp_group_(tp_group) {}
  std::map<std::string, int64_t> split_parameter_dims() const override {
    if (tp_group_ < 0) return {};
    return {{"bias", 0}};
  }

 private:
  int64_t tp_group_;
};

}  // namespace

// ---- BertConfig ----

BertConfig BertConfig::tiny() {
  return BertConfig()
      .num_hidden_layers(2)
      .hidden_size(128)
      .num_attention_heads(2)
      .intermediate_size(512);
}
BertConfig BertConfig::mini() {
  return BertConfig()
      .num_hidden_layers(4)
      .hidden_size(256)
      .num_attention_heads(4)
      .intermediate_size(1024);
}
BertConfig BertConfig::small() {
  return BertConfig()
      .num_hidden_layers(4)
      .hidden_size(512)
      .num_attention_heads(8)
      .intermediate_size(2048);
}
BertConfig BertConfig::base() { return BertConfig(); }
BertConfig BertConfig::large() {
  return BertConfig()
      .num_hidden_layers(24)
      .hidden_size(1024)
      .num_attention_heads(16)
      .intermediate_size(4096);
}

std::vector<std::string> BertConfig::known_names() {
  return {"tiny", "mini", "small", "base", "large"};
}

BertConfig BertConfig::by_name(const std::string& name) {
  if (name == "tiny") return tiny();
  if (name == "mini") return mini();
  if (name == "small") return small();
  if (name == "base") return base();
  if (name == "large") return large();
  TESSEL_FAIL("BertConfig: unknown configuration '", name, "'; known: ", join(known_names()));
}

void BertConfig::validate() const {
  TESSEL_CHECK(vocab_size_ > 0, "BertConfig: vocab_size must be positive, got ", vocab_size_);
  TESSEL_CHECK(hidden_size_ > 0 && num_attention_heads_ > 0,
               "BertConfig: hidden_size and num_attention_heads must be positive, got ",
               hidden_size_, " and ", num_attention_heads_);
  TESSEL_CHECK(hidden_size_ % num_attention_heads_ == 0, "BertConfig: hidden_size ", hidden_size_,
               " is not a multiple of num_attention_heads ", num_attention_heads_);
  TESSEL_CHECK(num_hidden_layers_ >= 0, "BertConfig: num_hidden_layers must not be negative, got ",
               num_hidden_layers_);
  TESSEL_CHECK(intermediate_size_ > 0, "BertConfig: intermediate_size must be positive, got ",
               intermediate_size_);
  TESSEL_CHECK(hidden_act_ == "gelu" || hidden_act_ == "gelu_new" || hidden_act_ == "relu",
               "BertConfig: hidden_act must be \"gelu\", \"gelu_new\" or \"relu\", got \"",
               hidden_act_, "\"");
  TESSEL_CHECK(hidden_dropout_prob_ >= 0 && hidden_dropout_prob_ <= 1 &&
                   attention_probs_dropout_prob_ >= 0 && attention_probs_dropout_prob_ <= 1,
               "BertConfig: dropout probabilities must be in [0, 1], got hidden_dropout_prob=",
               hidden_dropout_prob_,
               " and attention_probs_dropout_prob=", attention_probs_dropout_prob_);
  TESSEL_CHECK(max_position_embeddings_ > 0 && type_vocab_size_ > 0,
               "BertConfig: max_position_embeddings and type_vocab_size must be positive, got ",
               max_position_embeddings_, " and ", type_vocab_size_);
  TESSEL_CHECK(initializer_range_ >= 0 && layer_norm_eps_ > 0,
               "BertConfig: initializer_range must not be negative and layer_norm_eps must be "
               "positive, got ",
               initializer_range_, " and ", layer_norm_eps_);
}

// ---- BertEmbeddings ----

BertEmbeddings::BertEmbeddings(const BertConfig& config_in, int64_t tp_group)
    : nn::Module("BertEmbeddings"), config(config_in) {
  config.validate();
  const int64_t hidden = config.hidden_size();
  std::shared_ptr<nn::Embedding> words;
  if (tp_group < 0)
    words = std::make_shared<nn::Embedding>(nn::EmbeddingOptions(config.vocab_size(), hidden));
  else
    words =
        std::make_shared<parallel::VocabParallelEmbedding>(config.vocab_size(), hidden, tp_group);
  word_embeddings = register_module("word_embeddings", words);
  position_embeddings =
      register_module("position_embeddings", std::make_shared<nn::Embedding>(nn::EmbeddingOptions(
                                                 config.max_position_embeddings(), hidden)));
  token_type_embeddings = register_module(
      "token_type_embeddings",
      std::make_shared<nn::Embedding>(nn::EmbeddingOptions(config.type_vocab_size(), hidden)));
  norm = register_module("LayerNorm", make_layer_norm(config));
}

Tensor BertEmbeddings::forward(const Tensor& input_ids, const Tensor& token_type_ids) {
  const int64_t seq_len = input_ids.size(1);
  Tensor words = word_embeddings->forward(input_ids);  // (N, T, hidden)
  // Without token types every position is type 0: one row, broadcast (the same sum and the same
  // gradient as looking up zeros).
  Tensor types = token_type_ids.defined() ? token_type_embeddings->forward(token_type_ids)
                                          : narrow(token_type_embeddings->weight, 0, 0, 1);
  // Position ids are 0..T-1: the table's first T rows, a view instead of a lookup.
  Tensor positions = narrow(position_embeddings->weight, 0, 0, seq_len);  // (T, hidden)
  Tensor embeddings = add(add(words, types), positions);
  return dropout(norm->forward(embeddings), config.hidden_dropout_prob(), is_training());
}

// ---- BertLayer ----

BertLayer::BertLayer(const BertConfig& config_in, int64_t tp_group_in)
    : nn::Module("BertLayer"),
      config(config_in),
      tp_group(tp_group_in),
      local_heads(config.num_attention_heads()) {
  config.validate();
  if (tp_group >= 0)
    local_heads = parallel::split_size("BertLayer", "num_attention_heads",
                                       config.num_attention_heads(), tp_group);
  const int64_t hidden = config.hidden_size();
  auto column = [&](int64_t in, int64_t out) {
    return parallel::make_linear(in, out, tp_group, parallel::LinearSplit::kColumns);
  };
  auto row = [&](int64_t in, int64_t out) {
    return parallel::make_linear(in, out, tp_group, parallel::LinearSplit::kRows);
  };

  auto attention = register_module("attention", std::make_shared<nn::Module>("BertAttention"));
  auto self = attention->register_module("self", std::make_shared<nn::Module>("BertSelfAttention"));
  query = self->register_module("query", column(hidden, hidden));
  key = self->register_module("key", column(hidden, hidden));
  value = self->register_module("value", column(hidden, hidden));
  auto self_output =
      attention->register_module("output", std::make_shared<nn::Module>("BertSelfOutput"));
  attention_dense = self_output->register_module("dense", row(hidden, hidden));
  attention_norm = self_output->register_module("LayerNorm", make_layer_norm(config));

  auto intermediate =
      register_module("intermediate", std::make_shared<nn::Module>("BertIntermediate"));
  intermediate_dense =
      intermediate->register_module("dense", column(hidden, config.intermediate_size()));
  auto output = register_module("output", std::make_shared<nn::Module>("BertOutput"));
  output_dense = output->register_module("dense", row(config.intermediate_size(), hidden));
  output_norm = output->register_module("LayerNorm", make_layer_norm(config));
}

Tensor BertLayer::self_attention(const Tensor& hidden, const Tensor& attention_bias) {
  const int64_t batch = hidden.size(0), seq_len = hidden.size(1);
  const int64_t heads = local_heads, head_size = config.head_size();
  // (N, T, hidden) -> (N, heads, T, d): a view; bmm needs the batch (N, heads) in one stride,
  // which the copies below produce.
  auto split_heads = [&](const Tensor& x) {
    return x.view({batch, seq_len, heads, head_size}).permute({0, 2, 1, 3});
  };
  // Scaling q (N*T*hidden values) instead of the scores (N*heads*T*T) is cheaper, and the scaled
  // copy is already head-major.
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_size));
  // Split over a group, q, k and v share one copy_to_tp: one all-reduce of their summed input
  // gradient instead of three.
  Tensor input = tp_group < 0 ? hidden : parallel::copy_to_tp(hidden, tp_group);
  auto project = [&](const nn::Linear& layer) { return linear(input, layer.weight, layer.bias); };
  Tensor q = mul(split_heads(project(*query)), scale).view({batch * heads, seq_len, head_size});
  Tensor k = split_heads(project(*key)).contiguous().view({batch * heads, seq_len, head_size});
  Tensor v = split_heads(project(*value)).contiguous().view({batch * heads, seq_len, head_size});

  Tensor scores = bmm(q, k.transpose(1, 2));  // (N*heads, T, T); k^T is read in place
  if (attention_bias.defined())
    scores = add(scores.view({batch, heads, seq_len, seq_len}), attention_bias);
  Tensor probs = softmax(scores, -1);
  probs = dropout(probs, config.attention_probs_dropout_prob(), is_training());
  Tensor context = bmm(probs.view({batch * heads, seq_len, seq_len}), v);  // (N*heads, T, d)
  return context.view({batch, heads, seq_len, head_size})
      .permute({0, 2, 1, 3})
      .reshape({batch, seq_len, heads * head_size});
}

Tensor BertLayer::forward(const Tensor& hidden, const Tensor& attention_bias) {
  const double p = config.hidden_dropout_prob();
  const bool training = is_training();
  Tensor attended = attention_dense->forward(self_attention(hidden, attention_bias));
  Tensor attention_output = attention_norm->forward(add(dropout(attended, p, training), hidden));
  Tensor intermediate =
      activation(intermediate_dense->forward(attention_output), config.hidden_act());
  Tensor output = output_dense->forward(intermediate);
  return output_norm->forward(add(dropout(output, p, training), attention_output));
}

// ---- BertModel ----

BertModel::BertModel(const BertConfig& config_in, int64_t tp_group_in)
    : nn::Module("BertModel"), config(config_in), tp_group(tp_group_in) {
  config.validate();
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(config, tp_group));
  auto encoder = register_module("encoder", std::make_shared<nn::Module>("BertEncoder"));
  layers = encoder->register_module("layer", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < config.num_hidden_layers(); ++i)
    layers->push_back(std::make_shared<BertLayer>(config, tp_group));
  auto pooler = register_module("pooler", std::make_shared<nn::Module>("BertPooler"));
  pooler_dense = pooler->register_module(
      "dense", std::make_shared<nn::Linear>(config.hidden_size(), config.hidden_size()));
  if (tp_group < 0) reset_parameters();  // a shard is filled by load_shards
}

void BertModel::reset_parameters() { init_bert_weights(*this, config.initializer_range()); }

void BertModel::check_inputs(const Tensor& input_ids, const Tensor& token_type_ids,
                             const Tensor& attention_mask) const {
  TESSEL_CHECK(input_ids.defined(), "BertModel: input_ids is required");
  TESSEL_CHECK(input_ids.dim() == 2,
               "BertModel: input_ids must be 2-D (batch, seq_len), got shape ",
               shape_str(input_ids.sizes()));
  TESSEL_CHECK(is_integral(input_ids.dtype()) && input_ids.dtype() != DType::kBool,
               "BertModel: input_ids must hold integer token ids (i64), got ",
               dtype_name(input_ids.dtype()));
  const int64_t seq_len = input_ids.size(1);
  TESSEL_CHECK(seq_len <= config.max_position_embeddings(), "BertModel: sequence length ", seq_len,
               " (input_ids shape ", shape_str(input_ids.sizes()),
               ") exceeds max_position_embeddings=", config.max_position_embeddings());
  check_id_range(input_ids, config.vocab_size(), "input_ids", "vocab_size");
  if (token_type_ids.defined()) {
    TESSEL_CHECK(token_type_ids.sizes() == input_ids.sizes(), "BertModel: token_type_ids shape ",
                 shape_str(token_type_ids.sizes()), " differs from input_ids shape ",
                 shape_str(input_ids.sizes()));
    TESSEL_CHECK(is_integral(token_type_ids.dtype()) && token_type_ids.dtype() != DType::kBool,
                 "BertModel: token_type_ids must hold integers (i64), got ",
                 dtype_name(token_type_ids.dtype()));
    check_id_range(token_type_ids, config.type_vocab_size(), "token_type_ids", "type_vocab_size");
  }
  if (attention_mask.defined()) {
    TESSEL_CHECK(attention_mask.sizes() == input_ids.sizes(), "BertModel: attention_mask shape ",
                 shape_str(attention_mask.sizes()), " differs from input_ids shape ",
                 shape_str(input_ids.sizes()), " (expected (batch, seq_len) of 1 and 0)");
  }
}

BertModelOutput BertModel::forward(const Tensor& input_ids, const Tensor& token_type_ids,
                                   const Tensor& attention_mask) {
  check_inputs(input_ids, token_type_ids, attention_mask);
  const int64_t batch = input_ids.size(0), seq_len = input_ids.size(1);
  Tensor hidden = embeddings->forward(input_ids, token_type_ids);

  // (N, T) of 1/0 -> (N, 1, 1, T) of 0 / -10000, computed once for every layer.
  Tensor attention_bias;
  if (attention_mask.defined()) {
    Tensor mask = to_dtype(attention_mask, hidden.dtype());
    attention_bias =
        add(mul(mask, -kMaskedScoreBias), kMaskedScoreBias).reshape({batch, 1, 1, seq_len});
  }
  for (const auto& layer : *layers)
    hidden = static_cast<BertLayer&>(*layer).forward(hidden, attention_bias);

  Tensor first_token = select(hidden, 1, 0);  // (N, hidden)
  Tensor pooled = tanh(pooler_dense->forward(first_token));
  return {hidden, pooled};
}

// ---- BertForPreTraining ----

BertForPreTraining::BertForPreTraining(const BertConfig& config_in, int64_t tp_group_in)
    : nn::Module("BertForPreTraining"), config(config_in), tp_group(tp_group_in) {
  config.validate();
  const int64_t hidden = config.hidden_size();
  bert = register_module("bert", std::make_shared<BertModel>(config, tp_group));
  auto heads = register_module("cls", std::make_shared<nn::Module>("BertPreTrainingHeads"));
  auto predictions =
      heads->register_module("predictions", std::make_shared<BertLMPredictionHead>(tp_group));
  // The decoder has no module of its own: its weight is the word embedding table (tied) and its
  // bias is cls.predictions.bias, as in the checkpoints.
  const int64_t vocab = tp_group < 0 ? config.vocab_size()
                                     : parallel::split_size("BertForPreTraining", "vocab_size",
                                                            config.vocab_size(), tp_group);
  decoder_bias = predictions->register_parameter("bias", zeros({vocab}));
  auto transform = predictions->register_module(
      "transform", std::make_shared<nn::Module>("BertPredictionHeadTransform"));
  transform_dense =
      transform->register_module("dense", std::make_shared<nn::Linear>(hidden, hidden));
  transform_norm = transform->register_module("LayerNorm", make_layer_norm(config));
  seq_relationship =
      heads->register_module("seq_relationship", std::make_shared<nn::Linear>(hidden, 2));
  // bert initialised itself; only the heads are left (a shard is filled by load_shards).
  if (tp_group < 0) init_bert_weights(*heads, config.initializer_range());
}

void BertForPreTraining::reset_parameters() {
  init_bert_weights(*this, config.initializer_range());
  nn::init::zeros_(decoder_bias);
}

BertPreTrainingOutput BertForPreTraining::forward(const Tensor& input_ids,
                                                  const Tensor& token_type_ids,
                                                  const Tensor& attention_mask,
                                                  MlmOutput mlm_output) {
  BertModelOutput encoded = bert->forward(input_ids, token_type_ids, attention_mask);
  Tensor transformed =
      activation(transform_dense->forward(encoded.sequence_output), config.hidden_act());
  transformed = transform_norm->forward(transformed);
  // Split over a group, this rank's vocabulary rows give this rank's logit columns.
  if (tp_group >= 0) transformed = parallel::copy_to_tp(transformed, tp_group);
  BertPreTrainingOutput output;
  output.nsp_logits = seq_relationship->forward(encoded.pooled_output);  // (N, 2)
  output.vocab_group = tp_group;
  if (mlm_output == MlmOutput::kLogits || tp_group >= 0) {
    output.mlm_logits = linear(transformed, decoder_weight(), decoder_bias);  // (N, T, vocab)
  } else {
    output.mlm_hidden = transformed;
    output.decoder_weight = decoder_weight();
    output.decoder_bias = decoder_bias;
  }
  return output;
}

BertPreTrainingLoss bert_pretraining_loss(const BertPreTrainingOutput& output,
                                          const Tensor& mlm_labels, const Tensor& nsp_labels) {
  const Tensor& logits = output.mlm_logits;
  const Tensor& hidden = output.mlm_hidden;
  const bool scored_in_chunks = !logits.defined() && hidden.defined();
  const Tensor& head = scored_in_chunks ? hidden : logits;
  TESSEL_CHECK(head.defined() && head.dim() == 3,
               "bert_pretraining_loss: mlm_logits (or, from forward(..., MlmOutput::kHeadInput), "
               "mlm_hidden) must be (batch, seq_len, vocab_size or hidden_size)");
  const Shape label_shape(head.sizes().begin(), head.sizes().end() - 1);
  TESSEL_CHECK(mlm_labels.defined() && mlm_labels.sizes() == label_shape,
               "bert_pretraining_loss: mlm_labels must have shape ", shape_str(label_shape),
               " (batch, seq_len), got ",
               mlm_labels.defined() ? shape_str(mlm_labels.sizes()) : std::string("none"));
  const Tensor flat_labels = mlm_labels.reshape({-1});
  const Tensor flat_head = head.reshape({-1, head.size(2)});
  BertPreTrainingLoss loss;
  if (scored_in_chunks) {
    loss.mlm = linear_cross_entropy(flat_head, output.decoder_weight, output.decoder_bias,
                                    flat_labels, -100);
  } else {
    loss.mlm = output.vocab_group < 0 ? cross_entropy(flat_head, flat_labels, -100)
                                      : parallel::vocab_parallel_cross_entropy(
                                            flat_head, flat_labels, output.vocab_group, -100);
  }
  loss.total = loss.mlm;
  if (nsp_labels.defined()) {
    const Tensor& nsp_logits = output.nsp_logits;
    TESSEL_CHECK(nsp_logits.defined() && nsp_logits.dim() == 2,
                 "bert_pretraining_loss: nsp_labels given but nsp_logits is not (batch, 2)");
    TESSEL_CHECK(nsp_labels.dim() == 1 && nsp_labels.size(0) == nsp_logits.size(0),
                 "bert_pretraining_loss: nsp_labels must have shape [", nsp_logits.size(0),
                 "] (batch), got ", shape_str(nsp_labels.sizes()));
    loss.nsp = cross_entropy(nsp_logits, nsp_labels);
    loss.total = add(loss.mlm, loss.nsp);
  }
  return loss;
}

std::shared_ptr<BertForPreTraining> shard_bert(const BertForPreTraining& full, int64_t tp_group) {
  TESSEL_CHECK(full.tp_group < 0, "shard_bert: the model is already split over group ",
               full.tp_group);
  TESSEL_CHECK(tp_group >= 0, "shard_bert: expected a tensor-parallel group id, got ", tp_group);
  auto shard = std::make_shared<BertForPreTraining>(full.config, tp_group);
  shard->to(full.decoder_bias.device());  // the shards live where the full model does (a GPU)
  parallel::load_shards(*shard, full, tp_group);
  shard->train(full.is_training());
  return shard;
}

}  // namespace tessel::models
