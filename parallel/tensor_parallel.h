// Tensor parallelism in the Megatron-LM style: autograd-aware collectives over a tensor-parallel
// group, column/row parallel linear layers, vocabulary-parallel embedding and cross-entropy, and a
// BERT whose attention heads, MLP and vocabulary are split over the group.
//   int64_t tp = register_tp_group(grid.tensor_parallel());  auto bert = shard_bert(full, tp);
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/attrs.h"
#include "core/op.h"
#include "core/tensor.h"
#include "models/bert.h"
#include "nn/nn.h"
#include "parallel/communicator.h"

namespace tessel::ops {
// The collectives of tensor parallelism as ops (registered in parallel/tensor_parallel.cc; CUDA
// kernels in parallel/tensor_parallel_cuda.cc).
inline const OpHandle tp_copy{"tp_copy"};
inline const OpHandle tp_reduce{"tp_reduce"};
inline const OpHandle tp_gather{"tp_gather"};
inline const OpHandle tp_scatter{"tp_scatter"};
}  // namespace tessel::ops

namespace tessel::parallel {

// ---- the group registry: ops carry a group id (attr "group"), kernels look the communicator up.
// Registers `group` (process-wide) and returns its id; the same communicator gets the same id.
int64_t register_tp_group(std::shared_ptr<Communicator> group);
// The communicator of `id`; an error naming the id when it was never registered.
const std::shared_ptr<Communicator>& tp_group(int64_t id);
// The reduction a tp_reduce op's attributes ask for (sum, or max for max_from_tp): for the
// kernels of other devices.
ReduceOp tp_reduce_op(const Attrs& attrs);

// ---- collectives with backward; each op's backward is its dual [tp_copy tp_reduce tp_gather
// tp_scatter]. f32 and f64 tensors of any strides. Every rank of the group must call them in the
// same order, also in backward (autograd runs the duals in reverse order on every rank alike).
// Identity forward, all-reduce (sum) of the gradient backward: where a replicated input enters
// rank-local computation.
Tensor copy_to_tp(const Tensor& x, int64_t group);
// All-reduce (sum) forward, identity backward: where partial results are combined.
Tensor reduce_from_tp(const Tensor& x, int64_t group);
// (..., n) on every rank -> (..., n * tp) with rank r's part at columns [r n, (r+1) n); backward
// keeps this rank's columns of the gradient.
Tensor gather_from_tp(const Tensor& x, int64_t group);
// (..., n) -> this rank's columns (..., n / tp) (n divisible by tp); backward all-gathers.
Tensor scatter_to_tp(const Tensor& x, int64_t group);
// All-reduce max over the group, no gradient (the max-subtraction of the parallel softmax).
Tensor max_from_tp(const Tensor& x, int64_t group);

// ---- layers
// y = x A^T + b with A's rows (output features) split: rank r holds rows
// [r out/tp, (r+1) out/tp) of weight and bias. The output is this rank's columns, or every
// column with gather_output. out_features must be divisible by the group size.
class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, int64_t group, bool bias = true,
                       bool gather_output = false);
  // input (..., in_features) replicated -> (..., out_features / tp), or (..., out_features).
  Tensor forward(const Tensor& input) override;
  // Copies rank r's rows of a full (out, in) weight and (out) bias.
  void load_from(const nn::Linear& full);

  int64_t in_features, out_features, group;
  int tp_size, tp_rank;
  bool gather_output;
  Tensor weight;  // (out_features / tp, in_features)
  Tensor bias;    // (out_features / tp) or undefined
};

// y = x A^T + b with A's columns (input features) split: rank r holds columns
// [r in/tp, (r+1) in/tp). The partial products are all-reduced, then the (replicated) bias is
// added once. in_features must be divisible by the group size.
class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, int64_t group, bool bias = true,
                    bool input_is_parallel = true);
  // input (..., in_features / tp) with input_is_parallel, else (..., in_features) replicated ->
  // (..., out_features) replicated.
  Tensor forward(const Tensor& input) override;
  void load_from(const nn::Linear& full);

  int64_t in_features, out_features, group;
  int tp_size, tp_rank;
  bool input_is_parallel;
  Tensor weight;  // (out_features, in_features / tp)
  Tensor bias;    // (out_features), replicated, or undefined
};

// An embedding table whose rows are split: rank r holds ids [r V/tp, (r+1) V/tp). Ids outside
// this rank's range give zero rows; the all-reduce puts every row together.
class VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, int64_t group);
  // indices (...) i64 in [0, num_embeddings) -> (..., embedding_dim) replicated.
  Tensor forward(const Tensor& indices) override;
  void load_from(const nn::Embedding& full);

  int64_t num_embeddings, embedding_dim, group;
  int tp_size, tp_rank;
  int64_t vocab_start, vocab_end;  // this rank's ids
  Tensor weight;                   // (num_embeddings / tp, embedding_dim)
};

// cross_entropy over logits whose last dim (the vocabulary) is split over the group: logits
// (M, V / tp) are this rank's columns [r V/tp, (r+1) V/tp), target (M) i64 full ids. The max,
// the sum of exponentials and the target logit are all-reduced; the mean over targets that are
// not ignore_index is the same on every rank.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, int64_t group,
                                    int64_t ignore_index = -100);

// ---- BERT split by heads, MLP columns and vocabulary; the module names and parameter names of
// models::BertForPreTraining (the shapes of split parameters divided by tp).
class TensorParallelBertLayer : public nn::Module {
 public:
  TensorParallelBertLayer(const models::BertConfig& config, int64_t group);
  Tensor forward(const Tensor& hidden, const Tensor& attention_bias = Tensor());
  void load_from(const models::BertLayer& full);

  models::BertConfig config;
  int64_t group;
  int64_t local_heads;  // num_attention_heads / tp
  std::shared_ptr<ColumnParallelLinear> query, key, value;
  std::shared_ptr<RowParallelLinear> attention_dense;
  std::shared_ptr<nn::LayerNorm> attention_norm;
  std::shared_ptr<ColumnParallelLinear> intermediate_dense;
  std::shared_ptr<RowParallelLinear> output_dense;
  std::shared_ptr<nn::LayerNorm> output_norm;
};

struct TensorParallelBertOutput {
  Tensor mlm_logits;  // (N, T, vocab_size / tp): this rank's vocabulary columns
  Tensor nsp_logits;  // (N, 2) replicated
};

class TensorParallelBertForPreTraining : public nn::Module {
 public:
  // Needs num_attention_heads, intermediate_size and vocab_size divisible by the group size.
  TensorParallelBertForPreTraining(const models::BertConfig& config, int64_t group);
  TensorParallelBertOutput forward(const Tensor& input_ids, const Tensor& token_type_ids = Tensor(),
                                   const Tensor& attention_mask = Tensor());
  // Takes this rank's slice of every split parameter and a copy of every replicated one.
  void load_from(const models::BertForPreTraining& full);

  models::BertConfig config;
  int64_t group;
  std::shared_ptr<VocabParallelEmbedding> word_embeddings;  // tied with the MLM decoder
  std::shared_ptr<nn::Embedding> position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> embeddings_norm;
  std::vector<std::shared_ptr<TensorParallelBertLayer>> layers;
  std::shared_ptr<nn::Linear> pooler_dense, transform_dense, seq_relationship;
  std::shared_ptr<nn::LayerNorm> transform_norm;
  Tensor decoder_bias;  // (vocab_size / tp)
};

// A tensor-parallel copy of `full` for this rank of `group` (a collective-free, local call).
std::shared_ptr<TensorParallelBertForPreTraining> shard_bert(const models::BertForPreTraining& full,
                                                             int64_t group);

// The loss of models::bert_pretraining_loss with the vocabulary-parallel MLM cross-entropy.
models::BertPreTrainingLoss tensor_parallel_bert_loss(const TensorParallelBertOutput& output,
                                                      const Tensor& mlm_labels,
                                                      const Tensor& nsp_labels, int64_t group);

// Which dim of each parameter of `root` (by dotted name) is split over the group; parameters
// not listed are replicated.
std::map<std::string, int64_t> tensor_parallel_split_dims(nn::Module& root);

// The full tensor from every rank's `shard` split along `dim` (equal parts in rank order); no
// autograd. A collective over `group`.
Tensor gather_shards(const Tensor& shard, int64_t dim, Communicator& group);

}  // namespace tessel::parallel
