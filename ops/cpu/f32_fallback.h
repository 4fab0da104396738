// CPU kernels of the products and convolutions for 16-bit floats (bf16, f16, as autocast makes
// them): the f32 kernel runs on converted copies and its results are rounded back. And kernels
// whose outputs are sums over chunks of the batch, run by the memory layer over such chunks.
//   op.kernels[kCpu] = cpu::with_f32_fallback([](KernelContext& ctx) { ...f32/f64 kernel... });
#pragma once

#include <utility>
#include <vector>

#include "ops/cpu/loops.h"

namespace tessel::cpu {

inline bool is_16bit_float(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

// `kernel` as is for f32/f64 outputs; for 16-bit ones, on f32 copies of the 16-bit inputs and
// into f32 scratch outputs converted back at the end.
inline Kernel with_f32_fallback(Kernel kernel) {
  return [kernel = std::move(kernel)](KernelContext& context) {
    bool any_16bit = false;
    for (const auto& output : context.outputs) any_16bit |= is_16bit_float(output.dtype());
    if (!any_16bit) return kernel(context);
    std::vector<Tensor> inputs;
    for (const auto& input : context.inputs)
      inputs.push_back(input.defined() && is_16bit_float(input.dtype())
                           ? converted(context, input, DType::kFloat32)
                           : input);
    std::vector<Tensor> outputs;
    for (const auto& output : context.outputs)
      outputs.push_back(is_16bit_float(output.dtype())
                            ? context.workspace(output.sizes(), DType::kFloat32)
                            : output);
    {
      KernelContext inner{context.op,     inputs, outputs, context.attrs,
                          context.replay, {},     {},      context.chunk};
      kernel(inner);
    }
    for (size_t k = 0; k < outputs.size(); ++k)
      if (!outputs[k].is_same(context.outputs[k])) copy_convert(context.outputs[k], outputs[k]);
  };
}

// For an op whose outputs are sums over chunks of the batch (a SplitRule with output_dim -1 and
// one chunk pass, such as a weight's gradient): the first chunk's call writes the outputs, each
// later one computes its own into scratch and adds it in (f32/f64 outputs: split_rule keeps
// chunk passes to them).
inline Kernel summed_over_chunks(Kernel kernel) {
  return [kernel = std::move(kernel)](KernelContext& context) {
    if (!context.chunk || context.chunk->begin == 0) {
      KernelContext inner{
          context.op, context.inputs, context.outputs, context.attrs, context.replay, {},
          {},         nullptr};
      return kernel(inner);
    }
    std::vector<Tensor> partials;
    for (const auto& output : context.outputs)
      partials.push_back(context.workspace(output.sizes(), output.dtype()));
    {
      KernelContext inner{context.op, context.inputs, partials, context.attrs, context.replay, {},
                          {},         nullptr};
      kernel(inner);
    }
    for (size_t k = 0; k < partials.size(); ++k) {
      const Tensor& output = context.outputs[k];
      TESSEL_CHECK(output.is_contiguous(), context.op.name,
                   ": a sum over chunks needs a contiguous output");
      visit_float_dtype(output.dtype(), context.op.name.c_str(), [&](auto tag) {
        using T = decltype(tag);
        T* sum = output.data_ptr<T>();
        const T* part = partials[k].data_ptr<T>();
        for (int64_t i = 0; i < output.numel(); ++i) sum[i] += part[i];
      });
    }
  };
}

}  // namespace tessel::cpu
