// CUDA kernels for the factories, copies and casts of ops/factory.cc: clone, contiguous,
// to_dtype, copy_, fill_, full, arange and the random factories rand / randn / randint (the
// CPU's Philox stream, core/philox.h).
#include "core/philox.h"
#include "core/rng.h"
#include "cuda/ops/loops.cuh"
#include "ops/factory.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

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

TESSEL_REGISTER_OPS(cuda_factory) {
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
}

}  // namespace tessel::cuda
