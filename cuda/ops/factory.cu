// CUDA kernels for copies and creation: copy_convert (the strided, broadcasting cast every other
// kernel file uses), clone, contiguous, to_dtype, copy_, fill_, full, arange, the random
// factories rand / randn / randint and dropout (the CPU's Philox stream), cat, slice_backward.
#include <cmath>
#include <string>

#include "core/philox.h"
#include "core/rng.h"
#include "cuda/ops/loops.cuh"
#include "ops/dropout.h"
#include "ops/factory.h"
#include "ops/index.h"
#include "ops/math/dropout.h"
#include "ops/registry_helpers.h"
#include "ops/shape.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

template <typename Out, typename In>
struct ConvertFunctor {
  __device__ Out operator()(In value) const { return convert_value<Out>(value); }
};

template <typename T>
struct ConstantFunctor {
  T value;
  __device__ T operator()(int64_t) const { return value; }
};

template <typename T>
struct ArangeFunctor {
  double start, step;
  __device__ T operator()(int64_t i) const {
    return convert_value<T>(start + static_cast<double>(i) * step);
  }
};

template <typename T>
struct UniformFunctor {
  uint64_t seed, offset;
  double low, high;
  __device__ T operator()(int64_t i) const {
    const uint64_t index = static_cast<uint64_t>(i);
    const PhiloxWords words = philox4x32_words(seed, offset + index / 4);
    return convert_value<T>(low + (high - low) * uniform_from_bits(words.w[index % 4]));
  }
};

template <typename T>
struct NormalFunctor {
  uint64_t seed, offset;
  double mean, stddev;
  __device__ T operator()(int64_t i) const {
    const uint64_t index = static_cast<uint64_t>(i);
    const PhiloxWords words = philox4x32_words(seed, offset + index / 4);
    return convert_value<T>(mean + stddev * normal_from_words(words, index));
  }
};

template <typename T>
struct RandintFunctor {
  uint64_t seed, offset, range;
  int64_t low;
  __device__ T operator()(int64_t i) const {
    const uint64_t index = static_cast<uint64_t>(i);
    const PhiloxWords words = philox4x32_words(seed, offset + index / 4);
    return convert_value<T>(low + static_cast<int64_t>(words.w[index % 4] % range));
  }
};

// One thread per Philox counter: four elements, kept iff uniform >= p, scaled by 1 / (1 - p).
template <typename T>
__global__ void dropout_kernel(const T* x, T* y, bool* mask, int64_t numel, uint64_t seed,
                               uint64_t offset, double p, T scale) {
  const int64_t counters = (numel + 3) / 4;
  for (int64_t counter = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       counter < counters; counter += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dropout_counter(x, y, mask, numel, seed, offset, counter, p, scale);
}

RngState rng_attrs(const Attrs& attrs) {
  return RngState{static_cast<uint64_t>(attrs.get<int64_t>("rng_seed")),
                  static_cast<uint64_t>(attrs.get<int64_t>("rng_offset"))};
}

void copy_kernel(KernelContext& context) { copy_convert(context.outputs[0], context.inputs[0]); }

void fill_kernel(KernelContext& context) {
  const Tensor& out = context.outputs[0];
  const double value = context.attrs.get<double>("value");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_index<T>(out, ConstantFunctor<T>{convert_value<T>(value)});
  });
}

}  // namespace

void copy_convert(const Tensor& out, const Tensor& in) {
  if (out.numel() == 0) return;
  if (out.dtype() == in.dtype() && out.sizes() == in.sizes() && out.is_contiguous() &&
      in.is_contiguous()) {
    KernelDevice device(out);
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), in.raw_data(), out.nbytes(),
                                      cudaMemcpyDeviceToDevice, device.stream()));
    return;
  }
  visit_dtype(out.dtype(), [&](auto out_tag) {
    using Out = decltype(out_tag);
    visit_dtype(in.dtype(), [&](auto in_tag) {
      using In = decltype(in_tag);
      launch_unary<Out, In>(out, in, ConvertFunctor<Out, In>{});
    });
  });
}

Tensor converted(KernelContext& context, const Tensor& tensor, DType dtype) {
  if (tensor.dtype() == dtype) return tensor;
  Tensor copy = context.workspace(tensor.sizes(), dtype);
  copy_convert(copy, tensor);
  return copy;
}

Tensor dense_input(KernelContext& context, const Tensor& tensor) {
  if (tensor.is_contiguous()) return tensor;
  Tensor copy = context.workspace(tensor.sizes(), tensor.dtype());
  copy_convert(copy, tensor);
  return copy;
}

void zero_fill(const Tensor& tensor) {
  TESSEL_CHECK(tensor.is_contiguous(), "zero_fill: expected a contiguous tensor");
  if (tensor.numel() == 0) return;
  KernelDevice device(tensor);
  TESSEL_CUDA_CHECK(cudaMemsetAsync(tensor.raw_data(), 0, tensor.nbytes(), device.stream()));
}

TESSEL_REGISTER_OPS(cuda_copy) {
  ops::clone.set_kernel(kCuda, copy_kernel);
  ops::contiguous.set_kernel(kCuda, copy_kernel);
  ops::to_dtype.set_kernel(kCuda, copy_kernel);
  ops::copy_.set_kernel(kCuda, [](KernelContext& context) {
    Tensor source = context.inputs[1];
    // Overlapping views of one storage copy the values they had before the call.
    if (source.storage() == context.outputs[0].storage()) {
      Tensor snapshot = context.workspace(source.sizes(), source.dtype());
      copy_convert(snapshot, source);
      source = snapshot;
    }
    copy_convert(context.outputs[0], source);
  });
  ops::fill_.set_kernel(kCuda, fill_kernel);
  ops::full.set_kernel(kCuda, fill_kernel);
  ops::arange.set_kernel(kCuda, [](KernelContext& context) {
    const double start = context.attrs.get<double>("start");
    const double step = context.attrs.get<double>("step");
    const Tensor& out = context.outputs[0];
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch_index<T>(out, ArangeFunctor<T>{start, step});
    });
  });
  ops::rand.set_kernel(kCuda, [](KernelContext& context) {
    const RngState state = rng_attrs(context.attrs);
    const double low = context.attrs.get_or<double>("low", 0.0);
    const double high = context.attrs.get_or<double>("high", 1.0);
    const Tensor& out = context.outputs[0];
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch_index<T>(out, UniformFunctor<T>{state.seed, state.offset, low, high});
    });
  });
  ops::randn.set_kernel(kCuda, [](KernelContext& context) {
    const RngState state = rng_attrs(context.attrs);
    const double mean = context.attrs.get_or<double>("mean", 0.0);
    const double stddev = context.attrs.get_or<double>("std", 1.0);
    const Tensor& out = context.outputs[0];
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch_index<T>(out, NormalFunctor<T>{state.seed, state.offset, mean, stddev});
    });
  });
  ops::randint.set_kernel(kCuda, [](KernelContext& context) {
    const RngState state = rng_attrs(context.attrs);
    const int64_t low = context.attrs.get<int64_t>("low");
    const uint64_t range = static_cast<uint64_t>(context.attrs.get<int64_t>("high") - low);
    const Tensor& out = context.outputs[0];
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch_index<T>(out, RandintFunctor<T>{state.seed, state.offset, range, low});
    });
  });
  ops::dropout.set_kernel(kCuda, [](KernelContext& context) {
    const double p = context.attrs.get<double>("p");
    const RngState state = rng_attrs(context.attrs);
    visit_float_dtype(context.inputs[0].dtype(), ops::dropout.name(), [&](auto tag) {
      using T = decltype(tag);
      const Tensor x = dense_input(context, context.inputs[0]);
      DenseOutput y(context, context.outputs[0]);
      DenseOutput mask(context, context.outputs[1]);
      const int64_t numel = x.numel();
      if (numel > 0) {
        KernelDevice device(context);
        const T scale = static_cast<T>(p < 1.0 ? 1.0 / (1.0 - p) : 0.0);
        dropout_kernel<T><<<grid_for((numel + 3) / 4), kThreads, 0, device.stream()>>>(
            device_data<const T>(x), y.data<T>(), mask.data<bool>(), numel, state.seed,
            state.offset, p, scale);
        check_launch();
      }
      y.finish();
      mask.finish();
    });
  });
  ops::cat.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& out = context.outputs[0];
    const int64_t dim = wrap_dim(context.attrs.get<int64_t>("dim"), out.dim());
    int64_t position = 0;
    for (const Tensor& input : context.inputs) {
      Tensor part = make_view(out, input.sizes(), out.strides(),
                              out.storage_offset() + position * out.strides()[dim]);
      copy_convert(part, input);
      position += input.sizes()[dim];
    }
  });
  ops::slice_backward.set_kernel(kCuda, [](KernelContext& context) {
    const Tensor& out = context.outputs[0];
    DenseOutput dense(context, out);
    zero_fill(dense.dense);
    const Attrs& attrs = context.attrs;
    const int64_t dim = wrap_dim(attrs.get<int64_t>("dim"), out.dim());
    const int64_t step = attrs.get_or<int64_t>("step", 1);
    const int64_t size = out.sizes()[dim];
    int64_t start = attrs.get<int64_t>("start"), end = attrs.get<int64_t>("end");
    // As normalize_slice in ops/shape.cc (the shape rule already checked step > 0).
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = std::min(std::max<int64_t>(start, 0), size);
    end = std::min(std::max(end, start), size);
    Shape sizes = dense.dense.sizes(), strides = dense.dense.strides();
    sizes[dim] = (end - start + step - 1) / step;
    strides[dim] *= step;
    Tensor window = make_view(dense.dense, sizes, strides,
                              dense.dense.storage_offset() + start * dense.dense.strides()[dim]);
    copy_convert(window, context.inputs[0]);
    dense.finish();
  });
}

}  // namespace tessel::cuda
