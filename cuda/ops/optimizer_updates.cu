// Fused CUDA kernels for the optimizer updates of optim/optim_ops.cc: sgd_update and
// adam_update (Adam and AdamW) in one pass over parameter, gradient and state, with the CPU's
// arithmetic operation by operation (scalars rounded to the tensor's dtype where it does).
// Non-contiguous tensors are updated through dense copies.
#include <cmath>
#include <type_traits>

#include "cuda/ops/loops.cuh"
#include "ops/optimizer_updates.h"
#include "ops/registry_helpers.h"

namespace tessel::cuda {

namespace {

constexpr DeviceType kCuda = DeviceType::kCuda;

template <typename T>
struct SgdScalars {
  T decay, mu, keep, step;
  bool use_decay, use_momentum, nesterov, maximize, first_step;
};

template <typename T>
__global__ void sgd_kernel(T* param, const T* grad, T* buffer, int64_t numel, SgdScalars<T> s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T d = s.maximize ? -grad[i] : grad[i];
    if (s.use_decay) d = d + s.decay * param[i];
    if (s.use_momentum) {
      T b = s.first_step ? d : buffer[i] * s.mu + s.keep * d;
      buffer[i] = b;
      d = s.nesterov ? d + s.mu * b : b;
    }
    param[i] = param[i] + s.step * d;
  }
}

template <typename T>
struct AdamScalars {
  T b1, one_minus_b1, b2, one_minus_b2, decay, shrink, correction2_sqrt, epsilon, neg_step_size;
  bool decoupled, use_decay, amsgrad, maximize;
};

template <typename T>
__device__ __forceinline__ T square_root(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return sqrtf(x);
  } else {
    return sqrt(x);
  }
}

template <typename T>
__global__ void adam_kernel(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* max_exp_avg_sq,
                            int64_t numel, AdamScalars<T> s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T g = s.maximize ? -grad[i] : grad[i];
    T p = param[i];
    if (s.decoupled) {
      p = p * s.shrink;
    } else if (s.use_decay) {
      g = g + s.decay * p;
    }
    T m = exp_avg[i] * s.b1 + s.one_minus_b1 * g;
    T v = exp_avg_sq[i] * s.b2 + s.one_minus_b2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (s.amsgrad) {
      v = max_exp_avg_sq[i] > v ? max_exp_avg_sq[i] : v;
      max_exp_avg_sq[i] = v;
    }
    T denom = square_root(v) / s.correction2_sqrt + s.epsilon;
    param[i] = p + s.neg_step_size * (m / denom);
  }
}

// Dense working copies of the outputs (read and written in place) and inputs; finish() writes
// the copies back into strided outputs.
struct DenseOperands {
  std::vector<DenseOutput> outputs;
  explicit DenseOperands(KernelContext& context) {
    for (const Tensor& output : context.outputs) {
      outputs.emplace_back(context, output);
      if (!outputs.back().dense.is_same(output)) copy_convert(outputs.back().dense, output);
    }
  }
  void finish() const {
    for (const auto& output : outputs) output.finish();
  }
};

void sgd_op(KernelContext& context) {
  const Attrs& attrs = context.attrs;
  const double lr = attrs.get<double>("lr");
  const double momentum = attrs.get<double>("momentum");
  const double dampening = attrs.get<double>("dampening");
  const double weight_decay = attrs.get<double>("weight_decay");
  visit_float_dtype(context.outputs[0].dtype(), ops::sgd_update.name(), [&](auto tag) {
    using T = decltype(tag);
    DenseOperands operands(context);
    const Tensor grad = dense_input(context, context.inputs[1]);
    SgdScalars<T> scalars{
        static_cast<T>(weight_decay), static_cast<T>(momentum),    static_cast<T>(1 - dampening),
        static_cast<T>(-lr),          weight_decay != 0,           momentum != 0,
        attrs.get<bool>("nesterov"),  attrs.get<bool>("maximize"), attrs.get<bool>("first_step")};
    const int64_t numel = grad.numel();
    if (numel > 0) {
      KernelDevice device(context);
      T* buffer = operands.outputs.size() > 1 ? operands.outputs[1].data<T>() : nullptr;
      TESSEL_CHECK(buffer != nullptr || momentum == 0,
                   "sgd_update: momentum != 0 needs a momentum_buffer");
      sgd_kernel<T><<<grid_for(numel), kThreads, 0, device.stream()>>>(
          operands.outputs[0].data<T>(), device_data<const T>(grad), buffer, numel, scalars);
      check_launch();
    }
    operands.finish();
  });
}

void adam_op(KernelContext& context) {
  const Attrs& attrs = context.attrs;
  const double lr = attrs.get<double>("lr");
  const double beta1 = attrs.get<double>("beta1");
  const double beta2 = attrs.get<double>("beta2");
  const double eps = attrs.get<double>("eps");
  const double weight_decay = attrs.get<double>("weight_decay");
  const bool amsgrad = attrs.get<bool>("amsgrad");
  const double step = static_cast<double>(attrs.get<int64_t>("step"));
  // In double, as the CPU kernel (and PyTorch's Python floats) compute them.
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  visit_float_dtype(context.outputs[0].dtype(), ops::adam_update.name(), [&](auto tag) {
    using T = decltype(tag);
    DenseOperands operands(context);
    const Tensor grad = dense_input(context, context.inputs[1]);
    AdamScalars<T> scalars{static_cast<T>(beta1),
                           static_cast<T>(1 - beta1),
                           static_cast<T>(beta2),
                           static_cast<T>(1 - beta2),
                           static_cast<T>(weight_decay),
                           static_cast<T>(1 - lr * weight_decay),
                           static_cast<T>(bias_correction2_sqrt),
                           static_cast<T>(eps),
                           static_cast<T>(-step_size),
                           attrs.get<bool>("decoupled"),
                           weight_decay != 0,
                           amsgrad,
                           attrs.get<bool>("maximize")};
    const int64_t numel = grad.numel();
    if (numel > 0) {
      KernelDevice device(context);
      TESSEL_CHECK(!amsgrad || operands.outputs.size() > 3,
                   "adam_update: amsgrad needs a max_exp_avg_sq tensor");
      adam_kernel<T><<<grid_for(numel), kThreads, 0, device.stream()>>>(
          operands.outputs[0].data<T>(), device_data<const T>(grad), operands.outputs[1].data<T>(),
          operands.outputs[2].data<T>(), amsgrad ? operands.outputs[3].data<T>() : nullptr, numel,
          scalars);
      check_launch();
    }
    operands.finish();
  });
}

}  // namespace

TESSEL_REGISTER_OPS(cuda_optim) {
  ops::sgd_update.set_kernel(kCuda, sgd_op);
  ops::adam_update.set_kernel(kCuda, adam_op);
}

}  // namespace tessel::cuda
