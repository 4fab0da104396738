#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/philox.h"
#include "core/rng.h"
#include "cuda/runtime.h"
#include "tests/cuda/device_functions.h"

namespace tessel::cuda {

DeviceFunctionMismatches compare_device_functions_with_core(int64_t samples) {
  DeviceFunctionMismatches result;
  const RngState state{0x9e3779b97f4a7c15ull, 12345};
  uint64_t mix = 88172645463325252ull;  // xorshift64 for arbitrary float bit patterns
  for (int64_t i = 0; i < samples; ++i) {
    const uint64_t counter = static_cast<uint64_t>(i) * 7919 + (static_cast<uint64_t>(i) << 33);
    const auto cpu_words = philox4x32(state.seed ^ static_cast<uint64_t>(i), counter);
    const PhiloxWords device_words =
        philox4x32_words(state.seed ^ static_cast<uint64_t>(i), counter);
    for (int k = 0; k < 4; ++k) result.philox_words += cpu_words[k] != device_words.w[k];

    const uint64_t index = static_cast<uint64_t>(i) * 3;
    const PhiloxWords words = philox4x32_words(state.seed, state.offset + index / 4);
    result.uniform += uniform_at(state, index) != uniform_from_bits(words.w[index % 4]);
    const float cpu_normal = normal_at(state, index);
    const float device_normal = normal_from_words(words, index);
    result.normal += std::memcmp(&cpu_normal, &device_normal, sizeof(float)) != 0;

    mix ^= mix << 13, mix ^= mix >> 7, mix ^= mix << 17;
    const uint32_t bits = static_cast<uint32_t>(mix);
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    if (value == value) {  // NaN payloads may differ; both sides give a NaN
      result.to_bf16 += BFloat16(value).bits != float_to_bf16_bits(value);
      result.to_f16 += Float16(value).bits != float_to_f16_bits(value);
    }
    Float16 half;
    half.bits = static_cast<uint16_t>(bits);
    BFloat16 brain;
    brain.bits = static_cast<uint16_t>(bits >> 16);
    const float cpu_half = half, device_half = f16_bits_to_float(half.bits);
    const float cpu_brain = brain, device_brain = bf16_bits_to_float(brain.bits);
    result.from_half += std::memcmp(&cpu_half, &device_half, sizeof(float)) != 0;
    result.from_half += std::memcmp(&cpu_brain, &device_brain, sizeof(float)) != 0;
  }
  return result;
}

namespace {
__global__ void normals_kernel(RngState state, int64_t samples, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < samples;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t index = static_cast<uint64_t>(i) * 3;
    out[i] = normal_from_words(philox4x32_words(state.seed, state.offset + index / 4), index);
  }
}
}  // namespace

int64_t count_gpu_normal_mismatches(int64_t samples) {
  const RngState state{0x9e3779b97f4a7c15ull, 12345};
  DeviceGuard guard(0);
  float* device_out = nullptr;
  TESSEL_CUDA_CHECK(cudaMalloc(&device_out, samples * sizeof(float)));
  normals_kernel<<<256, 256>>>(state, samples, device_out);
  std::vector<float> out(samples);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t copied =
      cudaMemcpy(out.data(), device_out, samples * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(device_out);
  TESSEL_CUDA_CHECK(launched);
  TESSEL_CUDA_CHECK(copied);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < samples; ++i) {
    const float cpu_normal = normal_at(state, static_cast<uint64_t>(i) * 3);
    mismatches += std::memcmp(&cpu_normal, &out[i], sizeof(float)) != 0;
  }
  return mismatches;
}

}  // namespace tessel::cuda
