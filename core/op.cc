#include "core/op.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <sstream>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/builtin_ops.h"
#include "core/rng.h"

namespace tessel {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kUnspecified:
      return "unspecified";
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kConv:
      return "conv";
    case OpKind::kPointwise:
      return "pointwise";
    case OpKind::kActivation:
      return "activation";
    case OpKind::kReduction:
      return "reduction";
    case OpKind::kNorm:
      return "norm";
    case OpKind::kPool:
      return "pool";
    case OpKind::kLoss:
      return "loss";
    case OpKind::kDataMovement:
      return "data_movement";
    case OpKind::kIndexing:
      return "indexing";
    case OpKind::kFactory:
      return "factory";
    case OpKind::kOptimizer:
      return "optimizer";
    case OpKind::kCommunication:
      return "communication";
  }
  return "?";
}

OpRegistry& OpRegistry::get() {
  static OpRegistry* registry = new OpRegistry;
  return *registry;
}

OpDef& OpRegistry::entry(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = by_name_.find(name);
  if (found != by_name_.end()) return *found->second;
  entries_.push_back(std::make_unique<OpDef>());
  entries_.back()->name = name;
  by_name_[name] = entries_.back().get();
  return *entries_.back();
}

OpDef& OpRegistry::define(const OpHandle& handle) {
  OpDef& op = handle.def();
  std::lock_guard<std::mutex> lock(mutex_);
  TESSEL_CHECK(!op.registered, "op '", op.name, "' is registered twice");
  op.registered = true;
  registered_.push_back(&op);
  return op;
}

const OpDef* OpRegistry::find_or_null(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_name_.find(name);
  return it == by_name_.end() || !it->second->registered ? nullptr : it->second;
}

const OpDef& OpRegistry::find(const std::string& name) const {
  const OpDef* op = find_or_null(name);
  TESSEL_CHECK(op != nullptr, "unknown op '", name, "' (", names().size(),
               " ops registered; is its library linked with alwayslink?)");
  return *op;
}

std::vector<std::string> OpRegistry::names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> result;
  for (const OpDef* op : registered_) result.push_back(op->name);
  return result;
}

OpDef& OpHandle::def() const {
  OpDef* def = def_.load(std::memory_order_acquire);
  if (def == nullptr) {
    def = &OpRegistry::get().entry(name_);
    def_.store(def, std::memory_order_release);
  }
  return *def;
}

void OpHandle::set_kernel(DeviceType device, Kernel kernel) const {
  def().kernels[static_cast<int>(device)] = std::move(kernel);
}

Tensor KernelContext::workspace(const Shape& sizes, DType dtype) {
  Device device = outputs.empty() ? Device::cpu() : outputs[0].device();
  workspaces.push_back(empty(sizes, TensorOptions(dtype).device(device)));
  workspace_access.emplace_back(*workspaces.back().storage());
  return workspaces.back();
}

Tensor RecordedTensor::materialize() const {
  return Tensor(make_tensor_impl(storage, sizes, strides, offset, dtype));
}

OpCall::~OpCall() {
  for (auto& input : inputs)
    if (input.storage) input.storage->release_record_ref();
}

namespace {
RecordedTensor describe(const Tensor& tensor, bool keep_storage) {
  RecordedTensor record;
  if (!tensor.defined()) return record;
  if (keep_storage) {
    record.storage = tensor.storage();
    record.storage->add_record_ref();
  }
  record.sizes = tensor.sizes();
  record.strides = tensor.strides();
  record.offset = tensor.storage_offset();
  record.dtype = tensor.dtype();
  record.version = tensor.version();
  return record;
}

thread_local const KernelInProgress* current_kernel = nullptr;
// This thread's interceptor, and whether a call of it is under way (its own calls go through).
thread_local DispatchInterceptor* current_interceptor = nullptr;
thread_local bool intercepting = false;
std::atomic<int> running_kernels{0};

// Marks the kernel this thread runs, for the memory layer (nested replays restore the outer one).
// Kernels are counted process-wide only while a memory layer is installed, the one reader.
class KernelInProgressScope {
 public:
  KernelInProgressScope(KernelInProgress state, bool counted)
      : state_(state), previous_(current_kernel), counted_(counted) {
    current_kernel = &state_;
    if (counted_) running_kernels.fetch_add(1);
  }
  ~KernelInProgressScope() {
    if (counted_) running_kernels.fetch_sub(1);
    current_kernel = previous_;
  }
  KernelInProgressScope(const KernelInProgressScope&) = delete;
  KernelInProgressScope& operator=(const KernelInProgressScope&) = delete;

 private:
  KernelInProgress state_;
  const KernelInProgress* previous_;
  bool counted_;
};

// An op's operands (its inputs and outputs whole) did not fit on the device: running it in
// more chunks cannot help unless some of them stay in host memory (run_kernel_staged).
class OperandsOutOfMemory : public OutOfMemory {
 public:
  explicit OperandsOutOfMemory(const OutOfMemory& error)
      : OutOfMemory(error.message(), error.file(), error.line()) {}
};

// The storages of the kernels running on this thread, pinned: one stack, as a kernel (or bringing
// an operand back, by recomputing it) may dispatch ops itself; reused from op to op so that
// pinning allocates nothing. Each access is made before it is pushed, so that the ops it runs
// push and pop theirs first.
thread_local std::vector<StorageAccess> pinned_operands;

// Unpins what was pinned since it was made.
class PinnedOperandsScope {
 public:
  PinnedOperandsScope() : mark_(pinned_operands.size()) {}
  ~PinnedOperandsScope() {
    while (pinned_operands.size() > mark_) pinned_operands.pop_back();
  }
  PinnedOperandsScope(const PinnedOperandsScope&) = delete;
  PinnedOperandsScope& operator=(const PinnedOperandsScope&) = delete;

 private:
  size_t mark_;
};

// An op's resident inputs stay where they are while its outputs are allocated, so that making
// room for an output does not push out what the op reads next (DTR locks an op's inputs so).
// Where the outputs fit only with an input moved, the allocation runs again without the pins.
class ResidentInputsHeld {
 public:
  explicit ResidentInputsHeld(const std::vector<Tensor>& inputs) {
    if (!residency_hooks()) return;
    for (const Tensor& input : inputs)
      if (input.defined() && input.storage()->state() == Residency::kResident &&
          !input.storage()->sharded)
        pins_.emplace_back(*input.storage());
  }
  bool holding() const { return !pins_.empty(); }
  template <class Allocate>
  auto allocate(Allocate&& allocate_output) -> decltype(allocate_output()) {
    try {
      return allocate_output();
    } catch (const OutOfMemory&) {
      if (pins_.empty()) throw;
      pins_.clear();
      return allocate_output();
    }
  }

 private:
  std::vector<StoragePin> pins_;
};

void run_kernel_once(const OpDef& op, const Kernel& kernel, const std::vector<Tensor>& inputs,
                     std::vector<Tensor>& outputs, const Attrs& attrs, bool replay,
                     KernelInProgress progress, const ChunkPass* chunk = nullptr) {
  PinnedOperandsScope pinned;
  // With no memory layer installed nothing can take a resident storage's bytes away, so those
  // are not pinned (each pin is a locked instruction; Tensor::raw_data lets a running kernel
  // reach them).
  const bool pin_all = residency_hooks() != nullptr;
  auto pin = [&](StorageImpl& storage) {
    if (!pin_all && storage.state() == Residency::kResident && !storage.sharded) return;
    StorageAccess access(storage);
    pinned_operands.push_back(std::move(access));
  };
  try {
    // Resident operands first: bringing another back then cannot push them out.
    std::vector<StorageImpl*> not_resident;
    auto pin_if_resident = [&](StorageImpl& storage) {
      if (storage.state() == Residency::kResident) {
        pin(storage);
      } else {
        not_resident.push_back(&storage);
      }
    };
    for (const auto& input : inputs)
      if (input.defined()) pin_if_resident(*input.storage());
    for (const auto& output : outputs) pin_if_resident(*output.storage());
    for (StorageImpl* storage : not_resident) pin(*storage);
  } catch (const OutOfMemory& error) {
    throw OperandsOutOfMemory(error);
  }
  KernelContext context{op, inputs, outputs, attrs, replay, {}, {}, chunk};
  KernelInProgressScope scope(progress, pin_all);
  UnpinnedKernelScope unpinned(!pin_all);
  kernel(context);
}

// Elements [begin, end) of `tensor` along `dim`, over the same storage.
Tensor narrow_view(const Tensor& tensor, int64_t dim, int64_t begin, int64_t end) {
  Shape sizes = tensor.sizes();
  sizes[dim] = end - begin;
  return make_view(tensor, sizes, tensor.strides(),
                   tensor.storage_offset() + begin * tensor.stride(dim));
}

// Whether output `index` is cut along `rule` (an op with chunk passes keeps outputs without the
// split dimension, such as a reduced loss, and those the rule names whole).
bool output_cut(const SplitRule& rule, size_t index, const Tensor& output, int64_t size) {
  return rule.output_dim >= 0 && rule.output_dim < output.dim() &&
         output.size(rule.output_dim) == size &&
         std::find(rule.whole_outputs.begin(), rule.whole_outputs.end(), static_cast<int>(index)) ==
             rule.whole_outputs.end();
}

// The size of the dimension `rule` cuts: the first output's that has it, or for a rule whose
// outputs are sums over the chunks (output_dim -1), the first cut input's (0 when there is none).
int64_t split_size(const SplitRule& rule, const std::vector<Tensor>& inputs,
                   const std::vector<Tensor>& outputs) {
  for (const Tensor& output : outputs)
    if (rule.output_dim >= 0 && rule.output_dim < output.dim()) return output.size(rule.output_dim);
  for (size_t i = 0; i < inputs.size() && i < rule.input_dims.size(); ++i) {
    const int dim = rule.input_dims[i];
    if (inputs[i].defined() && dim >= 0 && dim < inputs[i].dim()) return inputs[i].size(dim);
  }
  return 0;
}

// The rule the memory layer lets `op` split along, or null: deterministic ops only, pure ones or
// ops whose kernel runs over chunks in passes (and applies its side effects once), and every
// output (the first, for the latter; none, for sums over chunks) must have the split dimension.
const SplitRule* split_rule(const OpDef& op, const std::vector<Tensor>& inputs,
                            const std::vector<Tensor>& outputs, const Attrs& attrs) {
  if (op.splits.empty() || op.flags.random || op.flags.view || outputs.empty()) return nullptr;
  const bool passes = op.chunk_passes > 0;
  if (!passes && (!op.flags.pure || op.flags.side_effects)) return nullptr;
  // Chunk passes are the way of the CPU's and CUDA's kernels computing in f32 or f64 (and of the
  // simulator) only.
  if (passes) {
    for (const auto& output : outputs)
      if (output.dtype() != DType::kFloat32 && output.dtype() != DType::kFloat64) return nullptr;
  }
  ResidencyHooks* hooks = residency_hooks();
  if (!hooks || !hooks->allow_split(op)) return nullptr;
  for (const SplitRule& rule : op.splits) {
    if ((rule.output_dim < 0 && !passes) || (rule.holds && !rule.holds(inputs, attrs))) continue;
    const int64_t size = split_size(rule, inputs, outputs);
    if (size < 2) continue;
    bool fits = true;
    for (size_t k = 0; k < outputs.size(); ++k)
      fits = fits && (passes || output_cut(rule, k, outputs[k], size));
    // A kernel running in passes reads every input its rule cuts as cut (a 1-D input of a loss
    // has no batch to cut).
    for (size_t i = 0; passes && i < inputs.size() && i < rule.input_dims.size(); ++i)
      fits = fits &&
             (rule.input_dims[i] < 0 || !inputs[i].defined() ||
              (rule.input_dims[i] < inputs[i].dim() && inputs[i].size(rule.input_dims[i]) == size));
    if (fits) return &rule;
  }
  return nullptr;
}

std::vector<Tensor> chunk_outputs_of(const SplitRule& rule, const std::vector<Tensor>& outputs,
                                     int64_t size, int64_t begin, int64_t end) {
  std::vector<Tensor> chunk_outputs;
  for (size_t k = 0; k < outputs.size(); ++k)
    chunk_outputs.push_back(output_cut(rule, k, outputs[k], size)
                                ? narrow_view(outputs[k], rule.output_dim, begin, end)
                                : outputs[k]);
  return chunk_outputs;
}

// The inputs of the chunk [begin, end) along `rule`: inputs split alongside the output are
// narrowed, the others (and broadcast ones, of size 1 there) are passed whole. An input of lower
// rank than the output is first read right-aligned (broadcasting: a bias of shape (C) is never cut
// along the batch) and, failing that, with the rule's dimension as given (indices of an
// embedding). An op whose kernel runs in passes gives its dimensions as they are read. The result
// is checked with the op's shape rule; false when no reading matches.
bool chunk_inputs(const OpDef& op, const SplitRule& rule, const std::vector<Tensor>& inputs,
                  const std::vector<Tensor>& chunk_outputs, const Attrs& attrs, int64_t full_size,
                  int64_t begin, int64_t end, std::vector<Tensor>& result) {
  const int64_t output_rank = chunk_outputs[0].dim();
  for (int reading = op.chunk_passes > 0 ? 1 : 0; reading < 2; ++reading) {
    result.clear();
    bool valid = true;
    for (size_t i = 0; i < inputs.size() && valid; ++i) {
      const Tensor& input = inputs[i];
      int dim = i < rule.input_dims.size() ? rule.input_dims[i] : -1;
      if (!input.defined() || dim < 0) {
        result.push_back(input);
        continue;
      }
      if (reading == 0 && input.dim() < output_rank)
        dim = static_cast<int>(rule.output_dim - (output_rank - input.dim()));
      if (dim < 0 || dim >= input.dim() || input.size(dim) == 1) {
        result.push_back(input);
      } else if (input.size(dim) == full_size) {
        result.push_back(narrow_view(input, dim, begin, end));
      } else {
        valid = false;
      }
    }
    if (!valid) continue;
    try {
      std::vector<OutputSpec> specs = op.shape(result, attrs);
      if (specs.size() != chunk_outputs.size()) continue;
      for (size_t k = 0; k < specs.size(); ++k)
        valid = valid && specs[k].sizes == chunk_outputs[k].sizes();
    } catch (const Error&) {
      valid = false;
    }
    if (valid) return true;
  }
  return false;
}

// Runs `op` as `chunks` calls, each writing its slice of the outputs. False when the inputs
// cannot be cut to match (the caller then reports the original out-of-memory error).
bool run_kernel_chunked(const OpDef& op, const Kernel& kernel, const SplitRule& rule,
                        const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                        const Attrs& attrs, bool replay, int64_t chunks, bool can_split_further) {
  const int64_t size = split_size(rule, inputs, outputs);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = size * chunk / chunks, end = size * (chunk + 1) / chunks;
    std::vector<Tensor> chunk_outputs = chunk_outputs_of(rule, outputs, size, begin, end);
    std::vector<Tensor> chunk_in;
    if (!chunk_inputs(op, rule, inputs, chunk_outputs, attrs, size, begin, end, chunk_in))
      return false;
    run_kernel_once(op, kernel, chunk_in, chunk_outputs, attrs, replay,
                    KernelInProgress{&op, chunks, can_split_further});
  }
  return true;
}

// Whether `inputs` can be cut along `rule` (checked on the first of two chunks).
bool cuttable(const OpDef& op, const SplitRule& rule, const std::vector<Tensor>& inputs,
              const std::vector<Tensor>& outputs, const Attrs& attrs) {
  const int64_t size = split_size(rule, inputs, outputs);
  std::vector<Tensor> chunk_in;
  return chunk_inputs(op, rule, inputs, chunk_outputs_of(rule, outputs, size, 0, size / 2), attrs,
                      size, 0, size / 2, chunk_in);
}

// An operand that may stay in host memory while the op runs over chunks along its first
// dimension: a dense tensor cut there (each chunk's part is one run of bytes).
struct StagedOperand {
  StorageImpl* storage;
  Tensor whole;          // the operand as the op sees it
  bool read = false;     // an input: each chunk's part is copied in
  bool written = false;  // an output: each chunk's part is copied out after the last pass
  Tensor buffer;         // device memory for the largest chunk's part
};

// The chunk's part of `operand` in its buffer, and where those bytes lie in its storage.
Tensor buffer_part(const StagedOperand& operand, int64_t rows) {
  return narrow_view(operand.buffer, 0, 0, rows);
}
size_t staged_offset(const StagedOperand& operand, int64_t begin) {
  return static_cast<size_t>(operand.whole.storage_offset() + begin * operand.whole.stride(0)) *
         operand.whole.element_size();
}

enum class StagedRun { kDone, kStageMore, kMoreChunks };

// Runs `op` over `chunks` chunks along `rule` (in OpDef::chunk_passes passes) with the operands
// in `staged` kept on host: for each chunk, their parts are copied into device buffers, the
// kernel runs on the buffers and the other operands' slices, and the outputs' parts are copied
// back to host after the last pass. kStageMore: the other operands do not fit whole;
// kMoreChunks: a chunk's buffers or kernel did not fit.
StagedRun run_chunks_staged(const OpDef& op, const Kernel& kernel, const SplitRule& rule,
                            const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                            const Attrs& attrs, bool replay, int64_t chunks,
                            std::vector<StagedOperand>& staged) {
  ResidencyHooks* hooks = residency_hooks();
  auto find_staged = [&](const Tensor& tensor) -> StagedOperand* {
    if (!tensor.defined()) return nullptr;
    for (StagedOperand& operand : staged)
      if (operand.storage == tensor.storage().get()) return &operand;
    return nullptr;
  };
  // The other operands stay resident throughout.
  std::vector<StorageAccess> whole;
  auto pin_whole = [&](const std::vector<Tensor>& operands) {
    for (const Tensor& operand : operands)
      if (operand.defined() && !find_staged(operand)) whole.emplace_back(*operand.storage());
  };
  try {
    pin_whole(inputs);
    pin_whole(outputs);
  } catch (const OutOfMemory&) {
    return StagedRun::kStageMore;
  }
  const int64_t size = split_size(rule, inputs, outputs);
  const int64_t largest = (size + chunks - 1) / chunks;
  std::vector<StorageAccess> buffers;
  try {
    for (StagedOperand& operand : staged) {
      Shape sizes = operand.whole.sizes();
      sizes[0] = largest;
      operand.buffer =
          empty(sizes, TensorOptions(operand.whole.dtype()).device(operand.whole.device()));
      buffers.emplace_back(*operand.buffer.storage());
    }
  } catch (const OutOfMemory&) {
    return StagedRun::kMoreChunks;
  }
  const int passes = std::max(op.chunk_passes, 1);
  std::vector<double> state;
  // An op writing into one of its inputs (a gradient reused in place) cannot start again once
  // its last pass has written a chunk.
  bool in_place = false;
  for (const Tensor& output : outputs)
    for (const Tensor& input : inputs)
      in_place |= input.defined() && input.storage() == output.storage();
  bool wrote_in_place = false;
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t begin = size * chunk / chunks, end = size * (chunk + 1) / chunks;
      std::vector<Tensor> chunk_outputs = chunk_outputs_of(rule, outputs, size, begin, end);
      std::vector<Tensor> chunk_in;
      TESSEL_CHECK(chunk_inputs(op, rule, inputs, chunk_outputs, attrs, size, begin, end, chunk_in),
                   op.name, ": its inputs cannot be cut as its outputs are");
      for (Tensor& output : chunk_outputs)
        if (StagedOperand* operand = find_staged(output))
          output = buffer_part(*operand, end - begin);
      for (StagedOperand& operand : staged) {
        if (!operand.read) continue;
        Tensor part = buffer_part(operand, end - begin);
        hooks->read_staged(*operand.storage, staged_offset(operand, begin), part.nbytes(),
                           buffers[&operand - staged.data()].data());
      }
      for (Tensor& input : chunk_in)
        if (StagedOperand* operand = find_staged(input)) input = buffer_part(*operand, end - begin);
      const ChunkPass progress{pass, passes, begin, end, size, &state};
      try {
        run_kernel_once(op, kernel, chunk_in, chunk_outputs, attrs, replay,
                        KernelInProgress{&op, chunks, false},
                        op.chunk_passes > 0 ? &progress : nullptr);
      } catch (const OutOfMemory&) {
        if (wrote_in_place) throw;
        return StagedRun::kMoreChunks;
      }
      if (pass + 1 < passes) continue;
      wrote_in_place = in_place;
      for (StagedOperand& operand : staged) {
        if (!operand.written) continue;
        hooks->write_staged(*operand.storage, staged_offset(operand, begin),
                            buffer_part(operand, end - begin).nbytes(),
                            buffers[&operand - staged.data()].data());
      }
    }
  }
  return StagedRun::kDone;
}

// The split policy's last resort, for an op whose operands do not fit on the device whole (in
// any number of chunks): stage the largest operands cut along the split's first dimension in
// host memory (those already there first), one more at a time, and run the op over chunks of
// them (run_chunks_staged), in 8, then 32, then single-row chunks. A recompute keeps its outputs
// on the device (the memory layer expects them there). False when no staging fits.
bool run_kernel_staged(const OpDef& op, const Kernel& kernel, const SplitRule& rule,
                       const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                       const Attrs& attrs, bool replay) {
  ResidencyHooks* hooks = residency_hooks();
  // Chunks along the first dimension only: each chunk's part of an operand is one run of bytes.
  if (!hooks || rule.output_dim > 0) return false;
  const int64_t size = split_size(rule, inputs, outputs);
  std::vector<Tensor> chunk_in;
  if (!chunk_inputs(op, rule, inputs, chunk_outputs_of(rule, outputs, size, 0, 1), attrs, size, 0,
                    1, chunk_in))
    return false;
  // Candidates: dense operands cut along dim 0, one per storage (a storage read or written
  // through two different geometries is left alone).
  std::vector<StagedOperand> candidates;
  std::vector<StorageImpl*> excluded;
  auto consider = [&](const Tensor& whole, bool cut, bool read) {
    if (!whole.defined()) return;
    StorageImpl* storage = whole.storage().get();
    if (std::find(excluded.begin(), excluded.end(), storage) != excluded.end()) return;
    auto same = std::find_if(candidates.begin(), candidates.end(),
                             [&](const StagedOperand& c) { return c.storage == storage; });
    const bool usable = cut && whole.is_contiguous() && whole.dim() >= 1 && whole.size(0) == size;
    if (same != candidates.end() && (!usable || same->whole.sizes() != whole.sizes() ||
                                     same->whole.storage_offset() != whole.storage_offset())) {
      excluded.push_back(storage);
      candidates.erase(same);
      return;
    }
    if (!usable) {
      excluded.push_back(storage);
      return;
    }
    if (same == candidates.end()) {
      candidates.push_back({storage, whole});
      same = candidates.end() - 1;
    }
    (read ? same->read : same->written) = true;
  };
  auto cut_along_first = [](const Tensor& whole, const Tensor& part) {
    if (whole.dim() != part.dim() || whole.dim() == 0 || part.size(0) != 1) return false;
    for (int64_t d = 1; d < whole.dim(); ++d)
      if (whole.size(d) != part.size(d)) return false;
    return whole.size(0) != 1;
  };
  for (size_t i = 0; i < inputs.size(); ++i)
    consider(inputs[i], inputs[i].defined() && cut_along_first(inputs[i], chunk_in[i]), true);
  for (size_t k = 0; k < outputs.size(); ++k)
    consider(outputs[k], !replay && output_cut(rule, k, outputs[k], size), false);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const StagedOperand& a, const StagedOperand& b) {
                     const bool a_on_host = a.storage->state() == Residency::kOnHost;
                     const bool b_on_host = b.storage->state() == Residency::kOnHost;
                     if (a_on_host != b_on_host) return a_on_host;
                     return a.storage->nbytes() > b.storage->nbytes();
                   });
  std::vector<StagedOperand> staged;
  struct EndStaging {
    ResidencyHooks* hooks;
    std::vector<StagedOperand>& staged;
    ~EndStaging() {
      for (StagedOperand& operand : staged) hooks->end_staging(*operand.storage);
    }
  } end_staging{hooks, staged};
  // Over 8, 32, then single-row chunks with what is staged now; false when none fits.
  auto run_with_staged = [&] {
    for (int64_t chunks : {int64_t{8}, int64_t{32}, size}) {
      chunks = std::min(chunks, size);
      const StagedRun run =
          run_chunks_staged(op, kernel, rule, inputs, outputs, attrs, replay, chunks, staged);
      for (StagedOperand& operand : staged) operand.buffer = Tensor();
      if (run == StagedRun::kDone) {
        hooks->on_split(op, chunks);
        return true;
      }
      if (run == StagedRun::kStageMore || chunks == size) return false;
    }
    return false;
  };
  // An op whose chunks run in passes has not run over chunks yet: first with nothing staged.
  if (op.chunk_passes > 0 && run_with_staged()) return true;
  for (StagedOperand& candidate : candidates) {
    // An input's bytes go to host; an output not read as an input has none yet.
    if (!hooks->stage_on_host(*candidate.storage, candidate.read)) continue;
    staged.push_back(candidate);
    if (run_with_staged()) return true;
  }
  return false;
}

// Runs the kernel for the outputs' device. When it runs out of memory and the memory layer
// allows it, runs it again in 2, 4, 8, ... chunks (up to the split dimension's size) along the
// op's SplitRule, writing into slices of the same outputs: the smallest count that fits wins.
// Only the last try (single rows, or the whole op when its inputs do not cut) tells the memory
// layer that no smaller split remains, so it evicts instead. When the operands themselves do not
// fit whole (or the op's chunks run in passes), it stages some of them on host instead
// (run_kernel_staged).
void run_kernel(const OpDef& op, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                const Attrs& attrs, bool replay) {
  Device device = outputs.empty() ? inputs.at(0).device() : outputs[0].device();
  static const Kernel simulated = [](KernelContext& context) { meta_executor()->run(context); };
  const Kernel& kernel =
      device.is_meta() && meta_executor() ? simulated : op.kernels[static_cast<int>(device.type)];
  TESSEL_CHECK(kernel != nullptr, op.name, ": no kernel for device ", device.str(),
               device.is_cuda() ? " (build with --config=cuda)" : "");
  const SplitRule* rule = split_rule(op, inputs, outputs, attrs);
  if (!rule || !cuttable(op, *rule, inputs, outputs, attrs)) {
    run_kernel_once(op, kernel, inputs, outputs, attrs, replay, KernelInProgress{&op, 1, false});
    return;
  }
  const int64_t size = split_size(*rule, inputs, outputs);
  const bool independent_chunks = op.chunk_passes == 0;
  try {
    run_kernel_once(op, kernel, inputs, outputs, attrs, replay,
                    KernelInProgress{&op, 1, independent_chunks});
    return;
  } catch (const OperandsOutOfMemory&) {
    if (run_kernel_staged(op, kernel, *rule, inputs, outputs, attrs, replay)) return;
    throw;
  } catch (const OutOfMemory&) {
    if (!independent_chunks) {
      if (run_kernel_staged(op, kernel, *rule, inputs, outputs, attrs, replay)) return;
      throw;
    }
  }
  for (int64_t chunks = 2;; chunks = std::min(chunks * 2, size)) {
    const bool last = chunks == size;
    bool cut = false;
    try {
      cut = run_kernel_chunked(op, kernel, *rule, inputs, outputs, attrs, replay, chunks, !last);
    } catch (const OperandsOutOfMemory&) {
      if (run_kernel_staged(op, kernel, *rule, inputs, outputs, attrs, replay)) return;
      throw;
    } catch (const OutOfMemory&) {
      if (last) throw;
      continue;
    }
    if (!cut) break;  // this count does not cut the inputs: fall back to the whole op
    if (ResidencyHooks* hooks = residency_hooks()) hooks->on_split(op, chunks);
    return;
  }
  run_kernel_once(op, kernel, inputs, outputs, attrs, replay, KernelInProgress{&op, 1, false});
}

TraceHook& trace_hook() {
  static TraceHook hook;
  return hook;
}

std::mutex meta_executor_mutex;
std::shared_ptr<MetaExecutor> installed_meta_executor;
std::atomic<MetaExecutor*> current_meta_executor{nullptr};
}  // namespace

std::shared_ptr<MetaExecutor> set_meta_executor(std::shared_ptr<MetaExecutor> executor) {
  std::lock_guard<std::mutex> lock(meta_executor_mutex);
  std::swap(installed_meta_executor, executor);
  current_meta_executor.store(installed_meta_executor.get());
  return executor;
}

MetaExecutor* meta_executor() { return current_meta_executor.load(std::memory_order_acquire); }

const KernelInProgress* kernel_in_progress() { return current_kernel; }

int kernels_running() { return running_kernels.load(); }

DispatchInterceptor* set_dispatch_interceptor(DispatchInterceptor* interceptor) {
  std::swap(current_interceptor, interceptor);
  return interceptor;
}

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
    const RecordedTensor& input = call.inputs[i];
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
  ResidentInputsHeld held(inputs);
  for (size_t k = 0; k < call.outputs.size(); ++k) {
    const RecordedTensor& geometry = call.outputs[k];
    auto storage = call.output_storages[k].lock();
    if (storage && storage->state() == Residency::kEvicted) {
      held.allocate([&] { storage->allocate_bytes(); });
      outputs.emplace_back(make_tensor_impl(storage, geometry.sizes, geometry.strides,
                                            geometry.offset, geometry.dtype));
    } else {
      // Resident or gone: computed again into scratch so the kernel sees every output.
      Device device = inputs.empty() ? Device::cpu() : inputs[0].device();
      outputs.push_back(held.allocate(
          [&] { return empty(geometry.sizes, TensorOptions(geometry.dtype).device(device)); }));
    }
  }
  run_kernel(op, inputs, outputs, call.attrs, /*replay=*/true);
}

namespace {
// A kernel that ran out of memory part-way can run again from the start: it writes every output
// whole and changes nothing else.
bool rerunnable(const OpDef& op) {
  return op.flags.pure && !op.flags.side_effects && op.mutated_inputs.empty();
}

// The second try of an op that ran out of memory under a memory policy: outputs not yet written
// hold nothing, so their room goes back; the memory layer makes one hole for the inputs that are
// not resident and the outputs (ResidencyHooks::gather), the inputs come in first (pinned), and
// the outputs are allocated after them. A swapped-in input and an empty output each stuck in the
// middle of the free memory can otherwise leave no hole for the other.
void run_kernel_inputs_first(const OpDef& op, const std::vector<Tensor>& inputs,
                             std::vector<Tensor>& outputs, const Attrs& attrs) {
  std::vector<StorageImpl*> released;
  std::vector<size_t> output_bytes;
  for (const Tensor& output : outputs) {
    StorageImpl* storage = output.storage().get();
    if (std::find(released.begin(), released.end(), storage) != released.end()) continue;
    storage->release_bytes(Residency::kEvicted);
    released.push_back(storage);
    output_bytes.push_back(storage->nbytes());
  }
  std::vector<StorageImpl*> input_storages;
  for (const Tensor& input : inputs)
    if (input.defined()) input_storages.push_back(input.storage().get());
  residency_hooks()->gather(input_storages, output_bytes);
  std::vector<StorageAccess> resident_inputs;
  resident_inputs.reserve(inputs.size());
  for (const Tensor& input : inputs)
    if (input.defined()) resident_inputs.emplace_back(*input.storage());
  for (StorageImpl* storage : released) storage->allocate_bytes();
  run_kernel(op, inputs, outputs, attrs, /*replay=*/false);
}

// Names the op that ran out of memory and its inputs, then adds what the memory layer knows
// (policy, candidates, top holders) to the report. A report already explained by an op further in
// (a recompute inside this one) is passed on as it is.
[[noreturn]] void rethrow_explained(const OpDef& op, const std::vector<Tensor>& inputs,
                                    const OutOfMemory& error) {
  static const std::string kOpLine = "\n  while running: ";
  if (error.message().find(kOpLine) != std::string::npos) throw error;
  std::ostringstream message;
  const std::string& text = error.message();
  const size_t first_line = text.find('\n');
  message << text.substr(0, first_line) << kOpLine << op.name
          << (in_backward_pass() ? " (in backward)" : "") << ", inputs";
  bool any = false;
  for (const Tensor& input : inputs) {
    if (!input.defined()) continue;
    message << (any ? ", " : " ") << shape_str(input.sizes());
    any = true;
  }
  if (!any) message << " none";
  if (first_line != std::string::npos) message << text.substr(first_line);
  ResidencyHooks* hooks = residency_hooks();
  if (!hooks) throw OutOfMemory(message.str(), error.file(), error.line());
  throw OutOfMemory(hooks->explain_out_of_memory(message.str()), error.file(), error.line());
}

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

// Outputs live on the inputs' device, except for the device transfer, whose "device" attribute
// names where its output goes.
Device output_device(const OpDef& op, const Device& device, const Attrs& attrs) {
  if (!op.flags.device_transfer) return device;
  return Device::parse(attrs.get<std::string>("device"));
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

// Under autocast (core/autocast.h): `inputs` with the casts the op's policy asks for, through the
// differentiable to_dtype op; false when nothing needs a cast.
bool autocast_inputs(const OpDef& op, const std::vector<Tensor>& inputs,
                     std::vector<Tensor>& cast) {
  const AutocastPolicy policy = autocast_policy(op);
  if (policy == AutocastPolicy::kKeep) return false;
  const DType lower = *autocast_dtype();
  bool changed = false;
  cast = inputs;
  for (auto& input : cast) {
    if (!input.defined()) continue;
    const DType dtype = input.dtype();
    DType target = dtype;
    if (policy == AutocastPolicy::kLowerPrecision && dtype == DType::kFloat32) target = lower;
    if (policy == AutocastPolicy::kWiden && (dtype == DType::kBFloat16 || dtype == DType::kFloat16))
      target = DType::kFloat32;
    if (target == dtype) continue;
    input = dispatch(ops::to_dtype, {input}, Attrs{{"dtype", std::string(dtype_name(target))}})[0];
    changed = true;
  }
  return changed;
}

}  // namespace

std::vector<Tensor> dispatch(const OpDef& op, const std::vector<Tensor>& inputs, Attrs attrs,
                             const std::vector<Tensor>& out) {
  TESSEL_CHECK(op.registered, "op '", op.name,
               "' is not registered (is the library that registers it linked with alwayslink?)");
  if (current_interceptor && !intercepting) {
    intercepting = true;
    struct Reset {
      ~Reset() { intercepting = false; }
    } reset;
    return current_interceptor->dispatch(op, inputs, attrs, out);
  }
  if (out.empty() && autocast_dtype()) {
    std::vector<Tensor> cast;
    if (autocast_inputs(op, inputs, cast)) return dispatch(op, cast, std::move(attrs), out);
  }
  Device device = common_device(op, inputs, attrs);
  const Device out_device = output_device(op, device, attrs);
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
      try {
        outputs.reserve(specs.size());
        ResidentInputsHeld held(inputs);
        for (auto& spec : specs) {
          const TensorOptions options = TensorOptions(spec.dtype).device(out_device);
          // The sizes are moved where no second try can need them.
          outputs.push_back(held.holding()
                                ? held.allocate([&] { return empty(spec.sizes, options); })
                                : empty(std::move(spec.sizes), options));
        }
      } catch (const OutOfMemory& error) {
        rethrow_explained(op, inputs, error);
      }
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
        TESSEL_CHECK(out[k].device() == out_device, op.name, ": out= tensor ", k, " is on ",
                     out[k].device().str(), " but the result goes to ", out_device.str());
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
    MetaExecutor* simulator = device.is_meta() ? meta_executor() : nullptr;
    if (!device.is_meta() || simulator) {
      ResidencyHooks* hooks = residency_hooks();
      if (hooks) {
        for (const auto& written : out) hooks->before_write(*written.storage());
        for (int i : op.mutated_inputs)
          if (inputs.at(i).defined()) hooks->before_write(*inputs[i].storage());
      }
      // Ops the memory layer records carry their time (measured, or the simulator's); no clock
      // is read for the others.
      const bool recorded = hooks && out.empty() && (op.flags.pure || op.flags.random);
      const auto start = recorded && !simulator ? std::chrono::steady_clock::now()
                                                : std::chrono::steady_clock::time_point();
      try {
        run_kernel(op, inputs, outputs, attrs, /*replay=*/false);
      } catch (const OutOfMemory& error) {
        if (!hooks || !out.empty() || !rerunnable(op)) rethrow_explained(op, inputs, error);
        try {
          run_kernel_inputs_first(op, inputs, outputs, attrs);
        } catch (const OutOfMemory& second) {
          rethrow_explained(op, inputs, second);
        }
      }
      for (const auto& written : out) written.storage()->bump_version();
      for (int i : op.mutated_inputs)
        if (inputs.at(i).defined()) inputs[i].storage()->bump_version();
      if (recorded) {
        const double seconds =
            simulator
                ? simulator->seconds(op, inputs, outputs, attrs)
                : std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        hooks->on_op_recorded(make_op_call(op, inputs, outputs, attrs), seconds);
      }
    }
  }
  if (record) record_autograd(op, inputs, outputs, attrs);
  if (const TraceHook& hook = trace_hook()) hook(op, inputs, outputs, attrs);
  return outputs;
}

}  // namespace tessel
