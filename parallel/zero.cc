#include "parallel/zero.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "core/autograd.h"
#include "core/shape.h"
#include "ops/ops.h"
#include "ops/transfer.h"
#include "optim/clip_grad.h"
#include "parallel/ddp.h"

namespace tessel::parallel {

struct ZeroOptimizer::Parts {
  std::vector<std::string> names;  // the trainable parameters', in module order
  std::vector<Tensor> parameters;  // the trainable parameters themselves
  std::vector<int64_t> begins;     // this rank's part of each flattened parameter
  std::vector<int64_t> counts;
  std::vector<Tensor> parts;  // views of this rank's ranges, which the shard optimizer updates
  std::vector<char> own;      // a shard this rank keeps whole (the constructor's `own`)
  std::vector<char> shared;   // a shard shared with some ranks (the constructor's `shared`)
  // The ranks each parameter is cut in parts over: the group, or those sharing its shard.
  std::vector<std::shared_ptr<Communicator>> groups;
  // sum_gradients_over: the group, and which parameters' gradients are partial sums over it.
  std::shared_ptr<Communicator> partial_group;
  std::vector<char> partial;
  // take_gradient_shares: each parameter's gradient is a share of a sum over the group (kShare)
  // or whole on every rank (kWhole); empty: a mean over each rank's rows (averaged).
  enum class Gradient { kShare, kWhole };
  std::vector<Gradient> gradients;

  // Stage 2: adds this rank's part of the group's mean of parameter i's gradient to the part's
  // gradient, and drops the parameter's whole gradient.
  void reduce_scatter_gradient(size_t i) {
    NoGradGuard no_grad;
    const Tensor& parameter = parameters[i];
    Tensor grad = parameter.grad();
    if (!grad.defined()) return;
    if (partial_group && partial[i]) partial_group->all_reduce(grad);  // dropped below anyway
    Tensor mine;
    if (own[i]) {
      mine = grad.contiguous().reshape({-1});
    } else if (!gradients.empty() && gradients[i] == Gradient::kWhole) {
      mine = grad.contiguous().reshape({-1}).narrow(0, begins[i], counts[i]).clone();
    } else {
      mine = zeros({counts[i]}, TensorOptions(grad.dtype()).device(grad.device()));
      groups[i]->reduce_scatter(grad.contiguous().reshape({-1}), mine,
                                gradients.empty() ? ReduceOp::kMean : ReduceOp::kSum);
    }
    parameter.set_grad(Tensor());
    Tensor held = parts[i].grad();
    parts[i].set_grad(held.defined() ? add(held, mine) : mine);
  }

  // The position of `parameter` among the trainable ones; an error naming `who` otherwise.
  size_t index_of(const Tensor& parameter, const char* who) const {
    size_t i = 0;
    while (i < parameters.size() && !parameters[i].is_same(parameter)) ++i;
    TESSEL_CHECK(i < parameters.size(), "ZeroOptimizer::", who,
                 ": a tensor that is not one of the module's trainable parameters");
    return i;
  }

  // The parameter a state entry "<parameter name>.<key>" belongs to (the longest name that
  // matches), or -1.
  int64_t owner(const std::string& entry) const {
    int64_t found = -1;
    size_t found_length = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      if (entry.size() > name.size() + 1 && entry.compare(0, name.size(), name) == 0 &&
          entry[name.size()] == '.' && name.size() >= found_length) {
        found = static_cast<int64_t>(i);
        found_length = name.size();
      }
    }
    return found;
  }
};

// Stage 3. Each parameter's storage is kSharded between uses: its ShardedBytes (GatheredOnUse)
// gathers the whole bytes from every rank's part when an access scope asks for them, and drops
// them when the last scope ends, first copying this rank's elements back into its part (the bytes
// may have been written meanwhile: load_state_dict). The storages own this state, so the parameters
// keep working after the optimizer is gone.
struct ZeroOptimizer::Stage3 {
  std::vector<std::shared_ptr<Communicator>> groups;  // each parameter's (Parts::groups)
  std::vector<Tensor> parts;  // this rank's elements of each parameter, in storages of their own
  std::vector<int64_t> begins, counts;
  std::vector<std::weak_ptr<StorageImpl>> storages;  // the parameters'
  std::vector<std::shared_ptr<Work>> in_flight;      // prefetches started, not yet waited for
  // Prefetched while still whole from the use before (the forward op's weight, next needed by
  // the backward op that follows at once): kept whole, kSharded, until that use.
  std::vector<char> kept;
  // The parameters gathered in the last step, in order, and so far in this one: while this step
  // follows the last one, each gather starts the next one's.
  std::vector<size_t> last_order, order;
  bool following = true;
  int64_t starting = -1;      // the prefetch being started (its all-gather's pins end early)
  bool hold = false;          // gather_parameters(): keep every gathered parameter whole
  bool writing_back = false;  // release() is copying into a part (through an access scope)
  int64_t gathers = 0, prefetched = 0;

  // The flattened whole parameter `i` over `storage`'s bytes.
  Tensor whole(StorageImpl& storage, size_t i) const {
    const int64_t elements = static_cast<int64_t>(storage.nbytes() / parts[i].element_size());
    return Tensor(make_tensor_impl(storage.shared_from_this(), Shape{elements}, Shape{1}, 0,
                                   parts[i].dtype()));
  }

  void gather(size_t i, StorageImpl& storage) {
    NoGradGuard no_grad;
    if (kept[i]) {
      kept[i] = 0;
      ++prefetched;
    } else if (in_flight[i]) {
      std::shared_ptr<Work> work = std::move(in_flight[i]);
      try {
        work->wait();
      } catch (...) {
        storage.set_state(Residency::kSharded);
        throw;
      }
      ++prefetched;
    } else {
      storage.allocate_bytes(Residency::kResident);
      try {
        groups[i]->all_gather(parts[i], whole(storage, i));
      } catch (...) {
        storage.set_state(Residency::kSharded);
        throw;
      }
    }
    storage.set_state(Residency::kResident);
    ++gathers;
    if (hold) return;
    const size_t position = order.size();
    order.push_back(i);
    following = following && position < last_order.size() && last_order[position] == i;
    if (following && position + 1 < last_order.size()) prefetch(last_order[position + 1]);
  }

  // Starts gathering parameter `j` into its bytes; they stay kSharded (an access waits for the
  // all-gather) until used.
  void prefetch(size_t j) {
    std::shared_ptr<StorageImpl> storage = storages[j].lock();
    if (!storage || in_flight[j] || kept[j]) return;
    if (storage->state() == Residency::kResident) {
      kept[j] = 1;
      return;
    }
    if (storage->state() != Residency::kSharded || storage->pins() > 0) return;
    storage->allocate_bytes(Residency::kResident);
    starting = static_cast<int64_t>(j);
    try {
      in_flight[j] = groups[j]->all_gather_async(parts[j], whole(*storage, j));
    } catch (...) {
      starting = -1;
      storage->release_bytes(Residency::kSharded);
      throw;
    }
    starting = -1;
    storage->set_state(Residency::kSharded);
  }

  void on_unpinned(size_t i, StorageImpl& storage) {
    if (hold || writing_back || starting == static_cast<int64_t>(i) || in_flight[i]) return;
    if (kept[i]) {
      write_back(i, storage);
      storage.set_state(Residency::kSharded);
      return;
    }
    release(i, storage);
  }

  // Drops parameter i's whole bytes (resident, unpinned), keeping what was written into them.
  void release(size_t i, StorageImpl& storage) {
    write_back(i, storage);
    storage.release_bytes(Residency::kSharded);
  }

  // Parameter i's whole bytes may have been written (load_state_dict): this rank's elements go
  // to its part. (Versions cannot tell: a write counts once the kernel's access scope ended.)
  void write_back(size_t i, StorageImpl& storage) {
    NoGradGuard no_grad;
    writing_back = true;
    try {
      parts[i].copy_(whole(storage, i).narrow(0, begins[i], counts[i]));
    } catch (...) {
      writing_back = false;
      throw;
    }
    writing_back = false;
  }

  // Gathers every parameter whole and keeps them so until drop_all().
  void hold_whole() {
    drop_all();
    hold = true;
    for (const auto& weak : storages)
      if (std::shared_ptr<StorageImpl> storage = weak.lock()) StorageAccess whole(*storage);
  }

  // Ends every prefetch and drops every whole parameter (before the parts change, and before
  // each step's forward).
  void drop_all() {
    hold = false;
    if (!order.empty()) last_order = std::move(order);
    order.clear();
    following = true;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::shared_ptr<StorageImpl> storage = storages[i].lock();
      if (in_flight[i]) {
        std::shared_ptr<Work> work = std::move(in_flight[i]);
        work->wait();
        if (storage && storage->pins() == 0) storage->release_bytes(Residency::kSharded);
      } else if (kept[i]) {
        if (storage && storage->state() == Residency::kSharded && storage->pins() == 0)
          storage->release_bytes(Residency::kSharded);
      } else if (storage && storage->state() == Residency::kResident && storage->pins() == 0) {
        release(i, *storage);
      }
      kept[i] = 0;
    }
  }
};

namespace {

class GatheredOnUse : public ShardedBytes {
 public:
  GatheredOnUse(std::shared_ptr<ZeroOptimizer::Stage3> stage3, size_t index)
      : stage3_(std::move(stage3)), index_(index) {}
  void gather(StorageImpl& storage) override { stage3_->gather(index_, storage); }
  void on_unpinned(StorageImpl& storage) override {
    try {
      stage3_->on_unpinned(index_, storage);
    } catch (const std::exception& error) {
      // Called from an access scope's end, which cannot throw: the bytes stay whole.
      std::cerr << "ZeroOptimizer: could not drop a gathered parameter: " << error.what()
                << std::endl;
    }
  }

 private:
  std::shared_ptr<ZeroOptimizer::Stage3> stage3_;
  size_t index_;
};

optim::NamedTensors trainable_parameters(const std::shared_ptr<nn::Module>& module) {
  TESSEL_CHECK(module != nullptr, "ZeroOptimizer: module is null");
  optim::NamedTensors trainable;
  for (const auto& [name, parameter] : module->named_parameters())
    if (parameter.requires_grad()) trainable.emplace_back(name, parameter);
  TESSEL_CHECK(!trainable.empty(), "ZeroOptimizer: the module has no trainable parameters");
  return trainable;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<nn::Module> module,
                             std::shared_ptr<Communicator> group,
                             const MakeShardOptimizer& make_optimizer, ZeroStage stage,
                             const std::set<std::string>& own,
                             const std::map<std::string, std::shared_ptr<Communicator>>& shared)
    : Optimizer(trainable_parameters(module), 0.0, {}, "ZeroOptimizer"),
      module_(std::move(module)),
      group_(std::move(group)),
      stage_(stage),
      parts_(std::make_shared<Parts>()) {
  TESSEL_CHECK(group_ != nullptr, "ZeroOptimizer: group is null");
  TESSEL_CHECK(make_optimizer != nullptr, "ZeroOptimizer: make_optimizer is empty");
  TESSEL_CHECK(stage == ZeroStage::kOptimizerState || stage == ZeroStage::kGradients ||
                   stage == ZeroStage::kParameters,
               "ZeroOptimizer: unknown stage ", static_cast<int>(stage), " (1, 2 or 3)");
  TESSEL_CHECK(stage != ZeroStage::kParameters || residency_hooks() == nullptr,
               "ZeroOptimizer: stage 3 gathers parameters when ops touch them, in the same order "
               "on every rank, which a memory policy's recomputation does not keep: use stage 2 "
               "under a memory policy");
  const auto named = [](const auto& entries, const std::string& name) {
    return std::any_of(entries.begin(), entries.end(),
                       [&](const auto& entry) { return entry.first == name; });
  };
  for (const std::string& name : own)
    TESSEL_CHECK(named(module_->named_parameters(), name) || named(module_->named_buffers(), name),
                 "ZeroOptimizer: 'own' names ", name,
                 ", which is not a parameter or buffer of the module");
  const optim::NamedTensors trainable = trainable_parameters(module_);
  std::set<std::string> kept = own;  // not started from (nor checked against) rank 0's
  for (const auto& [name, ranks] : shared) {
    const bool buffer = named(module_->named_buffers(), name);
    TESSEL_CHECK(buffer || named(trainable, name), "ZeroOptimizer: 'shared' names ", name,
                 ", which is not a trainable parameter or a buffer of the module");
    TESSEL_CHECK(!own.count(name), "ZeroOptimizer: ", name, " is in both 'own' and 'shared'");
    TESSEL_CHECK(ranks != nullptr && ranks->size() <= group_->size(), "ZeroOptimizer: the ranks ",
                 "sharing ", name, "'s shard must be some of the group's");
    if (buffer) shared_buffers_.emplace(name, ranks);
    kept.insert(name);
  }
  Parts& parts = *parts_;
  const Device device = group_->device();
  for (const auto& [name, parameter] : trainable) {
    TESSEL_CHECK(parameter.device() == device, "ZeroOptimizer: parameter ", name, " is on ",
                 parameter.device().str(), " but communicator '", group_->name(),
                 "' moves tensors on ", device.str());
    TESSEL_CHECK(parameter.is_contiguous(), "ZeroOptimizer: parameter ", name,
                 " is not contiguous; its parts are ranges of its elements");
    TESSEL_CHECK(
        stage != ZeroStage::kParameters ||
            (parameter.storage_offset() == 0 &&
             parameter.storage()->nbytes() == parameter.nbytes() &&
             parameter.storage()->state() == Residency::kResident && !parameter.storage()->sharded),
        "ZeroOptimizer: stage 3 drops the bytes of parameter ", name,
        " between uses, so it must own its storage (not be a view of a larger tensor, "
        "nor held by another ZeroOptimizer)");
    const int64_t elements = parameter.numel();
    const bool owned = own.count(name) > 0;
    auto sharing = shared.find(name);
    const std::shared_ptr<Communicator>& ranks = sharing == shared.end() ? group_ : sharing->second;
    TESSEL_CHECK(ranks->device() == device, "ZeroOptimizer: the ranks sharing ", name,
                 "'s shard move tensors on ", ranks->device().str(), ", the group on ",
                 device.str());
    parts.names.push_back(name);
    parts.parameters.push_back(parameter);
    parts.own.push_back(owned);
    parts.shared.push_back(sharing != shared.end());
    parts.groups.push_back(ranks);
    parts.begins.push_back(owned ? 0 : part_start(elements, ranks->size(), ranks->rank()));
    parts.counts.push_back(owned ? elements : part_rows(elements, ranks->size(), ranks->rank()));
  }
  own_ = own;
  // Stage 1 leaves the parameters to DDP (which starts every rank from rank 0's); stage 2 has no
  // DDP, so it does that here. Either way a different module on some rank is an error everywhere.
  if (stage != ZeroStage::kOptimizerState) {
    start_from_rank0(*group_, *module_, "ZeroOptimizer", kept);
    NoGradGuard no_grad;
    for (size_t i = 0; i < parts.parameters.size(); ++i)
      if (parts.shared[i]) parts.groups[i]->broadcast(parts.parameters[i].detach(), 0);
    for (const auto& [name, buffer] : module_->named_buffers()) {
      auto sharing = shared_buffers_.find(name);
      if (sharing != shared_buffers_.end()) sharing->second->broadcast(buffer, 0);
    }
  } else {
    check_same_module(*group_, *module_, "ZeroOptimizer");
  }

  optim::NamedTensors named_parts;
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < parts.parameters.size(); ++i) {
      // A view of the parameter's own elements: updated in place, never a second copy. Stage 3
      // keeps the part in a storage of its own: the parameter's bytes go.
      Tensor part =
          parts.parameters[i].detach().reshape({-1}).narrow(0, parts.begins[i], parts.counts[i]);
      parts.parts.push_back(stage == ZeroStage::kParameters && !parts.own[i] ? part.clone() : part);
      named_parts.emplace_back(parts.names[i], parts.parts.back());
    }
  }
  optimizer_ = make_optimizer(named_parts);
  TESSEL_CHECK(optimizer_ != nullptr, "ZeroOptimizer: make_optimizer returned null");
  const std::vector<Tensor>& given = optimizer_->parameters();
  bool same = given.size() == parts.parts.size();
  for (size_t i = 0; same && i < given.size(); ++i) same = given[i].impl() == parts.parts[i].impl();
  TESSEL_CHECK(same, "ZeroOptimizer: make_optimizer must build the optimizer over exactly the ",
               parts.parts.size(), " part tensors it is given, in that order (got ", given.size(),
               " parameters)");
  Optimizer::set_lr(optimizer_->lr());

  if (stage != ZeroStage::kOptimizerState) {
    std::weak_ptr<Parts> weak = parts_;
    for (size_t i = 0; i < parts.parameters.size(); ++i) {
      parts.parameters[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
        if (auto alive = weak.lock()) alive->reduce_scatter_gradient(i);
      });
    }
  }

  if (stage == ZeroStage::kParameters) {
    stage3_ = std::make_shared<Stage3>();
    Stage3& sharded = *stage3_;
    sharded.groups = parts.groups;
    sharded.parts = parts.parts;
    sharded.begins = parts.begins;
    sharded.counts = parts.counts;
    const size_t count = parts.parameters.size();
    sharded.in_flight.resize(count);
    sharded.kept.assign(count, 0);
    for (size_t i = 0; i < count; ++i) {
      if (parts.own[i]) {  // never dropped: no storage to gather into
        sharded.storages.emplace_back();
        continue;
      }
      const std::shared_ptr<StorageImpl>& storage = parts.parameters[i].storage();
      sharded.storages.push_back(storage);
      storage->sharded = std::make_shared<GatheredOnUse>(stage3_, i);
      storage->release_bytes(Residency::kSharded);
    }
  }
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::broadcast_buffers() {
  if (stage_ == ZeroStage::kOptimizerState) return;
  NoGradGuard no_grad;
  for (const auto& [name, buffer] : module_->named_buffers()) {
    if (own_.count(name)) continue;
    auto sharing = shared_buffers_.find(name);
    (sharing == shared_buffers_.end() ? *group_ : *sharing->second).broadcast(buffer, 0);
  }
}

void ZeroOptimizer::sum_gradients_over(std::shared_ptr<Communicator> group,
                                       const std::vector<Tensor>& parameters) {
  TESSEL_CHECK(group != nullptr, "ZeroOptimizer::sum_gradients_over: group is null");
  Parts& parts = *parts_;
  std::vector<char> partial(parts.parameters.size(), 0);
  for (const Tensor& parameter : parameters)
    partial[parts.index_of(parameter, "sum_gradients_over")] = 1;
  parts.partial_group = std::move(group);
  parts.partial = std::move(partial);
}

void ZeroOptimizer::take_gradient_shares(const std::vector<Tensor>& shares) {
  Parts& parts = *parts_;
  std::vector<Parts::Gradient> gradients(parts.parameters.size(), Parts::Gradient::kWhole);
  for (const Tensor& share : shares)
    gradients[parts.index_of(share, "take_gradient_shares")] = Parts::Gradient::kShare;
  parts.gradients = std::move(gradients);
}

void ZeroOptimizer::gather_parameters() {
  if (stage3_) stage3_->hold_whole();
}

int64_t ZeroOptimizer::gathers() const { return stage3_ ? stage3_->gathers : 0; }
int64_t ZeroOptimizer::prefetched_gathers() const { return stage3_ ? stage3_->prefetched : 0; }

void ZeroOptimizer::step() {
  Parts& parts = *parts_;
  NoGradGuard no_grad;
  if (stage3_) {
    // The parts change: whole copies (and gathers in flight) would be stale. The next forward
    // gathers the updated parts.
    stage3_->drop_all();
    optimizer_->step();
    for (const Tensor& parameter : parts.parameters) parameter.storage()->bump_version();
    return;
  }
  if (stage_ == ZeroStage::kOptimizerState) {
    for (size_t i = 0; i < parts.parameters.size(); ++i) {
      Tensor grad = parts.parameters[i].grad();
      parts.parts[i].set_grad(grad.defined() ? grad.contiguous().reshape({-1}).narrow(
                                                   0, parts.begins[i], parts.counts[i])
                                             : Tensor());
    }
  }
  optimizer_->step();
  // Every rank updated the same parameters (gradients are defined alike on every rank: averaged
  // by DDP, or reduce-scattered by all): gather those. The part lies inside the gathered
  // tensor, so it is sent from a copy.
  for (size_t i = 0; i < parts.parameters.size(); ++i) {
    if (parts.own[i] || !parts.parts[i].grad().defined()) continue;
    parts.groups[i]->all_gather(parts.parts[i].clone(), parts.parameters[i].detach().reshape({-1}));
  }
  if (stage_ == ZeroStage::kOptimizerState)
    for (const Tensor& part : parts.parts) part.set_grad(Tensor());
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  const auto& shared = parts_->shared;
  if (stage_ == ZeroStage::kOptimizerState && own_.empty() &&
      std::none_of(shared.begin(), shared.end(), [](char is_shared) { return is_shared; }))
    return optim::clip_grad_norm(parameters(), max_norm);
  return clip_grad_norm_over(max_norm, nullptr, nullptr);
}

double ZeroOptimizer::clip_grad_norm(double max_norm, Communicator& tp_group,
                                     const std::set<std::string>& split) {
  return clip_grad_norm_over(max_norm, &tp_group, &split);
}

double ZeroOptimizer::clip_grad_norm_over(double max_norm, Communicator* tp_group,
                                          const std::set<std::string>* split) {
  TESSEL_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  const Parts& parts = *parts_;
  // Stage 1: the whole gradients (averaged by DDP); stages 2 and 3: this rank's parts.
  const bool in_parts = stage_ != ZeroStage::kOptimizerState;
  std::vector<Tensor> grads;
  // Own shards' squares add over the group at every stage, like the parts'; so do shared
  // shards', each whole one (stage 1) counted once over the ranks sharing it.
  double split_squares = 0, other_squares = 0, own_squares = 0;
  for (size_t i = 0; i < parts.parameters.size(); ++i) {
    const Tensor grad = in_parts ? parts.parts[i].grad() : parts.parameters[i].grad();
    if (!grad.defined()) continue;
    grads.push_back(grad);
    if (grad.numel() == 0) continue;
    const Tensor wide = to_dtype(grad, DType::kFloat64);
    const double squares = sum(mul(wide, wide)).item<double>();
    if (parts.shared[i])
      own_squares += in_parts ? squares : squares / parts.groups[i]->size();
    else
      (parts.own[i]                            ? own_squares
       : split && split->count(parts.names[i]) ? split_squares
                                               : other_squares) += squares;
  }
  const bool any_shared =
      std::any_of(parts.shared.begin(), parts.shared.end(), [](char shared) { return shared; });
  auto sum_over = [](Communicator& group, std::vector<double> values) {
    Tensor total = to_device(from_vector<double>(values, {static_cast<int64_t>(values.size())}),
                             group.device());
    group.all_reduce(total);
    return to_device(total, Device::cpu()).to_vector<double>();
  };
  if (!in_parts && (!own_.empty() || any_shared)) own_squares = sum_over(*group_, {own_squares})[0];
  if (in_parts) {
    const std::vector<double> over_dp =
        sum_over(*group_, {split_squares, other_squares, own_squares});
    split_squares = over_dp[0];
    other_squares = over_dp[1];
    own_squares = over_dp[2];
  }
  if (tp_group) split_squares = sum_over(*tp_group, {split_squares})[0];
  const double norm = std::sqrt(split_squares + other_squares + own_squares);
  const double scale = max_norm / (norm + 1e-6);  // as optim::clip_grad_norm
  if (scale < 1.0 || std::isnan(scale))
    for (Tensor& grad : grads) grad.mul_(scale);
  return norm;
}

void ZeroOptimizer::zero_grad() {
  // Ends gather_parameters()'s hold; gathers in flight stay (zero_grad may come between forward
  // and backward).
  if (stage3_ && stage3_->hold) stage3_->drop_all();
  optimizer_->zero_grad();
  for (const Tensor& parameter : parts_->parameters) parameter.set_grad(Tensor());
}

void ZeroOptimizer::set_lr(double lr) {
  optimizer_->set_lr(lr);
  Optimizer::set_lr(lr);
}

void ZeroOptimizer::update(const Tensor&, const Tensor&, ParameterState&) {
  TESSEL_FAIL("ZeroOptimizer: update() is not used; step() updates this rank's parts");
}

std::vector<Tensor> ZeroOptimizer::held_tensors() const {
  std::vector<Tensor> held = parameters();
  for (const Tensor& tensor : optimizer_->held_tensors()) held.push_back(tensor);
  return held;
}

int64_t ZeroOptimizer::part_begin(size_t parameter) const {
  TESSEL_CHECK(parameter < parts_->begins.size(), "ZeroOptimizer: no parameter ", parameter);
  return parts_->begins[parameter];
}

int64_t ZeroOptimizer::part_count(size_t parameter) const {
  TESSEL_CHECK(parameter < parts_->counts.size(), "ZeroOptimizer: no parameter ", parameter);
  return parts_->counts[parameter];
}

optim::NamedTensors ZeroOptimizer::state_tensors() const {
  const Parts& parts = *parts_;
  // Stage 3: the module is read next, perhaps on one rank only.
  if (stage3_) stage3_->hold_whole();
  optim::NamedTensors whole;
  // The same entries on every rank, in the same order: every rank's optimizer stepped the same
  // parameters.
  for (const auto& [name, part] : optimizer_->state_tensors()) {
    const int64_t i = parts.owner(name);
    TESSEL_CHECK(i >= 0 && part.numel() == parts.counts[i], "ZeroOptimizer: the state '", name,
                 "' is not one value per element of its parameter; it cannot be gathered");
    const Tensor& parameter = parts.parameters[i];
    if (parts.own[i]) {
      whole.emplace_back(name, part.reshape(parameter.sizes()));
      continue;
    }
    Tensor gathered = zeros({parameter.numel()}, TensorOptions(part.dtype()).device(part.device()));
    parts.groups[i]->all_gather(part.contiguous(), gathered);
    whole.emplace_back(name, gathered.reshape(parameter.sizes()));
  }
  return whole;
}

void ZeroOptimizer::load_state_tensors(const optim::NamedTensors& state) {
  const Parts& parts = *parts_;
  optim::NamedTensors mine;
  for (const auto& [name, tensor] : state) {
    const int64_t i = parts.owner(name);
    if (i < 0 || !tensor.defined()) {
      mine.emplace_back(name, tensor);  // the shard optimizer reports what is wrong with it
      continue;
    }
    TESSEL_CHECK(tensor.numel() == parts.parameters[i].numel(), "ZeroOptimizer: state '", name,
                 "' has shape ", shape_str(tensor.sizes()), " but its parameter has shape ",
                 shape_str(parts.parameters[i].sizes()));
    mine.emplace_back(
        name, tensor.contiguous().reshape({-1}).narrow(0, parts.begins[i], parts.counts[i]));
  }
  optimizer_->load_state_tensors(mine);
}

ZeroCuts zero_cuts(const SplitParameters& module) {
  ZeroCuts cuts;
  for (const auto& [name, dim] : module.split_parameter_dims()) {
    std::shared_ptr<Communicator> copies = module.split_copies(name);
    if (copies)
      cuts.shared.emplace(name, std::move(copies));
    else
      cuts.own.insert(name);
  }
  return cuts;
}

optim::NamedScalars ZeroOptimizer::state_scalars() const { return optimizer_->state_scalars(); }

void ZeroOptimizer::load_state_scalars(const optim::NamedScalars& scalars) {
  optimizer_->load_state_scalars(scalars);
  Optimizer::set_lr(optimizer_->lr());
}

}  // namespace tessel::parallel
