// Strided element copies for CPU kernels whose tensors may have any strides (views, broadcasts,
// slices of a bigger output): copy between two geometries of one shape, or get a dense copy.
//   cpu::copy_strided(source, destination);             // same shape and dtype, any strides
//   Tensor dense = cpu::dense_input(ctx, ctx.inputs[1]);  // the input itself when contiguous
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/op.h"
#include "core/tensor.h"
#include "core/threading.h"

namespace tessel::cpu {

namespace detail {
template <typename Word>
void copy_words(const char* source_base, const Shape& source_strides, char* destination_base,
                const Shape& destination_strides, const Shape& sizes) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  if (ndim == 0) {
    *reinterpret_cast<Word*>(destination_base) = *reinterpret_cast<const Word*>(source_base);
    return;
  }
  const int64_t inner = sizes[ndim - 1];
  const int64_t source_inner_stride = source_strides[ndim - 1];
  const int64_t destination_inner_stride = destination_strides[ndim - 1];
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < ndim; ++d) rows *= sizes[d];
  if (rows == 0 || inner == 0) return;
  const Word* source = reinterpret_cast<const Word*>(source_base);
  Word* destination = reinterpret_cast<Word*>(destination_base);
  // Each chunk of rows finds its first row's multi-index once, then steps it like an odometer.
  parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(inner, 1)),
               [&](int64_t begin, int64_t end) {
                 Shape index(static_cast<size_t>(ndim > 1 ? ndim - 1 : 0), 0);
                 int64_t remainder = begin;
                 for (int64_t d = ndim - 2; d >= 0; --d) {
                   index[d] = remainder % sizes[d];
                   remainder /= sizes[d];
                 }
                 for (int64_t row = begin; row < end; ++row) {
                   int64_t source_offset = 0, destination_offset = 0;
                   for (int64_t d = 0; d + 1 < ndim; ++d) {
                     source_offset += index[d] * source_strides[d];
                     destination_offset += index[d] * destination_strides[d];
                   }
                   const Word* from = source + source_offset;
                   Word* to = destination + destination_offset;
                   if (source_inner_stride == 1 && destination_inner_stride == 1) {
                     std::memcpy(to, from, static_cast<size_t>(inner) * sizeof(Word));
                   } else {
                     for (int64_t i = 0; i < inner; ++i)
                       to[i * destination_inner_stride] = from[i * source_inner_stride];
                   }
                   for (int64_t d = ndim - 2; d >= 0; --d) {
                     if (++index[d] < sizes[d]) break;
                     index[d] = 0;
                   }
                 }
               });
}
// Merges neighbouring dims that both tensors step over as one (each dim's stride is the next's
// times its size in both) and drops dims of size 1, so the innermost run is as long as the two
// layouts allow: a slice of a concatenation's output (rows of 16 values in a channel plane of 4x4)
// then copies whole rows of all its channels at once.
inline void coalesce_dims(Shape& sizes, Shape& source_strides, Shape& destination_strides) {
  Shape merged_sizes, merged_source, merged_destination;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (!merged_sizes.empty() &&
        source_strides[d] == merged_source.front() * merged_sizes.front() &&
        destination_strides[d] == merged_destination.front() * merged_sizes.front()) {
      merged_sizes.front() *= sizes[d];
      continue;
    }
    merged_sizes.insert(merged_sizes.begin(), sizes[d]);
    merged_source.insert(merged_source.begin(), source_strides[d]);
    merged_destination.insert(merged_destination.begin(), destination_strides[d]);
  }
  sizes = std::move(merged_sizes);
  source_strides = std::move(merged_source);
  destination_strides = std::move(merged_destination);
}
}  // namespace detail

// Copies `source` into `destination` element by element (same shape and dtype, any strides).
// Both storages must be pinned (inside a kernel).
inline void copy_strided(const Tensor& source, const Tensor& destination) {
  TESSEL_CHECK(source.sizes() == destination.sizes() && source.dtype() == destination.dtype(),
               "copy_strided: source ", shape_str(source.sizes()), " ", dtype_name(source.dtype()),
               " vs destination ", shape_str(destination.sizes()), " ",
               dtype_name(destination.dtype()));
  if (source.numel() == 0) return;
  const char* from = static_cast<const char*>(source.raw_data());
  char* to = static_cast<char*>(destination.raw_data());
  if (source.is_contiguous() && destination.is_contiguous()) {
    std::memcpy(to, from, destination.nbytes());
    return;
  }
  Shape sizes = source.sizes(), source_strides = source.strides(),
        destination_strides = destination.strides();
  detail::coalesce_dims(sizes, source_strides, destination_strides);
  switch (source.element_size()) {
    case 1:
      return detail::copy_words<uint8_t>(from, source_strides, to, destination_strides, sizes);
    case 2:
      return detail::copy_words<uint16_t>(from, source_strides, to, destination_strides, sizes);
    case 4:
      return detail::copy_words<uint32_t>(from, source_strides, to, destination_strides, sizes);
    case 8:
      return detail::copy_words<uint64_t>(from, source_strides, to, destination_strides, sizes);
    default:
      TESSEL_FAIL("copy_strided: unsupported element size ", source.element_size());
  }
}

// `input` itself when it is contiguous, else a dense copy in the kernel's workspace.
inline Tensor dense_input(KernelContext& context, const Tensor& input) {
  if (input.is_contiguous()) return input;
  Tensor dense = context.workspace(input.sizes(), input.dtype());
  copy_strided(input, dense);
  return dense;
}

// The elements of `input` in row-major order: its own, or a dense copy's in the kernel's
// workspace.
template <typename T>
const T* dense_data(KernelContext& context, const Tensor& input) {
  if (input.is_contiguous()) return input.data_ptr<T>();
  return dense_input(context, input).template data_ptr<T>();
}

}  // namespace tessel::cpu
