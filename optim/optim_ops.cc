// The optimizer updates as registered ops, so a device backend can plug in fused kernels through
// their handles (ops/optimizer_updates.h, OpHandle::set_kernel). Both write their outputs in place
// through out=:
//
// sgd_update: inputs  (param, grad, momentum_buffer or undefined when momentum == 0)
//             outputs (param[, momentum_buffer])
//             attrs   lr, momentum, dampening, nesterov, weight_decay, maximize, first_step
//                     (first_step: the buffer is set to the gradient instead of decayed into)
// adam_update: inputs  (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq or undefined)
//              outputs (param, exp_avg, exp_avg_sq[, max_exp_avg_sq])
//              attrs   lr, beta1, beta2, eps, weight_decay, decoupled (AdamW), amsgrad, maximize,
//                      step (this update's 1-based count, for the bias corrections)
//
// The arithmetic follows PyTorch 1.13's single-tensor code operation by operation, scalars
// rounded to the tensor's dtype where PyTorch rounds them, so f32 results agree to rounding.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "ops/optimizer_updates.h"
#include "ops/registry_helpers.h"

namespace tessel {
namespace {

// Element i (row-major) of a tensor with any strides.
template <typename T>
struct StridedElements {
  T* data;
  const Shape* sizes;
  const Shape* strides;
  T& operator[](int64_t index) const {
    int64_t offset = 0;
    for (int64_t d = static_cast<int64_t>(sizes->size()) - 1; d >= 0; --d) {
      offset += (index % (*sizes)[d]) * (*strides)[d];
      index /= (*sizes)[d];
    }
    return data[offset];
  }
};

// Runs body(begin, end, accessors...) over all elements, with plain pointers when every tensor
// is contiguous and strided accessors otherwise. Undefined tensors get a null pointer.
template <typename T, typename Body>
void for_elements(const std::vector<Tensor>& tensors, Body body) {
  const int64_t count = tensors[0].numel();
  bool all_contiguous = true;
  for (const auto& tensor : tensors) all_contiguous &= !tensor.defined() || tensor.is_contiguous();
  constexpr int64_t kGrain = 1 << 15;
  if (all_contiguous) {
    std::vector<T*> pointers;
    for (const auto& tensor : tensors)
      pointers.push_back(tensor.defined() ? tensor.data_ptr<T>() : nullptr);
    parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) { body(begin, end, pointers); });
  } else {
    std::vector<StridedElements<T>> accessors;
    for (const auto& tensor : tensors) {
      accessors.push_back(tensor.defined() ? StridedElements<T>{tensor.data_ptr<T>(),
                                                                &tensor.sizes(), &tensor.strides()}
                                           : StridedElements<T>{nullptr, nullptr, nullptr});
    }
    parallel_for(0, count, kGrain,
                 [&](int64_t begin, int64_t end) { body(begin, end, accessors); });
  }
}

void check_like(const char* op, const Tensor& param, const Tensor& other, const char* what) {
  TESSEL_CHECK(other.sizes() == param.sizes(), op, ": ", what, " has shape ",
               shape_str(other.sizes()), " but the parameter has shape ", shape_str(param.sizes()));
  TESSEL_CHECK(other.dtype() == param.dtype(), op, ": ", what, " has dtype ",
               dtype_name(other.dtype()), " but the parameter has dtype ",
               dtype_name(param.dtype()));
}

std::vector<OutputSpec> update_shapes(const char* op, const std::vector<Tensor>& inputs,
                                      const std::vector<const char*>& names) {
  TESSEL_CHECK(inputs.size() == names.size(), op, ": expected ", names.size(), " inputs, got ",
               inputs.size());
  const Tensor& param = inputs[0];
  TESSEL_CHECK(param.defined() && is_floating(param.dtype()), op,
               ": the parameter must be a defined f32 or f64 tensor");
  std::vector<OutputSpec> specs{{param.sizes(), param.dtype()}};
  for (size_t i = 1; i < inputs.size(); ++i) {
    bool optional = i + 1 == inputs.size() && i >= 2;  // the last state input may be absent
    if (!inputs[i].defined()) {
      TESSEL_CHECK(optional, op, ": ", names[i], " is undefined");
      continue;
    }
    check_like(op, param, inputs[i], names[i]);
    if (i >= 2) specs.push_back({param.sizes(), param.dtype()});
  }
  return specs;
}

OpCost update_cost(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   double flops_per_element) {
  double bytes = 0;
  for (const auto& tensor : inputs)
    if (tensor.defined()) bytes += static_cast<double>(tensor.nbytes());
  for (const auto& tensor : outputs) bytes += static_cast<double>(tensor.nbytes());
  return OpCost{flops_per_element * static_cast<double>(inputs[0].numel()), bytes};
}

void sgd_kernel(KernelContext& ctx) {
  const Attrs& attrs = ctx.attrs;
  const double lr = attrs.get<double>("lr");
  const double momentum = attrs.get<double>("momentum");
  const double dampening = attrs.get<double>("dampening");
  const double weight_decay = attrs.get<double>("weight_decay");
  const bool nesterov = attrs.get<bool>("nesterov");
  const bool maximize = attrs.get<bool>("maximize");
  const bool first_step = attrs.get<bool>("first_step");
  // Inputs and outputs alias (param, buffer): read and write through the outputs.
  std::vector<Tensor> tensors{ctx.outputs[0], ctx.inputs[1],
                              ctx.outputs.size() > 1 ? ctx.outputs[1] : Tensor()};
  visit_float_dtype(tensors[0].dtype(), "sgd_update", [&](auto tag) {
    using T = decltype(tag);
    const T decay = static_cast<T>(weight_decay), mu = static_cast<T>(momentum);
    const T keep = static_cast<T>(1 - dampening), step = static_cast<T>(-lr);
    for_elements<T>(tensors, [&](int64_t begin, int64_t end, const auto& at) {
      auto& param = at[0];
      const auto& grad = at[1];
      auto& buffer = at[2];
      for (int64_t i = begin; i < end; ++i) {
        T d = maximize ? -grad[i] : grad[i];
        if (weight_decay != 0) d = d + decay * param[i];
        if (momentum != 0) {
          T b = first_step ? d : buffer[i] * mu + keep * d;
          buffer[i] = b;
          d = nesterov ? d + mu * b : b;
        }
        param[i] = param[i] + step * d;
      }
    });
  });
}

void adam_kernel(KernelContext& ctx) {
  const Attrs& attrs = ctx.attrs;
  const double lr = attrs.get<double>("lr");
  const double beta1 = attrs.get<double>("beta1");
  const double beta2 = attrs.get<double>("beta2");
  const double eps = attrs.get<double>("eps");
  const double weight_decay = attrs.get<double>("weight_decay");
  const bool decoupled = attrs.get<bool>("decoupled");
  const bool amsgrad = attrs.get<bool>("amsgrad");
  const bool maximize = attrs.get<bool>("maximize");
  const double step = static_cast<double>(attrs.get<int64_t>("step"));
  // Python floats are doubles: the bias corrections are computed in double, as there.
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  std::vector<Tensor> tensors{ctx.outputs[0], ctx.inputs[1], ctx.outputs[1], ctx.outputs[2],
                              amsgrad ? ctx.outputs[3] : Tensor()};
  visit_float_dtype(tensors[0].dtype(), "adam_update", [&](auto tag) {
    using T = decltype(tag);
    const T b1 = static_cast<T>(beta1), one_minus_b1 = static_cast<T>(1 - beta1);
    const T b2 = static_cast<T>(beta2), one_minus_b2 = static_cast<T>(1 - beta2);
    const T decay = static_cast<T>(weight_decay);
    const T shrink = static_cast<T>(1 - lr * weight_decay);
    const T correction2_sqrt = static_cast<T>(bias_correction2_sqrt);
    const T epsilon = static_cast<T>(eps), neg_step_size = static_cast<T>(-step_size);
    for_elements<T>(tensors, [&](int64_t begin, int64_t end, const auto& at) {
      auto& param = at[0];
      const auto& grad = at[1];
      auto& exp_avg = at[2];
      auto& exp_avg_sq = at[3];
      auto& max_exp_avg_sq = at[4];
      for (int64_t i = begin; i < end; ++i) {
        T g = maximize ? -grad[i] : grad[i];
        T p = param[i];
        if (decoupled) {
          p = p * shrink;
        } else if (weight_decay != 0) {
          g = g + decay * p;
        }
        T m = exp_avg[i] * b1 + one_minus_b1 * g;
        T v = exp_avg_sq[i] * b2 + one_minus_b2 * g * g;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        if (amsgrad) {
          v = std::max(max_exp_avg_sq[i], v);
          max_exp_avg_sq[i] = v;
        }
        T denom = std::sqrt(v) / correction2_sqrt + epsilon;
        param[i] = p + neg_step_size * (m / denom);
      }
    });
  });
}

}  // namespace

TESSEL_REGISTER_OPS(optim) {
  {
    OpDef& op = OpRegistry::get().define(ops::sgd_update);
    op.kind = OpKind::kOptimizer;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
      return update_shapes("sgd_update", inputs, {"param", "grad", "momentum_buffer"});
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = sgd_kernel;
    op.cost = [](const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                 const Attrs&) { return update_cost(inputs, outputs, 6); };
    op.flags.pure = false;
  }
  {
    OpDef& op = OpRegistry::get().define(ops::adam_update);
    op.kind = OpKind::kOptimizer;
    op.autocast = AutocastPolicy::kWiden;
    op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
      return update_shapes("adam_update", inputs,
                           {"param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
    };
    op.kernels[static_cast<int>(DeviceType::kCpu)] = adam_kernel;
    op.cost = [](const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                 const Attrs&) { return update_cost(inputs, outputs, 16); };
    op.flags.pure = false;
  }
}

}  // namespace tessel
