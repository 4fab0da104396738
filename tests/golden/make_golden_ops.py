#!/usr/bin/python3
"""Writes tests/golden/ops.safetensors: PyTorch reference values for every op in ops/ops.h.

Usage (from the repository root, with Debian's python3-torch):
    /usr/bin/python3 tests/golden/make_golden_ops.py

For every case `<case>` the file holds
    <case>.in0, <case>.in1, ...     the inputs (f32 floats, i64 indices, bool masks)
    <case>.out0, <case>.out1, ...   the outputs
    <case>.gout0, ...               a random upstream gradient for each float output
    <case>.grad<i>                  d sum(out * gout) / d in<i>, for each input given a gradient
    <case>.<extra>                  extra state, e.g. batch-norm running statistics after the call
tests/ops/golden_test.cc repeats each call with Tessel's ops and compares.

Inputs are drawn in f32; outputs and gradients are computed by PyTorch in f64 from those same
f32 inputs and stored in the dtype the op returns for f32 inputs, so the fixture holds the
exactly rounded answer rather than one particular f32 summation order.
"""

import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

OUTPUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops.safetensors")

SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.bool: "BOOL",
}

# name -> tensor, in insertion order (the order they are written).
TENSORS = {}


# ---------------------------------------------------------------------------------------------
# The case harness


def add_case(name, fn, inputs, grad_inputs=None, after=None, zero_grads=()):
    """Records one case: fn(*inputs) -> Tensor or list of Tensors.

    grad_inputs: indices of the inputs that get gradients (default: every float input).
    zero_grads: indices of inputs whose gradient is zero by the op's definition (floor, sign...);
    every other gradient must be non-zero somewhere, or the case checks no backward at all.
    after: {extra_name: input_index} stores that input's value after the call (ops that
    update an input in place, such as batch-norm running statistics).
    """
    assert not any(key.startswith(name + ".") for key in TENSORS), "duplicate case " + name
    if grad_inputs is None:
        grad_inputs = [i for i, t in enumerate(inputs) if t.is_floating_point()]
    after = after or {}

    # First in f32 without autograd: the dtypes the op returns for these inputs.
    with torch.no_grad():
        plain_outputs = as_list(fn(*[t.clone() for t in inputs]))
    # Then in f64 with autograd: the values.
    wide_inputs = []
    for i, t in enumerate(inputs):
        wide = t.detach().clone()
        if wide.is_floating_point():
            wide = wide.double()
            if i in grad_inputs:
                wide.requires_grad_(True)
        wide_inputs.append(wide)
    outputs = as_list(fn(*wide_inputs))
    assert len(outputs) == len(plain_outputs), name

    for i, t in enumerate(inputs):
        store(f"{name}.in{i}", t)
    upstream = []
    for k, (output, plain) in enumerate(zip(outputs, plain_outputs)):
        store(f"{name}.out{k}", output.detach().to(plain.dtype))
        if grad_inputs and output.is_floating_point():
            gout = torch.randn(output.shape, dtype=plain.dtype)
            store(f"{name}.gout{k}", gout)
            upstream.append((output, gout))
    for extra_name, index in after.items():
        store(f"{name}.{extra_name}", wide_inputs[index].detach().to(inputs[index].dtype))

    # Ops with only integer or bool outputs (comparisons, argmax) have no gradient.
    if grad_inputs and upstream:
        loss = sum((output * gout.double()).sum() for output, gout in upstream)
        wrt = [wide_inputs[i] for i in grad_inputs]
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        for i, grad in zip(grad_inputs, grads):
            if grad is None:
                grad = torch.zeros_like(wide_inputs[i])
            assert i in zero_grads or grad.abs().max() > 0, \
                f"{name}: the gradient of input {i} is zero everywhere (pass zero_grads=[{i}] " \
                "if the op defines it so)"
            store(f"{name}.grad{i}", grad.to(inputs[i].dtype))


def as_list(outputs):
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return list(outputs)


def store(key, tensor):
    assert key not in TENSORS, key
    assert tensor.dtype in SAFETENSORS_DTYPES, f"{key}: unsupported dtype {tensor.dtype}"
    TENSORS[key] = tensor.detach().contiguous()


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for key, tensor in tensors.items():
        blob = tensor.numpy().tobytes()  # little-endian: checked in main()
        header[key] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header_bytes)))
        out.write(header_bytes)
        for blob in blobs:
            out.write(blob)


# ---------------------------------------------------------------------------------------------
# Input makers (all draw from the one seeded generator)


def randn(*shape):
    return torch.randn(shape, dtype=torch.float32)


def positive(*shape):
    """Values in [0.5, 2): safe for log, sqrt, rsqrt, pow and division."""
    return torch.rand(shape, dtype=torch.float32) * 1.5 + 0.5


def away_from_zero(*shape):
    """Normal values with |x| >= 0.1, so abs/relu/clamp gradients are away from kinks."""
    x = randn(*shape)
    return torch.where(x.abs() < 0.1, x.sign() * 0.1 + x, x)


def small_ints_as_float(*shape):
    """Floats in {-2, ..., 2}: comparisons then have many ties."""
    return torch.randint(-2, 3, shape).to(torch.float32)


def indices(high, *shape):
    return torch.randint(0, high, shape, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# Case families


def creation_cases():
    # No inputs: the expected values only. Tessel's rand/randn/randint use their own Philox
    # streams, so they have no PyTorch reference.
    add_case("full_2x3", lambda: torch.full((2, 3), 1.5), [])
    add_case("zeros_2x3", lambda: torch.zeros(2, 3), [])
    add_case("ones_4", lambda: torch.ones(4), [])
    add_case("zeros_like", lambda x: torch.zeros_like(x), [randn(2, 3)], grad_inputs=[])
    add_case("ones_like", lambda x: torch.ones_like(x), [randn(3, 2)], grad_inputs=[])
    add_case("full_like", lambda x: torch.full_like(x, -0.25), [randn(2, 2)], grad_inputs=[])
    add_case("arange_int64_7", lambda: torch.arange(7), [])
    add_case("arange_float_start_end_step",
             lambda: torch.arange(0.5, 3.0, 0.25, dtype=torch.float32), [])
    add_case("arange_float_inexact_length",
             lambda: torch.arange(-1.0, 1.0, 0.3, dtype=torch.float32), [])


def copy_cases():
    add_case("clone", lambda x: x.clone(), [randn(3, 4)])
    add_case("contiguous_of_transposed", lambda x: x.t().contiguous(), [randn(3, 4)])
    add_case("to_dtype_f32_to_f64", lambda x: x.to(torch.float64), [randn(3, 4)])
    add_case("to_dtype_f32_to_i64_truncates", lambda x: x.to(torch.int64), [randn(3, 4) * 3],
             grad_inputs=[])
    add_case("to_dtype_i64_to_f32", lambda x: x.to(torch.float32), [indices(9, 3, 4) - 4])
    add_case("to_dtype_bool_to_f32", lambda x: x.to(torch.float32), [randn(3, 4) > 0])
    add_case("to_dtype_f32_to_bool", lambda x: x.to(torch.bool), [small_ints_as_float(3, 4)],
             grad_inputs=[])
    # In-place forms (Tensor methods): written into a fresh tensor, no autograd.
    add_case("copy_broadcast_row", lambda dst, src: dst.clone().copy_(src),
             [torch.zeros(3, 4), randn(4)], grad_inputs=[])
    add_case("fill_", lambda x: x.clone().fill_(2.5), [randn(3, 4)], grad_inputs=[])
    add_case("zero_", lambda x: x.clone().zero_(), [randn(3, 4)], grad_inputs=[])
    add_case("add_inplace_alpha", lambda x, y: x.clone().add_(y, alpha=-0.5),
             [randn(3, 4), randn(3, 4)], grad_inputs=[])
    add_case("mul_inplace_scalar", lambda x: x.clone().mul_(3.0), [randn(3, 4)], grad_inputs=[])


def binary_cases():
    ops = {
        "add": torch.add,
        "sub": torch.sub,
        "mul": torch.mul,
        "div": torch.div,
        "maximum": torch.maximum,
        "minimum": torch.minimum,
    }
    for op_name, fn in ops.items():
        denominator = positive if op_name == "div" else randn
        add_case(f"{op_name}_same_shape", fn, [randn(3, 4), denominator(3, 4)])
        add_case(f"{op_name}_broadcast_row", fn, [randn(3, 4), denominator(4)])
        both = [randn(2, 1, 4), denominator(3, 1)]
        if op_name in ("maximum", "minimum"):
            # Fixed values: each side wins somewhere, so both gradient branches are checked.
            both = [torch.tensor([[[-1.5, -0.25, 0.5, 1.75]], [[0.75, -1.0, 2.0, -0.5]]]),
                    torch.tensor([[0.0], [1.0], [-0.75]])]
        add_case(f"{op_name}_broadcast_both", fn, both)
    add_case("add_alpha", lambda a, b: torch.add(a, b, alpha=0.5), [randn(3, 4), randn(4)])
    add_case("sub_alpha", lambda a, b: torch.sub(a, b, alpha=2.0), [randn(3, 4), randn(3, 1)])
    add_case("add_zero_dim_tensor", torch.add, [randn(3, 4), randn()])
    add_case("add_transposed_input", lambda a, b: a.t() + b, [randn(4, 3), randn(3, 4)])
    add_case("mul_int64_by_float32_promotes", torch.mul, [indices(5, 3, 4), randn(3, 4)])
    # Ties: PyTorch splits the gradient of maximum/minimum evenly between equal inputs.
    add_case("maximum_with_ties", torch.maximum,
             [small_ints_as_float(3, 4), small_ints_as_float(3, 4)])
    add_case("minimum_with_ties", torch.minimum,
             [small_ints_as_float(3, 4), small_ints_as_float(3, 4)])
    add_case("pow_same_shape", torch.pow, [positive(3, 4), randn(3, 4)])
    add_case("pow_broadcast_exponent", torch.pow, [positive(3, 4), randn(4)])
    # Scalar forms.
    add_case("add_scalar", lambda a: a + 2.5, [randn(3, 4)])
    add_case("sub_scalar", lambda a: a - 0.75, [randn(3, 4)])
    add_case("mul_scalar", lambda a: a * -1.5, [randn(3, 4)])
    add_case("div_scalar", lambda a: a / 4.0, [randn(3, 4)])
    add_case("scalar_times_tensor", lambda a: 3.0 * a, [randn(3, 4)])
    add_case("pow_scalar_3", lambda a: a ** 3.0, [randn(3, 4)])
    add_case("pow_scalar_half", lambda a: a ** 0.5, [positive(3, 4)])
    add_case("pow_scalar_negative", lambda a: a ** -1.5, [positive(3, 4)])
    add_case("pow_scalar_2", lambda a: a ** 2.0, [randn(3, 4)])


def unary_cases():
    add_case("neg", torch.neg, [randn(3, 4)])
    add_case("unary_minus_operator", lambda x: -x, [randn(3, 4)])
    add_case("abs", torch.abs, [away_from_zero(3, 4)])
    add_case("exp", torch.exp, [randn(3, 4)])
    add_case("log", torch.log, [positive(3, 4)])
    add_case("sqrt", torch.sqrt, [positive(3, 4)])
    add_case("rsqrt", torch.rsqrt, [positive(3, 4)])
    add_case("tanh", torch.tanh, [randn(3, 4) * 2])
    add_case("sigmoid", torch.sigmoid, [randn(3, 4) * 3])
    add_case("relu", torch.relu, [away_from_zero(3, 4)])
    add_case("gelu_erf", lambda x: F.gelu(x, approximate="none"), [randn(3, 4) * 2])
    add_case("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), [randn(3, 4) * 2])
    add_case("clamp_both_bounds", lambda x: torch.clamp(x, -0.5, 0.7), [away_from_zero(4, 5)])
    add_case("clamp_max_only", lambda x: torch.clamp(x, max=0.3), [away_from_zero(4, 5)])
    add_case("clamp_min_only", lambda x: torch.clamp(x, min=-0.2), [away_from_zero(4, 5)])
    # At the kinks PyTorch's gradients are: relu'(0) = 0, abs'(0) = 0, and clamp passes the
    # gradient at a bound (min <= x <= max).
    add_case("relu_at_zero", torch.relu, [small_ints_as_float(4, 5)])
    add_case("abs_at_zero", torch.abs, [small_ints_as_float(4, 5)])
    add_case("clamp_at_bounds", lambda x: torch.clamp(x, -1.0, 1.0), [small_ints_as_float(4, 5)])
    add_case("relu_of_strided_slice", lambda x: torch.relu(x[:, ::2]), [away_from_zero(3, 8)])
    add_case("exp_of_transposed", lambda x: torch.exp(x.t()), [randn(4, 3)])


def selection_cases():
    add_case("where_broadcast", torch.where, [randn(3, 4) > 0, randn(3, 4), randn(4)])
    # A fixed mask with both values, so both branches of forward and backward are used (the
    # discarded draw keeps every later case's random inputs as they were).
    randn(4)
    add_case("where_condition_broadcast", torch.where,
             [torch.tensor([True, False, False, True]), randn(3, 4), randn(3, 1)])
    add_case("masked_fill_same_shape", lambda x, m: x.masked_fill(m, -2.5),
             [randn(3, 4), randn(3, 4) > 0])
    add_case("masked_fill_broadcast_mask", lambda x, m: x.masked_fill(m, 1e4),
             [randn(2, 3, 4), randn(3, 1) > 0])
    comparisons = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
                   "gt": torch.gt, "ge": torch.ge}
    for op_name, fn in comparisons.items():
        add_case(f"{op_name}_broadcast_with_ties", fn,
                 [small_ints_as_float(3, 4), small_ints_as_float(4)])
    add_case("eq_int64", torch.eq, [indices(3, 3, 4), indices(3, 3, 4)])


def reduction_cases():
    add_case("sum_all", lambda x: x.sum(), [randn(3, 4, 5)])
    add_case("sum_dim1", lambda x: x.sum(1), [randn(3, 4, 5)])
    add_case("sum_dims_0_2_keepdim", lambda x: x.sum((0, 2), keepdim=True), [randn(3, 4, 5)])
    add_case("sum_negative_dim", lambda x: x.sum(-1), [randn(3, 4, 5)])
    add_case("sum_of_transposed_dim0", lambda x: x.t().sum(0), [randn(4, 3)])
    add_case("expand_then_sum_dim0", lambda x: x.expand(5, 3, 4).sum(0), [randn(3, 1)])
    add_case("mean_all", lambda x: x.mean(), [randn(3, 4, 5)])
    add_case("mean_dim1_keepdim", lambda x: x.mean(1, keepdim=True), [randn(3, 4, 5)])
    add_case("mean_dims_0_2", lambda x: x.mean((0, 2)), [randn(3, 4, 5)])
    add_case("max_dim1", lambda x: x.max(1).values, [randn(3, 4, 5)])
    add_case("max_dim0_keepdim", lambda x: x.max(0, keepdim=True).values, [randn(3, 4, 5)])
    add_case("min_dim2", lambda x: x.min(2).values, [randn(3, 4, 5)])
    add_case("min_negative_dim_keepdim", lambda x: x.min(-1, keepdim=True).values,
             [randn(3, 4)])
    add_case("max_all", lambda x: x.max(), [randn(3, 4, 5)])
    add_case("min_all", lambda x: x.min(), [randn(3, 4, 5)])
    add_case("argmax_dim1", lambda x: x.argmax(1), [randn(3, 4, 5)])
    add_case("argmax_dim0_keepdim", lambda x: x.argmax(0, keepdim=True), [randn(3, 4, 5)])
    # Ties: argmax and max(dim) pick the first maximum (and send it the gradient); max() over
    # all elements splits the gradient evenly between equal maxima.
    add_case("argmax_with_ties_picks_first", lambda x: x.argmax(1), [small_ints_as_float(4, 6)])
    add_case("max_dim_with_ties", lambda x: x.max(1).values, [small_ints_as_float(4, 6)])
    add_case("max_all_with_ties", lambda x: x.max(), [small_ints_as_float(4, 6)])
    add_case("var_all_unbiased", lambda x: x.var(unbiased=True), [randn(3, 4, 5)])
    add_case("var_all_biased", lambda x: x.var(unbiased=False), [randn(3, 4, 5)])
    add_case("var_dim1_biased", lambda x: x.var(1, unbiased=False), [randn(3, 4, 5)])
    add_case("var_dims_0_2_unbiased_keepdim", lambda x: x.var((0, 2), unbiased=True,
                                                              keepdim=True), [randn(3, 4, 5)])
    add_case("softmax_dim1", lambda x: torch.softmax(x, 1), [randn(3, 4, 5)])
    add_case("softmax_last_dim", lambda x: torch.softmax(x, -1), [randn(3, 4, 5)])
    add_case("softmax_large_logits", lambda x: torch.softmax(x, -1), [randn(4, 6) * 100])
    add_case("softmax_of_transposed", lambda x: torch.softmax(x.t(), 0), [randn(4, 3)])
    add_case("softmax_size1_dim", lambda x: torch.softmax(x, 1), [randn(3, 1, 4)], zero_grads=[0])
    add_case("log_softmax_dim0", lambda x: torch.log_softmax(x, 0), [randn(3, 4, 5)])
    add_case("log_softmax_last_dim", lambda x: torch.log_softmax(x, -1), [randn(3, 4, 5)])
    add_case("log_softmax_large_logits", lambda x: torch.log_softmax(x, -1),
             [randn(4, 6) * 100])


def view_cases():
    add_case("reshape_3x4x5_to_4x15", lambda x: x.reshape(4, 15), [randn(3, 4, 5)])
    add_case("reshape_infer_dim", lambda x: x.reshape(-1, 10), [randn(3, 4, 5)])
    add_case("reshape_of_transposed_copies", lambda x: x.t().reshape(12), [randn(3, 4)])
    add_case("view_3x4x5_to_12x5", lambda x: x.view(12, 5), [randn(3, 4, 5)])
    add_case("transpose_0_2_contiguous", lambda x: x.transpose(0, 2).contiguous(),
             [randn(3, 4, 5)])
    add_case("transpose_then_matmul", lambda x, y: x.transpose(0, 1) @ y,
             [randn(4, 3), randn(4, 2)])
    add_case("permute_2_0_1", lambda x: x.permute(2, 0, 1), [randn(3, 4, 5)])
    add_case("permute_contiguous", lambda x: x.permute(1, 2, 0).contiguous(), [randn(3, 4, 5)])
    add_case("narrow_dim1", lambda x: x.narrow(1, 1, 2), [randn(3, 4, 5)])
    add_case("slice_step2", lambda x: x[:, 1:7:2], [randn(3, 8)])
    add_case("slice_step3_dim0", lambda x: x[0:8:3], [randn(8, 3)])
    add_case("select_dim1", lambda x: x.select(1, 2), [randn(3, 4, 5)])
    add_case("select_negative_index", lambda x: x.select(0, -1), [randn(3, 4)])
    add_case("expand_3x1_to_2x3x4", lambda x: x.expand(2, 3, 4), [randn(3, 1)])
    add_case("expand_keep_size", lambda x: x.expand(-1, 4), [randn(3, 1)])
    add_case("squeeze_dim1", lambda x: x.squeeze(1), [randn(3, 1, 4)])
    add_case("unsqueeze_dim0", lambda x: x.unsqueeze(0), [randn(3, 4)])
    add_case("unsqueeze_last", lambda x: x.unsqueeze(-1), [randn(3, 4)])
    add_case("flatten_all", lambda x: x.flatten(), [randn(3, 4, 5)])
    add_case("flatten_1_2", lambda x: x.flatten(1, 2), [randn(2, 3, 4, 2)])


def join_and_index_cases():
    add_case("cat_dim0_three", lambda a, b, c: torch.cat([a, b, c], 0),
             [randn(2, 3), randn(1, 3), randn(4, 3)])
    add_case("cat_dim1", lambda a, b: torch.cat([a, b], 1), [randn(2, 3), randn(2, 5)])
    add_case("cat_negative_dim", lambda a, b: torch.cat([a, b], -1),
             [randn(2, 3, 2), randn(2, 3, 1)])
    add_case("stack_dim0", lambda a, b, c: torch.stack([a, b, c], 0),
             [randn(2, 3), randn(2, 3), randn(2, 3)])
    add_case("stack_dim1", lambda a, b: torch.stack([a, b], 1), [randn(2, 3), randn(2, 3)])
    add_case("split_size2_dim1", lambda x: torch.split(x, 2, 1), [randn(3, 5)])
    add_case("chunk_3_dim0", lambda x: torch.chunk(x, 3, 0), [randn(7, 2)])
    add_case("index_select_dim0_repeated", lambda x, i: x.index_select(0, i),
             [randn(5, 3), torch.tensor([4, 0, 2, 0, 4, 4])])
    add_case("index_select_dim1", lambda x, i: x.index_select(1, i),
             [randn(2, 5, 3), torch.tensor([3, 1])])
    add_case("index_select_int32_index", lambda x, i: x.index_select(0, i),
             [randn(4, 3), torch.tensor([3, 3, 1], dtype=torch.int32)])
    add_case("gather_dim1", lambda x, i: x.gather(1, i), [randn(3, 4), indices(4, 3, 6)])
    add_case("gather_dim0_smaller_index", lambda x, i: x.gather(0, i),
             [randn(4, 3), indices(4, 2, 2)])


def linalg_cases():
    add_case("matmul_1d_1d", torch.matmul, [randn(5), randn(5)])
    add_case("matmul_2d_1d", torch.matmul, [randn(3, 5), randn(5)])
    add_case("matmul_1d_2d", torch.matmul, [randn(5), randn(5, 4)])
    add_case("matmul_2d_2d", torch.matmul, [randn(3, 5), randn(5, 4)])
    add_case("matmul_3d_2d", torch.matmul, [randn(2, 3, 5), randn(5, 4)])
    add_case("matmul_1d_3d", torch.matmul, [randn(5), randn(2, 5, 4)])
    add_case("matmul_batched_broadcast", torch.matmul, [randn(2, 1, 3, 4), randn(5, 4, 2)])
    add_case("matmul_expanded_lhs", lambda a, b: a.expand(3, 4) @ b, [randn(1, 4), randn(4, 2)])
    add_case("matmul_transposed_rhs", lambda a, b: a @ b.t(), [randn(3, 5), randn(4, 5)])
    add_case("bmm", torch.bmm, [randn(3, 2, 5), randn(3, 5, 4)])
    add_case("bmm_transposed_lhs", lambda a, b: torch.bmm(a.transpose(1, 2), b),
             [randn(3, 5, 2), randn(3, 5, 4)])
    add_case("linear_with_bias_3d_input", F.linear, [randn(2, 3, 6), randn(4, 6), randn(4)])
    add_case("linear_no_bias", F.linear, [randn(5, 6), randn(4, 6)])
    add_case("addmm", torch.addmm, [randn(3, 4), randn(3, 5), randn(5, 4)])
    add_case("addmm_transposed_lhs", lambda c, a, b: torch.addmm(c, a.t(), b),
             [randn(3, 4), randn(5, 3), randn(5, 4)])


def conv_cases():
    add_case("conv2d_basic", F.conv2d, [randn(2, 3, 6, 6), randn(4, 3, 3, 3), randn(4)])
    add_case("conv2d_stride2_pad1",
             lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
             [randn(2, 3, 7, 7), randn(4, 3, 3, 3), randn(4)])
    add_case("conv2d_dilation2_pad2",
             lambda x, w, b: F.conv2d(x, w, b, padding=2, dilation=2),
             [randn(1, 2, 7, 7), randn(3, 2, 3, 3), randn(3)])
    add_case("conv2d_stride2_pad1_groups2",
             lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
             [randn(2, 4, 6, 6), randn(6, 2, 3, 3), randn(6)])
    add_case("conv2d_depthwise",
             lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=4),
             [randn(2, 4, 5, 5), randn(4, 1, 3, 3), randn(4)])
    add_case("conv2d_of_nhwc_permuted_input",
             lambda x, w, b: F.conv2d(x.permute(0, 3, 1, 2), w, b, padding=1),
             [randn(2, 5, 5, 3), randn(2, 3, 3, 3), randn(2)])
    add_case("conv2d_1x1_no_bias", lambda x, w: F.conv2d(x, w),
             [randn(2, 4, 4, 4), randn(3, 4, 1, 1)])
    add_case("conv2d_rect_kernel_stride_pad_no_bias",
             lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 0)),
             [randn(1, 3, 7, 6), randn(2, 3, 2, 3)])


def pool_cases():
    add_case("max_pool2d_k2", lambda x: F.max_pool2d(x, 2), [randn(2, 3, 6, 6)])
    add_case("max_pool2d_k3_s2_pad1", lambda x: F.max_pool2d(x, 3, 2, 1), [randn(2, 2, 7, 7)])
    add_case("max_pool2d_ceil_mode", lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True),
             [randn(1, 2, 7, 7)])
    add_case("max_pool2d_dilation2", lambda x: F.max_pool2d(x, 2, 1, 0, dilation=2),
             [randn(1, 2, 6, 6)])
    add_case("max_pool2d_rect", lambda x: F.max_pool2d(x, (2, 3), (1, 2), (1, 1)),
             [randn(1, 2, 5, 6)])
    add_case("avg_pool2d_k2", lambda x: F.avg_pool2d(x, 2), [randn(2, 3, 6, 6)])
    add_case("avg_pool2d_k3_s2_pad1_include_pad", lambda x: F.avg_pool2d(x, 3, 2, 1),
             [randn(2, 2, 7, 7)])
    add_case("avg_pool2d_k3_s2_pad1_exclude_pad",
             lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [randn(2, 2, 7, 7)])
    add_case("avg_pool2d_ceil_mode", lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True),
             [randn(1, 2, 6, 6)])
    add_case("avg_pool2d_ceil_mode_pad1_exclude_pad",
             lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
             [randn(1, 2, 6, 6)])
    add_case("avg_pool2d_ceil_mode_pad1_include_pad",
             lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True),
             [randn(1, 2, 6, 6)])
    add_case("adaptive_avg_pool2d_7_to_3", lambda x: F.adaptive_avg_pool2d(x, 3),
             [randn(2, 2, 7, 7)])
    add_case("adaptive_avg_pool2d_5x6_to_2x4", lambda x: F.adaptive_avg_pool2d(x, (2, 4)),
             [randn(1, 3, 5, 6)])
    add_case("adaptive_avg_pool2d_global", lambda x: F.adaptive_avg_pool2d(x, 1),
             [randn(2, 3, 4, 4)])
    add_case("adaptive_avg_pool2d_3_to_4_upsamples", lambda x: F.adaptive_avg_pool2d(x, 4),
             [randn(1, 2, 3, 3)])


def norm_cases():
    # batch_norm inputs: x, weight, bias, running_mean, running_var (no gradient for the last
    # two; training updates them in place with the unbiased batch variance).
    def batch_norm(training, momentum=0.1, eps=1e-5):
        return lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training, momentum, eps)

    running = {"running_mean_after": 3, "running_var_after": 4}
    add_case("batch_norm_train_4d", batch_norm(True),
             [randn(4, 3, 2, 2), positive(3), randn(3), randn(3) * 0.1, positive(3)],
             grad_inputs=[0, 1, 2], after=running)
    add_case("batch_norm_train_2d_momentum_0_3_eps_1e-3", batch_norm(True, 0.3, 1e-3),
             [randn(6, 4) * 2 + 1, positive(4), randn(4), randn(4), positive(4)],
             grad_inputs=[0, 1, 2], after=running)
    add_case("batch_norm_train_no_affine",
             lambda x, m, v: F.batch_norm(x, m, v, None, None, True, 0.1, 1e-5),
             [randn(5, 2, 3), torch.zeros(2), torch.ones(2)], grad_inputs=[0],
             after={"running_mean_after": 1, "running_var_after": 2})
    add_case("batch_norm_eval", batch_norm(False),
             [randn(4, 3, 2, 2), positive(3), randn(3), randn(3) * 0.5, positive(3)],
             grad_inputs=[0, 1, 2], after=running)
    add_case("batch_norm_eval_2d", batch_norm(False),
             [randn(5, 3), positive(3), randn(3), randn(3), positive(3)],
             grad_inputs=[0, 1, 2], after=running)
    add_case("layer_norm_affine_last_dim",
             lambda x, w, b: F.layer_norm(x, (4,), w, b, 1e-5),
             [randn(2, 3, 4) * 3 + 1, positive(4), randn(4)])
    add_case("layer_norm_affine_last_two_dims",
             lambda x, w, b: F.layer_norm(x, (3, 4), w, b, 1e-5),
             [randn(2, 3, 4), randn(3, 4), randn(3, 4)])
    add_case("layer_norm_no_affine", lambda x: F.layer_norm(x, (3, 4), eps=1e-5),
             [randn(2, 3, 4)])
    add_case("layer_norm_of_transposed_input",
             lambda x, w, b: F.layer_norm(x.transpose(0, 1), (3,), w, b, 1e-5),
             [randn(3, 4), positive(3), randn(3)])
    add_case("layer_norm_eps_1e-2", lambda x, w, b: F.layer_norm(x, (5,), w, b, 1e-2),
             [randn(3, 5) * 0.1, positive(5), randn(5)])


def embedding_and_dropout_cases():
    add_case("embedding", lambda w, i: F.embedding(i, w), [randn(10, 4), indices(10, 2, 3)])
    add_case("embedding_padding_idx0", lambda w, i: F.embedding(i, w, padding_idx=0),
             [randn(10, 4), torch.tensor([[0, 3, 3], [7, 0, 9]])])
    # Dropout is the identity in eval mode and with p = 0 (random masks have no reference).
    add_case("dropout_eval_is_identity", lambda x: F.dropout(x, 0.5, training=False),
             [randn(3, 4)])
    add_case("dropout_p0_train_is_identity", lambda x: F.dropout(x, 0.0, training=True),
             [randn(3, 4)])
    # p = 1 drops everything: deterministic, so it has a reference.
    add_case("dropout_p1_train_zeroes_everything", lambda x: F.dropout(x, 1.0, training=True),
             [randn(3, 4)], zero_grads=[0])


def loss_cases():
    def cross_entropy(ignore_index=-100, label_smoothing=0.0, reduction="mean"):
        return lambda logits, target: F.cross_entropy(
            logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
            reduction=reduction)

    target = torch.tensor([1, 0, 3, 3, 2, 1])
    target_with_ignored = torch.tensor([1, -100, 3, 0, -100, 2])
    for reduction in ("mean", "sum", "none"):
        add_case(f"cross_entropy_{reduction}", cross_entropy(reduction=reduction),
                 [randn(6, 4) * 2, target])
        add_case(f"cross_entropy_ignore_index_{reduction}",
                 cross_entropy(reduction=reduction), [randn(6, 4) * 2, target_with_ignored])
        add_case(f"cross_entropy_label_smoothing_0_1_{reduction}",
                 cross_entropy(label_smoothing=0.1, reduction=reduction),
                 [randn(6, 4) * 2, target])
    add_case("cross_entropy_custom_ignore_index2", cross_entropy(ignore_index=2),
             [randn(6, 4), target])
    add_case("cross_entropy_label_smoothing_0_1_ignore_index",
             cross_entropy(label_smoothing=0.1), [randn(6, 4) * 2, target_with_ignored])
    add_case("cross_entropy_large_logits", cross_entropy(), [randn(6, 4) * 100, target])

    def nll_loss(ignore_index=-100, reduction="mean"):
        return lambda log_probs, target: F.nll_loss(log_probs, target,
                                                    ignore_index=ignore_index,
                                                    reduction=reduction)

    for reduction in ("mean", "sum", "none"):
        add_case(f"nll_loss_{reduction}", nll_loss(reduction=reduction),
                 [torch.log_softmax(randn(6, 4), 1), target])
    add_case("nll_loss_ignore_index_mean", nll_loss(),
             [torch.log_softmax(randn(6, 4), 1), target_with_ignored])
    add_case("nll_loss_custom_ignore_index3_sum", nll_loss(3, "sum"),
             [torch.log_softmax(randn(6, 4), 1), target])

    for reduction in ("mean", "sum", "none"):
        add_case(f"mse_loss_{reduction}",
                 lambda x, y, r=reduction: F.mse_loss(x, y, reduction=r),
                 [randn(3, 4), randn(3, 4)])


def main():
    assert sys.byteorder == "little", "safetensors data is little-endian"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    creation_cases()
    copy_cases()
    binary_cases()
    unary_cases()
    selection_cases()
    reduction_cases()
    view_cases()
    join_and_index_cases()
    linalg_cases()
    conv_cases()
    pool_cases()
    norm_cases()
    embedding_and_dropout_cases()
    loss_cases()
    metadata = {
        "generator": "tests/golden/make_golden_ops.py",
        "torch": torch.__version__.split("+")[0],
    }
    write_safetensors(OUTPUT_PATH, TENSORS, metadata)
    cases = {key.rsplit(".", 1)[0] for key in TENSORS if key.endswith(".out0")}
    size = os.path.getsize(OUTPUT_PATH)
    print(f"wrote {OUTPUT_PATH}: {len(cases)} cases, {len(TENSORS)} tensors, {size} bytes")


if __name__ == "__main__":
    main()
