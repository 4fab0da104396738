#include "parallel/dtensor.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <sstream>
#include <utility>

#include "core/autograd.h"
#include "core/error.h"
#include "ops/ops.h"
#include "parallel/tensor_parallel.h"

namespace tessel::parallel {
namespace {

int64_t normalize_dim(int64_t dim, int64_t rank, const char* what) {
  const int64_t normalized = dim < 0 ? dim + rank : dim;
  TESSEL_CHECK(normalized >= 0 && normalized < rank, what, ": dim ", dim,
               " is out of range for a tensor of ", rank, " dims");
  return normalized;
}

// Checks `placements` against the mesh and a tensor of `rank` dims; shard dims made non-negative.
std::vector<Placement> normalized(std::vector<Placement> placements, const DeviceMesh& mesh,
                                  int64_t rank, const char* what) {
  TESSEL_CHECK(static_cast<int>(placements.size()) == mesh.ndim(), what, ": ", placements.size(),
               " placements for a mesh of ", mesh.ndim(), " dims (", mesh.str(),
               "): give one per mesh dim");
  std::vector<bool> sharded(static_cast<size_t>(rank), false);
  for (Placement& placement : placements) {
    if (!placement.is_shard()) continue;
    placement.dim = normalize_dim(placement.dim, rank, what);
    TESSEL_CHECK(!sharded[placement.dim], what, ": tensor dim ", placement.dim,
                 " is sharded over two mesh dims (", placements_str(placements),
                 "); shard it over one");
    sharded[placement.dim] = true;
  }
  return placements;
}

// `x` grown along `dim` to `length` indices with zeros after its own (differentiable).
Tensor padded_to(const Tensor& x, int64_t dim, int64_t length) {
  if (x.size(dim) == length) return x;
  Shape sizes = x.sizes();
  sizes[dim] = length - x.size(dim);
  return cat({x, zeros(sizes, TensorOptions(x.dtype()).device(x.device()))}, dim);
}

int64_t longest_part(int64_t whole_size, int parts) { return (whole_size + parts - 1) / parts; }

}  // namespace

Tensor gather_along(const Tensor& x, int64_t dim, int64_t group, int64_t whole_size) {
  Communicator& comm = *tp_group(group);
  const int parts = comm.size();
  if (whole_size >= 0 && whole_size != x.size(dim) * parts) {
    // Unequal parts: every rank's padded to the longest, gathered, then each cut back to its own.
    const int64_t longest = longest_part(whole_size, parts);
    TESSEL_CHECK(x.size(dim) == part_rows(whole_size, parts, comm.rank()), "DTensor: dim ", dim,
                 " holds ", x.size(dim), " indices, not this rank's part of ", whole_size);
    const Tensor gathered = gather_along(padded_to(x, dim, longest), dim, group);
    std::vector<Tensor> pieces;
    for (int r = 0; r < parts; ++r)
      if (part_rows(whole_size, parts, r) > 0)
        pieces.push_back(narrow(gathered, dim, r * longest, part_rows(whole_size, parts, r)));
    return pieces.size() == 1 ? pieces[0].contiguous() : cat(pieces, dim);
  }
  if (is_floating(x.dtype())) return gather_from_tp(x, group, dim);
  Tensor send = transpose(x, 0, dim).contiguous();
  Shape sizes = send.sizes();
  sizes[0] *= parts;
  Tensor receive = empty(sizes, TensorOptions(x.dtype()).device(x.device()));
  comm.all_gather(send, receive);
  return transpose(receive, 0, dim).contiguous();
}

Tensor batch_norm_across(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& running_mean, const Tensor& running_var, double momentum,
                         double eps, const std::vector<int64_t>& groups) {
  TESSEL_CHECK(x.defined() && x.dim() >= 2, "batch_norm_across: expected x (N, C, ...), got ",
               x.defined() ? shape_str(x.sizes()) : std::string("an undefined tensor"));
  const int64_t channels = x.size(1);
  std::vector<int64_t> reduced{0};
  for (int64_t d = 2; d < x.dim(); ++d) reduced.push_back(d);
  Shape per_channel(static_cast<size_t>(x.dim()), 1);
  per_channel[1] = channels;
  Tensor batch_mean = mean(x, reduced);
  const Tensor centred = sub(x, reshape(batch_mean, per_channel));
  Tensor squares = sum(mul(centred, centred), reduced);
  // Rows behind each rank's statistics: this rank's, then each group's ranks' together.
  double rows =
      static_cast<double>(x.numel()) / static_cast<double>(std::max<int64_t>(channels, 1));
  for (int64_t group : groups) {
    // Gathered forward; backward each rank's gradient of the parts covers its own rows only, so
    // it is summed over the group first.
    const Tensor parts = copy_to_tp(
        gather_along(reshape(cat({batch_mean, squares}), {1, 2 * channels}), 0, group), group);
    const Tensor means = narrow(parts, 1, 0, channels);
    const Tensor group_mean = mean(means, {0});
    const Tensor spread = sub(means, group_mean);
    squares = add(sum(narrow(parts, 1, channels, channels), {0}),
                  mul(sum(mul(spread, spread), {0}), rows));
    batch_mean = group_mean;
    rows *= static_cast<double>(tp_group(group)->size());
  }
  const Tensor variance = div(squares, rows);
  Tensor y = mul(sub(x, reshape(batch_mean, per_channel)),
                 reshape(rsqrt(add(variance, eps)), per_channel));
  if (weight.defined()) y = mul(y, reshape(weight, per_channel));
  if (bias.defined()) y = add(y, reshape(bias, per_channel));
  // The running statistics as one process's batch_norm keeps them (an unbiased variance).
  NoGradGuard no_grad;
  auto update = [&](const Tensor& running, const Tensor& batch) {
    if (!running.defined()) return;
    Tensor target = running;
    target.copy_(add(mul(running, 1.0 - momentum), mul(batch.detach(), momentum)));
  };
  update(running_mean, batch_mean);
  update(running_var, mul(variance, rows / std::max(rows - 1.0, 1.0)));
  return y;
}

Tensor shard_along(const Tensor& x, int64_t dim, int64_t group) {
  const int parts = tp_group(group)->size(), rank = tp_group(group)->rank();
  const int64_t whole_size = x.size(dim), length = part_rows(whole_size, parts, rank);
  if (!is_floating(x.dtype()))  // a copy, not a view that keeps x whole
    return narrow(x, dim, part_start(whole_size, parts, rank), length).clone();
  if (whole_size % parts == 0) return scatter_to_tp(x, group, dim);
  // Unequal parts: each padded to the longest, so that the slice is one of equal parts and its
  // backward all-gathers the gradient.
  const int64_t longest = longest_part(whole_size, parts);
  std::vector<Tensor> blocks;
  for (int r = 0; r < parts; ++r)
    blocks.push_back(
        padded_to(narrow(x, dim, part_start(whole_size, parts, r), part_rows(whole_size, parts, r)),
                  dim, longest));
  return narrow(scatter_to_tp(cat(blocks, dim), group, dim), dim, 0, length).contiguous();
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::kReplicate:
      return "Replicate";
    case Kind::kShard:
      return "Shard(" + std::to_string(dim) + ")";
    case Kind::kPartial:
      return "Partial";
  }
  return "?";
}

std::string placements_str(const std::vector<Placement>& placements) {
  std::string text = "[";
  for (size_t i = 0; i < placements.size(); ++i) text += (i ? ", " : "") + placements[i].str();
  return text + "]";
}

// ---- DeviceMesh ----

DeviceMesh::DeviceMesh(std::shared_ptr<Communicator> group, std::string name) {
  TESSEL_CHECK(group != nullptr, "DeviceMesh: the communicator is null");
  group_ids_.push_back(register_tp_group(group));
  groups_.push_back(std::move(group));
  names_.push_back(std::move(name));
}

DeviceMesh::DeviceMesh(const ProcessGrid& grid) {
  for (const auto& [group, name] : {std::make_pair(grid.data_parallel_on_device(), "dp"),
                                    std::make_pair(grid.tensor_parallel_on_device(), "tp")}) {
    group_ids_.push_back(register_tp_group(group));
    groups_.push_back(group);
    names_.emplace_back(name);
  }
}

int DeviceMesh::size(int dim) const { return groups_.at(static_cast<size_t>(dim))->size(); }
int DeviceMesh::coordinate(int dim) const { return groups_.at(static_cast<size_t>(dim))->rank(); }
int64_t DeviceMesh::group(int dim) const { return group_ids_.at(static_cast<size_t>(dim)); }
const std::string& DeviceMesh::dim_name(int dim) const {
  return names_.at(static_cast<size_t>(dim));
}

std::string DeviceMesh::str() const {
  std::string text = "mesh (";
  for (int i = 0; i < ndim(); ++i)
    text += (i ? ", " : "") + names_[i] + "=" + std::to_string(size(i));
  return text + ")";
}

// ---- DTensor ----

DTensor::DTensor(Tensor local, std::shared_ptr<const DeviceMesh> mesh,
                 std::vector<Placement> placements)
    : local_(std::move(local)), mesh_(std::move(mesh)) {
  TESSEL_CHECK(local_.defined(), "DTensor: the local tensor is undefined");
  TESSEL_CHECK(mesh_ != nullptr, "DTensor: the mesh is null");
  placements_ = normalized(std::move(placements), *mesh_, local_.dim(), "DTensor");
  shape_ = local_.sizes();
  for (int i = 0; i < mesh_->ndim(); ++i)
    if (placements_[i].is_shard()) shape_[placements_[i].dim] *= mesh_->size(i);
}

DTensor::DTensor(Tensor local, std::shared_ptr<const DeviceMesh> mesh,
                 std::vector<Placement> placements, Shape global_shape)
    : DTensor(std::move(local), std::move(mesh), std::move(placements)) {
  Shape expected = global_shape;
  TESSEL_CHECK(expected.size() == shape_.size(), "DTensor: the global shape ",
               shape_str(global_shape), " does not have the local tensor's ", local_.dim(),
               " dims");
  for (int i = 0; i < mesh_->ndim(); ++i) {
    if (!placements_[i].is_shard()) continue;
    int64_t& length = expected[placements_[i].dim];
    length = part_rows(length, mesh_->size(i), mesh_->coordinate(i));
  }
  TESSEL_CHECK(expected == local_.sizes(), "DTensor: the local shape ", shape_str(local_.sizes()),
               " is not this rank's part ", shape_str(expected), " of the global shape ",
               shape_str(global_shape), " laid out as ", placements_str(placements_), " on ",
               mesh_->str());
  shape_ = std::move(global_shape);
}

DTensor DTensor::redistribute(std::vector<Placement> target) const {
  TESSEL_CHECK(defined(), "DTensor::redistribute: the DTensor is undefined");
  target = normalized(std::move(target), *mesh_, dim(), "DTensor::redistribute");
  Tensor local = local_;
  std::vector<Placement> current = placements_;
  auto cut_elsewhere = [&](int mesh_dim, int64_t tensor_dim) {
    for (int k = 0; k < mesh_->ndim(); ++k)
      if (k != mesh_dim && ((current[k].is_shard() && current[k].dim == tensor_dim) ||
                            (target[k].is_shard() && target[k].dim == tensor_dim)))
        return true;
    return false;
  };
  // Into Partial over a mesh dim, without communication: from Shard(d), each rank's part at its
  // place in zeros of the whole dim (the parts sum to the whole; backward each rank keeps its
  // part of the gradient); from Replicate, the values on the dim's coordinate 0 and zeros
  // elsewhere (backward the gradient reaches coordinate 0's copy, the other ranks' is zero).
  for (int i = 0; i < mesh_->ndim(); ++i) {
    if (!target[i].is_partial() || current[i].is_partial()) continue;
    TESSEL_CHECK(is_floating(local.dtype()), "DTensor::redistribute: a ", dtype_name(local.dtype()),
                 " tensor cannot be Partial (sums of ids or labels are not offered)");
    const Communicator& group = *tp_group(mesh_->group(i));
    if (current[i].is_shard()) {
      const int64_t d = current[i].dim;
      TESSEL_CHECK(!cut_elsewhere(i, d), "DTensor::redistribute: ", current[i].str(),
                   " -> Partial over mesh dim ", mesh_->dim_name(i),
                   " where another mesh dim also cuts dim ", d, " is not offered (from ",
                   placements_str(placements_), " to ", placements_str(target), ")");
      auto zeros_of = [&](int64_t length) {
        Shape sizes = local.sizes();
        sizes[d] = length;
        return zeros(sizes, TensorOptions(local.dtype()).device(local.device()));
      };
      const int64_t before = part_start(shape_[d], group.size(), group.rank());
      const int64_t after = shape_[d] - before - local.size(d);
      std::vector<Tensor> pieces;
      if (before > 0) pieces.push_back(zeros_of(before));
      pieces.push_back(local);
      if (after > 0) pieces.push_back(zeros_of(after));
      local = pieces.size() == 1 ? local : cat(pieces, d);
    } else if (group.rank() != 0) {
      local = masked_fill(
          local, full(Shape{}, 1.0, TensorOptions(DType::kBool).device(local.device())), 0.0);
    }
    current[i] = target[i];
  }
  // Shard(a) -> Shard(b) over one mesh dim, where no other mesh dim cuts a or b: an all-to-all.
  for (int i = 0; i < mesh_->ndim(); ++i) {
    if (!current[i].is_shard() || !target[i].is_shard() || current[i] == target[i] ||
        !is_floating(local.dtype()) || cut_elsewhere(i, current[i].dim) ||
        cut_elsewhere(i, target[i].dim) || shape_[current[i].dim] % mesh_->size(i) != 0 ||
        shape_[target[i].dim] % mesh_->size(i) != 0)
      continue;
    local = all_to_all_tp(local, target[i].dim, current[i].dim, mesh_->group(i));
    current[i] = target[i];
  }
  // Partial -> Shard(d) over one mesh dim, where no other mesh dim cuts d: a reduce-scatter (half
  // an all-reduce's traffic, no slice after it).
  for (int i = 0; i < mesh_->ndim(); ++i) {
    if (!current[i].is_partial() || !target[i].is_shard() || !is_floating(local.dtype()) ||
        cut_elsewhere(i, target[i].dim) || local.size(target[i].dim) % mesh_->size(i) != 0)
      continue;
    local = reduce_scatter_to_tp(local, mesh_->group(i), target[i].dim);
    current[i] = target[i];
  }
  // Then everything that leaves a Shard or a Partial becomes Replicate, then the new shards are
  // sliced: no tensor dim is ever sharded over two mesh dims on the way.
  for (int i = 0; i < mesh_->ndim(); ++i) {
    if (current[i] == target[i]) continue;
    if (current[i].is_shard()) {
      local = gather_along(local, current[i].dim, mesh_->group(i), shape_[current[i].dim]);
    } else if (current[i].is_partial()) {
      TESSEL_CHECK(is_floating(local.dtype()), "DTensor::redistribute: a Partial ",
                   dtype_name(local.dtype()), " tensor cannot be summed here");
      local = reduce_from_tp(local, mesh_->group(i));
    }
    current[i] = Placement::replicate();
  }
  for (int i = 0; i < mesh_->ndim(); ++i) {
    if (current[i] == target[i]) continue;
    local = shard_along(local, target[i].dim, mesh_->group(i));
    current[i] = target[i];
  }
  return DTensor(local, mesh_, current, shape_);
}

Tensor DTensor::full_tensor() const {
  return redistribute(std::vector<Placement>(mesh_->ndim(), Placement::replicate())).local();
}

std::string DTensor::str() const {
  if (!defined()) return "DTensor(undefined)";
  std::ostringstream out;
  out << "DTensor(shape " << shape_str(shape_) << ", " << placements_str(placements_) << ", local "
      << shape_str(local_.sizes()) << ")";
  return out.str();
}

DTensor distribute_tensor(const Tensor& full, std::shared_ptr<const DeviceMesh> mesh,
                          std::vector<Placement> placements) {
  TESSEL_CHECK(mesh != nullptr, "distribute_tensor: the mesh is null");
  const int ndim = mesh->ndim();
  return DTensor(full, std::move(mesh), std::vector<Placement>(ndim, Placement::replicate()))
      .redistribute(std::move(placements));
}

// ---- ops ----

namespace dt {
namespace {

void check_same_mesh(const DTensor& a, const DTensor& b, const char* op) {
  TESSEL_CHECK(a.defined() && b.defined(), op, ": an operand is undefined");
  TESSEL_CHECK(a.mesh() == b.mesh(), op, ": the operands live on different meshes (",
               a.mesh()->str(), " and ", b.mesh()->str(), ")");
}

// An op's result: `local` laid out as `placements`, each sharded dim as long as `reference`'s
// (the operand whose dim it keeps), every other dim as long as `local`'s.
DTensor result_of(Tensor local, const std::shared_ptr<const DeviceMesh>& mesh,
                  std::vector<Placement> placements, const Shape& reference) {
  Shape global_shape = local.sizes();
  for (const Placement& placement : placements)  // the ops' shard dims are non-negative
    if (placement.is_shard()) global_shape.at(placement.dim) = reference.at(placement.dim);
  return DTensor(std::move(local), mesh, std::move(placements), std::move(global_shape));
}

// An op's result laid out as `like`, of `like`'s global size in its sharded dims.
DTensor result_like(Tensor local, const DTensor& like) {
  return result_of(std::move(local), like.mesh(), like.placements(), like.shape());
}

std::vector<Placement> replicated(const DTensor& x) {
  return std::vector<Placement>(x.mesh()->ndim(), Placement::replicate());
}

// Partial over any mesh dim combined first (for ops that are not linear).
DTensor combine_partials(const DTensor& x) {
  std::vector<Placement> target = x.placements();
  for (Placement& placement : target)
    if (placement.is_partial()) placement = Placement::replicate();
  return target == x.placements() ? x : x.redistribute(target);
}

// How a product contracts x with a weight: y = x P over x's dim `x_in` and the weight's dim
// `w_in`; the weight's dim `w_out` becomes y's dim `y_out`; x's other dims pass to y (those for
// which `keeps_rows` holds may stay sharded; convolutions' spatial dims would need halos).
struct Contraction {
  const char* op;
  int64_t x_in, y_out, w_out, w_in;
  bool (*keeps_rows)(int64_t dim, int64_t x_in);
  std::function<Tensor(const Tensor& x, const Tensor& weight)> multiply;
  std::function<Tensor(const Tensor& y, const Tensor& bias)> add_bias;
};

// Decides x's layout and y's per mesh dim, moves x, multiplies the shards and adds the bias once.
DTensor contract(const DTensor& x, const DTensor& weight, const DTensor& bias,
                 const Contraction& how) {
  const char* op = how.op;
  check_same_mesh(x, weight, op);
  TESSEL_CHECK(how.x_in < x.dim() && x.shape()[how.x_in] == weight.shape()[how.w_in], op, ": x ",
               x.str(), " does not match the weight ", weight.str());
  const DeviceMesh& mesh = *x.mesh();
  std::vector<Placement> x_target = x.placements(), y_placements(mesh.ndim());
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement w = weight.placements()[i], px = x.placements()[i];
    TESSEL_CHECK(w.is_replicate() || w.is_shard(how.w_out) || w.is_shard(how.w_in), op,
                 ": the weight ", weight.str(), " is ", w.str(), " over ", mesh.dim_name(i),
                 "; weights are Replicate or split by output or input features");
    if (w.is_replicate()) {
      // Rows of x may stay split, and a Partial x gives a Partial y (the product is linear).
      if (px.is_shard() && !how.keeps_rows(px.dim, how.x_in)) x_target[i] = Placement::replicate();
      y_placements[i] = x_target[i];
    } else if (w.is_shard(how.w_out)) {
      x_target[i] = Placement::replicate();  // output features: every rank needs all of x
      y_placements[i] = Placement::shard(how.y_out);
    } else {  // input features: each rank sums its part of the inner dim
      x_target[i] = Placement::shard(how.x_in);
      y_placements[i] = Placement::partial();
    }
  }
  const DTensor moved = x_target == x.placements() ? x : x.redistribute(x_target);
  // A whole x meeting a weight split by output features: each rank's gradient for x covers its
  // features only, so backward sums them over the mesh dim (identity forward).
  Tensor x_local = moved.local();
  for (int i = 0; i < mesh.ndim(); ++i)
    if (weight.placements()[i].is_shard(how.w_out)) x_local = copy_to_tp(x_local, mesh.group(i));
  Shape y_reference = x.shape();  // y's dims are x's, but for the weight's output features
  y_reference.at(static_cast<size_t>(how.y_out)) = weight.shape()[how.w_out];
  DTensor y = result_of(how.multiply(x_local, weight.local()), x.mesh(), y_placements, y_reference);
  if (!bias.defined()) return y;
  check_same_mesh(y, bias, op);
  TESSEL_CHECK(bias.dim() == 1 && bias.shape()[0] == weight.shape()[how.w_out], op, ": the bias ",
               bias.str(), " does not match the weight ", weight.str());
  // The bias is added once: Partial sums are combined first; it is split as y's features are.
  y = combine_partials(y);
  std::vector<Placement> bias_target(mesh.ndim(), Placement::replicate());
  for (int i = 0; i < mesh.ndim(); ++i)
    if (y.placements()[i].is_shard(how.y_out)) bias_target[i] = Placement::shard(0);
  const DTensor b = bias.placements() == bias_target ? bias : bias.redistribute(bias_target);
  return result_like(how.add_bias(y.local(), b.local()), y);
}

bool any_other_dim(int64_t dim, int64_t x_in) { return dim != x_in; }
bool batch_dim_only(int64_t dim, int64_t /*x_in*/) { return dim == 0; }

Tensor add_last_dim_bias(const Tensor& y, const Tensor& bias) { return tessel::add(y, bias); }

enum class Binary { kAdd, kSub, kMul };

DTensor binary(const DTensor& a_in, const DTensor& b_in, Binary kind, const char* op) {
  check_same_mesh(a_in, b_in, op);
  TESSEL_CHECK(a_in.shape() == b_in.shape(), op, ": the shapes differ (", shape_str(a_in.shape()),
               " and ", shape_str(b_in.shape()), "); broadcasting is not offered for DTensors");
  DTensor a = a_in;
  // Sums of two Partial operands stay Partial; anything else needs the combined values.
  std::vector<Placement> a_target = a.placements();
  for (int i = 0; i < a.mesh()->ndim(); ++i) {
    const bool both_partial = a.placements()[i].is_partial() && b_in.placements()[i].is_partial();
    if (a_target[i].is_partial() && !(both_partial && kind != Binary::kMul))
      a_target[i] = Placement::replicate();
  }
  if (a_target != a.placements()) a = a.redistribute(a_target);
  const DTensor b = b_in.placements() == a.placements() ? b_in : b_in.redistribute(a.placements());
  Tensor result;
  switch (kind) {
    case Binary::kAdd:
      result = tessel::add(a.local(), b.local());
      break;
    case Binary::kSub:
      result = tessel::sub(a.local(), b.local());
      break;
    case Binary::kMul:
      result = tessel::mul(a.local(), b.local());
      break;
  }
  return result_like(result, a);
}

}  // namespace

DTensor linear(const DTensor& x, const DTensor& weight, const DTensor& bias) {
  TESSEL_CHECK(x.defined() && weight.defined() && weight.dim() == 2 && x.dim() >= 1,
               "dt::linear: x (..., in) and a 2-D weight (out, in) are needed, got ", x.str(),
               " and ", weight.str());
  const int64_t last = x.dim() - 1;
  return contract(
      x, weight, bias,
      {"dt::linear", last, last, 0, 1, any_other_dim,
       [](const Tensor& a, const Tensor& w) { return tessel::linear(a, w); }, add_last_dim_bias});
}

DTensor matmul(const DTensor& a, const DTensor& b) {
  TESSEL_CHECK(a.defined() && b.defined() && b.dim() == 2 && a.dim() >= 1,
               "dt::matmul: a (..., k) and a 2-D b (k, m) are needed, got ", a.str(), " and ",
               b.str());
  const int64_t last = a.dim() - 1;
  return contract(
      a, b, DTensor(),
      {"dt::matmul", last, last, 1, 0, any_other_dim,
       [](const Tensor& x, const Tensor& w) { return tessel::matmul(x, w); }, add_last_dim_bias});
}

DTensor conv2d(const DTensor& x, const DTensor& weight, const DTensor& bias,
               std::vector<int64_t> stride, std::vector<int64_t> padding) {
  TESSEL_CHECK(x.defined() && weight.defined() && x.dim() == 4 && weight.dim() == 4,
               "dt::conv2d: x (N, C, H, W) and weight (O, C, kh, kw) are needed, got ", x.str(),
               " and ", weight.str());
  return contract(x, weight, bias,
                  {"dt::conv2d", 1, 1, 0, 1, batch_dim_only,
                   [stride, padding](const Tensor& a, const Tensor& w) {
                     return tessel::conv2d(a, w, Tensor(), stride, padding);
                   },
                   [](const Tensor& y, const Tensor& b) {
                     return tessel::add(y, reshape(b, {1, b.size(0), 1, 1}));
                   }});
}

DTensor embedding(const DTensor& weight, const DTensor& ids) {
  check_same_mesh(weight, ids, "dt::embedding");
  TESSEL_CHECK(weight.dim() == 2 && !is_floating(ids.local().dtype()),
               "dt::embedding: a 2-D weight (rows, features) and integer ids are needed, got ",
               weight.str(), " and ", ids.str());
  const DeviceMesh& mesh = *weight.mesh();
  std::vector<Placement> ids_target = ids.placements(), out(mesh.ndim());
  int vocab_dim = -1;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement w = weight.placements()[i];
    TESSEL_CHECK(!ids.placements()[i].is_partial(), "dt::embedding: the ids ", ids.str(),
                 " are Partial over ", mesh.dim_name(i));
    TESSEL_CHECK(!w.is_partial(), "dt::embedding: the weight ", weight.str(), " is Partial");
    if (w.is_replicate()) {
      out[i] = ids.placements()[i];  // rows of ids stay split
      continue;
    }
    ids_target[i] = Placement::replicate();
    if (w.is_shard(1)) {
      out[i] = Placement::shard(ids.dim());  // features
    } else {
      out[i] = Placement::partial();  // rows of the table: other ranks' ids give zeros
      vocab_dim = i;
    }
  }
  const DTensor moved = ids_target == ids.placements() ? ids : ids.redistribute(ids_target);
  Tensor index = to_dtype(moved.local(), DType::kInt64);
  Tensor rows;
  if (vocab_dim < 0) {
    rows = tessel::embedding(weight.local(), index);
  } else {
    const int64_t count = weight.local().size(0);
    const int64_t start =
        part_start(weight.shape()[0], mesh.size(vocab_dim), mesh.coordinate(vocab_dim));
    const DType dtype = weight.local().dtype();
    const Tensor in_range =
        tessel::mul(to_dtype(ge(index, static_cast<double>(start)), dtype),
                    to_dtype(lt(index, static_cast<double>(start + count)), dtype));
    const Tensor local_index =
        where(gt(in_range, 0.5), tessel::sub(index, static_cast<double>(start)), zeros_like(index));
    rows = tessel::mul(tessel::embedding(weight.local(), local_index), unsqueeze(in_range, -1));
  }
  Shape reference = ids.shape();  // the ids' dims, then the table's features
  reference.push_back(weight.shape()[1]);
  return result_of(rows, weight.mesh(), out, reference);
}

DTensor cross_entropy(const DTensor& logits_in, const DTensor& target, int64_t ignore_index) {
  check_same_mesh(logits_in, target, "dt::cross_entropy");
  TESSEL_CHECK(
      logits_in.dim() == 2 && target.dim() == 1 && target.shape()[0] == logits_in.shape()[0],
      "dt::cross_entropy: logits (rows, classes) and a target (rows) are needed, got ",
      logits_in.str(), " and ", target.str());
  const DTensor logits = combine_partials(logits_in);
  const DeviceMesh& mesh = *logits.mesh();
  // The target's rows split as the logits' rows are; whole elsewhere.
  std::vector<Placement> target_layout(mesh.ndim(), Placement::replicate());
  std::vector<Placement> loss_sum_layout(mesh.ndim(), Placement::replicate());
  int class_dim = -1;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (logits.placements()[i].is_shard(0)) {
      target_layout[i] = Placement::shard(0);
      loss_sum_layout[i] = Placement::partial();
    } else if (logits.placements()[i].is_shard(1)) {
      class_dim = i;
    }
  }
  const DTensor rows =
      target.placements() == target_layout ? target : target.redistribute(target_layout);
  const Tensor labels = to_dtype(rows.local(), DType::kInt64);
  const Tensor valid = ne(labels, static_cast<double>(ignore_index));
  const double local_count = tessel::sum(to_dtype(valid, DType::kFloat64)).item<double>();
  Tensor local_sum;
  if (class_dim < 0) {
    local_sum = tessel::cross_entropy(logits.local(), labels, ignore_index, 0.0, "sum");
  } else if (local_count > 0) {
    // The vocabulary-parallel loss gives the mean over this rank's rows, the same on every rank
    // of the class dimension.
    local_sum = tessel::mul(
        vocab_parallel_cross_entropy(
            logits.local(), labels, mesh.group(class_dim), ignore_index, /*sum_rows=*/false,
            part_start(logits.shape()[1], mesh.size(class_dim), mesh.coordinate(class_dim))),
        local_count);
  } else {
    local_sum = tessel::mul(tessel::sum(logits.local()), 0.0);  // no rows here: zero, in the graph
  }
  Tensor count = full({}, local_count, TensorOptions(logits.local().dtype()));
  for (int i = 0; i < mesh.ndim(); ++i)
    if (loss_sum_layout[i].is_partial()) count = reduce_from_tp(count, mesh.group(i));
  const DTensor total =
      DTensor(local_sum, logits.mesh(), loss_sum_layout).redistribute(replicated(logits));
  return DTensor(tessel::div(total.local(), count), logits.mesh(), replicated(logits));
}

DTensor add(const DTensor& a, const DTensor& b) { return binary(a, b, Binary::kAdd, "dt::add"); }
DTensor sub(const DTensor& a, const DTensor& b) { return binary(a, b, Binary::kSub, "dt::sub"); }
DTensor mul(const DTensor& a, const DTensor& b) { return binary(a, b, Binary::kMul, "dt::mul"); }

DTensor relu(const DTensor& x) {
  TESSEL_CHECK(x.defined(), "dt::relu: the operand is undefined");
  const DTensor combined = combine_partials(x);
  return result_like(tessel::relu(combined.local()), combined);
}

DTensor gelu(const DTensor& x) {
  TESSEL_CHECK(x.defined(), "dt::gelu: the operand is undefined");
  const DTensor combined = combine_partials(x);
  return result_like(tessel::gelu(combined.local()), combined);
}

DTensor softmax(const DTensor& x, int64_t dim) {
  TESSEL_CHECK(x.defined(), "dt::softmax: the operand is undefined");
  dim = normalize_dim(dim, x.dim(), "dt::softmax");
  std::vector<Placement> target = x.placements();
  for (Placement& placement : target)
    if (placement.is_partial() || placement.is_shard(dim)) placement = Placement::replicate();
  const DTensor moved = target == x.placements() ? x : x.redistribute(target);
  return result_like(tessel::softmax(moved.local(), dim), moved);
}

namespace {

// x with the mesh dims that shard one of `dims` (or hold Partial sums, unless `keep_partial`)
// moved to Replicate.
DTensor gathered_along(const DTensor& x, const std::vector<int64_t>& dims, bool keep_partial) {
  std::vector<Placement> target = x.placements();
  for (Placement& placement : target) {
    const bool sharded =
        placement.is_shard() && std::find(dims.begin(), dims.end(), placement.dim) != dims.end();
    if (sharded || (placement.is_partial() && !keep_partial)) placement = Placement::replicate();
  }
  return target == x.placements() ? x : x.redistribute(target);
}

DTensor pool(const DTensor& x, const char* op, bool linear,
             const std::function<Tensor(const Tensor&)>& run) {
  TESSEL_CHECK(x.defined() && x.dim() == 4, op, ": expected x (N, C, H, W), got ",
               x.defined() ? x.str() : "an undefined operand");
  const DTensor moved = gathered_along(x, {2, 3}, /*keep_partial=*/linear);
  return result_like(run(moved.local()), moved);
}

// A per-channel tensor laid out as x's channel dim (1) is: moved there, or for running statistics
// (written in place, so a moved copy would lose the update) checked to be there already.
DTensor as_channels(const DTensor& per_channel, const DTensor& x, bool written_in_place) {
  if (!per_channel.defined()) return per_channel;
  check_same_mesh(x, per_channel, "dt::batch_norm");
  std::vector<Placement> target(x.mesh()->ndim(), Placement::replicate());
  for (int i = 0; i < x.mesh()->ndim(); ++i)
    if (x.placements()[i].is_shard(1)) target[i] = Placement::shard(0);
  if (target == per_channel.placements()) return per_channel;
  TESSEL_CHECK(!written_in_place, "dt::batch_norm: running statistics ", per_channel.str(),
               " must be laid out as x's channels, ", placements_str(target), ", for x ", x.str());
  return per_channel.redistribute(target);
}

Tensor local_or_none(const DTensor& x) { return x.defined() ? x.local() : Tensor(); }

}  // namespace

DTensor max_pool2d(const DTensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                   std::vector<int64_t> padding) {
  return pool(x, "dt::max_pool2d", /*linear=*/false, [&](const Tensor& local) {
    return tessel::max_pool2d(local, kernel_size, stride, padding);
  });
}

DTensor avg_pool2d(const DTensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                   std::vector<int64_t> padding) {
  return pool(x, "dt::avg_pool2d", /*linear=*/true, [&](const Tensor& local) {
    return tessel::avg_pool2d(local, kernel_size, stride, padding);
  });
}

DTensor adaptive_avg_pool2d(const DTensor& x, std::vector<int64_t> output_size) {
  return pool(x, "dt::adaptive_avg_pool2d", /*linear=*/true,
              [&](const Tensor& local) { return tessel::adaptive_avg_pool2d(local, output_size); });
}

DTensor batch_norm(const DTensor& x, const DTensor& weight, const DTensor& bias,
                   const DTensor& running_mean, const DTensor& running_var, bool training,
                   double momentum, double eps) {
  TESSEL_CHECK(x.defined() && x.dim() >= 2, "dt::batch_norm: expected x (N, C, ...), got ",
               x.defined() ? x.str() : "an undefined operand");
  const DTensor laid_out = combine_partials(x);  // x's layout, Partial combined
  // Training with rows cut over mesh dims: the statistics are combined across those dims' ranks
  // and each rank normalises its own rows, x staying where it is. Eval (running statistics) and
  // channel shards normalise each rank's part alone.
  std::vector<int64_t> row_groups;
  for (int i = 0; training && i < laid_out.mesh()->ndim(); ++i) {
    const Placement placement = laid_out.placements()[i];
    if (!placement.is_shard() || placement.is_shard(1)) continue;
    // batch_norm_across weighs every rank's statistics alike.
    TESSEL_CHECK(laid_out.shape()[placement.dim] % laid_out.mesh()->size(i) == 0,
                 "dt::batch_norm: in training the rows must be cut into equal parts, but x ",
                 laid_out.str(), " cuts dim ", placement.dim, " into ", laid_out.mesh()->size(i),
                 " unequal parts over ", laid_out.mesh()->dim_name(i));
    row_groups.push_back(laid_out.mesh()->group(i));
  }
  auto local_channels = [&](const DTensor& per_channel, bool written_in_place) {
    return local_or_none(as_channels(per_channel, laid_out, written_in_place));
  };
  const Tensor w = local_channels(weight, false), b = local_channels(bias, false);
  const Tensor stats_mean = local_channels(running_mean, true);
  const Tensor stats_var = local_channels(running_var, true);
  const Tensor y = row_groups.empty() ? tessel::batch_norm(laid_out.local(), w, b, stats_mean,
                                                           stats_var, training, momentum, eps)
                                      : batch_norm_across(laid_out.local(), w, b, stats_mean,
                                                          stats_var, momentum, eps, row_groups);
  return result_like(y, laid_out);
}

DTensor layer_norm(const DTensor& x, const Shape& normalized_shape, const DTensor& weight,
                   const DTensor& bias, double eps) {
  TESSEL_CHECK(x.defined(), "dt::layer_norm: the operand is undefined");
  const int64_t normalized = static_cast<int64_t>(normalized_shape.size());
  TESSEL_CHECK(normalized >= 1 && normalized <= x.dim(), "dt::layer_norm: normalized_shape ",
               shape_str(normalized_shape), " does not fit x ", x.str());
  std::vector<int64_t> feature_dims;
  for (int64_t d = x.dim() - normalized; d < x.dim(); ++d) feature_dims.push_back(d);
  const DTensor moved = gathered_along(x, feature_dims, /*keep_partial=*/false);
  auto whole = [&](const DTensor& parameter) {
    if (!parameter.defined()) return Tensor();
    check_same_mesh(x, parameter, "dt::layer_norm");
    return parameter.full_tensor();
  };
  const DTensor result = result_like(
      tessel::layer_norm(moved.local(), normalized_shape, whole(weight), whole(bias), eps), moved);
  const DTensor laid_out = combine_partials(x);
  return result.placements() == laid_out.placements() ? result
                                                      : result.redistribute(laid_out.placements());
}

DTensor sum(const DTensor& x) {
  TESSEL_CHECK(x.defined(), "dt::sum: the operand is undefined");
  std::vector<Placement> partial_sums = replicated(x);
  for (int i = 0; i < x.mesh()->ndim(); ++i)
    if (!x.placements()[i].is_replicate()) partial_sums[i] = Placement::partial();
  return DTensor(tessel::sum(x.local()), x.mesh(), partial_sums).redistribute(replicated(x));
}

}  // namespace dt
}  // namespace tessel::parallel
