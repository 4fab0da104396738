// Tensor parallelism in the Megatron-LM style: autograd-aware collectives over a tensor-parallel
// group, column/row parallel linear layers, vocabulary-parallel embedding and cross-entropy, and
// load_shards, which fills a model built for the group from the whole model. A model builds its
// own parallel form from these layers (models::BertForPreTraining(config, group)).
//   int64_t tp = register_tp_group(grid.tensor_parallel());
//   ColumnParallelLinear up(512, 2048, tp);  RowParallelLinear down(2048, 512, tp);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/op.h"
#include "core/tensor.h"
#include "nn/nn.h"
#include "parallel/communicator.h"

namespace tessel::ops {
// The collectives of tensor parallelism as ops (registered in parallel/tensor_parallel.cc; CUDA
// kernels in parallel/tensor_parallel_cuda.cc).
inline const OpHandle tp_copy{"tp_copy"};
inline const OpHandle tp_reduce{"tp_reduce"};
inline const OpHandle tp_gather{"tp_gather"};
inline const OpHandle tp_scatter{"tp_scatter"};
inline const OpHandle tp_all_to_all{"tp_all_to_all"};
inline const OpHandle tp_reduce_scatter{"tp_reduce_scatter"};
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
// tp_scatter tp_all_to_all tp_reduce_scatter]. f32 and f64 tensors of any strides. Every rank of
// the group must call them in the same order, also in backward (autograd runs the duals in reverse
// order on every rank alike). Identity forward, all-reduce (sum) of the gradient backward: where a
// replicated input enters rank-local computation.
Tensor copy_to_tp(const Tensor& x, int64_t group);
// All-reduce (sum) forward, identity backward: where partial results are combined.
Tensor reduce_from_tp(const Tensor& x, int64_t group);
// (..., n) on every rank -> (..., n * tp) with rank r's part at columns [r n, (r+1) n); backward
// keeps this rank's columns of the gradient. With `dim`, along that dim instead of the last (the
// channels of images: no transposes, each rank's part copied in runs of its rows).
Tensor gather_from_tp(const Tensor& x, int64_t group, int64_t dim = -1);
// (..., n) -> this rank's columns (..., n / tp) (n divisible by tp); backward all-gathers. With
// `dim`, along that dim.
Tensor scatter_to_tp(const Tensor& x, int64_t group, int64_t dim = -1);
// Partial sums (..., n, ...) on every rank -> this rank's part (..., n / tp, ...) along `dim` of
// their sum (n divisible by tp): a reduce-scatter, half an all-reduce's traffic; backward
// all-gathers the gradient along `dim`.
Tensor reduce_scatter_to_tp(const Tensor& x, int64_t group, int64_t dim);
// The (parts, part...) view of a reduce-scatter's input (part r: rank r's part along `dim`, the
// output's shape), whose dense copy is the buffer Communicator::reduce_scatter cuts by rows.
struct ReduceScatterGeometry {
  Shape parts_sizes, parts_strides;
};
ReduceScatterGeometry reduce_scatter_geometry(const Tensor& input, int parts, int64_t dim);
// A tensor cut along `concat_dim` over the group (rank r holds part r) -> cut along `split_dim`
// instead: each rank sends every other rank that rank's part of `split_dim` (divisible by the
// group's size) and keeps the parts it receives, in rank order along `concat_dim`. It moves
// 1 / size of what gathering the whole tensor would; backward moves the gradient back.
Tensor all_to_all_tp(const Tensor& x, int64_t split_dim, int64_t concat_dim, int64_t group);
// The pieces of an all-to-all's exchange in an order that needs no buffering: in round s, rank r
// pairs with (s - r) mod size (itself when equal: its own piece); the lower rank sends first.
struct AllToAllStep {
  int peer;
  bool send_first;
};
std::vector<AllToAllStep> all_to_all_schedule(int rank, int size);
// For the kernels of a tp_all_to_all: the piece of the input sent to rank q (piece_sizes with the
// input's strides, q * piece_offset elements past its start), and the output (dense) as
// received_sizes read with received_strides from the dense buffer of the pieces received.
struct AllToAllGeometry {
  Shape piece_sizes;
  int64_t piece_offset = 0;
  Shape received_sizes, received_strides;
};
AllToAllGeometry all_to_all_geometry(const Tensor& input, int parts, const Attrs& attrs);
// For the kernels of tp_gather and tp_scatter: the dim they join or cut (the "dim" attribute,
// the last by default), and for a gather the dense output as `received_sizes` read with
// `received_strides` from the buffer of every rank's dense input in rank order.
struct GatherGeometry {
  int64_t dim = 0;
  Shape received_sizes, received_strides;
};
GatherGeometry gather_geometry(const Tensor& input, int parts, const Attrs& attrs);
// All-reduce max over the group, no gradient (the max-subtraction of the parallel softmax).
Tensor max_from_tp(const Tensor& x, int64_t group);

// ---- layers
// A module whose own parameters are split over a tensor-parallel group says which, and along which
// dim (its children say theirs); tensor_parallel_split_dims and load_shards read it.
class SplitParameters {
 public:
  virtual ~SplitParameters() = default;
  virtual std::map<std::string, int64_t> split_parameter_dims() const = 0;
  // Where `parameter` is cut over other ranks than the tensor-parallel group's (a plan's grid
  // over part of the ranks): the number of parts and this rank's part; {0, 0} otherwise.
  virtual std::pair<int, int> split_part(const std::string& /*parameter*/) const { return {0, 0}; }
  // `local`, this rank's part of `parameter` (or of its optimizer state) where split_part is not
  // {0, 0}, whole: a collective over the ranks that cut it.
  virtual Tensor gather_split(const std::string& parameter, const Tensor& local) const {
    TESSEL_FAIL("gather_split: ", parameter, " is cut over the tensor-parallel group");
  }
  // Where split_part is not {0, 0}: the ranks that hold the same part of `parameter` as this
  // one, or null where no other rank does.
  virtual std::shared_ptr<Communicator> split_copies(const std::string& /*parameter*/) const {
    return nullptr;
  }
};

// y = x A^T + b with A's rows (output features) split: rank r holds rows
// [r out/tp, (r+1) out/tp) of weight and bias. The output is this rank's columns, or every
// column with gather_output. out_features must be divisible by the group size. An nn::Linear
// whose weight and bias are this rank's part (options() holds the local sizes).
class ColumnParallelLinear : public nn::Linear, public SplitParameters {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, int64_t group, bool bias = true,
                       bool gather_output = false);
  // input (..., in_features) replicated -> (..., out_features / tp), or (..., out_features).
  Tensor forward(const Tensor& input) override;
  // Copies rank r's rows of a full (out, in) weight and (out) bias.
  void load_from(const nn::Linear& full);
  std::map<std::string, int64_t> split_parameter_dims() const override;

  int64_t in_features, out_features, group;
  int tp_size, tp_rank;
  bool gather_output;
};

// y = x A^T + b with A's columns (input features) split: rank r holds columns
// [r in/tp, (r+1) in/tp). The partial products are all-reduced, then the (replicated) bias is
// added once. in_features must be divisible by the group size.
class RowParallelLinear : public nn::Linear, public SplitParameters {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, int64_t group, bool bias = true,
                    bool input_is_parallel = true);
  // input (..., in_features / tp) with input_is_parallel, else (..., in_features) replicated ->
  // (..., out_features) replicated.
  Tensor forward(const Tensor& input) override;
  void load_from(const nn::Linear& full);
  std::map<std::string, int64_t> split_parameter_dims() const override;

  int64_t in_features, out_features, group;
  int tp_size, tp_rank;
  bool input_is_parallel;
};

// How a model's linear is split when the model is built for a tensor-parallel group.
enum class LinearSplit { kColumns, kRows };
// The linear of a model that may be split: an nn::Linear when group < 0 (no tensor
// parallelism), else a ColumnParallelLinear or RowParallelLinear over `group` (as
// parallelize_module's ColwiseParallel and RowwiseParallel do). A split layer's parameters are
// zero until load_shards fills them.
std::shared_ptr<nn::Linear> make_linear(int64_t in_features, int64_t out_features, int64_t group,
                                        LinearSplit split);

// An embedding table whose rows are split: rank r holds ids [r V/tp, (r+1) V/tp). Ids outside
// this rank's range give zero rows; the all-reduce puts every row together.
class VocabParallelEmbedding : public nn::Embedding, public SplitParameters {
 public:
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, int64_t group);
  // indices (...) i64 in [0, num_embeddings) -> (..., embedding_dim) replicated.
  Tensor forward(const Tensor& indices) override;
  void load_from(const nn::Embedding& full);
  std::map<std::string, int64_t> split_parameter_dims() const override { return {{"weight", 0}}; }

  int64_t num_embeddings, embedding_dim, group;
  int tp_size, tp_rank;
  int64_t vocab_start, vocab_end;  // this rank's ids; weight is (num_embeddings / tp, dim)
};

// The lookup of VocabParallelEmbedding as a function: `local_table` is this rank's rows
// [r V/tp, (r+1) V/tp) of a (V, dim) table; ids of other ranks give zero rows before the
// all-reduce. `padding_idx` (a whole-table id, or -1) gets no gradient, as embedding's does.
Tensor vocab_parallel_embedding(const Tensor& local_table, const Tensor& indices, int64_t group,
                                int64_t padding_idx = -1);

// cross_entropy over logits whose last dim (the vocabulary) is split over the group: logits
// (M, V / tp) are this rank's columns [r V/tp, (r+1) V/tp), target (M) i64 full ids. The max,
// the sum of exponentials and the target logit are all-reduced; the mean over targets that are
// not ignore_index is the same on every rank (with sum_rows, their sum instead). Columns of
// unequal width: `first_class` is this rank's first (-1: r times its column count).
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, int64_t group,
                                    int64_t ignore_index = -100, bool sum_rows = false,
                                    int64_t first_class = -1);

// nll_loss over log-probabilities whose last dim (the classes) is split over the group, as
// vocab_parallel_cross_entropy takes its logits: each rank picks the targets' values among its
// columns, one all-reduce sums them, and the mean over targets that are not ignore_index (with
// sum_rows, their sum) is the same on every rank.
Tensor vocab_parallel_nll_loss(const Tensor& log_probs, const Tensor& target, int64_t group,
                               int64_t ignore_index = -100, bool sum_rows = false);

// ---- whole models
// The size of `group` (an id of register_tp_group) that `what` of `layer`, of `size`, is split
// over; an error naming both unless size is a positive multiple of it. Returns size / tp.
int64_t split_size(const char* layer, const char* what, int64_t size, int64_t group);

// Fills `shard`, this rank's part of a model split over `group`, from `full`, the whole model
// with the same parameter and buffer names: this rank's slice of every split parameter
// (tensor_parallel_split_dims), a copy of every other tensor. A local call, outside autograd;
// an error naming the first tensor whose name or shape does not match.
void load_shards(nn::Module& shard, const nn::Module& full, int64_t group);

// Which dim of each parameter and buffer of `root` (by dotted name) is split over the group, as
// its modules declare (SplitParameters); tensors not listed are replicated. Checkpoints of a
// split model gather along these dims.
std::map<std::string, int64_t> tensor_parallel_split_dims(nn::Module& root);

// The full tensor from every rank's `shard` split along `dim` (equal parts in rank order); no
// autograd. A collective over `group`.
Tensor gather_shards(const Tensor& shard, int64_t dim, Communicator& group);

}  // namespace tessel::parallel
