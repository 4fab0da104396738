#include "core/op.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "core/autograd.h"
#include "core/rng.h"

namespace tessel {

OpRegistry& OpRegistry::get() {
  static OpRegistry* registry = new OpRegistry;
  return *registry;
}

OpDef& OpRegistry::define(const std::string& name) {
  TESSEL_CHECK(find_or_null(name) == nullptr, "op '", name, "' is registered twice");
  ops_.push_back(std::make_unique<OpDef>());
  ops_.back()->name = name;
  by_name_[name] = ops_.back().get();
  return *ops_.back();
}

void OpRegistry::set_kernel(const std::string& name, DeviceType device, Kernel kernel) {
  OpDef* op = const_cast<OpDef*>(find_or_null(name));
  TESSEL_CHECK(op != nullptr, "set_kernel: unknown op '", name, "'");
  op->kernels[static_cast<int>(device)] = std::move(kernel);
}

const OpDef* OpRegistry::find_or_null(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const OpDef& OpRegistry::find(const std::string& name) const {
  const OpDef* op = find_or_null(name);
  TESSEL_CHECK(op != nullptr, "unknown op '", name, "' (", ops_.size(),
               " ops registered; is //ops linked with alwayslink?)");
  return *op;
}

std::vector<std::string> OpRegistry::names() const {
  std::vector<std::string> result;
  for (const auto& op : ops_) result.push_back(op->name);
  return result;
}

Tensor KernelContext::workspace(const Shape& sizes, DType dtype) {
  Device device = outputs.empty() ? Device::cpu() : outputs[0].device();
  workspaces.push_back(empty(sizes, TensorOptions(dtype).device(device)));
  workspace_access.emplace_back(*workspaces.back().storage());
  return workspaces.back();
}

Tensor RecipeTensor::materialize() const {
  return Tensor(std::make_shared<TensorImpl>(storage, sizes, strides, offset, dtype));
}

OpCall::~OpCall() {
  for (auto& input : inputs)
    if (input.storage) input.storage->release_recipe_ref();
}

namespace {
RecipeTensor describe(const Tensor& tensor, bool keep_storage) {
  RecipeTensor recipe;
  if (!tensor.defined()) return recipe;
  if (keep_storage) {
    recipe.storage = tensor.storage();
    recipe.storage->add_recipe_ref();
  }
  recipe.sizes = tensor.sizes();
  recipe.strides = tensor.strides();
  recipe.offset = tensor.storage_offset();
  recipe.dtype = tensor.dtype();
  recipe.version = tensor.version();
  return recipe;
}

void run_kernel(const OpDef& op, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                const Attrs& attrs, bool replay) {
  Device device = outputs.empty() ? inputs.at(0).device() : outputs[0].device();
  const Kernel& kernel = op.kernels[static_cast<int>(device.type)];
  TESSEL_CHECK(kernel != nullptr, op.name, ": no kernel for device ", device.str(),
               device.is_cuda() ? " (build with --config=cuda)" : "");
  std::vector<StorageAccess> accesses;
  accesses.reserve(inputs.size() + outputs.size());
  for (const auto& input : inputs)
    if (input.defined()) accesses.emplace_back(*input.storage());
  for (const auto& output : outputs) accesses.emplace_back(*output.storage());
  KernelContext context{op, inputs, outputs, attrs, replay, {}, {}};
  kernel(context);
}

TraceHook& trace_hook() {
  static TraceHook hook;
  return hook;
}
}  // namespace

TraceHook set_trace_hook(TraceHook hook) {
  std::swap(trace_hook(), hook);
  return hook;
}

std::shared_ptr<OpCall> make_op_call(const OpDef& op, const std::vector<Tensor>& inputs,
                                     const std::vector<Tensor>& outputs, const Attrs& attrs) {
  auto call = std::make_shared<OpCall>();
  call->op = &op;
  call->attrs = attrs;
  for (const auto& input : inputs) call->inputs.push_back(describe(input, true));
  for (const auto& output : outputs) {
    call->output_storages.push_back(output.storage());
    call->outputs.push_back(describe(output, false));
  }
  return call;
}

void replay_op_call(const OpCall& call) {
  const OpDef& op = *call.op;
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const RecipeTensor& input = call.inputs[i];
    if (!input.storage) {
      inputs.emplace_back();
      continue;
    }
    // Inputs the op mutates as a side effect (running statistics) are not read on replay.
    bool mutated = std::find(op.mutated_inputs.begin(), op.mutated_inputs.end(),
                             static_cast<int>(i)) != op.mutated_inputs.end();
    TESSEL_CHECK(mutated || input.storage->version() == input.version, "cannot recompute ", op.name,
                 ": input ", i, " was modified in place after the op ran (version ",
                 input.storage->version(), ", recorded ", input.version, ")");
    inputs.push_back(input.materialize());
  }
  std::vector<Tensor> outputs;
  for (size_t k = 0; k < call.outputs.size(); ++k) {
    const RecipeTensor& geometry = call.outputs[k];
    auto storage = call.output_storages[k].lock();
    if (storage && storage->state() == Residency::kEvicted) {
      storage->allocate_bytes();
      outputs.emplace_back(std::make_shared<TensorImpl>(storage, geometry.sizes, geometry.strides,
                                                        geometry.offset, geometry.dtype));
    } else {
      // Resident or gone: computed again into scratch so the kernel sees every output.
      Device device = inputs.empty() ? Device::cpu() : inputs[0].device();
      outputs.push_back(empty(geometry.sizes, TensorOptions(geometry.dtype).device(device)));
    }
  }
  run_kernel(op, inputs, outputs, call.attrs, /*replay=*/true);
}

namespace {
Device common_device(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  int first = -1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    if (first < 0) {
      first = static_cast<int>(i);
      continue;
    }
    TESSEL_CHECK(inputs[i].device() == inputs[first].device(), op.name, ": input ", i, " is on ",
                 inputs[i].device().str(), " but input ", first, " is on ",
                 inputs[first].device().str(), " (move it with .to(device))");
  }
  if (first >= 0) return inputs[first].device();
  return Device::parse(attrs.get_or<std::string>("device", "cpu"));
}

void record_autograd(const OpDef& op, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& outputs, const Attrs& attrs) {
  auto node = std::make_shared<OpNode>(op, attrs);
  node->sequence_nr = next_sequence_nr();
  node->saved_inputs.resize(inputs.size());
  node->saved_outputs.resize(outputs.size());
  for (const auto& input : inputs) {
    bool needs = input.defined() && input.requires_grad();
    node->next_edges.push_back(needs ? gradient_edge(input) : Edge{});
    node->needs_input_grad.push_back(needs);
    node->input_specs.push_back(input.defined() ? OutputSpec{input.sizes(), input.dtype()}
                                                : OutputSpec{{}, DType::kFloat32});
  }
  for (int i : op.save_inputs)
    if (inputs.at(i).defined()) node->saved_inputs[i] = SavedTensor::save(inputs[i]);
  for (int i : op.save_outputs) node->saved_outputs[i] = SavedTensor::save(outputs.at(i));
  node->pre_hooks.resize(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    node->output_specs.push_back({outputs[k].sizes(), outputs[k].dtype()});
    node->output_devices.push_back(outputs[k].device());
    if (!is_floating(outputs[k].dtype())) continue;
    TensorImpl* impl = outputs[k].impl();
    impl->requires_grad = true;
    impl->grad_fn = node;
    impl->output_nr = static_cast<int>(k);
  }
}
}  // namespace

std::vector<Tensor> dispatch(const OpDef& op, const std::vector<Tensor>& inputs, Attrs attrs,
                             const std::vector<Tensor>& out) {
  Device device = common_device(op, inputs, attrs);
  bool any_requires_grad = false;
  for (const auto& input : inputs) any_requires_grad |= input.defined() && input.requires_grad();
  bool record = any_requires_grad && GradMode::is_enabled() && op.backward != nullptr;

  std::vector<Tensor> outputs;
  if (op.flags.view) {
    TESSEL_CHECK(out.empty(), op.name, ": a view op takes no out= tensor");
    outputs.push_back(op.view_fn(inputs.at(0), attrs));
  } else {
    if (op.flags.random && !attrs.has("rng_seed")) {
      RngState state = reserve_rng(op.rng_counters(inputs, attrs));
      attrs.set("rng_seed", static_cast<int64_t>(state.seed));
      attrs.set("rng_offset", static_cast<int64_t>(state.offset));
    }
    std::vector<OutputSpec> specs = op.shape(inputs, attrs);
    if (out.empty()) {
      for (const auto& spec : specs)
        outputs.push_back(empty(spec.sizes, TensorOptions(spec.dtype).device(device)));
    } else {
      TESSEL_CHECK(out.size() == specs.size(), op.name, ": expected ", specs.size(),
                   " out= tensors, got ", out.size());
      for (size_t k = 0; k < out.size(); ++k) {
        TESSEL_CHECK(out[k].sizes() == specs[k].sizes, op.name, ": out= tensor ", k, " has shape ",
                     shape_str(out[k].sizes()), " but the result has shape ",
                     shape_str(specs[k].sizes));
        TESSEL_CHECK(out[k].dtype() == specs[k].dtype, op.name, ": out= tensor ", k, " has dtype ",
                     dtype_name(out[k].dtype()), " but the result has dtype ",
                     dtype_name(specs[k].dtype));
        TESSEL_CHECK(out[k].device() == device, op.name, ": out= tensor ", k, " is on ",
                     out[k].device().str(), " but the inputs are on ", device.str());
        TESSEL_CHECK(!out[k].has_internal_overlap(), op.name,
                     ": cannot write in place into an expanded view (shape ",
                     shape_str(out[k].sizes()), ", strides ", shape_str(out[k].strides()),
                     "); call .contiguous() first");
        TESSEL_CHECK(
            !(GradMode::is_enabled() && (any_requires_grad || out[k].requires_grad())), op.name,
            ": in-place writes into tensors that take part in autograd are not recorded; use the "
            "out-of-place form, or wrap the update in NoGradGuard");
      }
      outputs = out;
      record = false;
    }
    if (!device.is_meta()) {
      ResidencyHooks* hooks = residency_hooks();
      auto start = std::chrono::steady_clock::now();
      run_kernel(op, inputs, outputs, attrs, /*replay=*/false);
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      for (const auto& written : out) written.storage()->bump_version();
      for (int i : op.mutated_inputs)
        if (inputs.at(i).defined()) inputs[i].storage()->bump_version();
      if (hooks && out.empty() && (op.flags.pure || op.flags.random)) {
        hooks->on_op_recorded(make_op_call(op, inputs, outputs, attrs), seconds);
      }
    }
  }
  if (record) record_autograd(op, inputs, outputs, attrs);
  if (const TraceHook& hook = trace_hook()) hook(op, inputs, outputs, attrs);
  return outputs;
}

Tensor dispatch1(const char* name, const std::vector<Tensor>& inputs, Attrs attrs) {
  return dispatch(OpRegistry::get().find(name), inputs, std::move(attrs)).at(0);
}

}  // namespace tessel
