// The op registry and dispatcher. Every op is registered once (kind, autocast policy, planner
// traits, shape rule, kernel per device, backward, cost, splittable dimensions, flags) and every
// call goes through `dispatch`, which is where autograd recording, op records for the memory layer
// and meta-device tracing attach.
// Code names an op only through its handle (OpHandle below), declared in its family's header:
//   Tensor out = dispatch(ops::add, {a, b}, Attrs{{"alpha", 1.0}})[0];  // ops/elementwise.h
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/attrs.h"
#include "core/tensor.h"

namespace tessel {

struct OpDef;

struct OutputSpec {
  Shape sizes;
  DType dtype;
};

// The one output of an op's shape rule, its shape moved in (a braced list would copy it).
inline std::vector<OutputSpec> one_output(Shape sizes, DType dtype) {
  std::vector<OutputSpec> specs;
  specs.reserve(1);
  specs.push_back({std::move(sizes), dtype});
  return specs;
}

struct OpCost {
  double flops = 0;  // floating-point operations
  double bytes = 0;  // bytes read plus written
};

// What a kernel sees. Inputs are pinned and resident; outputs are allocated (possibly strided
// views into a larger tensor) and must be fully written.
// Where a kernel of an op with OpDef::chunk_passes is in its run over chunks: its inputs and
// outputs are the chunk [begin, end) of `size` along the split (outputs without that dimension
// whole), and `state` is kept from call to call (empty at the first).
struct ChunkPass {
  int pass = 0;
  int passes = 1;
  int64_t begin = 0, end = 0, size = 0;
  std::vector<double>* state = nullptr;
  // The final pass writes the outputs; earlier ones only read (and add to the state).
  bool last_pass() const { return pass + 1 == passes; }
};

struct KernelContext {
  const OpDef& op;
  const std::vector<Tensor>& inputs;
  std::vector<Tensor>& outputs;
  const Attrs& attrs;
  bool replay;  // recomputation from an op record: skip side effects (running statistics)
  // Scratch memory from the device allocator (counted, budgeted), freed with the context.
  Tensor workspace(const Shape& sizes, DType dtype);
  std::vector<Tensor> workspaces;
  std::vector<StorageAccess> workspace_access;
  const ChunkPass* chunk = nullptr;  // null: the whole op in one call
};

// What a backward function sees; it returns one gradient per input (undefined: none).
struct BackwardContext {
  const std::vector<Tensor>& grad_outputs;     // undefined where an output got no gradient
  const std::vector<Tensor>& saved_inputs;     // undefined unless listed in OpDef::save_inputs
  const std::vector<Tensor>& saved_outputs;    // undefined unless listed in OpDef::save_outputs
  const std::vector<OutputSpec>& input_specs;  // shape and dtype of every input
  const std::vector<bool>& needs_input_grad;
  const Attrs& attrs;
  // grad_outputs[k] is held by nothing else (not by the caller, a hook, a leaf's .grad or a saved
  // tensor), so a backward may write its result into it: a gradient as large as the activation
  // then needs no new memory.
  const std::vector<bool>& reusable_grad_outputs;
  // saved_inputs[i] is held by nothing but this node, which lets it go after this backward: a
  // backward that reads it element by element may write its result over it (batch norm's input
  // gradient over its input, where the incoming gradient is shared with a residual branch).
  const std::vector<bool>& reusable_saved_inputs;
  // {grad_outputs[k]} as the out= tensors of an op whose one output has `output`'s shape and
  // dtype, when that gradient may be overwritten (dense, whole storage); {} otherwise.
  std::vector<Tensor> reusable_grad(size_t k, const OutputSpec& output) const;
  // The same for saved_inputs[i].
  std::vector<Tensor> reusable_saved_input(size_t i, const OutputSpec& output) const;
};

using ShapeRule =
    std::function<std::vector<OutputSpec>(const std::vector<Tensor>& inputs, const Attrs& attrs)>;
using Kernel = std::function<void(KernelContext& context)>;
using BackwardFn = std::function<std::vector<Tensor>(const BackwardContext& context)>;
using CostFn = std::function<OpCost(const std::vector<Tensor>& inputs,
                                    const std::vector<Tensor>& outputs, const Attrs& attrs)>;
// For view ops: the output geometry over the input's storage, no kernel.
using ViewFn = std::function<Tensor(const Tensor& input, const Attrs& attrs)>;

// A dimension along which the op may run in chunks: output dim `output_dim`, and for every
// input the dim split alongside it (-1: each chunk reads the whole input). output_dim -1 (with
// OpDef::chunk_passes): the outputs are sums over the chunks of the inputs.
struct SplitRule {
  int output_dim;
  std::vector<int> input_dims;
  // Whether the rule holds for a call (empty: always), e.g. softmax over another dimension.
  std::function<bool(const std::vector<Tensor>& inputs, const Attrs& attrs)> holds;
  // Outputs never cut (per-channel statistics of an op with chunk passes), whatever their sizes.
  std::vector<int> whole_outputs;
};

// What an op computes, coarsely. The planner prices ops by it (parallel/planner/strategies.cc);
// every registered op declares one (tests/planner/op_contract_test.cc).
enum class OpKind {
  kUnspecified,    // not declared: a registration error
  kGemm,           // matrix products: matmul, bmm, linear
  kConv,           // convolutions and their gradients
  kPointwise,      // element-wise arithmetic, comparisons, selection, masks
  kActivation,     // element-wise transcendental functions (exp, tanh, gelu, pow): priced apart
  kReduction,      // sums, means, extrema, variance, softmax
  kNorm,           // batch and layer normalisation
  kPool,           // pooling windows
  kLoss,           // losses and their gradients
  kDataMovement,   // views, copies, casts, joins, device transfers
  kIndexing,       // embedding lookups, gathers and their scatter-add gradients
  kFactory,        // constants, ranges and random numbers
  kOptimizer,      // fused parameter updates
  kCommunication,  // tensor-parallel collectives
};
inline constexpr OpKind kAllOpKinds[] = {
    OpKind::kGemm,         OpKind::kConv,     OpKind::kPointwise, OpKind::kActivation,
    OpKind::kReduction,    OpKind::kNorm,     OpKind::kPool,      OpKind::kLoss,
    OpKind::kDataMovement, OpKind::kIndexing, OpKind::kFactory,   OpKind::kOptimizer,
    OpKind::kCommunication};
const char* op_kind_name(OpKind kind);  // "gemm", "pointwise", ...; "unspecified"

// What autocast (core/autocast.h) does to the floating inputs of an op.
enum class AutocastPolicy {
  kUnspecified,     // not declared: a registration error
  kKeep,            // views and casts: inputs pass through unchanged
  kLowerPrecision,  // products and convolutions: f32 inputs cast to the autocast dtype
  kWiden,           // everything else: 16-bit float inputs cast to f32
};

// How the planner may cut an op across a tensor-parallel group (parallel/planner/strategies.cc).
enum class ParallelSplit {
  kNone,                // kept whole on every device of the group
  kPointwise,           // any dim but the batch, alongside full-size operands
  kLinearWeight,        // the (out, in) weight: by output features (column) or input (row)
  kBatchedHeads,        // a batched product along its batch of attention heads
  kConvChannels,        // output channels (column), input channels (row) or whole groups
  kEmbeddingTable,      // the (vocab, hidden) table: by rows (vocab) or columns
  kLossClasses,         // the classes of the log-probabilities: one all-reduce of target values
  kSoftmaxLossClasses,  // the classes of the logits: all-reduces of maxima, sums and targets
  kSoftmaxHeads,        // attention scores along their heads, never the normalised dim
  kChannels,            // dim 1 (channels), per-channel parameters along dim 0
  kSpatialReduction,    // reductions over spatial dims keep the channels (dim 1)
  kConcat,              // joins along dim 1 (channels)
};

// How the planner splits and prices an op.
struct PlannerTraits {
  ParallelSplit split = ParallelSplit::kNone;
  // The device profile's measured rate that prices it (DeviceProfile::op_kinds); null: the
  // kind's ("gemm", "conv", "activation", otherwise "elementwise").
  const char* rate = nullptr;
};

struct OpFlags {
  bool pure = true;           // same inputs and attributes give the same outputs
  bool random = false;        // consumes the RNG; the dispatcher records seed and offset in attrs
  bool side_effects = false;  // writes some inputs (listed in mutated_inputs) besides its outputs
  bool view = false;          // output aliases input 0's storage (view_fn, no kernel)
  bool device_transfer = false;  // the output goes to the device its "device" attribute names
};

struct OpDef {
  std::string name;
  OpKind kind = OpKind::kUnspecified;
  AutocastPolicy autocast = AutocastPolicy::kUnspecified;
  PlannerTraits planner;
  ShapeRule shape;
  std::array<Kernel, kNumDeviceTypes> kernels;
  BackwardFn backward;  // empty: not differentiable
  std::vector<int> save_inputs;
  std::vector<int> save_outputs;
  CostFn cost;
  std::vector<SplitRule> splits;
  // Chunks that are not independent (batch statistics): the memory layer may still run the op
  // over chunks of its first SplitRule, calling its kernel for every chunk in this many passes
  // (KernelContext::chunk says which); the kernel then keeps its running sums in the chunk state
  // and applies any side effect once. 0: chunks are independent (one call each).
  int chunk_passes = 0;
  OpFlags flags;
  std::vector<int> mutated_inputs;
  ViewFn view_fn;
  // Random ops: how many Philox counters (4 numbers each) a call consumes.
  std::function<uint64_t(const std::vector<Tensor>& inputs, const Attrs& attrs)> rng_counters;
  bool registered = false;  // set by OpRegistry::define; a handle may name an op not linked in
};

// The one way code names an op: a handle defined once per op, in the header of the op's family
// (ops/conv.h: `inline const OpHandle conv2d{"conv2d"};`). Its OpDef is looked up on first use
// and cached, so a call costs one atomic load. The op's registration defines it through the
// handle and other backends attach kernels through it, in whichever order the static
// initialisers of their libraries run.
class OpHandle {
 public:
  explicit constexpr OpHandle(const char* name) : name_(name) {}
  OpHandle(const OpHandle&) = delete;
  OpHandle& operator=(const OpHandle&) = delete;

  const char* name() const { return name_; }
  OpDef& def() const;
  operator const OpDef&() const { return def(); }  // NOLINT: a handle stands for its op
  const OpDef* operator->() const { return &def(); }
  // Adds or replaces the op's kernel for one device type (the CUDA backend).
  void set_kernel(DeviceType device, Kernel kernel) const;

 private:
  const char* name_;
  mutable std::atomic<OpDef*> def_{nullptr};
};

class OpRegistry {
 public:
  static OpRegistry& get();
  // Registers the op `handle` names and returns its definition to fill in; throws if the op is
  // registered already.
  OpDef& define(const OpHandle& handle);
  // The definition of `name`, created unregistered when nothing named it before (OpHandle::def).
  OpDef& entry(const std::string& name);
  // Registered ops by name, for code that holds names (tests walking every op, tools).
  const OpDef& find(const std::string& name) const;  // throws naming the unknown op
  const OpDef* find_or_null(const std::string& name) const;
  std::vector<std::string> names() const;  // registered ops, in registration order

 private:
  mutable std::mutex mutex_;  // handles may resolve from several threads at once
  std::vector<std::unique_ptr<OpDef>> entries_;
  std::unordered_map<std::string, OpDef*> by_name_;
  std::vector<const OpDef*> registered_;  // in registration order
};

// A pure, replayable record of one op call: what the memory layer recomputes from.
struct RecordedTensor {
  std::shared_ptr<StorageImpl> storage;
  Shape sizes, strides;
  int64_t offset = 0;
  DType dtype = DType::kFloat32;
  uint64_t version = 0;
  Tensor materialize() const;  // a Tensor over the same bytes (adds a user reference)
};
struct OpCall {
  const OpDef* op = nullptr;
  Attrs attrs;                         // random ops carry rng_seed and rng_offset here
  std::vector<RecordedTensor> inputs;  // holds op record references
  std::vector<std::weak_ptr<StorageImpl>> output_storages;
  std::vector<RecordedTensor> outputs;  // geometry of the outputs (storage left null)
  double cost_seconds = 0;
  ~OpCall();
};
std::shared_ptr<OpCall> make_op_call(const OpDef& op, const std::vector<Tensor>& inputs,
                                     const std::vector<Tensor>& outputs, const Attrs& attrs);
// Recomputes the outputs of `call` whose storage is evicted, into that storage, bitwise as the
// first time (inputs must be unmodified: their versions are checked). Side effects are skipped.
void replay_op_call(const OpCall& call);

// The kernel running on this thread, while it runs. `can_split_further`: when it runs out of
// memory the dispatcher would retry it in more chunks (the memory layer's split policy then
// prefers that to evicting).
struct KernelInProgress {
  const OpDef* op = nullptr;
  int64_t chunks = 1;
  bool can_split_further = false;
};
const KernelInProgress* kernel_in_progress();  // null outside kernels
// Kernels running now on any thread, counted while a memory layer is installed: while there are
// none, no code holds a raw address of a tensor, so the memory layer may move even pinned tensors
// (defragmentation). A memory layer is installed while no other thread runs ops.
int kernels_running();

// Runs ops on the meta device in place of kernels while one is installed (the memory
// simulator, memory/sim): meta storages then take (virtual) bytes from the allocator installed
// for meta, and the memory layer's hooks see every op as on a real device. Without one, ops on
// meta only compute shapes.
class MetaExecutor {
 public:
  virtual ~MetaExecutor() = default;
  // The op's modelled time in seconds (the cost the memory layer records for it).
  virtual double seconds(const OpDef& op, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& outputs, const Attrs& attrs) = 0;
  // Stands for the kernel: inputs are resident and pinned, outputs allocated.
  virtual void run(const KernelContext& context) = 0;
};
// Installs `executor` process-wide (nullptr removes it); returns the previous one.
std::shared_ptr<MetaExecutor> set_meta_executor(std::shared_ptr<MetaExecutor> executor);
MetaExecutor* meta_executor();

// Observes every op call (the planner traces shapes on the meta device with it).
using TraceHook = std::function<void(const OpDef& op, const std::vector<Tensor>& inputs,
                                     const std::vector<Tensor>& outputs, const Attrs& attrs)>;
TraceHook set_trace_hook(TraceHook hook);  // returns the previous hook

// Takes over the op calls made on this thread while installed (parallel/parallelize.h runs a
// model's ops on shards of its tensors this way). Calls it makes itself dispatch as usual.
class DispatchInterceptor {
 public:
  virtual ~DispatchInterceptor() = default;
  // Stands for dispatch(op, inputs, attrs, out): returns what that would.
  virtual std::vector<Tensor> dispatch(const OpDef& op, const std::vector<Tensor>& inputs,
                                       const Attrs& attrs, const std::vector<Tensor>& out) = 0;
};
// Installs `interceptor` for this thread (nullptr removes it); returns the previous one.
DispatchInterceptor* set_dispatch_interceptor(DispatchInterceptor* interceptor);

// Runs an op: checks devices, applies the shape rule, allocates outputs (or writes into `out`),
// runs the kernel for the inputs' device, records autograd and the op record.
// An op's inputs as dispatch takes them, each handle copied once (a braced list copies each
// twice, and every copy of a handle counts a reference): dispatch(op, inputs_of(a, b)).
template <typename... Inputs>
std::vector<Tensor> inputs_of(const Inputs&... inputs) {
  std::vector<Tensor> result;
  result.reserve(sizeof...(inputs));
  (result.push_back(inputs), ...);
  return result;
}

// An op's only output, moved out of dispatch's result: return first_output(dispatch(...));
inline Tensor first_output(std::vector<Tensor>&& outputs) { return std::move(outputs.at(0)); }

std::vector<Tensor> dispatch(const OpDef& op, const std::vector<Tensor>& inputs, Attrs attrs = {},
                             const std::vector<Tensor>& out = {});

}  // namespace tessel
