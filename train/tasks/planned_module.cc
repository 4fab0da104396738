#include "train/tasks/planned_module.h"

#include "core/autograd.h"
#include "core/error.h"
#include "parallel/zero.h"

namespace tessel::train {
namespace {

std::string leaf(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace

PlannedModule::PlannedModule(std::shared_ptr<parallel::ParallelModule> parallel,
                             std::shared_ptr<nn::Module> evaluated)
    : nn::Module("PlannedModule"),
      parallel_(std::move(parallel)),
      evaluated_(std::move(evaluated)) {
  for (const auto& [name, shard] : parallel_->named_parameters())
    owner(name).register_parameter(leaf(name), shard);
  for (const auto& [name, shard] : parallel_->buffers())
    owner(name).register_buffer(leaf(name), shard);
}

Tensor PlannedModule::forward(const Tensor&) {
  TESSEL_FAIL("PlannedModule: a plan's ops run through PlannedModule::loss");
}

std::map<std::string, int64_t> PlannedModule::split_parameter_dims() const {
  return parallel_->split_dims();
}

std::pair<int, int> PlannedModule::split_part(const std::string& parameter) const {
  if (parallel_->shard_copies(parameter) == 1) return {0, 0};
  return parallel_->cut_parts(parameter);
}

std::shared_ptr<parallel::Communicator> PlannedModule::split_copies(
    const std::string& parameter) const {
  return parallel_->copies_of_cut(parameter);
}

Tensor PlannedModule::gather_split(const std::string& parameter, const Tensor& local) const {
  return parallel_->gather_cut(parameter, local);
}

Tensor PlannedModule::loss(const std::vector<Tensor>& inputs) {
  Tensor loss = parallel_->loss(inputs);
  if (loss.requires_grad() && !zero_reduces_gradients_) {
    // Queued when the loss's gradient, the first of the pass, arrives: the sums run once every
    // gradient has.
    parallel::ParallelModule* parallel = parallel_.get();
    loss.register_hook([parallel](const Tensor&) {
      queue_backward_callback([parallel] { parallel->synchronize_gradients(); });
      return Tensor();
    });
  }
  return loss;
}

void PlannedModule::hand_gradients_to(optim::Optimizer& optimizer) {
  auto* zero = dynamic_cast<parallel::ZeroOptimizer*>(&optimizer);
  if (!zero || zero->stage() == parallel::ZeroStage::kOptimizerState) return;
  // Gradients that are each rank's rows' share: of parameters some op splits the batch for, and
  // of those cut over part of the ranks (summed over the ranks holding the same part).
  std::vector<Tensor> shares;
  const std::set<std::string>& batch_split = parallel_->batch_split_parameters();
  for (const auto& [name, shard] : parallel_->named_parameters())
    if (batch_split.count(name) || parallel_->shard_copies(name) > 1) shares.push_back(shard);
  zero->take_gradient_shares(shares);
  zero_reduces_gradients_ = true;
}

nn::Module& PlannedModule::gathered() {
  evaluated_->load_state_dict(parallel_->full_state_dict());
  return *evaluated_;
}

// The module that holds `name`'s leaf: a tree of plain modules, one per dotted prefix.
nn::Module& PlannedModule::owner(const std::string& name) {
  nn::Module* module = this;
  size_t begin = 0;
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', begin)) {
    const std::string part = name.substr(begin, dot - begin);
    std::shared_ptr<nn::Module> child;
    for (const auto& [child_name, existing] : module->named_children())
      if (child_name == part) child = existing;
    if (!child) child = module->register_module(part, std::make_shared<nn::Module>("Shards"));
    module = child.get();
    begin = dot + 1;
  }
  return *module;
}

}  // namespace tessel::train
