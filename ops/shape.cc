// View ops: reshape, view, transpose, permute, slice, select, expand, squeeze, unsqueeze. Each
// builds its output with make_view over the input's storage (no kernel, no copy); reshape copies
// only when the strides allow no view. Backward passes are views again, except slice and select,
// whose gradients are scattered into zeros by the "slice_backward" op (its CPU kernel is in
// ops/cpu/shape.cc, with the slice geometry both use).
#include "ops/shape.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

using cpu::normalize_slice;
using cpu::slice_geometry;

OpCost no_cost(const std::vector<Tensor>&, const std::vector<Tensor>&, const Attrs&) {
  return OpCost{0, 0};
}

// Resolves one -1 in `shape` from the element count and checks the count matches.
Shape infer_shape(const char* op_name, const Shape& shape, const Tensor& x) {
  const int64_t numel = x.numel();
  Shape result = shape;
  int64_t inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TESSEL_CHECK(inferred < 0, op_name, ": only one dimension can be -1, got shape ",
                   shape_str(shape));
      inferred = static_cast<int64_t>(i);
    } else {
      TESSEL_CHECK(shape[i] >= 0, op_name, ": invalid size ", shape[i], " in shape ",
                   shape_str(shape));
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    TESSEL_CHECK(known > 0, op_name, ": cannot infer the -1 in shape ", shape_str(shape),
                 " for an input of ", numel, " elements (shape ", shape_str(x.sizes()), ")");
    TESSEL_CHECK(numel % known == 0, op_name, ": shape ", shape_str(shape),
                 " is invalid for an input of ", numel, " elements (shape ", shape_str(x.sizes()),
                 ")");
    result[inferred] = numel / known;
    known *= result[inferred];
  }
  TESSEL_CHECK(known == numel, op_name, ": shape ", shape_str(shape),
               " is invalid for an input of ", numel, " elements (shape ", shape_str(x.sizes()),
               ")");
  return result;
}

// Strides that let `new_sizes` view a tensor of `sizes`/`strides` without copying, if any.
// Dimensions are matched in chunks that are contiguous with respect to each other.
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides,
                                  const Shape& new_sizes) {
  const int64_t new_ndim = static_cast<int64_t>(new_sizes.size());
  Shape new_strides(new_sizes.size(), 1);
  if (sizes.empty()) return new_strides;  // a 0-d tensor views as any shape of one element
  if (shape_numel(sizes) == 0) return contiguous_strides(new_sizes);
  int64_t view_d = new_ndim - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(sizes.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= sizes[tensor_d];
    bool chunk_ends = tensor_d == 0 || (sizes[tensor_d - 1] != 1 &&
                                        strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
      new_strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_sizes[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (tensor_d > 0) {
      chunk_base_stride = strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

Tensor reshape_view(const char* op_name, const Tensor& x, const Attrs& attrs, bool may_copy) {
  Shape sizes = infer_shape(op_name, attrs.get<Shape>("shape"), x);
  std::optional<Shape> strides = view_strides(x.sizes(), x.strides(), sizes);
  if (strides) return make_view(x, sizes, *strides, x.storage_offset());
  TESSEL_CHECK(may_copy, "view: shape ", shape_str(sizes), " is not compatible with the input's ",
               "shape ", shape_str(x.sizes()), " and strides ", shape_str(x.strides()),
               " (at least one dimension spans two non-adjacent memory regions); use reshape() "
               "or call contiguous() first");
  // The copy is not part of the graph: the reshape node itself routes the gradient.
  Tensor dense;
  {
    NoGradGuard no_grad;
    dense = contiguous(x);
  }
  return make_view(dense, sizes, contiguous_strides(sizes), dense.storage_offset());
}

std::vector<int64_t> checked_permutation(const Tensor& x, const std::vector<int64_t>& dims) {
  TESSEL_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), "permute: got ", dims.size(), " dims ",
               shape_str(dims), " for a ", x.dim(), "-d tensor of shape ", shape_str(x.sizes()));
  std::vector<int64_t> wrapped(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    wrapped[i] = wrap_dim(dims[i], x.dim(), "permute: dim");
    TESSEL_CHECK(!seen[wrapped[i]], "permute: dim ", dims[i], " appears twice in ",
                 shape_str(dims));
    seen[wrapped[i]] = true;
  }
  return wrapped;
}

Tensor slice_backward_of(const Tensor& grad, const Shape& input_sizes, int64_t dim, int64_t start,
                         int64_t end, int64_t step) {
  return dispatch(ops::slice_backward, {grad},
                  Attrs{{"input_sizes", input_sizes},
                        {"dim", dim},
                        {"start", start},
                        {"end", end},
                        {"step", step}})[0];
}

void register_view() {
  OpDef& op = OpRegistry::get().define(ops::view);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = [](const Tensor& x, const Attrs& attrs) {
    return reshape_view("view", x, attrs, /*may_copy=*/false);
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {reshape(ctx.grad_outputs[0], ctx.input_specs[0].sizes)};
  };
  op.cost = no_cost;
}

void register_reshape() {
  // A view when the strides allow one, otherwise a contiguous copy viewed in the new shape.
  OpDef& op = OpRegistry::get().define(ops::reshape);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = [](const Tensor& x, const Attrs& attrs) {
    return reshape_view("reshape", x, attrs, /*may_copy=*/true);
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {reshape(ctx.grad_outputs[0], ctx.input_specs[0].sizes)};
  };
  op.cost = no_cost;
}

void register_transpose() {
  OpDef& op = OpRegistry::get().define(ops::transpose);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = [](const Tensor& x, const Attrs& attrs) {
    int64_t dim0 = wrap_dim(attrs.get<int64_t>("dim0"), x.dim(), "transpose: dim0");
    int64_t dim1 = wrap_dim(attrs.get<int64_t>("dim1"), x.dim(), "transpose: dim1");
    Shape sizes = x.sizes();
    Shape strides = x.strides();
    if (x.dim() > 0) {
      std::swap(sizes[dim0], sizes[dim1]);
      std::swap(strides[dim0], strides[dim1]);
    }
    return make_view(x, sizes, strides, x.storage_offset());
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {transpose(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("dim0"),
                      ctx.attrs.get<int64_t>("dim1"))};
  };
  op.cost = no_cost;
}

void register_permute() {
  OpDef& op = OpRegistry::get().define(ops::permute);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = [](const Tensor& x, const Attrs& attrs) {
    std::vector<int64_t> dims = checked_permutation(x, attrs.get<std::vector<int64_t>>("dims"));
    Shape sizes(dims.size()), strides(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) {
      sizes[i] = x.sizes()[dims[i]];
      strides[i] = x.strides()[dims[i]];
    }
    return make_view(x, sizes, strides, x.storage_offset());
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    const auto& dims = ctx.attrs.get<std::vector<int64_t>>("dims");
    const int64_t ndim = static_cast<int64_t>(dims.size());
    std::vector<int64_t> inverse(dims.size());
    for (int64_t i = 0; i < ndim; ++i) inverse[dims[i] < 0 ? dims[i] + ndim : dims[i]] = i;
    return {permute(ctx.grad_outputs[0], inverse)};
  };
  op.cost = no_cost;
}

void register_slice() {
  OpDef& op = OpRegistry::get().define(ops::slice);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = slice_geometry;
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {slice_backward_of(ctx.grad_outputs[0], ctx.input_specs[0].sizes,
                              ctx.attrs.get<int64_t>("dim"), ctx.attrs.get<int64_t>("start"),
                              ctx.attrs.get<int64_t>("end"), ctx.attrs.get_or<int64_t>("step", 1))};
  };
  op.cost = no_cost;
}

void register_slice_backward() {
  // The gradient of slice: zeros of the input's shape with `grad` written into the slice.
  OpDef& op = OpRegistry::get().define(ops::slice_backward);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Shape& input_sizes = attrs.get<Shape>("input_sizes");
    Shape expected = input_sizes;
    TESSEL_CHECK(!input_sizes.empty(), "slice_backward: input_sizes is empty");
    int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), static_cast<int64_t>(input_sizes.size()),
                           "slice_backward: dim");
    expected[dim] = normalize_slice(input_sizes[dim], attrs.get<int64_t>("start"),
                                    attrs.get<int64_t>("end"), attrs.get<int64_t>("step"))
                        .length;
    TESSEL_CHECK(in.at(0).sizes() == expected, "slice_backward: gradient has shape ",
                 shape_str(in[0].sizes()), " but the slice has shape ", shape_str(expected));
    return std::vector<OutputSpec>{{input_sizes, in[0].dtype()}};
  };
  op.kernels[static_cast<int>(DeviceType::kCpu)] = cpu::slice_backward_kernel;
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {slice(ctx.grad_outputs[0], ctx.attrs.get<int64_t>("dim"),
                  ctx.attrs.get<int64_t>("start"), ctx.attrs.get<int64_t>("end"),
                  ctx.attrs.get<int64_t>("step"))};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs&) {
    return OpCost{0, static_cast<double>(in[0].nbytes() + out[0].nbytes())};
  };
}

void register_select() {
  OpDef& op = OpRegistry::get().define(ops::select);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = [](const Tensor& x, const Attrs& attrs) {
    TESSEL_CHECK(x.dim() > 0, "select: cannot select from a 0-d tensor");
    int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), x.dim(), "select: dim");
    int64_t index = attrs.get<int64_t>("index");
    int64_t size = x.sizes()[dim];
    TESSEL_CHECK(index >= -size && index < size, "select: index ", index,
                 " is out of range for dimension ", dim, " of size ", size, " (shape ",
                 shape_str(x.sizes()), ")");
    if (index < 0) index += size;
    Shape sizes = x.sizes();
    Shape strides = x.strides();
    sizes.erase(sizes.begin() + dim);
    strides.erase(strides.begin() + dim);
    return make_view(x, sizes, strides, x.storage_offset() + index * x.strides()[dim]);
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    const Shape& input_sizes = ctx.input_specs[0].sizes;
    int64_t ndim = static_cast<int64_t>(input_sizes.size());
    int64_t dim = wrap_dim(ctx.attrs.get<int64_t>("dim"), ndim);
    int64_t index = ctx.attrs.get<int64_t>("index");
    if (index < 0) index += input_sizes[dim];
    return {slice_backward_of(unsqueeze(ctx.grad_outputs[0], dim), input_sizes, dim, index,
                              index + 1, 1)};
  };
  op.cost = no_cost;
}

void register_expand() {
  OpDef& op = OpRegistry::get().define(ops::expand);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = [](const Tensor& x, const Attrs& attrs) {
    const Shape& target = attrs.get<Shape>("shape");
    const int64_t ndim = static_cast<int64_t>(target.size());
    TESSEL_CHECK(ndim >= x.dim(), "expand: cannot expand shape ", shape_str(x.sizes()), " to ",
                 shape_str(target), " (the target has fewer dimensions)");
    const int64_t lead = ndim - x.dim();
    Shape sizes(target.size()), strides(target.size());
    for (int64_t i = 0; i < ndim; ++i) {
      if (i < lead) {
        TESSEL_CHECK(target[i] >= 0, "expand: size ", target[i], " for the new leading dimension ",
                     i, " of ", shape_str(target), " (-1 is only allowed for existing ones)");
        sizes[i] = target[i];
        strides[i] = 0;
        continue;
      }
      int64_t size = x.sizes()[i - lead];
      int64_t wanted = target[i] == -1 ? size : target[i];
      TESSEL_CHECK(wanted == size || size == 1, "expand: cannot expand shape ",
                   shape_str(x.sizes()), " to ", shape_str(target), " (dimension ", i, ": size ",
                   size, " can only expand when it is 1)");
      TESSEL_CHECK(wanted >= 0, "expand: invalid size ", wanted, " in ", shape_str(target));
      sizes[i] = wanted;
      strides[i] = wanted == size ? x.strides()[i - lead] : 0;
    }
    return make_view(x, sizes, strides, x.storage_offset());
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    const Tensor& grad = ctx.grad_outputs[0];
    const Shape& input_sizes = ctx.input_specs[0].sizes;
    const int64_t lead = grad.dim() - static_cast<int64_t>(input_sizes.size());
    std::vector<int64_t> dims;
    for (int64_t i = 0; i < grad.dim(); ++i)
      if (i < lead || (input_sizes[i - lead] == 1 && grad.sizes()[i] != 1)) dims.push_back(i);
    if (dims.empty()) return {reshape(grad, input_sizes)};
    return {reshape(sum(grad, dims, /*keepdim=*/true), input_sizes)};
  };
  op.cost = no_cost;
}

void register_squeeze() {
  OpDef& op = OpRegistry::get().define(ops::squeeze);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = [](const Tensor& x, const Attrs& attrs) {
    int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), x.dim(), "squeeze: dim");
    // Like PyTorch, squeezing a dimension whose size is not 1 leaves the tensor unchanged.
    if (x.dim() == 0 || x.sizes()[dim] != 1)
      return make_view(x, x.sizes(), x.strides(), x.storage_offset());
    Shape sizes = x.sizes();
    Shape strides = x.strides();
    sizes.erase(sizes.begin() + dim);
    strides.erase(strides.begin() + dim);
    return make_view(x, sizes, strides, x.storage_offset());
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {reshape(ctx.grad_outputs[0], ctx.input_specs[0].sizes)};
  };
  op.cost = no_cost;
}

void register_unsqueeze() {
  OpDef& op = OpRegistry::get().define(ops::unsqueeze);
  op.kind = OpKind::kDataMovement;
  op.autocast = AutocastPolicy::kKeep;
  op.flags.view = true;
  op.view_fn = [](const Tensor& x, const Attrs& attrs) {
    int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), x.dim() + 1, "unsqueeze: dim");
    Shape sizes = x.sizes();
    Shape strides = x.strides();
    int64_t stride = dim < x.dim() ? sizes[dim] * strides[dim] : 1;
    sizes.insert(sizes.begin() + dim, 1);
    strides.insert(strides.begin() + dim, stride);
    return make_view(x, sizes, strides, x.storage_offset());
  };
  op.backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
    return {reshape(ctx.grad_outputs[0], ctx.input_specs[0].sizes)};
  };
  op.cost = no_cost;
}

}  // namespace

TESSEL_REGISTER_OPS(shape) {
  register_view();
  register_reshape();
  register_transpose();
  register_permute();
  register_slice();
  register_slice_backward();
  register_select();
  register_expand();
  register_squeeze();
  register_unsqueeze();
}

Tensor reshape(const Tensor& x, const Shape& sizes) {
  return first_output(dispatch(ops::reshape, {x}, Attrs{{"shape", sizes}}));
}

Tensor view(const Tensor& x, const Shape& sizes) {
  return first_output(dispatch(ops::view, {x}, Attrs{{"shape", sizes}}));
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  return first_output(dispatch(ops::transpose, {x}, Attrs{{"dim0", dim0}, {"dim1", dim1}}));
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  return first_output(dispatch(ops::permute, {x}, Attrs{{"dims", dims}}));
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return dispatch(ops::slice, {x},
                  Attrs{{"dim", dim}, {"start", start}, {"end", end}, {"step", step}})[0];
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  TESSEL_CHECK(x.dim() > 0, "narrow: cannot narrow a 0-d tensor");
  int64_t wrapped = wrap_dim(dim, x.dim(), "narrow: dim");
  int64_t size = x.sizes()[wrapped];
  TESSEL_CHECK(start >= -size && start <= size, "narrow: start ", start,
               " is out of range for dimension ", wrapped, " of size ", size);
  if (start < 0) start += size;
  TESSEL_CHECK(length >= 0 && start + length <= size, "narrow: start ", start, " + length ", length,
               " exceeds dimension ", wrapped, " of size ", size, " (shape ", shape_str(x.sizes()),
               ")");
  return slice(x, wrapped, start, start + length, 1);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  return first_output(dispatch(ops::select, {x}, Attrs{{"dim", dim}, {"index", index}}));
}

Tensor expand(const Tensor& x, const Shape& sizes) {
  return first_output(dispatch(ops::expand, {x}, Attrs{{"shape", sizes}}));
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  return first_output(dispatch(ops::squeeze, {x}, Attrs{{"dim", dim}}));
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  return first_output(dispatch(ops::unsqueeze, {x}, Attrs{{"dim", dim}}));
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  int64_t start = wrap_dim(start_dim, x.dim(), "flatten: start_dim");
  int64_t end = wrap_dim(end_dim, x.dim(), "flatten: end_dim");
  TESSEL_CHECK(start <= end, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim,
               " for shape ", shape_str(x.sizes()));
  if (start == end) return x;
  Shape sizes(x.sizes().begin(), x.sizes().begin() + start);
  int64_t flat = 1;
  for (int64_t d = start; d <= end; ++d) flat *= x.sizes()[d];
  sizes.push_back(flat);
  sizes.insert(sizes.end(), x.sizes().begin() + end + 1, x.sizes().end());
  return reshape(x, sizes);
}

}  // namespace tessel
