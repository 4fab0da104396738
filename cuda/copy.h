// Device copies shared by the CUDA backend: a strided-to-contiguous gather kernel (any strides,
// stride-0 broadcasts included, up to 8 dimensions after merging) and host-side helpers.
//   cuda::gather_contiguous(x.raw_data(), x.sizes(), x.strides(), x.element_size(), out, stream);
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/shape.h"

namespace tessel::cuda {

// Writes the elements of the strided view at `source` (device memory; strides in elements)
// densely, row-major, to `destination` (device memory) on `stream`. Elements of 1, 2, 4 or 8 bytes.
void gather_contiguous(const void* source, const Shape& sizes, const Shape& strides,
                       size_t element_size, void* destination, cudaStream_t stream);

// The same on the host (both pointers host memory).
void gather_contiguous_host(const void* source, const Shape& sizes, const Shape& strides,
                            size_t element_size, void* destination);

}  // namespace tessel::cuda
