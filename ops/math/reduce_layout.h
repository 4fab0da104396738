// How reductions read their input, shared by the CPU kernels (ops/cpu/reduce.cc) and the CUDA
// kernels (cuda/ops/reduce.cu): a row-major [outer, reduce, inner] block. When the reduced
// dims are adjacent the (contiguous) input already is that block; otherwise a permuted copy
// with the kept dims first and the reduced dims last is. Planning runs on the host; the
// layout's offsets also in device code.
//   ReductionPlan plan = plan_reduction(x.sizes(), x.strides(), reduced_flags("sum", x.sizes(),
//   dims));
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/attrs.h"
#include "core/error.h"
#include "core/host_device.h"
#include "core/shape.h"

namespace tessel {

struct ReduceLayout {
  int64_t outer = 1, reduce = 1, inner = 1;
  // Offset of element (o, r, i) of the block.
  TESSEL_HOST_DEVICE int64_t offset(int64_t o, int64_t r, int64_t i) const {
    return (o * reduce + r) * inner + i;
  }
};

// Which dims `dims` reduces (empty: all), with clear errors for bad or repeated dims.
inline std::vector<bool> reduced_flags(const std::string& op, const Shape& sizes,
                                       const std::vector<int64_t>& dims) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  std::vector<bool> reduced(ndim, dims.empty());
  const std::string what = op + ": dim";
  for (int64_t dim : dims) {
    const int64_t wrapped = wrap_dim(dim, ndim, what.c_str());
    if (ndim == 0) continue;
    TESSEL_CHECK(!reduced[wrapped], op, ": dim ", dim, " appears twice in dims ", dims);
    reduced[wrapped] = true;
  }
  return reduced;
}

inline std::vector<bool> single_dim(const std::string& op, const Shape& sizes, int64_t dim) {
  return reduced_flags(op, sizes, {dim});
}

// The "dims" attribute of a reduction; absent: every dim.
inline const std::vector<int64_t>& dims_attr(const Attrs& attrs) {
  static const std::vector<int64_t> kAll;
  return attrs.has("dims") ? attrs.get<std::vector<int64_t>>("dims") : kAll;
}

struct ReductionPlan {
  ReduceLayout layout;
  // Whether the block is a permuted copy: the input viewed with `sizes` / `strides` (kept dims
  // first, then reduced dims, each in their order) copied to row-major.
  bool permuted = false;
  Shape sizes, strides;
};

// The block layout of a row-major input of `sizes`, or the permutation of a tensor of `sizes` /
// `strides` that gives one.
inline ReductionPlan plan_reduction(const Shape& sizes, const Shape& strides,
                                    const std::vector<bool>& reduced) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  std::vector<std::pair<int64_t, bool>> groups;  // runs of kept / reduced dims
  for (int64_t d = 0; d < ndim; ++d) {
    const int64_t size = sizes[d];
    if (size == 1) continue;  // size-1 dims do not matter
    if (!groups.empty() && groups.back().second == reduced[d]) {
      groups.back().first *= size;
    } else {
      groups.emplace_back(size, reduced[d]);
    }
  }
  int reduced_groups = 0;
  for (const auto& group : groups) reduced_groups += group.second;
  ReductionPlan plan;
  if (reduced_groups <= 1) {
    bool seen_reduced = false;
    for (const auto& [size, is_reduced] : groups) {
      if (is_reduced) {
        plan.layout.reduce = size;
        seen_reduced = true;
      } else if (seen_reduced) {
        plan.layout.inner *= size;
      } else {
        plan.layout.outer *= size;
      }
    }
    return plan;
  }
  plan.permuted = true;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t d = 0; d < ndim; ++d) {
      if (reduced[d] != (pass == 1)) continue;
      plan.sizes.push_back(sizes[d]);
      plan.strides.push_back(strides[d]);
      (pass == 0 ? plan.layout.outer : plan.layout.reduce) *= sizes[d];
    }
  }
  return plan;
}

}  // namespace tessel
