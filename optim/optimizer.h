// Optimizer: the base of SGD, Adam and AdamW: parameters (optionally named), learning rate and
// per-parameter state, all capturable for checkpoints (state_tensors, state_scalars).
//   SGD sgd(net->named_parameters(), SGDOptions(0.1).momentum(0.9));  ...  sgd.step();
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tessel::optim {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using NamedScalars = std::vector<std::pair<std::string, double>>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter whose gradient is defined (others are skipped, their state kept),
  // without recording autograd.
  virtual void step();
  // Sets every parameter's gradient to undefined.
  virtual void zero_grad();

  double lr() const { return lr_; }
  virtual void set_lr(double lr);

  const std::vector<Tensor>& parameters() const { return parameters_; }
  // The names given, or "0", "1", ... for a plain list.
  const std::vector<std::string>& parameter_names() const { return names_; }
  virtual std::string name() const = 0;
  // True when state_tensors() is a collective call that every rank of a group must make (an
  // optimizer whose state is spread over ranks, parallel::ZeroOptimizer).
  virtual bool collective_state() const { return false; }

  // Per-parameter state tensors named "<parameter name>.<key>" ("fc.weight.exp_avg"), in
  // parameter order; parameters not yet stepped have none.
  virtual NamedTensors state_tensors() const;
  // The parameters (their gradients come with them) and the state tensors: with the module's
  // buffers, what training holds from step to step (memory::MemoryScope::end_step).
  virtual std::vector<Tensor> held_tensors() const;
  // Replaces the whole tensor state with `state` (copied, converted to each parameter's dtype
  // and device). Everything is checked first: unknown names or keys and shape mismatches throw
  // one error and change nothing.
  virtual void load_state_tensors(const NamedTensors& state);
  // "lr" and "<parameter name>.step" (the number of updates each parameter has had).
  virtual NamedScalars state_scalars() const;
  // Restores what state_scalars() returned; absent steps become 0. Checked first like tensors.
  virtual void load_state_scalars(const NamedScalars& scalars);

  struct ParameterState {
    std::vector<Tensor> tensors;  // one per state key; undefined until the first update
    int64_t step = 0;             // updates so far, this one included inside update()
  };

 protected:
  Optimizer(const std::vector<Tensor>& parameters, double lr, std::vector<std::string> state_keys,
            const char* optimizer_name);
  Optimizer(const NamedTensors& named_parameters, double lr, std::vector<std::string> state_keys,
            const char* optimizer_name);

  // One update of `parameter` from its defined `grad`; `state.step` is already incremented.
  virtual void update(const Tensor& parameter, const Tensor& grad, ParameterState& state) = 0;

  const std::vector<std::string>& state_keys() const { return state_keys_; }

 private:
  void check_parameters(const char* optimizer_name) const;

  std::vector<Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<std::string> state_keys_;
  std::vector<ParameterState> state_;
  double lr_;
};

// Learning rates must be non-negative and finite.
void check_learning_rate(const char* optimizer_name, double lr);

}  // namespace tessel::optim
