// A plan run op by op as priced (parallel::ParallelModule) seen by a recipe as one module: this
// rank's shards of the plan's parameters and buffers under the model's own dotted names, for the
// optimizer, checkpoints (the split tensors are declared, so they are gathered whole) and memory
// accounting; a whole model of the same architecture, filled on demand, for evaluation.
//   auto planned = std::make_shared<PlannedModule>(parallel, evaluated);
//   optim::SGD sgd(planned->named_parameters(), options);
//   Tensor loss = planned->loss({rows, labels});  loss.backward();  sgd.step();
//   evaluate(planned->gathered());
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "parallel/parallelize.h"
#include "parallel/tensor_parallel.h"

namespace tessel::train {

class PlannedModule : public nn::Module, public parallel::SplitParameters {
 public:
  // `evaluated`: a model of the same architecture as the one `parallel` runs, on this rank.
  PlannedModule(std::shared_ptr<parallel::ParallelModule> parallel,
                std::shared_ptr<nn::Module> evaluated);
  Tensor forward(const Tensor&) override;  // an error: a plan's ops run through loss()
  std::map<std::string, int64_t> split_parameter_dims() const override;
  // Tensors the plan cuts over part of the ranks (a grid of per-op degrees): cut and gathered as
  // ParallelModule keeps them.
  std::pair<int, int> split_part(const std::string& parameter) const override;
  Tensor gather_split(const std::string& parameter, const Tensor& local) const override;
  std::shared_ptr<parallel::Communicator> split_copies(const std::string& parameter) const override;
  // The plan's loss of this rank's rows of each step input (the same scalar on every rank). Its
  // backward ends with the plan's gradient sums over dp (ParallelModule::synchronize_gradients).
  Tensor loss(const std::vector<Tensor>& inputs);
  // Under ZeRO stage 2 or 3 (`optimizer` a parallel::ZeroOptimizer over the plan's dp group over
  // this module), ZeRO's reduce-scatters during backward take over the plan's gradient sums over
  // dp. Nothing for other optimizers (stage 1 reads the sums).
  void hand_gradients_to(optim::Optimizer& optimizer);
  parallel::ParallelModule& parallel() { return *parallel_; }
  // The evaluated model with every tensor whole (a collective: gathered over tp).
  nn::Module& gathered();

 private:
  nn::Module& owner(const std::string& name);

  std::shared_ptr<parallel::ParallelModule> parallel_;
  std::shared_ptr<nn::Module> evaluated_;
  bool zero_reduces_gradients_ = false;  // hand_gradients_to a ZeRO stage 2 or 3
};

}  // namespace tessel::train
