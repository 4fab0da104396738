// Strided, broadcasting element-wise loops and small helpers for Tessel's own CUDA kernels:
// device element types and conversions that match the CPU bit for bit, a loop geometry of up to
// 8 coalesced dims (stride 0 where broadcast), launchers for index/unary/binary/ternary loops.
//   cuda::launch_binary<float, float, float>(out, a, b, AddFunctor<float>{alpha});
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/op.h"
#include "core/tensor.h"
#include "cuda/runtime.h"

namespace tessel::cuda {

constexpr int kMaxDims = 8;
constexpr int kThreads = 256;

// ---- element types on the device ----

// 16-bit floats as raw bits (the layout of tessel::BFloat16 / Float16), converted exactly as
// core/dtype.cc does, so casts agree bit for bit with the CPU.
struct BF16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

__host__ __device__ inline uint32_t float_to_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
#endif
}

__host__ __device__ inline float bits_to_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
#endif
}

__host__ __device__ inline BF16 float_to_bf16(float value) {
  if (value != value) return BF16{0x7fc0};
  uint32_t bits32 = float_to_bits(value);
  uint32_t rounding = 0x7fff + ((bits32 >> 16) & 1);  // round to nearest even
  return BF16{static_cast<uint16_t>((bits32 + rounding) >> 16)};
}

__host__ __device__ inline float bf16_to_float(BF16 value) {
  return bits_to_float(static_cast<uint32_t>(value.bits) << 16);
}

__host__ __device__ inline F16 float_to_f16(float value) {
  uint32_t x = float_to_bits(value);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exponent = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff)
    return F16{static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0))};
  if (exponent >= 31) return F16{static_cast<uint16_t>(sign | 0x7c00)};
  if (exponent <= 0) {
    if (exponent < -10) return F16{static_cast<uint16_t>(sign)};
    mantissa |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half_mantissa = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half_mantissa & 1))) ++half_mantissa;
    return F16{static_cast<uint16_t>(sign | half_mantissa)};
  }
  uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  uint32_t remainder = mantissa & 0x1fff;
  if (remainder > 0x1000 || (remainder == 0x1000 && (half & 1))) ++half;
  return F16{static_cast<uint16_t>(half)};
}

__host__ __device__ inline float f16_to_float(F16 value) {
  uint32_t bits = value.bits;
  uint32_t sign = (bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_to_float(sign | 0x7f800000 | (mantissa << 13));
  return bits_to_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

template <typename T>
struct IsHalf : std::false_type {};
template <>
struct IsHalf<BF16> : std::true_type {};
template <>
struct IsHalf<F16> : std::true_type {};

template <typename T>
__host__ __device__ inline float half_to_float(T value) {
  if constexpr (std::is_same_v<T, BF16>) {
    return bf16_to_float(value);
  } else {
    return f16_to_float(value);
  }
}

// One value between element types, as cpu::convert_value does (ops/cpu/loops.h).
template <typename To, typename From>
__host__ __device__ inline To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (IsHalf<From>::value) {
    return convert<To>(half_to_float(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<double>(static_cast<float>(value)) != 0.0;
  } else if constexpr (std::is_same_v<To, BF16>) {
    return float_to_bf16(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, F16>) {
    return float_to_f16(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

// Calls fn(T{}) with T the device type of `dtype`.
template <typename Fn>
decltype(auto) visit_device_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kBFloat16:
      return fn(BF16{});
    case DType::kFloat16:
      return fn(F16{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kUInt8:
      return fn(uint8_t{});
    case DType::kBool:
      return fn(bool{});
  }
  TESSEL_FAIL("unknown dtype ", static_cast<int>(dtype));
}

// The device pointer of a tensor's first element (inside a kernel: the storage is pinned).
template <typename T>
T* device_data(const Tensor& tensor) {
  return static_cast<T*>(tensor.raw_data());
}

// ---- launch configuration ----

// The device of a kernel (its first output, else its first defined input), made current for
// the guard's lifetime, and its compute stream.
class KernelDevice {
 public:
  explicit KernelDevice(const KernelContext& context)
      : KernelDevice(context.outputs.empty() ? first_input(context) : context.outputs[0]) {}
  explicit KernelDevice(const Tensor& tensor)
      : index_(tensor.device().index), guard_(index_), stream_(compute_stream(index_)) {}
  cudaStream_t stream() const { return stream_; }
  int index() const { return index_; }

 private:
  static const Tensor& first_input(const KernelContext& context) {
    for (const auto& input : context.inputs)
      if (input.defined()) return input;
    TESSEL_FAIL(context.op.name, ": no tensor to take the device from");
  }
  int index_;
  DeviceGuard guard_;
  cudaStream_t stream_;
};

inline unsigned grid_for(int64_t count, int threads = kThreads) {
  int64_t blocks = (count + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  // Grid-stride loops cover the rest.
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;
  return static_cast<unsigned>(blocks);
}

inline void check_launch() { TESSEL_CUDA_CHECK(cudaGetLastError()); }

// ---- loop geometry ----

// Offsets (in elements) of N operands over one loop shape: dims of size 1 dropped, dims
// adjacent in memory for every operand merged, row-major order kept.
template <int N>
struct Geometry {
  int ndim = 0;
  bool dense = false;  // ndim <= 1: offset = linear * stride
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&result)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) result[k] = 0;
    if (dense) {
#pragma unroll
      for (int k = 0; k < N; ++k) result[k] = linear * strides[k][0];
      return;
    }
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t size = sizes[d];
      const int64_t index = linear % size;
      linear /= size;
#pragma unroll
      for (int k = 0; k < N; ++k) result[k] += index * strides[k][d];
    }
  }
};

// Strides of `tensor` read as if broadcast to `sizes`: 0 on broadcast dims.
inline Shape broadcast_strides(const Tensor& tensor, const Shape& sizes) {
  const Shape& own_sizes = tensor.sizes();
  const Shape& own_strides = tensor.strides();
  Shape strides(sizes.size(), 0);
  size_t lead = sizes.size() - own_sizes.size();
  for (size_t i = 0; i < own_sizes.size(); ++i)
    strides[lead + i] = own_sizes[i] == 1 ? 0 : own_strides[i];
  return strides;
}

template <int N>
Geometry<N> make_geometry(const Shape& loop_sizes, const std::array<Shape, N>& element_strides) {
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> strides;
  for (size_t d = 0; d < loop_sizes.size(); ++d) {
    if (loop_sizes[d] == 1) continue;
    bool merged = !sizes.empty();
    for (int k = 0; merged && k < N; ++k)
      merged = strides[k].back() == element_strides[k][d] * loop_sizes[d];
    if (merged) {
      sizes.back() *= loop_sizes[d];
      for (int k = 0; k < N; ++k) strides[k].back() = element_strides[k][d];
    } else {
      sizes.push_back(loop_sizes[d]);
      for (int k = 0; k < N; ++k) strides[k].push_back(element_strides[k][d]);
    }
  }
  TESSEL_CHECK(sizes.size() <= static_cast<size_t>(kMaxDims), "cuda kernels: a loop over ",
               sizes.size(), " non-mergeable dims (shape ", shape_str(loop_sizes),
               ") exceeds the limit of ", kMaxDims, "; call .contiguous() first");
  Geometry<N> geometry;
  geometry.ndim = static_cast<int>(sizes.size());
  geometry.dense = sizes.size() <= 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    geometry.sizes[d] = sizes[d];
    for (int k = 0; k < N; ++k) geometry.strides[k][d] = strides[k][d];
  }
  if (sizes.empty()) {
    geometry.sizes[0] = 1;
    for (int k = 0; k < N; ++k) geometry.strides[k][0] = 0;
  }
  return geometry;
}

// ---- element-wise kernels ----

template <typename Out, typename Fn>
__global__ void index_kernel(int64_t numel, Geometry<1> geometry, Out* out, Fn fn) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t offsets[1];
    geometry.offsets(i, offsets);
    out[offsets[0]] = fn(i);
  }
}

template <typename Out, typename In, typename Fn>
__global__ void unary_kernel(int64_t numel, Geometry<2> geometry, Out* out, const In* in, Fn fn) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t offsets[2];
    geometry.offsets(i, offsets);
    out[offsets[0]] = fn(in[offsets[1]]);
  }
}

template <typename Out, typename A, typename B, typename Fn>
__global__ void binary_kernel(int64_t numel, Geometry<3> geometry, Out* out, const A* a, const B* b,
                              Fn fn) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t offsets[3];
    geometry.offsets(i, offsets);
    out[offsets[0]] = fn(a[offsets[1]], b[offsets[2]]);
  }
}

template <typename Out, typename A, typename B, typename C, typename Fn>
__global__ void ternary_kernel(int64_t numel, Geometry<4> geometry, Out* out, const A* a,
                               const B* b, const C* c, Fn fn) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t offsets[4];
    geometry.offsets(i, offsets);
    out[offsets[0]] = fn(a[offsets[1]], b[offsets[2]], c[offsets[3]]);
  }
}

// out[i] = fn(i) for every element of `out` (any strides), i the row-major index.
template <typename Out, typename Fn>
void launch_index(const Tensor& out, Fn fn) {
  const int64_t numel = out.numel();
  if (numel == 0) return;
  KernelDevice device(out);
  // fn sees the row-major index of out's shape: merging dims keeps that order.
  const Geometry<1> geometry = make_geometry<1>(out.sizes(), {out.strides()});
  index_kernel<Out><<<grid_for(numel), kThreads, 0, device.stream()>>>(numel, geometry,
                                                                       device_data<Out>(out), fn);
  check_launch();
}

// out = fn(in), `in` broadcast to out's shape.
template <typename Out, typename In, typename Fn>
void launch_unary(const Tensor& out, const Tensor& in, Fn fn) {
  const int64_t numel = out.numel();
  if (numel == 0) return;
  KernelDevice device(out);
  auto geometry =
      make_geometry<2>(out.sizes(), {out.strides(), broadcast_strides(in, out.sizes())});
  unary_kernel<Out, In><<<grid_for(numel), kThreads, 0, device.stream()>>>(
      numel, geometry, device_data<Out>(out), device_data<const In>(in), fn);
  check_launch();
}

// out = fn(a, b), a and b broadcast to out's shape.
template <typename Out, typename A, typename B, typename Fn>
void launch_binary(const Tensor& out, const Tensor& a, const Tensor& b, Fn fn) {
  const int64_t numel = out.numel();
  if (numel == 0) return;
  KernelDevice device(out);
  auto geometry = make_geometry<3>(out.sizes(), {out.strides(), broadcast_strides(a, out.sizes()),
                                                 broadcast_strides(b, out.sizes())});
  binary_kernel<Out, A, B><<<grid_for(numel), kThreads, 0, device.stream()>>>(
      numel, geometry, device_data<Out>(out), device_data<const A>(a), device_data<const B>(b), fn);
  check_launch();
}

// out = fn(a, b, c), all broadcast to out's shape.
template <typename Out, typename A, typename B, typename C, typename Fn>
void launch_ternary(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, Fn fn) {
  const int64_t numel = out.numel();
  if (numel == 0) return;
  KernelDevice device(out);
  auto geometry = make_geometry<4>(
      out.sizes(), {out.strides(), broadcast_strides(a, out.sizes()),
                    broadcast_strides(b, out.sizes()), broadcast_strides(c, out.sizes())});
  ternary_kernel<Out, A, B, C><<<grid_for(numel), kThreads, 0, device.stream()>>>(
      numel, geometry, device_data<Out>(out), device_data<const A>(a), device_data<const B>(b),
      device_data<const C>(c), fn);
  check_launch();
}

// ---- helpers shared by the kernel files (defined in copy.cu) ----

// out = in converted to out's dtype, `in` broadcast to out's shape (any dtypes and strides).
void copy_convert(const Tensor& out, const Tensor& in);
// `tensor` in `dtype`: itself when it already has it, else a converted copy in a workspace.
Tensor converted(KernelContext& context, const Tensor& tensor, DType dtype);
// `tensor` as a row-major tensor: itself when contiguous, else a copy in a workspace.
Tensor dense_input(KernelContext& context, const Tensor& tensor);
// Sets every byte of a (contiguous) tensor to zero on its compute stream.
void zero_fill(const Tensor& tensor);
// Checks that every value of the dense i64/i32 `index` lies in [0, size) (or equals `allowed`,
// when given) and throws naming the first bad one: "<op>: index V is out of range for <what>
// of size S". Waits for the stream (the check needs the values on the host).
void check_index_range(KernelContext& context, const Tensor& index, int64_t size, const char* op,
                       const std::string& what, const int64_t* allowed = nullptr);
// The first index outside [0, size) and != allowed, with its flat position; position -1: none.
struct BadIndex {
  int64_t position = -1, value = 0;
};
BadIndex find_bad_index(KernelContext& context, const Tensor& index, int64_t size,
                        const int64_t* allowed);

// A row-major buffer for one output: the output itself when contiguous, else a workspace that
// finish() copies back.
struct DenseOutput {
  Tensor target, dense;
  DenseOutput(KernelContext& context, const Tensor& output) : target(output) {
    dense = output.is_contiguous() ? output : context.workspace(output.sizes(), output.dtype());
  }
  template <typename T>
  T* data() const {
    return device_data<T>(dense);
  }
  void finish() const {
    if (!dense.is_same(target)) copy_convert(target, dense);
  }
};

}  // namespace tessel::cuda
