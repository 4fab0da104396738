// cuBLAS products, cuDNN convolutions, batch norm and pooling on CUDA against the CPU result of
// the same inputs in the same process, forward and backward: several shapes, transposed and
// sliced inputs, groups, strides, padding, dilation, bf16 within bf16's precision, the cached
// algorithm search and the fallback to a smaller workspace when the allocator refuses one.
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "cuda/ops/conv.h"
#include "cuda/runtime.h"
#include "memory/memory.h"
#include "ops/ops.h"
#include "ops/pool.h"
#include "tests/gpu_skip.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using Inputs = std::vector<Tensor>;
using Fn = std::function<Tensor(const Inputs&)>;

struct Tolerance {
  double rtol = 1e-5, atol = 1e-6;
};
constexpr Tolerance kF32{1e-5, 1e-6};
// cuDNN's algorithms (FFT, Winograd) sum in other orders than the CPU's GEMM.
constexpr Tolerance kConvF32{1e-4, 1e-5};
constexpr Tolerance kF64{1e-10, 1e-12};
// bf16 keeps 8 bits of mantissa: one rounding step is 2^-8 of the value.
constexpr Tolerance kBF16{2e-2, 2e-2};

Inputs leaves_on(const Inputs& inputs, Device device) {
  Inputs result;
  for (const auto& input : inputs) {
    if (!input.defined()) {
      result.push_back(input);
      continue;
    }
    Tensor moved = input.detach().to(device);
    if (input.requires_grad()) moved.set_requires_grad(true);
    result.push_back(moved);
  }
  return result;
}

// fn on CPU and on cuda:0 from the same leaves: the output and every input gradient agree.
void expect_cuda_matches_cpu(const Inputs& cpu_leaves, const Fn& fn, Tolerance tolerance) {
  Inputs cuda_leaves = leaves_on(cpu_leaves, Device::cuda(0));
  Inputs cpu_run = leaves_on(cpu_leaves, Device::cpu());
  Tensor cpu_out = fn(cpu_run);
  Tensor cuda_out = fn(cuda_leaves);
  ASSERT_EQ(cuda_out.device(), Device::cuda(0));
  EXPECT_TRUE(all_close(cuda_out.to(Device::cpu()), cpu_out, tolerance.rtol, tolerance.atol));
  if (!cpu_out.requires_grad()) return;
  // sum(out * r) with one random r gives every output element its own weight.
  Tensor weights = randn(cpu_out.sizes(), cpu_out.dtype());
  sum(mul(cpu_out, weights)).backward();
  sum(mul(cuda_out, weights.to(Device::cuda(0)))).backward();
  for (size_t i = 0; i < cpu_leaves.size(); ++i) {
    if (!cpu_leaves[i].defined() || !cpu_leaves[i].requires_grad()) continue;
    SCOPED_TRACE("gradient of input " + std::to_string(i));
    // A leaf fn does not use (a bias left out) gets a gradient on neither device.
    ASSERT_EQ(cuda_leaves[i].grad().defined(), cpu_run[i].grad().defined());
    if (!cpu_run[i].grad().defined()) continue;
    EXPECT_TRUE(all_close(cuda_leaves[i].grad().to(Device::cpu()), cpu_run[i].grad(),
                          tolerance.rtol, tolerance.atol));
  }
}

Tensor leaf(const Shape& sizes, DType dtype = DType::kFloat32) {
  return randn(sizes, dtype).set_requires_grad(true);
}

// ---- cuBLAS ----

TEST(CudaMatmul, MatchesCpuForSeveralShapes) {
  TESSEL_SKIP_IF_NO_GPU();
  const std::vector<std::array<int64_t, 3>> shapes{{1, 1, 1}, {7, 5, 3}, {64, 33, 17}, {3, 128, 1}};
  for (auto [n, k, m] : shapes) {
    SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(k) + "x" + std::to_string(m));
    expect_cuda_matches_cpu(
        {leaf({n, k}), leaf({k, m})}, [](const Inputs& in) { return matmul(in[0], in[1]); }, kF32);
    expect_cuda_matches_cpu(
        {leaf({n, k}, DType::kFloat64), leaf({k, m}, DType::kFloat64)},
        [](const Inputs& in) { return matmul(in[0], in[1]); }, kF64);
  }
}

TEST(CudaMatmul, TransposedOperandsAreReadInPlace) {
  TESSEL_SKIP_IF_NO_GPU();
  expect_cuda_matches_cpu(
      {leaf({5, 9}), leaf({6, 5})}, [](const Inputs& in) { return matmul(in[0].t(), in[1].t()); },
      kF32);
  expect_cuda_matches_cpu(
      {leaf({9, 5}), leaf({6, 5})}, [](const Inputs& in) { return matmul(in[0], in[1].t()); },
      kF32);
}

TEST(CudaMatmul, StridedOperandsAreCopied) {
  TESSEL_SKIP_IF_NO_GPU();
  // Every other column: neither row- nor column-major.
  expect_cuda_matches_cpu(
      {leaf({6, 10}), leaf({5, 4})},
      [](const Inputs& in) { return matmul(slice(in[0], 1, 0, 10, 2), in[1]); }, kF32);
}

TEST(CudaMatmul, EmptyInnerDimensionGivesZeros) {
  TESSEL_SKIP_IF_NO_GPU();
  Tensor product = matmul(zeros({3, 0}).to(Device::cuda(0)), zeros({0, 4}).to(Device::cuda(0)));
  EXPECT_TRUE(bitwise_equal(product.to(Device::cpu()), zeros({3, 4})));
}

TEST(CudaBmm, MatchesCpuWithTransposesAndBroadcastBatch) {
  TESSEL_SKIP_IF_NO_GPU();
  expect_cuda_matches_cpu(
      {leaf({3, 4, 5}), leaf({3, 5, 6})}, [](const Inputs& in) { return bmm(in[0], in[1]); }, kF32);
  expect_cuda_matches_cpu(
      {leaf({3, 5, 4}), leaf({3, 6, 5})},
      [](const Inputs& in) { return bmm(transpose(in[0], 1, 2), transpose(in[1], 1, 2)); }, kF32);
  // A batch stride of 0: one matrix for every batch entry.
  expect_cuda_matches_cpu(
      {leaf({4, 5}), leaf({3, 5, 2})},
      [](const Inputs& in) {
        return bmm(expand(unsqueeze(in[0], 0), {3, 4, 5}), in[1]);
      },
      kF32);
  // Batched matmul with broadcast batch dims goes through bmm.
  expect_cuda_matches_cpu(
      {leaf({2, 1, 3, 4}), leaf({5, 4, 2})}, [](const Inputs& in) { return matmul(in[0], in[1]); },
      kF32);
}

TEST(CudaLinear, MatchesCpuWithAndWithoutBias) {
  TESSEL_SKIP_IF_NO_GPU();
  expect_cuda_matches_cpu(
      {leaf({8, 5}), leaf({3, 5}), leaf({3})},
      [](const Inputs& in) { return linear(in[0], in[1], in[2]); }, kF32);
  expect_cuda_matches_cpu(
      {leaf({2, 7, 5}), leaf({3, 5})}, [](const Inputs& in) { return linear(in[0], in[1]); }, kF32);
  expect_cuda_matches_cpu(
      {leaf({4, 6}, DType::kFloat64), leaf({3, 6}, DType::kFloat64), leaf({3}, DType::kFloat64)},
      [](const Inputs& in) { return linear(in[0], in[1], in[2]); }, kF64);
}

TEST(CudaLinear, TransposedInputAndWeightAreReadInPlace) {
  TESSEL_SKIP_IF_NO_GPU();
  expect_cuda_matches_cpu(
      {leaf({5, 8}), leaf({5, 3}), leaf({3})},
      [](const Inputs& in) { return linear(in[0].t(), in[1].t(), in[2]); }, kF32);
  // Sliced batch rows do not collapse into one matrix: copied first.
  expect_cuda_matches_cpu(
      {leaf({4, 6, 5}), leaf({3, 5})},
      [](const Inputs& in) { return linear(slice(in[0], 1, 0, 6, 2), in[1]); }, kF32);
}

TEST(CudaBlas, Bf16ProductsMatchCpuWithinBf16Precision) {
  TESSEL_SKIP_IF_NO_GPU();
  auto bf16 = [](const Tensor& t) { return to_dtype(t, DType::kBFloat16); };
  auto f32 = [](const Tensor& t) { return to_dtype(t, DType::kFloat32); };
  expect_cuda_matches_cpu(
      {leaf({16, 32}), leaf({32, 8})},
      [&](const Inputs& in) { return f32(matmul(bf16(in[0]), bf16(in[1]))); }, kBF16);
  expect_cuda_matches_cpu(
      {leaf({2, 16, 32}), leaf({2, 8, 32})},
      [&](const Inputs& in) { return f32(bmm(bf16(in[0]), transpose(bf16(in[1]), 1, 2))); }, kBF16);
  expect_cuda_matches_cpu(
      {leaf({6, 32}), leaf({10, 32}), leaf({10})},
      [&](const Inputs& in) { return f32(linear(bf16(in[0]), bf16(in[1]), bf16(in[2]))); }, kBF16);
}

TEST(CudaBlas, Tf32IsOffByDefaultAndCloseWhenAllowed) {
  TESSEL_SKIP_IF_NO_GPU();
  EXPECT_FALSE(cuda::allow_tf32());
  Tensor a = randn({64, 256}), b = randn({256, 32});
  Tensor expected = matmul(a, b);
  cuda::set_allow_tf32(true);
  Tensor relaxed = matmul(a.to(Device::cuda(0)), b.to(Device::cuda(0))).to(Device::cpu());
  cuda::set_allow_tf32(false);
  // TF32 keeps 10 bits of mantissa.
  EXPECT_TRUE(all_close(relaxed, expected, 1e-2, 1e-2));
}

TEST(CudaAutocast, LinearAndConvRunInBf16AndGradientsReachF32Weights) {
  TESSEL_SKIP_IF_NO_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = randn({4, 8}).to(gpu);
  Tensor w = randn({3, 8}).to(gpu).set_requires_grad(true);
  Tensor image = randn({2, 3, 8, 8}).to(gpu);
  Tensor kernel = randn({4, 3, 3, 3}).to(gpu).set_requires_grad(true);
  Tensor y, z;
  {
    AutocastGuard autocast(DType::kBFloat16);
    y = linear(x, w);
    z = conv2d(image, kernel);
  }
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  EXPECT_EQ(z.dtype(), DType::kBFloat16);
  add(sum(to_dtype(y, DType::kFloat32)), sum(to_dtype(z, DType::kFloat32))).backward();
  EXPECT_EQ(w.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(kernel.grad().dtype(), DType::kFloat32);
}

// ---- cuDNN convolutions ----

struct ConvCase {
  Shape input, weight;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
};

std::vector<ConvCase> conv_cases() {
  return {
      {{2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1, true},
      {{2, 4, 9, 7}, {6, 4, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, false},
      {{1, 4, 10, 10}, {4, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 2, true},  // groups, dilation
      {{2, 6, 7, 7}, {12, 1, 5, 3}, {1, 2}, {2, 1}, {1, 1}, 6, true},   // depthwise x2
      {{3, 8, 5, 5}, {16, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, false},  // pointwise
      {{2, 3, 16, 16}, {8, 3, 7, 7}, {2, 2}, {3, 3}, {1, 1}, 1, true},  // ResNet stem
  };
}

Fn conv_fn(const ConvCase& c) {
  return [c](const Inputs& in) {
    return conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.stride, c.padding, c.dilation,
                  c.groups);
  };
}

TEST(CudaConv2d, MatchesCpuForwardAndBackward) {
  TESSEL_SKIP_IF_NO_GPU();
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(shape_str(c.input) + " * " + shape_str(c.weight));
    expect_cuda_matches_cpu({leaf(c.input), leaf(c.weight), leaf({c.weight[0]})}, conv_fn(c),
                            kConvF32);
    expect_cuda_matches_cpu({leaf(c.input, DType::kFloat64), leaf(c.weight, DType::kFloat64),
                             leaf({c.weight[0]}, DType::kFloat64)},
                            conv_fn(c), kF64);
  }
}

TEST(CudaConv2d, NonContiguousInputsAreCopied) {
  TESSEL_SKIP_IF_NO_GPU();
  // NHWC memory seen as NCHW, and a weight sliced along its output channels.
  expect_cuda_matches_cpu(
      {leaf({2, 8, 8, 3}), leaf({8, 3, 3, 3})},
      [](const Inputs& in) {
        return conv2d(permute(in[0], {0, 3, 1, 2}), slice(in[1], 0, 0, 8, 2), Tensor(), {1, 1},
                      {1, 1});
      },
      kConvF32);
}

TEST(CudaConv2d, Bf16MatchesCpuWithinBf16Precision) {
  TESSEL_SKIP_IF_NO_GPU();
  auto bf16 = [](const Tensor& t) { return to_dtype(t, DType::kBFloat16); };
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(shape_str(c.input) + " * " + shape_str(c.weight));
    expect_cuda_matches_cpu(
        {leaf(c.input), leaf(c.weight), leaf({c.weight[0]})},
        [&](const Inputs& in) {
          Inputs low{bf16(in[0]), bf16(in[1]), bf16(in[2])};
          return to_dtype(conv_fn(c)(low), DType::kFloat32);
        },
        kBF16);
  }
}

TEST(CudaConv2d, AlgorithmSearchRunsOncePerShape) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::clear_conv_algorithm_cache();
  Tensor x = randn({2, 3, 12, 12}).to(Device::cuda(0));
  Tensor w = randn({5, 3, 3, 3}).to(Device::cuda(0));
  Tensor first = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  Tensor second = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  cuda::ConvAlgorithmStats stats = cuda::conv_algorithm_stats();
  EXPECT_EQ(stats.searches, 1);
  EXPECT_EQ(stats.cache_hits, 1);
  EXPECT_TRUE(bitwise_equal(second.to(Device::cpu()), first.to(Device::cpu())));
  // Another padding is another key.
  conv2d(x, w, Tensor(), {1, 1}, {0, 0});
  EXPECT_EQ(cuda::conv_algorithm_stats().searches, 2);
}

TEST(CudaConv2d, UnderAMemoryPolicyANewShapeTakesTheHeuristicRankingWithoutASearch) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::clear_conv_algorithm_cache();
  Tensor x_cpu = randn({3, 8, 20, 20}), w_cpu = randn({12, 8, 3, 3});
  Tensor expected = conv2d(x_cpu, w_cpu, Tensor(), {1, 1}, {1, 1});
  Tensor actual;
  {
    memory::MemoryScope scope(memory::MemoryOptions()
                                  .device(Device::cuda(0))
                                  .budget(size_t{64} << 20)
                                  .policy(memory::Policy::kDtr));
    Tensor x = x_cpu.to(Device::cuda(0)), w = w_cpu.to(Device::cuda(0));
    actual = conv2d(x, w, Tensor(), {1, 1}, {1, 1}).to(Device::cpu());
  }
  const cuda::ConvAlgorithmStats stats = cuda::conv_algorithm_stats();
  EXPECT_EQ(stats.searches, 0);
  EXPECT_EQ(stats.heuristic_rankings, 1);
  EXPECT_TRUE(all_close(actual, expected, kConvF32.rtol, kConvF32.atol));
  // Without the policy the same shape is searched once (the heuristic ranking was provisional).
  conv2d(x_cpu.to(Device::cuda(0)), w_cpu.to(Device::cuda(0)), Tensor(), {1, 1}, {1, 1});
  EXPECT_LE(cuda::conv_algorithm_stats().searches, 1);
}

// Passes every request to the real CUDA allocator, except those above `limit` bytes while
// `refusing`: those throw OutOfMemory, as a budget would.
class RefusingAllocator : public memory::Allocator {
 public:
  RefusingAllocator(std::shared_ptr<memory::Allocator> inner, size_t limit)
      : inner_(std::move(inner)), limit_(limit) {}
  void* allocate(size_t nbytes, memory::Stream stream) override {
    if (refusing && nbytes > limit_)
      throw TESSEL_ERROR_TYPE(OutOfMemory, "test budget refuses ", nbytes, " bytes");
    return inner_->allocate(nbytes, stream);
  }
  void deallocate(void* ptr, size_t nbytes, memory::Stream stream) override {
    inner_->deallocate(ptr, nbytes, stream);
  }
  memory::AllocatorStats stats() const override { return inner_->stats(); }
  void reset_peak() override { inner_->reset_peak(); }
  bool refusing = false;

 private:
  std::shared_ptr<memory::Allocator> inner_;
  size_t limit_;
};

TEST(CudaConv2d, FallsBackToASmallerWorkspaceWhenTheAllocatorRefuses) {
  TESSEL_SKIP_IF_NO_GPU();
  constexpr size_t kLimit = 512 * 1024;  // above every tensor here, below FFT workspaces
  auto original = memory::allocator_for(Device::cuda(0));
  auto refusing = std::make_shared<RefusingAllocator>(original, kLimit);
  memory::set_allocator(DeviceType::kCuda, refusing);
  Tensor x_cpu = randn({4, 16, 24, 24}), w_cpu = randn({16, 16, 5, 5});
  Tensor expected = conv2d(x_cpu, w_cpu, Tensor(), {1, 1}, {2, 2});
  Tensor x = x_cpu.to(Device::cuda(0)), w = w_cpu.to(Device::cuda(0));
  cuda::clear_conv_algorithm_cache();
  // Unrestricted first: the ranking is cached with every algorithm in it.
  conv2d(x, w, Tensor(), {1, 1}, {2, 2});
  refusing->refusing = true;
  Tensor limited;
  try {
    limited = conv2d(x, w, Tensor(), {1, 1}, {2, 2});
  } catch (...) {
    memory::set_allocator(DeviceType::kCuda, original);
    throw;
  }
  refusing->refusing = false;
  memory::set_allocator(DeviceType::kCuda, original);
  EXPECT_LE(cuda::conv_algorithm_stats().last_workspace, kLimit);
  EXPECT_TRUE(all_close(limited.to(Device::cpu()), expected, kConvF32.rtol, kConvF32.atol));
}

// ---- batch norm ----

TEST(CudaBatchNorm, TrainingMatchesCpuAndUpdatesRunningStatistics) {
  TESSEL_SKIP_IF_NO_GPU();
  for (const Shape& shape : std::vector<Shape>{{4, 3, 5, 5}, {8, 6}, {2, 4, 3}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t channels = shape[1];
    Tensor running_mean_cpu = randn({channels}), running_var_cpu = add(rand({channels}), 0.5);
    Tensor running_mean_gpu = running_mean_cpu.clone().to(Device::cuda(0));
    Tensor running_var_gpu = running_var_cpu.clone().to(Device::cuda(0));
    Tensor mean_cpu = running_mean_cpu.clone(), var_cpu = running_var_cpu.clone();
    expect_cuda_matches_cpu(
        {leaf(shape), leaf({channels}), leaf({channels})},
        [&](const Inputs& in) {
          const bool on_gpu = in[0].device().is_cuda();
          return batch_norm(in[0], in[1], in[2], on_gpu ? running_mean_gpu : mean_cpu,
                            on_gpu ? running_var_gpu : var_cpu, /*training=*/true, 0.1, 1e-5);
        },
        kF32);
    EXPECT_TRUE(all_close(running_mean_gpu.to(Device::cpu()), mean_cpu));
    EXPECT_TRUE(all_close(running_var_gpu.to(Device::cpu()), var_cpu));
  }
}

TEST(CudaBatchNorm, EvalAndF64MatchCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  Tensor mean = randn({3}), var = add(rand({3}), 0.5);
  expect_cuda_matches_cpu(
      {leaf({2, 3, 4, 4}), leaf({3}), leaf({3})},
      [&](const Inputs& in) {
        return batch_norm(in[0], in[1], in[2], mean.to(in[0].device()), var.to(in[0].device()),
                          /*training=*/false);
      },
      kF32);
  Tensor mean64 = randn({3}, DType::kFloat64), var64 = add(rand({3}, DType::kFloat64), 0.5);
  expect_cuda_matches_cpu(
      {leaf({2, 3, 4, 4}, DType::kFloat64), Tensor(), Tensor()},
      [&](const Inputs& in) {
        return batch_norm(permute(in[0], {0, 1, 3, 2}), Tensor(), Tensor(),
                          mean64.to(in[0].device()), var64.to(in[0].device()), true);
      },
      kF64);
}

// ---- pooling ----

TEST(CudaPool, MaxPoolMatchesCpuIncludingIndices) {
  TESSEL_SKIP_IF_NO_GPU();
  struct Case {
    Shape input;
    std::vector<int64_t> kernel, stride, padding, dilation;
    bool ceil_mode;
  };
  const std::vector<Case> cases{
      {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
      {{1, 2, 9, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
      {{2, 2, 11, 11}, {3, 2}, {1, 2}, {1, 1}, {2, 3}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.input));
    Tensor x = randn(c.input);
    auto pool = [&](const Tensor& input) {
      return dispatch(ops::max_pool2d, {input},
                      Attrs{{"kernel_size", c.kernel},
                            {"stride", c.stride},
                            {"padding", c.padding},
                            {"dilation", c.dilation},
                            {"ceil_mode", c.ceil_mode}});
    };
    std::vector<Tensor> cpu = pool(x), gpu = pool(x.to(Device::cuda(0)));
    EXPECT_TRUE(bitwise_equal(gpu[0].to(Device::cpu()), cpu[0]));
    EXPECT_TRUE(bitwise_equal(gpu[1].to(Device::cpu()), cpu[1]));
    expect_cuda_matches_cpu(
        {leaf(c.input)},
        [&](const Inputs& in) {
          return max_pool2d(in[0], c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
        },
        kF32);
  }
}

TEST(CudaPool, MaxPoolPropagatesNaN) {
  TESSEL_SKIP_IF_NO_GPU();
  Tensor x = tensor({1, NAN, 3, 4}, {1, 1, 2, 2});
  Tensor pooled = max_pool2d(x.to(Device::cuda(0)), {2, 2}).to(Device::cpu());
  EXPECT_TRUE(std::isnan(pooled.item<float>()));
}

TEST(CudaPool, AvgPoolMatchesCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  for (bool count_include_pad : {true, false}) {
    for (bool ceil_mode : {false, true}) {
      expect_cuda_matches_cpu(
          {leaf({2, 3, 9, 8})},
          [&](const Inputs& in) {
            return avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, ceil_mode, count_include_pad);
          },
          kF32);
    }
  }
  expect_cuda_matches_cpu(
      {leaf({2, 3, 8, 8}, DType::kFloat64)},
      [](const Inputs& in) {
        return avg_pool2d(transpose(in[0], 2, 3), {2, 2});
      },
      kF64);
}

TEST(CudaPool, AdaptiveAvgPoolMatchesCpuShrinkingAndGrowing) {
  TESSEL_SKIP_IF_NO_GPU();
  for (auto [input, output] : std::vector<std::pair<Shape, std::vector<int64_t>>>{
           {{2, 3, 7, 7}, {1, 1}}, {{2, 3, 7, 9}, {3, 4}}, {{1, 2, 3, 2}, {5, 7}}}) {
    SCOPED_TRACE(shape_str(input));
    expect_cuda_matches_cpu(
        {leaf(input)}, [&](const Inputs& in) { return adaptive_avg_pool2d(in[0], output); }, kF32);
  }
}

}  // namespace
}  // namespace tessel
