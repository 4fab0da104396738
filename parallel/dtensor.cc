#include "parallel/dtensor.h"

#include <numeric>
#include <sstream>
#include <utility>

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

// Swaps `dim` with the last dim (a view; its own inverse).
Tensor with_dim_last(const Tensor& x, int64_t dim) {
  const int64_t last = x.dim() - 1;
  if (dim == last) return x;
  std::vector<int64_t> order(static_cast<size_t>(x.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[dim], order[last]);
  return permute(x, order);
}

// Every rank's part along `dim` of the group, in rank order (backward: this rank's part).
Tensor all_gather_along(const Tensor& x, int64_t dim, int64_t group) {
  return with_dim_last(gather_from_tp(with_dim_last(x, dim), group), dim);
}

// This rank's part along `dim` (backward: all-gather).
Tensor slice_along(const Tensor& x, int64_t dim, int64_t group, int parts) {
  TESSEL_CHECK(x.size(dim) % parts == 0, "DTensor: dim ", dim, " of size ", x.size(dim),
               " (local shape ", shape_str(x.sizes()), ") does not split into ", parts,
               " equal parts; shards must be equal");
  return with_dim_last(scatter_to_tp(with_dim_last(x, dim), group), dim);
}

}  // namespace

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

DTensor DTensor::redistribute(std::vector<Placement> target) const {
  TESSEL_CHECK(defined(), "DTensor::redistribute: the DTensor is undefined");
  target = normalized(std::move(target), *mesh_, dim(), "DTensor::redistribute");
  for (int i = 0; i < mesh_->ndim(); ++i) {
    TESSEL_CHECK(!target[i].is_partial() || placements_[i].is_partial(),
                 "DTensor::redistribute: ", placements_[i].str(), " -> Partial over mesh dim ",
                 mesh_->dim_name(i), " is not offered (from ", placements_str(placements_), " to ",
                 placements_str(target), ")");
  }
  Tensor local = local_;
  std::vector<Placement> current = placements_;
  // First everything that leaves a Shard or a Partial becomes Replicate, then the new shards are
  // sliced: no tensor dim is ever sharded over two mesh dims on the way.
  for (int i = 0; i < mesh_->ndim(); ++i) {
    if (current[i] == target[i]) continue;
    if (current[i].is_shard()) {
      local = all_gather_along(local, current[i].dim, mesh_->group(i));
    } else if (current[i].is_partial()) {
      local = reduce_from_tp(local, mesh_->group(i));
    }
    current[i] = Placement::replicate();
  }
  for (int i = 0; i < mesh_->ndim(); ++i) {
    if (current[i] == target[i]) continue;
    local = slice_along(local, target[i].dim, mesh_->group(i), mesh_->size(i));
    current[i] = target[i];
  }
  return DTensor(local, mesh_, current);
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
  for (const Placement& placement : placements)
    TESSEL_CHECK(!placement.is_partial(), "distribute_tensor: ", placements_str(placements),
                 ": Partial is not a layout of a whole tensor; distribute as Replicate");
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

// y = x P (+ bias) where P is a weight whose dim `out` holds the output features and dim `in`
// the input features (linear: weight (out, in); matmul: b (in, out)). Decides x's layout and y's
// per mesh dim, moves x, and multiplies the shards.
DTensor project(const DTensor& x, const DTensor& weight, int64_t out, int64_t in,
                const DTensor& bias, const char* op) {
  check_same_mesh(x, weight, op);
  TESSEL_CHECK(weight.dim() == 2, op, ": the weight must be 2-D, got ", weight.str());
  TESSEL_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[in], op, ": x ", x.str(),
               " does not match the weight ", weight.str());
  const DeviceMesh& mesh = *x.mesh();
  const int64_t x_last = x.dim() - 1;
  std::vector<Placement> x_target = x.placements(), y_placements(mesh.ndim());
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement w = weight.placements()[i], px = x.placements()[i];
    TESSEL_CHECK(!w.is_partial(), op, ": the weight ", weight.str(), " is Partial over ",
                 mesh.dim_name(i), "; weights must be Replicate or Shard");
    if (w.is_replicate()) {
      // Rows of x (a leading dim) may stay split, and a Partial x gives a Partial y (linear).
      if (px.is_shard(x_last)) x_target[i] = Placement::replicate();
      y_placements[i] = x_target[i];
    } else if (w.is_shard(out)) {
      x_target[i] = Placement::replicate();  // columns: every rank needs all of x
      y_placements[i] = Placement::shard(x_last);
    } else {  // w.is_shard(in): rows; each rank sums its part of the inner dim
      x_target[i] = Placement::shard(x_last);
      y_placements[i] = Placement::partial();
    }
  }
  const DTensor moved = x_target == x.placements() ? x : x.redistribute(x_target);
  const Tensor product = out == 0 ? tessel::linear(moved.local(), weight.local())
                                  : tessel::matmul(moved.local(), weight.local());
  DTensor y(product, x.mesh(), y_placements);
  if (!bias.defined()) return y;
  check_same_mesh(y, bias, op);
  TESSEL_CHECK(bias.dim() == 1 && bias.shape()[0] == weight.shape()[out], op, ": the bias ",
               bias.str(), " does not match the weight ", weight.str());
  // The bias is added once: Partial sums are combined first; it is split as y's columns are.
  y = combine_partials(y);
  std::vector<Placement> bias_target(mesh.ndim(), Placement::replicate());
  for (int i = 0; i < mesh.ndim(); ++i)
    if (y.placements()[i].is_shard(x_last)) bias_target[i] = Placement::shard(0);
  const DTensor b = bias.placements() == bias_target ? bias : bias.redistribute(bias_target);
  return DTensor(tessel::add(y.local(), b.local()), y.mesh(), y.placements());
}

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
  return DTensor(result, a.mesh(), a.placements());
}

}  // namespace

DTensor linear(const DTensor& x, const DTensor& weight, const DTensor& bias) {
  return project(x, weight, /*out=*/0, /*in=*/1, bias, "dt::linear");
}

DTensor matmul(const DTensor& a, const DTensor& b) {
  return project(a, b, /*out=*/1, /*in=*/0, DTensor(), "dt::matmul");
}

DTensor add(const DTensor& a, const DTensor& b) { return binary(a, b, Binary::kAdd, "dt::add"); }
DTensor sub(const DTensor& a, const DTensor& b) { return binary(a, b, Binary::kSub, "dt::sub"); }
DTensor mul(const DTensor& a, const DTensor& b) { return binary(a, b, Binary::kMul, "dt::mul"); }

DTensor relu(const DTensor& x) {
  TESSEL_CHECK(x.defined(), "dt::relu: the operand is undefined");
  const DTensor combined = combine_partials(x);
  return DTensor(tessel::relu(combined.local()), combined.mesh(), combined.placements());
}

DTensor gelu(const DTensor& x) {
  TESSEL_CHECK(x.defined(), "dt::gelu: the operand is undefined");
  const DTensor combined = combine_partials(x);
  return DTensor(tessel::gelu(combined.local()), combined.mesh(), combined.placements());
}

DTensor softmax(const DTensor& x, int64_t dim) {
  TESSEL_CHECK(x.defined(), "dt::softmax: the operand is undefined");
  dim = normalize_dim(dim, x.dim(), "dt::softmax");
  std::vector<Placement> target = x.placements();
  for (Placement& placement : target)
    if (placement.is_partial() || placement.is_shard(dim)) placement = Placement::replicate();
  const DTensor moved = target == x.placements() ? x : x.redistribute(target);
  return DTensor(tessel::softmax(moved.local(), dim), moved.mesh(), moved.placements());
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
