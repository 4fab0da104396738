// The CPU kernels of full, arange, rand, randn, randint, the copies and casts (clone,
// contiguous, to_dtype) and the in-place fill_ and copy_, on the strided loops of
// ops/cpu/loops.h. Random kernels compute each Philox counter once per four elements.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/philox.h"
#include "core/rng.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"
#include "ops/ops.h"
#include "ops/registry_helpers.h"

namespace tessel::cpu {

namespace {

RngState rng_attrs(const Attrs& attrs) {
  return RngState{static_cast<uint64_t>(attrs.get<int64_t>("rng_seed")),
                  static_cast<uint64_t>(attrs.get<int64_t>("rng_offset"))};
}

// The four numbers of one Philox counter, and the values rng.h derives from them. Random
// kernels compute each counter once instead of once per number; the values are those of
// random_bits / uniform_at / normal_at at the same index.
struct PhiloxBlock {
  PhiloxWords words{};
  float radius[2] = {}, angle[2] = {};  // Box-Muller over numbers (0, 1) and (2, 3)

  void compute(const RngState& state, uint64_t counter, bool with_normals) {
    words = philox4x32_words(state.seed, state.offset + counter);
    for (int pair = 0; with_normals && pair < 2; ++pair) {
      radius[pair] = box_muller_radius(words.w[2 * pair]);
      angle[pair] = box_muller_angle(words.w[2 * pair + 1]);
    }
  }
  uint32_t bits(uint64_t index) const { return words.w[index % 4]; }
  float uniform(uint64_t index) const { return uniform_from_bits(words.w[index % 4]); }
  float normal(uint64_t index) const {
    const int pair = static_cast<int>((index % 4) / 2);
    return box_muller_normal(radius[pair], angle[pair], (index & 1) != 0);
  }
};

// out[i] = value(block of counter i / 4, i) over every element of `out` (any strides).
template <typename T, typename Fn>
void random_loop(const Tensor& out, const RngState& state, bool with_normals, Fn&& value) {
  cpu::for_each_run<1>(out.sizes(), {cpu::byte_pointer(out)}, {out.strides()},
                       {static_cast<int64_t>(sizeof(T))}, cpu::kElementwiseGrain,
                       [&](const std::array<char*, 1>& data, const std::array<int64_t, 1>& strides,
                           int64_t count, int64_t first_index) {
                         PhiloxBlock block;
                         uint64_t cached = UINT64_MAX;
                         for (int64_t i = 0; i < count; ++i) {
                           uint64_t index = static_cast<uint64_t>(first_index + i);
                           if (index / 4 != cached) {
                             cached = index / 4;
                             block.compute(state, cached, with_normals);
                           }
                           *reinterpret_cast<T*>(data[0] + i * strides[0]) = value(block, index);
                         }
                       });
}

}  // namespace

void full_kernel(KernelContext& context) {
  const Tensor& out = context.outputs[0];
  double value = context.attrs.get<double>("value");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T filled = convert_value<T>(value);
    cpu::index_loop<T>(out, [filled](int64_t) { return filled; });
  });
}

void arange_kernel(KernelContext& context) {
  double start = context.attrs.get<double>("start"), step = context.attrs.get<double>("step");
  visit_dtype(context.outputs[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::index_loop<T>(context.outputs[0], [=](int64_t i) {
      return convert_value<T>(start + static_cast<double>(i) * step);
    });
  });
}

void rand_kernel(KernelContext& context) {
  RngState state = rng_attrs(context.attrs);
  double low = context.attrs.get_or<double>("low", 0.0);
  double high = context.attrs.get_or<double>("high", 1.0);
  visit_dtype(context.outputs[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    random_loop<T>(context.outputs[0], state, false, [=](const PhiloxBlock& block, uint64_t i) {
      return convert_value<T>(low + (high - low) * block.uniform(i));
    });
  });
}

void randn_kernel(KernelContext& context) {
  RngState state = rng_attrs(context.attrs);
  double mean = context.attrs.get_or<double>("mean", 0.0);
  double stddev = context.attrs.get_or<double>("std", 1.0);
  visit_dtype(context.outputs[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    random_loop<T>(context.outputs[0], state, true, [=](const PhiloxBlock& block, uint64_t i) {
      return convert_value<T>(mean + stddev * block.normal(i));
    });
  });
}

void randint_kernel(KernelContext& context) {
  RngState state = rng_attrs(context.attrs);
  int64_t low = context.attrs.get<int64_t>("low");
  uint64_t range = static_cast<uint64_t>(context.attrs.get<int64_t>("high") - low);
  visit_dtype(context.outputs[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    random_loop<T>(context.outputs[0], state, false, [=](const PhiloxBlock& block, uint64_t i) {
      return convert_value<T>(low + static_cast<int64_t>(block.bits(i) % range));
    });
  });
}

void clone_kernel(KernelContext& context) {
  cpu::copy_convert(context.outputs[0], context.inputs[0]);
}

void to_dtype_kernel(KernelContext& context) {
  cpu::copy_convert(context.outputs[0], context.inputs[0]);
}

void fill_inplace_kernel(KernelContext& context) {
  const Tensor& out = context.outputs[0];
  double value = context.attrs.get<double>("value");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T filled = convert_value<T>(value);
    cpu::index_loop<T>(out, [filled](int64_t) { return filled; });
  });
}

void copy_inplace_kernel(KernelContext& context) {
  Tensor source = context.inputs[1];
  // A source sharing the destination's bytes is read from a snapshot, so overlapping
  // views (x.copy_(x.t())) copy the values they had before the call.
  if (source.storage() == context.outputs[0].storage()) {
    Tensor snapshot = context.workspace(source.sizes(), source.dtype());
    cpu::copy_convert(snapshot, source);
    source = snapshot;
  }
  cpu::copy_convert(context.outputs[0], source);
}

}  // namespace tessel::cpu
