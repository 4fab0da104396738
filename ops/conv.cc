// conv2d (NCHW, stride, padding, dilation, groups, optional bias) and its two backward ops: their
// definitions (shape rules, backward, cost, splits). The CPU kernels are in ops/cpu/conv.cc, the
// CUDA ones in cuda/ops/conv.cu.
#include "ops/conv.h"

#include <vector>

#include "ops/cpu/conv.h"
#include "ops/cpu/f32_fallback.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel {

namespace {

constexpr int kCpu = static_cast<int>(DeviceType::kCpu);

using cpu::ConvGeometry;
using cpu::geometry_from_attr;
using cpu::make_geometry;

// 16-bit floats are accepted for autocast (CPU kernels compute them in f32).
void check_float(const char* op, const Tensor& tensor, const char* what) {
  TESSEL_CHECK(is_floating(tensor.dtype()), op, ": expected a f32 or f64 ", what, ", got ",
               dtype_name(tensor.dtype()),
               " (bf16 and f16 work too; convert with .to(DType::kFloat32))");
}

void check_same_dtype(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                      const char* b_name) {
  TESSEL_CHECK(a.dtype() == b.dtype(), op, ": ", a_name, " is ", dtype_name(a.dtype()), " but ",
               b_name, " is ", dtype_name(b.dtype()), "; convert one with .to()");
}

double total_bytes(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  double bytes = 0;
  for (const auto& t : inputs)
    if (t.defined()) bytes += static_cast<double>(t.nbytes());
  for (const auto& t : outputs) bytes += static_cast<double>(t.nbytes());
  return bytes;
}

Attrs with_sizes(const Attrs& attrs, const char* name, const Shape& sizes) {
  Attrs result = attrs;
  result.set(name, std::vector<int64_t>(sizes.begin(), sizes.end()));
  return result;
}

void check_grad_shape(const char* op, const Tensor& grad, const ConvGeometry& g) {
  TESSEL_CHECK(grad.dim() == 4 && grad.sizes() == g.output_sizes(), op, ": grad_output has shape ",
               shape_str(grad.sizes()), " but the convolution output has ", "shape ",
               shape_str(g.output_sizes()));
}

std::vector<int64_t> normalized_pair(std::vector<int64_t> values, const char* name) {
  if (values.size() == 1) values.push_back(values[0]);
  TESSEL_CHECK(values.size() == 2, "conv2d: ", name, " must have 1 or 2 values, got ", values);
  return values;
}

void register_conv2d() {
  // conv2d: x (N, C, H, W), weight (O, C / groups, KH, KW), bias (O) or undefined.
  OpDef& op = OpRegistry::get().define(ops::conv2d);
  op.kind = OpKind::kConv;
  op.autocast = AutocastPolicy::kLowerPrecision;
  op.planner.split = ParallelSplit::kConvChannels;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& x = in.at(0);
    const Tensor& weight = in.at(1);
    const Tensor& bias = in.at(2);
    ConvGeometry g = make_geometry(x.sizes(), weight.sizes(), attrs);
    check_float("conv2d", x, "input");
    check_same_dtype("conv2d", x, "input", weight, "weight");
    if (bias.defined()) {
      TESSEL_CHECK(bias.dim() == 1 && bias.size(0) == g.out_channels, "conv2d: bias has shape ",
                   shape_str(bias.sizes()), " but weight has ", g.out_channels,
                   " output channels (weight shape ", shape_str(weight.sizes()), ")");
      check_same_dtype("conv2d", bias, "bias", weight, "weight");
    }
    return one_output(g.output_sizes(), x.dtype());
  };
  op.kernels[kCpu] = cpu::with_f32_fallback(cpu::conv2d_forward);
  op.save_inputs = {0, 1};
  op.backward = [](const BackwardContext& context) -> std::vector<Tensor> {
    const Tensor& grad = context.grad_outputs[0];
    const Tensor& x = context.saved_inputs[0];
    const Tensor& weight = context.saved_inputs[1];
    Tensor grad_x, grad_weight, grad_bias;
    // The weight's gradient first: it is the last reader of x, which a memory policy may then
    // evict or swap before grad_x (as large as x) is allocated.
    if (context.needs_input_grad[1]) {
      grad_weight = dispatch(ops::conv2d_backward_weight, {grad, x},
                             with_sizes(context.attrs, "weight_size", weight.sizes()))[0];
    }
    if (context.needs_input_grad[0]) {
      grad_x = dispatch(ops::conv2d_backward_input, {grad, weight},
                        with_sizes(context.attrs, "input_size", x.sizes()))[0];
    }
    if (context.needs_input_grad[2]) {
      // 16-bit gradients (autocast) are summed in f32.
      grad_bias = cpu::is_16bit_float(grad.dtype())
                      ? to_dtype(sum(to_dtype(grad, DType::kFloat32), {0, 2, 3}), grad.dtype())
                      : sum(grad, {0, 2, 3});
    }
    return {grad_x, grad_weight, grad_bias};
  };
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
    ConvGeometry g = make_geometry(in[0].sizes(), in[1].sizes(), attrs);
    return OpCost{g.flops(), total_bytes(in, out)};
  };
  op.splits = {{0, {0, -1, -1}}};
}

void register_conv2d_backward_input() {
  // conv2d_backward_input: grad (N, O, OH, OW), weight -> grad of x (input_size).
  OpDef& op = OpRegistry::get().define(ops::conv2d_backward_input);
  op.kind = OpKind::kConv;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& grad = in.at(0);
    const Tensor& weight = in.at(1);
    ConvGeometry g = geometry_from_attr(attrs, "input_size", weight.sizes(), true);
    check_float("conv2d_backward_input", grad, "grad_output");
    check_same_dtype("conv2d_backward_input", grad, "grad_output", weight, "weight");
    check_grad_shape("conv2d_backward_input", grad, g);
    return one_output({g.batch, g.in_channels, g.height, g.width}, grad.dtype());
  };
  op.kernels[kCpu] = cpu::with_f32_fallback(cpu::conv2d_backward_input);
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
    ConvGeometry g = geometry_from_attr(attrs, "input_size", in[1].sizes(), true);
    return OpCost{g.flops(), total_bytes(in, out)};
  };
  op.splits = {{0, {0, -1}}};
}

void register_conv2d_backward_weight() {
  // conv2d_backward_weight: grad (N, O, OH, OW), x -> grad of weight (weight_size).
  OpDef& op = OpRegistry::get().define(ops::conv2d_backward_weight);
  op.kind = OpKind::kConv;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& grad = in.at(0);
    const Tensor& x = in.at(1);
    ConvGeometry g = geometry_from_attr(attrs, "weight_size", x.sizes(), false);
    check_float("conv2d_backward_weight", grad, "grad_output");
    check_same_dtype("conv2d_backward_weight", grad, "grad_output", x, "input");
    check_grad_shape("conv2d_backward_weight", grad, g);
    return one_output(g.weight_sizes(), grad.dtype());
  };
  op.kernels[kCpu] = cpu::summed_over_chunks(cpu::with_f32_fallback(cpu::conv2d_backward_weight));
  op.cost = [](const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
    ConvGeometry g = geometry_from_attr(attrs, "weight_size", in[1].sizes(), false);
    return OpCost{g.flops(), total_bytes(in, out)};
  };
  // The weight's gradient sums over the batch: chunks of grad and x add theirs up.
  op.splits = {{-1, {0, 0}}};
  op.chunk_passes = 1;
}

}  // namespace

TESSEL_REGISTER_OPS(conv) {
  register_conv2d();
  register_conv2d_backward_input();
  register_conv2d_backward_weight();
}

namespace {

// The kernel taps along one axis that read the input for some output, when trimming the kernel to
// them keeps every output where it is: the first, how many, and the padding that keeps the reads.
struct LiveTaps {
  int64_t first = 0, count = 0, padding = 0;
};

bool live_taps(int64_t input, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation,
               LiveTaps* taps) {
  auto outputs = [&](int64_t taps_count, int64_t pad) -> int64_t {
    const int64_t span = input + 2 * pad - dilation * (taps_count - 1) - 1;
    return span < 0 ? 0 : span / stride + 1;
  };
  if (input <= 0 || kernel <= 0 || stride <= 0 || dilation <= 0 || padding < 0) return false;
  const int64_t output = outputs(kernel, padding);
  int64_t first = -1, last = -1;
  for (int64_t tap = 0; tap < kernel; ++tap) {
    bool live = false;
    for (int64_t o = 0; o < output && !live; ++o) {
      const int64_t at = o * stride - padding + tap * dilation;
      live = at >= 0 && at < input;
    }
    if (!live) continue;
    if (first >= 0 && last != tap - 1) return false;  // not one run of taps
    if (first < 0) first = tap;
    last = tap;
  }
  if (first < 0) return false;  // every read is padding: leave it to the op
  const LiveTaps trimmed{first, last - first + 1, padding - first * dilation};
  if (trimmed.padding < 0 || outputs(trimmed.count, trimmed.padding) != output) return false;
  *taps = trimmed;
  return true;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              std::vector<int64_t> stride, std::vector<int64_t> padding,
              std::vector<int64_t> dilation, int64_t groups) {
  stride = normalized_pair(std::move(stride), "stride");
  padding = normalized_pair(std::move(padding), "padding");
  dilation = normalized_pair(std::move(dilation), "dilation");
  // Kernel taps that only ever read padding (a 3x3 kernel over a 1x1 plane uses its centre alone)
  // multiply zeros: the same convolution with the kernel cut to the live taps skips that work.
  // The cut weight is a view, so its gradient lands in the live taps and the rest stays zero.
  Tensor used_weight = weight;
  LiveTaps rows, cols;
  if (x.defined() && weight.defined() && x.dim() == 4 && weight.dim() == 4 && groups > 0 &&
      x.size(1) == weight.size(1) * groups &&
      live_taps(x.size(2), weight.size(2), stride[0], padding[0], dilation[0], &rows) &&
      live_taps(x.size(3), weight.size(3), stride[1], padding[1], dilation[1], &cols) &&
      (rows.count < weight.size(2) || cols.count < weight.size(3))) {
    used_weight = narrow(narrow(weight, 2, rows.first, rows.count), 3, cols.first, cols.count);
    padding = {rows.padding, cols.padding};
    // What is left over a 1x1 plane is a product of the channels: one GEMM over the whole batch
    // instead of the convolution's blocks of images.
    if (x.size(2) == 1 && x.size(3) == 1 && rows.count == 1 && cols.count == 1 && groups == 1) {
      const int64_t batch = x.size(0), out_channels = weight.size(0);
      return reshape(linear(reshape(x, {batch, x.size(1)}),
                            reshape(used_weight, {out_channels, weight.size(1)}), bias),
                     {batch, out_channels, 1, 1});
    }
  }
  Attrs attrs{{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
  return first_output(dispatch(ops::conv2d, {x, used_weight, bias}, std::move(attrs)));
}

}  // namespace tessel
