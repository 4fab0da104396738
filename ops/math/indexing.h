// Index maps of the gathering ops (embedding, index_select and their scatter-add gradients),
// shared by the CPU kernels (ops/cpu/index.cc) and the CUDA kernels (cuda/ops/index.cu): a
// tensor seen as (outer, size, inner) around one dim, rows picked along that dim.
//   Around shape = around(x.sizes(), dim);  src[shape.offset(o, index[j], k)]
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tessel {

// A tensor seen as (outer, size, inner) around one dim.
struct Around {
  int64_t outer = 1, size = 1, inner = 1;
  // Offset of element k of row `row` in outer slice o.
  TESSEL_HOST_DEVICE int64_t offset(int64_t o, int64_t row, int64_t k) const {
    return (o * size + row) * inner + k;
  }
};

// `sizes` (any container of dims) seen around `dim`.
template <typename Sizes>
Around around(const Sizes& sizes, int64_t dim) {
  Around result;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d) {
    if (d < dim) result.outer *= sizes[d];
    if (d == dim) result.size = sizes[d];
    if (d > dim) result.inner *= sizes[d];
  }
  return result;
}

// Element i of a row-major (outer, count, inner) tensor: slice o, row j, column k.
struct RowPosition {
  int64_t o, j, k;
};

TESSEL_HOST_DEVICE inline RowPosition row_position(int64_t i, int64_t count, int64_t inner) {
  return RowPosition{i / (count * inner), (i / inner) % count, i % inner};
}

}  // namespace tessel
