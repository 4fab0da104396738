#include "parallel/ddp.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <unordered_set>

#include "core/autograd.h"
#include "core/shape.h"
#include "ops/ops.h"
#include "ops/transfer.h"

namespace tessel::parallel {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Runs `collective` on one flat tensor per dtype holding `tensors`, then copies the result back
// into them.
void coalesced(const std::vector<Tensor>& tensors, const std::function<void(Tensor&)>& collective) {
  NoGradGuard no_grad;
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (const auto& tensor : tensors) by_dtype[tensor.dtype()].push_back(tensor);
  for (auto& [dtype, group_tensors] : by_dtype) {
    std::vector<Tensor> flat_parts;
    for (const auto& tensor : group_tensors) flat_parts.push_back(tensor.reshape({-1}));
    Tensor flat = cat(flat_parts, 0);
    collective(flat);
    int64_t offset = 0;
    for (auto& tensor : group_tensors) {
      int64_t count = tensor.numel();
      tensor.copy_(flat.narrow(0, offset, count).view(tensor.sizes()));
      offset += count;
    }
  }
}

// Copies root's values of `tensors` to every rank, one broadcast per dtype.
void broadcast_coalesced(Communicator& group, const std::vector<Tensor>& tensors, int root) {
  coalesced(tensors, [&](Tensor& flat) { group.broadcast(flat, root); });
}

// A fingerprint of the parameters' and buffers' shapes and dtypes (FNV-1a).
int64_t module_fingerprint(const nn::Module& module) {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](int64_t value) {
    hash ^= static_cast<uint64_t>(value);
    hash *= 1099511628211ull;
  };
  for (const auto& list : {module.parameters(), module.buffers()}) {
    mix(static_cast<int64_t>(list.size()));
    for (const auto& tensor : list) {
      mix(tensor.dim());
      for (int64_t size : tensor.sizes()) mix(size);
      mix(static_cast<int64_t>(tensor.dtype()));
    }
  }
  return static_cast<int64_t>(hash >> 1);
}

int64_t numel_of(const std::vector<Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& tensor : tensors) total += tensor.numel();
  return total;
}

}  // namespace

struct DistributedDataParallel::Reducer {
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket's buffer
  };
  struct Bucket {
    GradBucket info;
    Tensor buffer;  // (elements,) of info.dtype: the gradients, then their average
    int pending = 0;
    std::shared_ptr<Work> work;
  };

  std::shared_ptr<Communicator> group;
  bool find_unused = false;
  std::vector<Tensor> parameters;  // module->parameters(), registration order
  std::vector<std::string> names;
  std::vector<bool> trainable;  // requires_grad at construction
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::vector<GradBucket> bucket_infos;

  std::weak_ptr<Reducer> self;  // for the end-of-backward callback

  // The current step.
  bool active = false;         // a step has begun (prepared, or a first gradient arrived)
  bool finish_queued = false;  // finish_backward waits for the end of the running backward
  std::vector<char> ready;
  std::vector<char> marked_unused;  // by the graph walk
  size_t next_to_launch = 0;
  Tensor used_flags;  // u8 per parameter, max over ranks: used anywhere
  std::shared_ptr<Work> used_work;
  std::string failure;

  Tensor slot_view(size_t index) const {
    const Slot& slot = slots[index];
    const Tensor& parameter = parameters[index];
    return buckets[slot.bucket]
        .buffer.narrow(0, slot.offset, parameter.numel())
        .view(parameter.sizes());
  }

  void begin_step() {
    active = true;
    finish_queued = false;
    ready.assign(parameters.size(), 0);
    marked_unused.assign(parameters.size(), 0);
    for (auto& bucket : buckets) {
      bucket.pending = static_cast<int>(bucket.info.parameters.size());
      bucket.work.reset();
    }
    next_to_launch = 0;
    used_work.reset();
    // Parameters frozen after construction never get a gradient: count them as ready now.
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (trainable[i] && !parameters[i].requires_grad()) {
        NoGradGuard no_grad;
        slot_view(i).zero_();
        mark_ready(i);
      }
    }
  }

  std::vector<std::string> parameters_without_gradient() const {
    std::vector<std::string> missing;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (trainable[i] && !ready[i]) missing.push_back(names[i]);
    }
    return missing;
  }

  // `what` says when the unfinished step was noticed, e.g. "forward was called before the
  // previous step's gradient reduction finished".
  [[noreturn]] void fail_unfinished(const char* what) {
    auto missing = parameters_without_gradient();
    std::string listed;
    for (size_t i = 0; i < missing.size() && i < 10; ++i) listed += (i ? ", " : "") + missing[i];
    if (missing.size() > 10) listed += ", ... (" + std::to_string(missing.size()) + " in all)";
    failure = detail::str_cat(
        "DistributedDataParallel: ", what, "; these parameters received no gradient: ", listed,
        ". If some parameters do not take part in every forward pass, construct with "
        "DDPOptions().find_unused_parameters(true); otherwise make every parameter contribute "
        "to the loss, and call backward once after each forward");
    TESSEL_FAIL(failure);
  }

  void check_usable() const {
    TESSEL_CHECK(failure.empty(),
                 "DistributedDataParallel is unusable after an earlier error: ", failure);
  }

  void mark_ready(size_t index) {
    ready[index] = 1;
    Bucket& bucket = buckets[slots[index].bucket];
    if (--bucket.pending == 0) launch_ready_buckets();
  }

  // Buckets start strictly in index order, so every rank issues the same collectives in the same
  // order whatever order its gradients arrive in.
  void launch_ready_buckets() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
      Bucket& bucket = buckets[next_to_launch];
      bucket.work = group->all_reduce_async(bucket.buffer, ReduceOp::kMean);
      ++next_to_launch;
    }
  }

  void on_gradient(size_t index) {
    check_usable();
    if (!active) {
      if (find_unused) {
        failure =
            "DistributedDataParallel: with find_unused_parameters, run the forward pass through "
            "ddp.forward() or call ddp.prepare_for_backward(outputs) before backward";
        TESSEL_FAIL(failure);
      }
      begin_step();
    }
    // The engine calls finish_backward once the whole pass is through, so no caller has to.
    if (!finish_queued && in_backward_pass()) {
      finish_queued = true;
      std::weak_ptr<Reducer> weak = self;
      queue_backward_callback([weak] {
        if (auto alive = weak.lock()) alive->finish_backward();
      });
    }
    if (ready[index]) {
      if (marked_unused[index]) {
        failure = detail::str_cat(
            "DistributedDataParallel: parameter ", names[index],
            " received a gradient although it is not reachable from the outputs given to "
            "prepare_for_backward; pass every output the loss is computed from");
        TESSEL_FAIL(failure);
      }
      fail_unfinished(
          "a new backward pass started before the previous step's gradient reduction finished");
    }
    const Tensor& parameter = parameters[index];
    Tensor grad = parameter.grad();
    {
      NoGradGuard no_grad;
      Tensor slot = slot_view(index);
      if (grad.defined()) {
        slot.copy_(grad);
      } else {
        slot.zero_();
      }
    }
    mark_ready(index);
    // MPI progresses only inside MPI calls: nudge the buckets already in flight.
    for (size_t b = 0; b < next_to_launch; ++b) buckets[b].work->poll();
    if (next_to_launch == buckets.size()) finish_step();
  }

  void prepare(const std::vector<Tensor>& outputs) {
    check_usable();
    if (active) {
      fail_unfinished(
          "prepare_for_backward was called before the previous step's gradient reduction "
          "finished");
    }
    bool needs_backward = GradMode::is_enabled() &&
                          std::any_of(outputs.begin(), outputs.end(), [](const Tensor& output) {
                            return output.defined() && output.requires_grad();
                          });
    if (!needs_backward) return;
    begin_step();
    if (find_unused) mark_unused_parameters(outputs);
    // Everything may be ready already (all parameters frozen or unused).
    if (next_to_launch == buckets.size()) finish_step();
  }

  void mark_unused_parameters(const std::vector<Tensor>& outputs) {
    // Walk the graph from the outputs; a parameter is used when its accumulator is reached.
    std::unordered_set<const Node*> reached;
    std::vector<std::shared_ptr<Node>> stack;
    for (const auto& output : outputs) {
      if (!output.defined() || !output.requires_grad()) continue;
      stack.push_back(gradient_edge(output).node);
    }
    while (!stack.empty()) {
      std::shared_ptr<Node> node = std::move(stack.back());
      stack.pop_back();
      if (!node || !reached.insert(node.get()).second) continue;
      for (const auto& edge : node->next_edges) {
        if (edge.node && !reached.count(edge.node.get())) stack.push_back(edge.node);
      }
    }
    std::vector<uint8_t> used(parameters.size(), 0);
    for (size_t i = 0; i < parameters.size(); ++i) {
      auto accumulator = parameters[i].impl()->grad_accumulator.lock();
      used[i] = accumulator && reached.count(accumulator.get()) ? 1 : 0;
    }
    // Which parameters some rank used; it is started before any bucket so every rank issues the
    // same collectives in the same order.
    used_flags =
        to_device(from_vector<uint8_t>(used, {static_cast<int64_t>(used.size())}), group->device());
    used_work = group->all_reduce_async(used_flags, ReduceOp::kMax);
    NoGradGuard no_grad;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (used[i] || ready[i] || !trainable[i]) continue;
      marked_unused[i] = 1;
      slot_view(i).zero_();
      mark_ready(i);
    }
  }

  // At the end of a backward pass that produced gradients: every bucket must have started by
  // now, so a parameter without a gradient is an error here rather than at the next step.
  void finish_backward() {
    finish_queued = false;
    if (failure.empty() && active && next_to_launch != buckets.size())
      fail_unfinished("backward ended before this step's gradient reduction finished");
    finish_step();
  }

  void finish_step() {
    check_usable();
    if (!active) return;
    if (next_to_launch != buckets.size()) {
      fail_unfinished("finalize() found this step's gradient reduction unfinished");
    }
    std::vector<uint8_t> used_anywhere;
    if (used_work) {
      used_work->wait();
      used_anywhere = used_flags.to_vector<uint8_t>();
    }
    for (auto& bucket : buckets) bucket.work->wait();
    NoGradGuard no_grad;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (!trainable[i] || !parameters[i].requires_grad()) continue;
      if (!used_anywhere.empty() && !used_anywhere[i]) continue;  // stays undefined everywhere
      Tensor averaged = slot_view(i);
      Tensor grad = parameters[i].grad();
      if (grad.defined()) {
        grad.copy_(averaged);
      } else {
        parameters[i].set_grad(clone(averaged));
      }
    }
    for (auto& bucket : buckets) bucket.work.reset();
    used_work.reset();
    active = false;
  }
};

void check_same_module(Communicator& group, const nn::Module& module, const char* who) {
  const Device device = group.device();
  std::vector<Tensor> parameters = module.parameters();
  std::vector<Tensor> buffers = module.buffers();
  // Compare with rank 0's fingerprint first, so a mismatch is an error on every rank rather than
  // a broadcast of the wrong sizes.
  std::vector<int64_t> local = {static_cast<int64_t>(parameters.size()), numel_of(parameters),
                                static_cast<int64_t>(buffers.size()), numel_of(buffers),
                                module_fingerprint(module)};
  Tensor reference =
      to_device(from_vector<int64_t>(local, {static_cast<int64_t>(local.size())}), device);
  group.broadcast(reference, 0);
  auto expected = reference.to_vector<int64_t>();
  Tensor mismatch = to_device(from_vector<int32_t>({expected == local ? 0 : 1}, {1}), device);
  group.all_reduce(mismatch, ReduceOp::kMax);
  if (mismatch.item<int32_t>() != 0) {
    TESSEL_FAIL(
        who, ": the module differs between ranks (rank 0: ", expected[0], " parameters with ",
        expected[1], " elements, ", expected[2], " buffers with ", expected[3], " elements; rank ",
        group.rank(), ": ", local[0], ", ", local[1], ", ", local[2], ", ", local[3],
        expected == local ? ", the same as rank 0, so another rank differs"
                          : (expected[4] != local[4] ? ", or shapes and dtypes differ" : ""),
        "). Build the same model on every rank");
  }
}

void start_from_rank0(Communicator& group, nn::Module& module, const char* who,
                      const std::set<std::string>& own) {
  check_same_module(group, module, who);
  std::vector<Tensor> state;
  for (const auto& named : {module.named_parameters(), module.named_buffers()})
    for (const auto& [name, tensor] : named)
      if (!own.count(name)) state.push_back(tensor);
  broadcast_coalesced(group, state, 0);
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<Communicator> process_group,
                                                 DDPOptions options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options),
      reducer_(std::make_shared<Reducer>()) {
  TESSEL_CHECK(module_ != nullptr, "DistributedDataParallel: module is null");
  TESSEL_CHECK(process_group_ != nullptr, "DistributedDataParallel: process_group is null");
  TESSEL_CHECK(std::isfinite(options.bucket_cap_mb()) && options.bucket_cap_mb() > 0,
               "DistributedDataParallel: bucket_cap_mb must be positive, got ",
               options.bucket_cap_mb());
  TESSEL_CHECK(std::isfinite(options.first_bucket_mb()) && options.first_bucket_mb() > 0,
               "DistributedDataParallel: first_bucket_mb must be positive, got ",
               options.first_bucket_mb());
  Communicator& group = *process_group_;
  Reducer& reducer = *reducer_;
  reducer.group = process_group_;
  reducer.find_unused = options.find_unused_parameters();

  // Buckets, broadcasts and the checks below all run on the communicator's device.
  const Device device = group.device();
  auto named = module_->named_parameters();
  for (auto& [name, parameter] : named) {
    TESSEL_CHECK(parameter.device().is_cpu() || parameter.device().is_cuda(),
                 "DistributedDataParallel: parameter ", name, " is on ", parameter.device().str(),
                 "; move the module to a real device first");
    TESSEL_CHECK(parameter.device() == device, "DistributedDataParallel: parameter ", name,
                 " is on ", parameter.device().str(), " but communicator '", group.name(),
                 "' moves tensors on ", device.str(),
                 " (MPI: cpu; for a GPU use make_device_communicator, which gives NCCL)");
    reducer.names.push_back(name);
    reducer.parameters.push_back(parameter);
    reducer.trainable.push_back(parameter.requires_grad());
  }

  for (const auto& [name, buffer] : module_->named_buffers()) {
    TESSEL_CHECK(buffer.device() == device, "DistributedDataParallel: buffer ", name, " is on ",
                 buffer.device().str(), " but communicator '", group.name(), "' moves tensors on ",
                 device.str(), "; move the whole module there");
  }
  start_from_rank0(group, *module_, "DistributedDataParallel");

  // Buckets: trainable parameters in reverse registration order (the order backward produces
  // their gradients), one open bucket per dtype, closed when the next gradient would overflow.
  int64_t first_cap = static_cast<int64_t>(options.first_bucket_mb() * kMiB);
  int64_t cap = static_cast<int64_t>(options.bucket_cap_mb() * kMiB);
  std::map<DType, GradBucket> open;
  std::map<DType, int> closed_count;
  std::vector<GradBucket> finished;
  auto close = [&](DType dtype) {
    auto it = open.find(dtype);
    if (it == open.end()) return;
    finished.push_back(std::move(it->second));
    open.erase(it);
    ++closed_count[dtype];
  };
  for (size_t k = reducer.parameters.size(); k-- > 0;) {
    if (!reducer.trainable[k]) continue;
    const Tensor& parameter = reducer.parameters[k];
    DType dtype = parameter.dtype();
    int64_t bytes = static_cast<int64_t>(parameter.nbytes());
    auto it = open.find(dtype);
    if (it != open.end() && it->second.bytes + bytes > it->second.capacity) {
      close(dtype);
      it = open.end();
    }
    if (it == open.end()) {
      GradBucket bucket;
      bucket.dtype = dtype;
      bucket.capacity = closed_count[dtype] == 0 ? first_cap : cap;
      it = open.emplace(dtype, std::move(bucket)).first;
    }
    it->second.parameters.push_back(k);
    it->second.names.push_back(reducer.names[k]);
    it->second.bytes += bytes;
  }
  while (!open.empty()) close(open.begin()->first);
  // Launch order follows backward: by the position of each bucket's first gradient.
  auto position = [&](const GradBucket& bucket) {
    return reducer.parameters.size() - bucket.parameters.front();
  };
  std::stable_sort(finished.begin(), finished.end(), [&](const GradBucket& a, const GradBucket& b) {
    return position(a) < position(b);
  });

  reducer.slots.resize(reducer.parameters.size());
  for (size_t b = 0; b < finished.size(); ++b) {
    Reducer::Bucket bucket;
    bucket.info = finished[b];
    int64_t elements = 0;
    for (size_t index : bucket.info.parameters) {
      reducer.slots[index] = {b, elements};
      elements += reducer.parameters[index].numel();
    }
    bucket.buffer =
        zeros({elements}, TensorOptions(bucket.info.dtype)
                              .device(reducer.parameters[bucket.info.parameters[0]].device()));
    reducer.buckets.push_back(std::move(bucket));
    reducer.bucket_infos.push_back(finished[b]);
  }

  std::weak_ptr<Reducer> weak = reducer_;
  reducer.self = weak;
  for (size_t i = 0; i < reducer.parameters.size(); ++i) {
    if (!reducer.trainable[i]) continue;
    reducer.parameters[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto alive = weak.lock()) alive->on_gradient(i);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::prepare_forward() {
  reducer_->check_usable();
  if (reducer_->active) {
    reducer_->fail_unfinished(
        "forward was called before the previous step's gradient reduction finished");
  }
  if (options_.broadcast_buffers()) {
    std::vector<Tensor> buffers = module_->buffers();
    if (!buffers.empty() && process_group_->size() > 1)
      broadcast_coalesced(*process_group_, buffers, 0);
  }
}

void DistributedDataParallel::prepare_for_backward(const std::vector<Tensor>& outputs) {
  reducer_->prepare(outputs);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  prepare_forward();
  Tensor output = module_->forward(input);
  prepare_for_backward({output});
  return output;
}

void DistributedDataParallel::finalize() { reducer_->finish_step(); }

void DistributedDataParallel::sync_buffers(bool from_rank0) {
  std::vector<Tensor> floating, others;
  for (const Tensor& buffer : module_->buffers())
    (!from_rank0 && is_floating(buffer.dtype()) ? floating : others).push_back(buffer);
  if (process_group_->size() == 1) return;
  if (!others.empty()) broadcast_coalesced(*process_group_, others, 0);
  coalesced(floating, [&](Tensor& flat) { process_group_->all_reduce(flat, ReduceOp::kMean); });
}

const std::vector<GradBucket>& DistributedDataParallel::buckets() const {
  return reducer_->bucket_infos;
}

}  // namespace tessel::parallel
