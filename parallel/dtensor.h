// Sharded tensors: a tensor laid out over a mesh of ranks, one placement per mesh dimension, in
// the manner of PyTorch's DTensor, on Tessel's own dispatcher and communicators.
//   auto mesh = std::make_shared<const DeviceMesh>(grid);     // 2-D: dp x tp (or 1-D: a group)
//   DTensor x = distribute_tensor(batch, mesh, {Placement::shard(0), Placement::replicate()});
//   DTensor w = distribute_tensor(weight, mesh, {Placement::replicate(), Placement::shard(0)});
//   DTensor y = dt::linear(x, w);        // Shard(0) over dp, Shard(-1) (columns) over tp
//   Tensor full = y.full_tensor();       // every rank: the whole result
//
// A DTensor is this rank's local shard plus, per mesh dimension, a placement:
//   Replicate   every rank of that dimension holds the same values;
//   Shard(d)    the tensor's dim d is cut into parts in rank order as torch.tensor_split cuts it:
//               where the ranks do not divide its size, the first size % ranks parts hold one
//               index more (and parts are empty where the size is below the ranks);
//   Partial     each rank holds a summand: the tensor is the sum over that dimension's ranks.
// redistribute() moves between placements with the collectives of the tensor-parallel ops
// (parallel/tensor_parallel.h), so autograd runs through every move and every rank must call the
// same moves in the same order: Shard -> Replicate is an all-gather (backward: this rank's part of
// the gradient), Replicate -> Shard a local slice (backward: all-gather), Partial -> Replicate an
// all-reduce (backward: identity), Partial -> Shard a reduce-scatter (reduce_scatter_to_tp;
// backward: all-gather; an all-reduce and a local slice where another mesh dim cuts that dim or
// the group's size does not divide it), Shard(i) ->
// Shard(j) an all-to-all (all_to_all_tp; an all-gather along i and a slice along j where another
// mesh dim cuts i or j, or the group's size does not divide both). Unequal parts travel padded to
// the longest part (one all-gather or scatter of equal parts, then the padding is cut off).
// Into Partial takes no collective: Replicate -> Partial keeps the values
// on the dimension's coordinate 0 and zeros elsewhere (backward: the gradient on coordinate 0,
// zeros elsewhere), Shard(d) -> Partial puts each rank's part at its place in zeros (backward:
// this rank's part of the gradient; not where another mesh dim also cuts d).
//
// The ops of namespace dt propagate placements (linear, matmul and conv2d by output or input
// features, embedding by rows or features, cross_entropy by classes or rows, element-wise ops,
// relu, gelu, softmax, sum, pooling, batch and layer norm) and insert the cheapest redistribution
// where their inputs disagree;
// the shard of a DTensor is an ordinary tensor to the rest of Tessel.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/communicator.h"
#include "parallel/process_group.h"

namespace tessel::parallel {

struct Placement {
  enum class Kind { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  int64_t dim = 0;  // Shard only; negative counts from the end until normalised by a DTensor

  static Placement replicate() { return {Kind::kReplicate, 0}; }
  static Placement shard(int64_t dim) { return {Kind::kShard, dim}; }
  static Placement partial() { return {Kind::kPartial, 0}; }
  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_shard() const { return kind == Kind::kShard; }
  bool is_shard(int64_t d) const { return kind == Kind::kShard && dim == d; }
  bool is_partial() const { return kind == Kind::kPartial; }
  std::string str() const;  // "Replicate", "Shard(1)", "Partial"
  bool operator==(const Placement& other) const {
    return kind == other.kind && (kind != Kind::kShard || dim == other.dim);
  }
  bool operator!=(const Placement& other) const { return !(*this == other); }
};
std::string placements_str(const std::vector<Placement>& placements);  // "[Shard(0), Replicate]"

// Ranks laid out as a 1-D or 2-D grid. Each mesh dimension has the communicator of the ranks
// that differ only in that coordinate, registered for the tensor-parallel ops.
class DeviceMesh {
 public:
  // One dimension over every rank of `group`.
  explicit DeviceMesh(std::shared_ptr<Communicator> group, std::string name = "tp");
  // Two dimensions, dp x tp, over a process grid's groups (for tensors on its device).
  explicit DeviceMesh(const ProcessGrid& grid);

  int ndim() const { return static_cast<int>(groups_.size()); }
  int size(int dim) const;        // ranks along `dim`
  int coordinate(int dim) const;  // this rank's index along `dim`
  int64_t group(int dim) const;   // the registered group id of `dim`'s communicator
  const std::string& dim_name(int dim) const;
  std::string str() const;  // "mesh (dp=2, tp=2)"

 private:
  std::vector<std::shared_ptr<Communicator>> groups_;
  std::vector<int64_t> group_ids_;
  std::vector<std::string> names_;
};

class DTensor {
 public:
  DTensor() = default;
  // From a local shard laid out as `placements` say (one per mesh dimension); the global shape is
  // derived as if every part were equal (each sharded dim's local size times its ranks). Errors
  // for a placement count that differs from the mesh's, a shard dim out of range.
  DTensor(Tensor local, std::shared_ptr<const DeviceMesh> mesh, std::vector<Placement> placements);
  // The same with the global shape given, for unequal parts: an error unless `local` has this
  // rank's part of it.
  DTensor(Tensor local, std::shared_ptr<const DeviceMesh> mesh, std::vector<Placement> placements,
          Shape global_shape);

  bool defined() const { return local_.defined(); }
  const Tensor& local() const { return local_; }
  const Shape& shape() const { return shape_; }  // the global shape
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  const std::vector<Placement>& placements() const { return placements_; }
  const std::shared_ptr<const DeviceMesh>& mesh() const { return mesh_; }
  bool requires_grad() const { return local_.requires_grad(); }

  // The same tensor laid out as `placements` (differentiable; a collective on every rank).
  DTensor redistribute(std::vector<Placement> placements) const;
  // The whole tensor on every rank (redistributes to Replicate everywhere).
  Tensor full_tensor() const;
  std::string str() const;  // "DTensor(shape [8, 6], [Shard(0), Replicate], local [4, 6])"

 private:
  Tensor local_;
  std::shared_ptr<const DeviceMesh> mesh_;
  std::vector<Placement> placements_;
  Shape shape_;
};

// Every rank's part along `dim` of tensor-parallel group `group` (register_tp_group), in rank
// order, into `whole_size` indices (parts as torch.tensor_split cuts them; -1: every part as long
// as this rank's); backward keeps this rank's part of the gradient. Integer tensors (ids,
// labels) carry no gradient and go through the communicator directly.
Tensor gather_along(const Tensor& x, int64_t dim, int64_t group, int64_t whole_size = -1);
// This rank's part along `dim` (parts in rank order as torch.tensor_split cuts them); backward
// all-gathers the gradient.
Tensor shard_along(const Tensor& x, int64_t dim, int64_t group);

// Batch norm in training over x (N, C, ...) whose rows (every dim but the channels) are split
// in equal parts over the ranks of each group of `groups` (register_tp_group ids): each rank's
// per-channel mean and centred sum of squares are all-gathered over each group in turn and
// combined (Chan's formula: no cancellation as in E[x^2] - E[x]^2), and this rank's x is
// normalised by the whole batch's statistics, so y equals one process's batch_norm on this
// rank's rows; the running statistics (this rank's channels, updated in place) as one process
// keeps them. Backward sums the statistics' gradient over the groups; `weight` and `bias`
// receive the gradient of this rank's rows only.
Tensor batch_norm_across(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& running_mean, const Tensor& running_var, double momentum,
                         double eps, const std::vector<int64_t>& groups);

// `full`, the whole tensor with the same values on every rank, laid out as `placements` without
// communication (each rank keeps its slices; Partial keeps the values on coordinate 0 and zeros
// elsewhere). Differentiable: the gradient reaching `full` is the whole tensor's.
DTensor distribute_tensor(const Tensor& full, std::shared_ptr<const DeviceMesh> mesh,
                          std::vector<Placement> placements);

namespace dt {
// y = x W^T (+ b), x (..., in), weight (out, in), bias (out). Per mesh dimension: weight Shard(0)
// with x Replicate gives y Shard(-1) (columns); weight Shard(1) with x Shard(-1) gives y Partial
// (rows; a bias is then added once the sums are combined, as Replicate); weight Replicate keeps x's
// Shard of a leading dim (batch). Other combinations redistribute x first.
DTensor linear(const DTensor& x, const DTensor& weight, const DTensor& bias = DTensor());
// a (..., n, k) @ b (k, m): b Shard(1) with a Replicate -> Shard(-1); b Shard(0) with a Shard(-1)
// -> Partial; b Replicate keeps a's Shard of a leading dim.
DTensor matmul(const DTensor& a, const DTensor& b);
// x (N, C, H, W) * weight (O, C, kh, kw): weight Shard(0) with x Replicate gives y Shard(1)
// (output channels); weight Shard(1) with x Shard(1) gives y Partial (input channels); weight
// Replicate keeps x's Shard(0) (batch). Spatial dims are gathered first.
DTensor conv2d(const DTensor& x, const DTensor& weight, const DTensor& bias = DTensor(),
               std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0});
// Rows of `weight` looked up by integer `ids`: weight Shard(0) (rows of the table) gives Partial
// (ids of other ranks' rows give zeros), Shard(1) gives the output's features split, Replicate
// keeps the ids' layout.
DTensor embedding(const DTensor& weight, const DTensor& ids);
// The mean cross-entropy of logits (rows, classes) against target (rows, integer classes), a
// scalar replicated everywhere: classes may be split over one mesh dim (the vocabulary-parallel
// loss), rows over others (sums and counts of the rows not equal to ignore_index combined).
DTensor cross_entropy(const DTensor& logits, const DTensor& target, int64_t ignore_index = -100);
// Element-wise on equal global shapes: the second operand is laid out as the first (a local
// slice where it is Replicate, a collective otherwise); Partial operands are combined first
// except for add and sub of two Partial operands, which stay Partial.
DTensor add(const DTensor& a, const DTensor& b);
DTensor sub(const DTensor& a, const DTensor& b);
DTensor mul(const DTensor& a, const DTensor& b);
DTensor relu(const DTensor& x);  // Partial is combined first
DTensor gelu(const DTensor& x);
// Along `dim`: a mesh dimension sharding `dim` (or Partial) is gathered first.
DTensor softmax(const DTensor& x, int64_t dim);
// The sum of every element, Replicate on every mesh dimension (a scalar on every rank).
DTensor sum(const DTensor& x);
// Pooling of x (N, C, H, W) over H and W: shards of H or W are gathered first, batch and channel
// shards stay. Max pooling combines Partial first; average pooling is linear, so Partial stays.
DTensor max_pool2d(const DTensor& x, std::vector<int64_t> kernel_size,
                   std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0});
DTensor avg_pool2d(const DTensor& x, std::vector<int64_t> kernel_size,
                   std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0});
DTensor adaptive_avg_pool2d(const DTensor& x, std::vector<int64_t> output_size);
// Batch norm of x (N, C, ...) with per-channel weight, bias and running statistics, laid out as
// x's channels (Shard(0) where x is Shard(1), else Replicate; other layouts are moved there).
// Every shard stays where it is; Partial is combined first. Channel shards normalise locally. In
// training with batch or spatial shards each rank's per-channel statistics are combined over the
// mesh dims that cut them (batch_norm_across: one all-gather of 2 C values per rank, and one
// all-reduce of their gradient backward), so each rank's rows are normalised by the whole
// batch's; a replicated weight or bias then receives its rank's part of the gradient (sum it
// over those mesh dims, as DDP does); unequal row parts are an error in training. In eval the op
// is per-channel affine. Running statistics are updated in place on every rank.
DTensor batch_norm(const DTensor& x, const DTensor& weight, const DTensor& bias,
                   const DTensor& running_mean, const DTensor& running_var, bool training,
                   double momentum = 0.1, double eps = 1e-5);
// Layer norm over x's last normalized_shape.size() dims: shards of those dims (and Partial) are
// gathered first and the output is laid out as x was; shards of the leading dims (rows) stay.
// weight and bias (normalized_shape) are used whole (moved to Replicate).
DTensor layer_norm(const DTensor& x, const Shape& normalized_shape,
                   const DTensor& weight = DTensor(), const DTensor& bias = DTensor(),
                   double eps = 1e-5);
}  // namespace dt

}  // namespace tessel::parallel
