#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "cuda/copy.h"
#include "cuda/runtime.h"

namespace tessel::cuda {
namespace {

constexpr int kMaxGatherDims = 8;

struct Layout {
  int dims = 0;
  int64_t sizes[kMaxGatherDims];
  int64_t strides[kMaxGatherDims];
};

// Drops size-1 dimensions and merges dimensions that are contiguous with each other, so that
// most real layouts (transposes, slices, broadcasts) fit in kMaxGatherDims.
Layout merge_dims(const Shape& sizes, const Shape& strides) {
  std::vector<int64_t> merged_sizes, merged_strides;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (!merged_sizes.empty() && merged_strides.back() == strides[d] * sizes[d]) {
      merged_sizes.back() *= sizes[d];
      merged_strides.back() = strides[d];
      continue;
    }
    merged_sizes.push_back(sizes[d]);
    merged_strides.push_back(strides[d]);
  }
  TESSEL_CHECK(merged_sizes.size() <= kMaxGatherDims, "gather_contiguous: a layout of ",
               merged_sizes.size(), " dimensions that cannot be merged (at most ", kMaxGatherDims,
               "); shape ", shape_str(sizes), ", strides ", shape_str(strides));
  Layout layout;
  layout.dims = static_cast<int>(merged_sizes.size());
  for (int d = 0; d < layout.dims; ++d) {
    layout.sizes[d] = merged_sizes[d];
    layout.strides[d] = merged_strides[d];
  }
  return layout;
}

template <typename T>
__global__ void gather_kernel(const T* __restrict__ source, T* __restrict__ destination,
                              Layout layout, int64_t count) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += step) {
    int64_t rest = i, offset = 0;
    for (int d = layout.dims - 1; d >= 0; --d) {
      offset += (rest % layout.sizes[d]) * layout.strides[d];
      rest /= layout.sizes[d];
    }
    destination[i] = source[offset];
  }
}

template <typename T>
void launch(const void* source, void* destination, const Layout& layout, int64_t count,
            cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((count + threads - 1) / threads, 65535 * 8);
  gather_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      static_cast<const T*>(source), static_cast<T*>(destination), layout, count);
  TESSEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void gather_contiguous(const void* source, const Shape& sizes, const Shape& strides,
                       size_t element_size, void* destination, cudaStream_t stream) {
  int64_t count = 1;
  for (int64_t size : sizes) count *= size;
  if (count == 0) return;
  const Layout layout = merge_dims(sizes, strides);
  switch (element_size) {
    case 1:
      return launch<uint8_t>(source, destination, layout, count, stream);
    case 2:
      return launch<uint16_t>(source, destination, layout, count, stream);
    case 4:
      return launch<uint32_t>(source, destination, layout, count, stream);
    case 8:
      return launch<uint64_t>(source, destination, layout, count, stream);
    default:
      TESSEL_FAIL("gather_contiguous: unsupported element size ", element_size);
  }
}

void gather_contiguous_host(const void* source, const Shape& sizes, const Shape& strides,
                            size_t element_size, void* destination) {
  int64_t count = 1;
  for (int64_t size : sizes) count *= size;
  if (count == 0) return;
  const Layout layout = merge_dims(sizes, strides);
  const auto* base = static_cast<const char*>(source);
  auto* out = static_cast<char*>(destination);
  std::vector<int64_t> index(layout.dims, 0);
  const auto element = static_cast<int64_t>(element_size);
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < layout.dims; ++d) offset += index[d] * layout.strides[d];
    std::memcpy(out + i * element, base + offset * element, element_size);
    for (int d = layout.dims - 1; d >= 0; --d) {
      if (++index[d] < layout.sizes[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace tessel::cuda
