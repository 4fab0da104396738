// cuDNN kernels for conv2d, conv2d_backward_input and conv2d_backward_weight (cuDNN 9's legacy
// convolution API): f32, f64, and bf16/f16 with f32 accumulation. Algorithms are searched once
// per (pass, shapes, dtype, attributes, device) with cudnnFind*AlgorithmEx and cached as a list
// ranked by time; each call takes the fastest one whose workspace the allocator grants
// (KernelContext::workspace, so it is budgeted) and falls back to smaller ones on OutOfMemory.
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/storage.h"
#include "cuda/allocator.h"
#include "cuda/ops/conv.h"
#include "cuda/ops/loops.cuh"
#include "ops/conv.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;
// The search tries algorithms with workspaces up to this size; calls may use less.
constexpr size_t kMaxSearchWorkspace = size_t{1} << 30;

enum class ConvPass { kForward, kBackwardData, kBackwardFilter };

const char* pass_op_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::kForward:
      return ops::conv2d.name();
    case ConvPass::kBackwardData:
      return ops::conv2d_backward_input.name();
    case ConvPass::kBackwardFilter:
      return ops::conv2d_backward_weight.name();
  }
  return ops::conv2d.name();
}

// One ranked algorithm: cuDNN's enum value for its pass, workspace bytes, math type.
struct Choice {
  int algo;
  size_t memory;
  cudnnMathType_t math;
};

// The algorithms of one convolution, fastest first, and how thoroughly they were searched.
struct Ranking {
  std::vector<Choice> choices;
  size_t wanted = 0;      // the search workspace the heuristics asked for
  bool complete = false;  // searched with all of it: algorithms needing more were timed too
};

struct Cache {
  std::mutex mutex;
  std::map<std::string, Ranking> choices;
  ConvAlgorithmStats stats;
};
Cache& cache() {
  static auto* instance = new Cache;
  return *instance;
}

cudnnDataType_t data_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::kFloat32:
      return CUDNN_DATA_FLOAT;
    case DType::kFloat64:
      return CUDNN_DATA_DOUBLE;
    case DType::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kFloat16:
      return CUDNN_DATA_HALF;
    default:
      TESSEL_FAIL(op, ": expected a f32, f64, bf16 or f16 tensor on CUDA, got ", dtype_name(dtype));
  }
}

// f32 convolutions stay in plain FMA math unless TF32 is allowed; 16-bit ones use tensor cores.
cudnnMathType_t math_type(DType dtype) {
  if (dtype == DType::kFloat32) return allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  if (dtype == DType::kFloat64) return CUDNN_DEFAULT_MATH;
  return CUDNN_TENSOR_OP_MATH;
}

// The descriptors of one convolution: x (N, C, H, W), w (O, C / groups, KH, KW), y (N, O, OH, OW),
// every tensor dense.
class ConvDescriptors {
 public:
  ConvDescriptors(const Shape& x, const Shape& w, const Shape& y, DType dtype, const Attrs& attrs,
                  const char* op) {
    const cudnnDataType_t type = data_type(dtype, op);
    const auto& stride = attrs.get<std::vector<int64_t>>("stride");
    const auto& padding = attrs.get<std::vector<int64_t>>("padding");
    const auto& dilation = attrs.get<std::vector<int64_t>>("dilation");
    const int64_t groups = attrs.get<int64_t>("groups");
    TESSEL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    TESSEL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    TESSEL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    TESSEL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
    set_tensor(x_, x, type, op);
    set_tensor(y_, y, type, op);
    TESSEL_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, type, CUDNN_TENSOR_NCHW, to_int(w[0], op),
                                                  to_int(w[1], op), to_int(w[2], op),
                                                  to_int(w[3], op)));
    // f64 accumulates in f64; f32 and the 16-bit types in f32.
    const cudnnDataType_t compute = dtype == DType::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    TESSEL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv_, to_int(padding[0], op), to_int(padding[1], op), to_int(stride[0], op),
        to_int(stride[1], op), to_int(dilation[0], op), to_int(dilation[1], op),
        CUDNN_CROSS_CORRELATION, compute));
    TESSEL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv_, to_int(groups, op)));
    TESSEL_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, math_type(dtype)));
  }
  ~ConvDescriptors() {
    cudnnDestroyConvolutionDescriptor(conv_);
    cudnnDestroyFilterDescriptor(w_);
    cudnnDestroyTensorDescriptor(y_);
    cudnnDestroyTensorDescriptor(x_);
  }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;

  cudnnTensorDescriptor_t x() const { return x_; }
  cudnnTensorDescriptor_t y() const { return y_; }
  cudnnFilterDescriptor_t w() const { return w_; }
  cudnnConvolutionDescriptor_t conv() const { return conv_; }

 private:
  static int to_int(int64_t value, const char* op) {
    TESSEL_CHECK(value >= 0 && value <= INT32_MAX, op, ": size ", value,
                 " is beyond what cuDNN takes");
    return static_cast<int>(value);
  }
  static void set_tensor(cudnnTensorDescriptor_t descriptor, const Shape& sizes,
                         cudnnDataType_t type, const char* op) {
    TESSEL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(descriptor, CUDNN_TENSOR_NCHW, type,
                                                  to_int(sizes[0], op), to_int(sizes[1], op),
                                                  to_int(sizes[2], op), to_int(sizes[3], op)));
  }
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
};

std::string cache_key(ConvPass pass, const Shape& x, const Shape& w, const Shape& y, DType dtype,
                      const Attrs& attrs, int device) {
  std::ostringstream key;
  key << static_cast<int>(pass) << '|' << dtype_name(dtype) << '|' << shape_str(x) << '|'
      << shape_str(w) << '|' << shape_str(y) << '|' << attrs.str() << '|' << device << '|'
      << allow_tf32();
  return key.str();
}

// The raw device pointers of one call: x, w, y for every pass (one of them is the output).
struct ConvBuffers {
  void* x;
  void* w;
  void* y;
};

template <typename Perf>
std::vector<Choice> ranked(const Perf* results, int count) {
  std::vector<Choice> choices;
  for (int i = 0; i < count; ++i)
    if (results[i].status == CUDNN_STATUS_SUCCESS)
      choices.push_back(
          {static_cast<int>(results[i].algo), results[i].memory, results[i].mathType});
  return choices;
}

// cuDNN's heuristic ranking of the algorithms of `pass`, best first, from the shapes alone (no
// trial runs, no buffers).
std::vector<Choice> heuristic_choices(ConvPass pass, cudnnHandle_t handle,
                                      const ConvDescriptors& d) {
  int count = 0;
  if (pass == ConvPass::kForward) {
    cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    TESSEL_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        handle, d.x(), d.w(), d.conv(), d.y(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, results));
    return ranked(results, count);
  }
  if (pass == ConvPass::kBackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    TESSEL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, d.w(), d.y(), d.conv(), d.x(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count,
        results));
    return ranked(results, count);
  }
  cudnnConvolutionBwdFilterAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  TESSEL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      handle, d.x(), d.y(), d.conv(), d.w(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
      results));
  return ranked(results, count);
}

// The workspace bytes the heuristics say the algorithms of `pass` may use (capped).
size_t search_workspace(const std::vector<Choice>& heuristics) {
  size_t largest = 0;
  for (const Choice& choice : heuristics)
    largest = std::max(largest, std::min(choice.memory, kMaxSearchWorkspace));
  return largest;
}

// Times every algorithm of `pass` on the call's own buffers (the output is overwritten later).
std::vector<Choice> find_choices(ConvPass pass, cudnnHandle_t handle, const ConvDescriptors& d,
                                 const ConvBuffers& b, void* workspace, size_t workspace_bytes) {
  int count = 0;
  if (pass == ConvPass::kForward) {
    cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    TESSEL_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
        handle, d.x(), b.x, d.w(), b.w, d.conv(), d.y(), b.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
        &count, results, workspace, workspace_bytes));
    return ranked(results, count);
  }
  if (pass == ConvPass::kBackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    TESSEL_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
        handle, d.w(), b.w, d.y(), b.y, d.conv(), d.x(), b.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        &count, results, workspace, workspace_bytes));
    return ranked(results, count);
  }
  cudnnConvolutionBwdFilterAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  TESSEL_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
      handle, d.x(), b.x, d.y(), b.y, d.conv(), d.w(), b.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
      &count, results, workspace, workspace_bytes));
  return ranked(results, count);
}

// The cached ranking for this call. Outside a memory policy, a miss searches (times every
// algorithm) with as much of the wanted workspace as the allocator has free without evicting
// anything and without raising the peak: a search may use what the process needed at its peak and
// does not hold now, so the first step's peak (from which --memory_budget's fractions are taken)
// holds no search buffer. A ranking searched with less is searched again once, when the whole
// workspace fits so. While a memory policy manages the device (a residency manager is installed),
// or with the search turned off, a miss takes cuDNN's heuristic ranking instead: no search buffer
// competes with the budget, and the chunks of a split op (new shapes) run at once. The search
// buffer (up to 1 GiB) is freed when the search returns, before the chosen algorithm takes its own
// workspace: the allocator hands that one the same block instead of holding both at once.
std::vector<Choice> choices_for(ConvPass pass, cudnnHandle_t handle, const ConvDescriptors& d,
                                const ConvBuffers& b, const std::string& key, int device) {
  const auto allocator = caching_allocator(device);
  const bool heuristic_only = !conv_algorithm_search() || residency_hooks() != nullptr;
  const auto usage = allocator->memory_stats().base;
  const size_t below_peak =
      static_cast<size_t>(std::max<int64_t>(usage.peak_allocated_bytes - usage.allocated_bytes, 0));
  const size_t free_bytes = std::min(allocator->largest_allocatable(), below_peak);
  {
    std::lock_guard<std::mutex> lock(cache().mutex);
    auto found = cache().choices.find(key);
    if (found != cache().choices.end() &&
        (found->second.complete || heuristic_only || free_bytes < found->second.wanted)) {
      ++cache().stats.cache_hits;
      return found->second.choices;
    }
  }
  const std::vector<Choice> heuristics = heuristic_choices(pass, handle, d);
  const size_t wanted = search_workspace(heuristics);
  if (heuristic_only) {
    TESSEL_CHECK(!heuristics.empty(), pass_op_name(pass),
                 ": cuDNN found no algorithm for this convolution (", key, ")");
    std::lock_guard<std::mutex> lock(cache().mutex);
    ++cache().stats.heuristic_rankings;
    cache().choices[key] = {heuristics, wanted, false};
    return heuristics;
  }
  size_t bytes = std::min(wanted, free_bytes);
  void* workspace = nullptr;
  Tensor search_buffer;
  std::unique_ptr<StorageAccess> search_access;  // released before search_buffer
  if (bytes > 0) {
    try {
      search_buffer = empty({static_cast<int64_t>(bytes)},
                            TensorOptions(DType::kUInt8).device(Device::cuda(device)));
      search_access = std::make_unique<StorageAccess>(*search_buffer.storage());
      workspace = search_access->data();
    } catch (const OutOfMemory&) {
      bytes = 0;  // search among the algorithms that need no workspace
    }
  }
  std::vector<Choice> choices = find_choices(pass, handle, d, b, workspace, bytes);
  TESSEL_CHECK(!choices.empty(), pass_op_name(pass),
               ": cuDNN found no algorithm for this convolution (", key, ")");
  std::lock_guard<std::mutex> lock(cache().mutex);
  ++cache().stats.searches;
  cache().choices[key] = {choices, wanted, bytes == wanted};
  return choices;
}

// Runs one algorithm of `pass`: the output is overwritten, or added to (`accumulate`).
void run_choice(ConvPass pass, cudnnHandle_t handle, const ConvDescriptors& d, const ConvBuffers& b,
                const Choice& choice, void* workspace, DType dtype, bool accumulate) {
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = dtype == DType::kFloat64;
  const void* one = f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* zero = f64 ? static_cast<const void*>(&zero_d) : &zero_f;
  const void* beta = accumulate ? one : zero;
  // f32 without TF32 keeps FMA math whatever the search reported.
  const cudnnMathType_t math =
      dtype == DType::kFloat32 && !allow_tf32() ? CUDNN_FMA_MATH : choice.math;
  TESSEL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv(), math));
  if (pass == ConvPass::kForward) {
    TESSEL_CUDNN_CHECK(cudnnConvolutionForward(handle, one, d.x(), b.x, d.w(), b.w, d.conv(),
                                               static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo),
                                               workspace, choice.memory, zero, d.y(), b.y));
  } else if (pass == ConvPass::kBackwardData) {
    TESSEL_CUDNN_CHECK(
        cudnnConvolutionBackwardData(handle, one, d.w(), b.w, d.y(), b.y, d.conv(),
                                     static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo),
                                     workspace, choice.memory, zero, d.x(), b.x));
  } else {
    TESSEL_CUDNN_CHECK(
        cudnnConvolutionBackwardFilter(handle, one, d.x(), b.x, d.y(), b.y, d.conv(),
                                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo),
                                       workspace, choice.memory, beta, d.w(), b.w));
  }
}

// y + bias in f32 (f64 for f64), rounded once to the element type.
template <typename T>
struct BiasAdd {
  __device__ T operator()(T y, T bias) const {
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    return convert_value<T>(convert_value<Acc>(y) + convert_value<Acc>(bias));
  }
};

bool shares_storage(const Tensor& output, const std::vector<Tensor>& inputs) {
  for (const auto& input : inputs)
    if (input.defined() && input.storage() == output.storage()) return true;
  return false;
}

// One pass of a convolution. inputs/outputs as the op registers them:
//   forward         (x, w, bias) -> y
//   backward data   (grad_y, w)  -> grad_x
//   backward filter (grad_y, x)  -> grad_w
void convolution_kernel(KernelContext& context, ConvPass pass) {
  const char* op = pass_op_name(pass);
  const Tensor& out = context.outputs[0];
  if (out.numel() == 0) return;
  KernelDevice device(context);
  const DType dtype = out.dtype();
  // cuDNN reads and writes dense NCHW here; strided or aliasing outputs go through scratch.
  const bool direct = out.is_contiguous() && !shares_storage(out, context.inputs);
  Tensor target = direct ? out : context.workspace(out.sizes(), dtype);
  // The weight's gradient over chunks of the batch (KernelContext::chunk): chunks after the first
  // add theirs to what the chunks before them wrote. Chunks run under a memory policy, where
  // cuDNN's algorithm search (which writes the output) does not run.
  const bool accumulate =
      pass == ConvPass::kBackwardFilter && context.chunk && context.chunk->begin > 0;
  if (accumulate && !direct) copy_convert(target, out);
  Tensor first = dense_input(context, context.inputs[0]);
  Tensor second = dense_input(context, context.inputs[1]);
  Tensor x, w, y;
  switch (pass) {
    case ConvPass::kForward:
      x = first, w = second, y = target;
      break;
    case ConvPass::kBackwardData:
      y = first, w = second, x = target;
      break;
    case ConvPass::kBackwardFilter:
      y = first, x = second, w = target;
      break;
  }
  if (x.numel() == 0 || y.numel() == 0) {
    // An empty batch: no image contributes (only the weight gradient is left to write).
    if (accumulate) return;
    TESSEL_CUDA_CHECK(cudaMemsetAsync(target.raw_data(), 0, target.nbytes(), device.stream()));
    if (!direct) copy_convert(out, target);
    return;
  }
  cudnnHandle_t handle = cudnn_handle(device.index());
  ConvDescriptors descriptors(x.sizes(), w.sizes(), y.sizes(), dtype, context.attrs, op);
  const ConvBuffers buffers{x.raw_data(), w.raw_data(), y.raw_data()};
  const std::string key =
      cache_key(pass, x.sizes(), w.sizes(), y.sizes(), dtype, context.attrs, device.index());
  const std::vector<Choice> choices =
      choices_for(pass, handle, descriptors, buffers, key, device.index());

  // The fastest algorithm whose workspace fits; smaller ones when the allocator refuses.
  bool ran = false;
  int64_t skipped = 0;
  for (const Choice& choice : choices) {
    void* workspace = nullptr;
    if (choice.memory > 0) {
      try {
        workspace =
            context.workspace({static_cast<int64_t>(choice.memory)}, DType::kUInt8).raw_data();
      } catch (const OutOfMemory&) {
        ++skipped;
        continue;
      }
    }
    run_choice(pass, handle, descriptors, buffers, choice, workspace, dtype, accumulate);
    std::lock_guard<std::mutex> lock(cache().mutex);
    cache().stats.fallbacks += skipped > 0 ? 1 : 0;
    cache().stats.last_workspace = choice.memory;
    ran = true;
    break;
  }
  if (!ran) {
    // Every algorithm needs more workspace than the budget leaves: let the dispatcher split.
    throw TESSEL_ERROR_TYPE(
        OutOfMemory, op, ": no cuDNN algorithm's workspace fits in memory (", choices.size(),
        " algorithms tried, the smallest needs ",
        std::min_element(choices.begin(), choices.end(),
                         [](const Choice& a, const Choice& b) { return a.memory < b.memory; })
            ->memory,
        " bytes)");
  }

  if (pass == ConvPass::kForward && context.inputs[2].defined()) {
    // y += bias, broadcast over (N, H, W): the bias read as (C, 1, 1).
    const Tensor& bias = context.inputs[2];
    Tensor channels =
        make_view(bias, {bias.size(0), 1, 1}, {bias.stride(0), 1, 1}, bias.storage_offset());
    switch (dtype) {
      case DType::kFloat32:
        launch_binary<float, float, float>(y, y, channels, BiasAdd<float>{});
        break;
      case DType::kFloat64:
        launch_binary<double, double, double>(y, y, channels, BiasAdd<double>{});
        break;
      case DType::kBFloat16:
        launch_binary<BFloat16, BFloat16, BFloat16>(y, y, channels, BiasAdd<BFloat16>{});
        break;
      default:
        launch_binary<Float16, Float16, Float16>(y, y, channels, BiasAdd<Float16>{});
        break;
    }
  }
  if (!direct) copy_convert(out, target);
}

}  // namespace

namespace {
std::atomic<bool>& search_enabled() {
  static std::atomic<bool> enabled{[] {
    const char* value = std::getenv("TESSEL_CUDNN_SEARCH");
    return !(value && std::string(value) == "0");
  }()};
  return enabled;
}
}  // namespace

void set_conv_algorithm_search(bool enabled) { search_enabled() = enabled; }
bool conv_algorithm_search() { return search_enabled(); }

ConvAlgorithmStats conv_algorithm_stats() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().stats;
}

void clear_conv_algorithm_cache() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().choices.clear();
  cache().stats = ConvAlgorithmStats{};
}

TESSEL_REGISTER_OPS(cuda_cudnn_conv) {
  ops::conv2d.set_kernel(
      kCuda, [](KernelContext& context) { convolution_kernel(context, ConvPass::kForward); });
  ops::conv2d_backward_input.set_kernel(
      kCuda, [](KernelContext& context) { convolution_kernel(context, ConvPass::kBackwardData); });
  ops::conv2d_backward_weight.set_kernel(kCuda, [](KernelContext& context) {
    convolution_kernel(context, ConvPass::kBackwardFilter);
  });
}

}  // namespace tessel::cuda
