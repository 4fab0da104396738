// Optimizers against PyTorch (tests/golden/optim.safetensors, made by
// tests/golden/make_golden_nn.py with the same hyperparameters), their option checks, exact
// state capture for checkpoints, and gradient clipping.
#include "optim/optim.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "core/op.h"
#include "core/rng.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel::optim {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::throws_error;

const std::map<std::string, Tensor>& golden() {
  static const auto* fixtures = new std::map<std::string, Tensor>(testing::load_golden("optim"));
  return *fixtures;
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(const std::vector<Tensor>&)>;

// Three steps from the recorded parameters and gradients; parameters compared after each.
void check_case(const std::string& name, const MakeOptimizer& make) {
  std::vector<Tensor> params;
  for (int k = 0; k < 2; ++k) {
    params.push_back(
        testing::golden_tensor(golden(), name + ".p" + std::to_string(k) + ".initial").clone());
    params.back().set_requires_grad(true);
  }
  std::unique_ptr<Optimizer> optimizer = make(params);
  for (int step = 0; step < 3; ++step) {
    for (int k = 0; k < 2; ++k) {
      auto grad = golden().find(name + ".p" + std::to_string(k) + ".grad" + std::to_string(step));
      params[k].set_grad(grad == golden().end() ? Tensor() : grad->second.clone());
    }
    optimizer->step();
    for (int k = 0; k < 2; ++k) {
      std::string key = name + ".p" + std::to_string(k) + ".after" + std::to_string(step);
      EXPECT_TRUE(all_close(params[k], testing::golden_tensor(golden(), key))) << key;
    }
  }
}

TEST(SGDGolden, PlainMatchesPyTorch) {
  check_case("sgd_plain", [](const std::vector<Tensor>& p) {
    return std::make_unique<SGD>(p, SGDOptions(0.1));
  });
}

TEST(SGDGolden, NesterovMomentumWithWeightDecayMatchesPyTorch) {
  check_case("sgd_nesterov", [](const std::vector<Tensor>& p) {
    return std::make_unique<SGD>(p,
                                 SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(0.01));
  });
}

TEST(SGDGolden, DampeningMatchesPyTorch) {
  check_case("sgd_dampening", [](const std::vector<Tensor>& p) {
    return std::make_unique<SGD>(p,
                                 SGDOptions(0.05).momentum(0.8).dampening(0.3).weight_decay(0.02));
  });
}

TEST(AdamGolden, DefaultsMatchPyTorch) {
  check_case("adam", [](const std::vector<Tensor>& p) {
    return std::make_unique<Adam>(p, AdamOptions(0.01));
  });
}

TEST(AdamGolden, WeightDecayAndAmsgradMatchPyTorch) {
  check_case("adam_decay_amsgrad", [](const std::vector<Tensor>& p) {
    return std::make_unique<Adam>(
        p, AdamOptions(0.02).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.1).amsgrad(true));
  });
}

TEST(AdamGolden, ParameterWithoutGradientIsSkippedAndKeepsItsStepCount) {
  check_case("adam_skip", [](const std::vector<Tensor>& p) {
    return std::make_unique<Adam>(p, AdamOptions(0.01));
  });
}

TEST(AdamWGolden, DecoupledWeightDecayMatchesPyTorch) {
  check_case("adamw", [](const std::vector<Tensor>& p) {
    return std::make_unique<AdamW>(p, AdamWOptions(0.01).weight_decay(0.1));
  });
}

TEST(AdamW, DefaultsToWeightDecayOneHundredth) {
  EXPECT_EQ(AdamWOptions().weight_decay(), 1e-2);
  EXPECT_EQ(AdamOptions().weight_decay(), 0.0);
  EXPECT_EQ(AdamOptions().lr(), 1e-3);
}

// ---- option and parameter checks ----

std::vector<Tensor> some_params() { return {randn({2, 2}).set_requires_grad(true)}; }

TEST(Options, SGDRejectsBadValues) {
  EXPECT_TRUE(throws_error([] { SGD(some_params(), SGDOptions(-0.1)); }, "invalid learning rate"));
  EXPECT_TRUE(
      throws_error([] { SGD(some_params(), SGDOptions(0.1).momentum(-0.5)); }, "invalid momentum"));
  EXPECT_TRUE(throws_error([] { SGD(some_params(), SGDOptions(0.1).weight_decay(-1)); },
                           "invalid weight_decay"));
  EXPECT_TRUE(throws_error([] { SGD(some_params(), SGDOptions(0.1).nesterov(true)); },
                           "Nesterov momentum requires a momentum > 0 and zero dampening"));
  EXPECT_TRUE(throws_error(
      [] { SGD(some_params(), SGDOptions(0.1).momentum(0.9).dampening(0.1).nesterov(true)); },
      "zero dampening"));
}

TEST(Options, AdamRejectsBadValues) {
  EXPECT_TRUE(
      throws_error([] { Adam(some_params(), AdamOptions(-1e-3)); }, "invalid learning rate"));
  EXPECT_TRUE(throws_error(
      [] {
        Adam(some_params(), AdamOptions().betas({1.0, 0.999}));
      },
      "invalid beta1 1"));
  EXPECT_TRUE(throws_error(
      [] {
        Adam(some_params(), AdamOptions().betas({0.9, -0.1}));
      },
      "invalid beta2"));
  EXPECT_TRUE(throws_error([] { Adam(some_params(), AdamOptions().eps(-1)); }, "invalid epsilon"));
  EXPECT_TRUE(throws_error([] { AdamW(some_params(), AdamWOptions().weight_decay(-0.1)); },
                           "AdamW: invalid weight_decay"));
}

TEST(Options, ParameterListIsChecked) {
  EXPECT_TRUE(
      throws_error([] { SGD(std::vector<Tensor>{}, SGDOptions(0.1)); }, "empty parameter list"));
  Tensor leaf = randn({3}).set_requires_grad(true);
  EXPECT_TRUE(throws_error([&] { SGD({leaf, leaf}, SGDOptions(0.1)); }, "appears more than once"));
  Tensor computed = mul(leaf, 2.0);
  EXPECT_TRUE(throws_error([&] { SGD({computed}, SGDOptions(0.1)); }, "not a leaf"));
  EXPECT_TRUE(
      throws_error([] { SGD({zeros({2}, DType::kInt64)}, SGDOptions(0.1)); }, "floating-point"));
}

// ---- behaviour ----

TEST(Optimizer, SkipsParametersWithoutGradient) {
  Tensor a = randn({3}).set_requires_grad(true), b = randn({3}).set_requires_grad(true);
  Tensor b_before = b.clone();
  SGD sgd({a, b}, SGDOptions(0.1).momentum(0.9));
  a.set_grad(ones({3}));
  sgd.step();
  EXPECT_TRUE(bitwise_equal(b, b_before));
  auto state = sgd.state_tensors();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "0.momentum_buffer");
}

TEST(Optimizer, ZeroGradMakesGradientsUndefined) {
  Tensor a = randn({3}).set_requires_grad(true);
  a.set_grad(ones({3}));
  Adam adam({a}, AdamOptions());
  adam.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(Optimizer, SetLrChangesTheNextStep) {
  Tensor a = zeros({2}).set_requires_grad(true);
  SGD sgd({a}, SGDOptions(0.1));
  sgd.set_lr(0.5);
  EXPECT_EQ(sgd.lr(), 0.5);
  a.set_grad(ones({2}));
  sgd.step();
  EXPECT_TRUE(all_close(a, full({2}, -0.5)));
  EXPECT_TRUE(throws_error([&] { sgd.set_lr(-1); }, "invalid learning rate"));
}

TEST(Optimizer, UpdatesRunThroughTheDispatcher) {
  std::vector<std::string> seen;
  TraceHook previous =
      set_trace_hook([&](const OpDef& op, const std::vector<Tensor>&, const std::vector<Tensor>&,
                         const Attrs&) { seen.push_back(op.name); });
  Tensor a = randn({4}).set_requires_grad(true);
  a.set_grad(ones({4}));
  SGD({a}, SGDOptions(0.1).momentum(0.9)).step();
  Adam({a}, AdamOptions()).step();
  set_trace_hook(previous);
  EXPECT_NE(std::find(seen.begin(), seen.end(), "sgd_update"), seen.end());
  EXPECT_NE(std::find(seen.begin(), seen.end(), "adam_update"), seen.end());
}

TEST(Optimizer, WorksWithModuleParametersAndF64) {
  nn::Linear linear(3, 2);
  linear.to(DType::kFloat64);
  Adam adam(linear.named_parameters(), AdamOptions(0.1));
  Tensor before = linear.weight.clone();
  linear.forward(randn({4, 3}, DType::kFloat64)).sum().backward();
  adam.step();
  EXPECT_FALSE(all_close(linear.weight, before, 0, 0));
  EXPECT_EQ(adam.state_tensors()[0].first, "weight.exp_avg");
  EXPECT_EQ(adam.state_tensors()[0].second.dtype(), DType::kFloat64);
}

TEST(Optimizer, NonContiguousParametersAreUpdatedInPlace) {
  Tensor base = randn({3, 4});
  Tensor param = base.t().contiguous().t();  // a transposed layout
  param.set_requires_grad(true);
  ASSERT_FALSE(param.is_contiguous());
  Tensor expected = sub(param, mul(full({3, 4}, 1.0), 0.1));
  param.set_grad(ones({3, 4}));
  SGD({param}, SGDOptions(0.1)).step();
  EXPECT_TRUE(all_close(param, expected));
}

// ---- state capture for checkpoints ----

// Runs `steps` updates with gradients drawn from `seed`, the same on every call.
void run_steps(Optimizer& optimizer, const std::vector<Tensor>& params, uint64_t seed, int steps) {
  manual_seed(seed);
  for (int step = 0; step < steps; ++step) {
    for (const Tensor& param : params) param.set_grad(randn(param.sizes()));
    optimizer.step();
  }
}

template <typename MakeOptimizer>
void expect_exact_resume(MakeOptimizer make) {
  manual_seed(11);
  NamedTensors named{{"fc.weight", randn({4, 3}).set_requires_grad(true)},
                     {"fc.bias", randn({3}).set_requires_grad(true)}};
  auto original = make(named);
  std::vector<Tensor> params{named[0].second, named[1].second};
  run_steps(*original, params, 1, 2);

  // Restore into a fresh optimizer over copies of the parameters.
  NamedTensors copies;
  for (const auto& [name, tensor] : named)
    copies.emplace_back(name, tensor.detach().clone().set_requires_grad(true));
  auto restored = make(copies);
  restored->load_state_tensors(original->state_tensors());
  restored->load_state_scalars(original->state_scalars());

  run_steps(*original, params, 2, 3);
  run_steps(*restored, {copies[0].second, copies[1].second}, 2, 3);
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_TRUE(bitwise_equal(copies[i].second, named[i].second)) << named[i].first;
  EXPECT_EQ(restored->state_scalars(), original->state_scalars());
}

TEST(OptimizerState, SGDResumesExactly) {
  expect_exact_resume([](const NamedTensors& named) {
    return std::make_unique<SGD>(named, SGDOptions(0.1).momentum(0.9).nesterov(true));
  });
}

TEST(OptimizerState, AdamResumesExactly) {
  expect_exact_resume([](const NamedTensors& named) {
    return std::make_unique<Adam>(named, AdamOptions(0.01).amsgrad(true));
  });
}

TEST(OptimizerState, AdamWResumesExactly) {
  expect_exact_resume(
      [](const NamedTensors& named) { return std::make_unique<AdamW>(named, AdamWOptions(0.01)); });
}

TEST(OptimizerState, NamesTensorsAndScalarsByParameter) {
  NamedTensors named{{"w", randn({2}).set_requires_grad(true)},
                     {"b", randn({1}).set_requires_grad(true)}};
  Adam adam(named, AdamOptions(0.5));
  named[0].second.set_grad(ones({2}));
  adam.step();
  std::vector<std::string> names;
  for (const auto& entry : adam.state_tensors()) names.push_back(entry.first);
  EXPECT_EQ(names, (std::vector<std::string>{"w.exp_avg", "w.exp_avg_sq"}));
  EXPECT_EQ(adam.state_scalars(), (NamedScalars{{"lr", 0.5}, {"w.step", 1.0}, {"b.step", 0.0}}));
}

TEST(OptimizerState, LoadedTensorsAreCopies) {
  Tensor w = randn({2}).set_requires_grad(true);
  SGD sgd({w}, SGDOptions(0.1).momentum(0.9));
  Tensor buffer = ones({2});
  sgd.load_state_tensors({{"0.momentum_buffer", buffer}});
  buffer.fill_(5);
  EXPECT_TRUE(bitwise_equal(sgd.state_tensors()[0].second, ones({2})));
}

TEST(OptimizerState, BadTensorStateThrowsAndLoadsNothing) {
  Tensor w = randn({2}).set_requires_grad(true);
  Adam adam({w}, AdamOptions());
  w.set_grad(ones({2}));
  adam.step();
  NamedTensors before = adam.state_tensors();
  std::vector<Tensor> before_values;
  for (const auto& entry : before) before_values.push_back(entry.second.clone());
  EXPECT_TRUE(throws_error(
      [&] {
        adam.load_state_tensors({{"0.exp_avg", zeros({2})}, {"0.momentum_buffer", zeros({2})}});
      },
      "unexpected state '0.momentum_buffer'"));
  EXPECT_TRUE(throws_error(
      [&] {
        adam.load_state_tensors({{"0.exp_avg", zeros({3})}});
      },
      "size mismatch for '0.exp_avg'"));
  EXPECT_TRUE(throws_error(
      [&] {
        adam.load_state_tensors({{"7.exp_avg", zeros({2})}});
      },
      "unexpected state '7.exp_avg'"));
  auto after = adam.state_tensors();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_TRUE(bitwise_equal(after[i].second, before_values[i])) << after[i].first;
}

TEST(OptimizerState, BadScalarsThrowAndLoadNothing) {
  Tensor w = randn({2}).set_requires_grad(true);
  Adam adam({w}, AdamOptions(0.1));
  EXPECT_TRUE(throws_error(
      [&] {
        adam.load_state_scalars({{"lr", 0.2}, {"0.step", 1.5}});
      },
      "whole number"));
  EXPECT_TRUE(throws_error(
      [&] {
        adam.load_state_scalars({{"momentum", 0.9}});
      },
      "unexpected scalar 'momentum'"));
  EXPECT_TRUE(throws_error([&] { adam.load_state_scalars({{"lr", -1.0}}); }, "learning rate"));
  EXPECT_EQ(adam.lr(), 0.1);
  EXPECT_EQ(adam.state_scalars()[1].second, 0.0);
}

// ---- clip_grad_norm ----

TEST(ClipGradNorm, ScalesAllGradientsByTheTotalNorm) {
  Tensor a = zeros({2}).set_requires_grad(true), b = zeros({1}).set_requires_grad(true);
  a.set_grad(tensor({3, 4}, {2}));
  b.set_grad(tensor({12}, {1}));
  double total = clip_grad_norm({a, b}, 6.5);
  EXPECT_NEAR(total, 13.0, 1e-5);
  double scale = 6.5 / (13.0 + 1e-6);
  EXPECT_TRUE(all_close(
      a.grad(), tensor({static_cast<float>(3 * scale), static_cast<float>(4 * scale)}, {2})));
  EXPECT_TRUE(all_close(b.grad(), tensor({static_cast<float>(12 * scale)}, {1})));
}

TEST(ClipGradNorm, LeavesGradientsBelowTheLimitAlone) {
  Tensor a = zeros({2}).set_requires_grad(true);
  a.set_grad(tensor({3, 4}, {2}));
  EXPECT_NEAR(clip_grad_norm({a}, 10.0), 5.0, 1e-6);
  EXPECT_TRUE(bitwise_equal(a.grad(), tensor({3, 4}, {2})));
}

TEST(ClipGradNorm, SupportsInfinityOneAndOtherNorms) {
  Tensor a = zeros({2}).set_requires_grad(true), b = zeros({1}).set_requires_grad(true);
  auto reset = [&] {
    a.set_grad(tensor({3, -4}, {2}));
    b.set_grad(tensor({-12}, {1}));
  };
  reset();
  EXPECT_NEAR(clip_grad_norm({a, b}, 100.0, INFINITY), 12.0, 1e-6);
  reset();
  EXPECT_NEAR(clip_grad_norm({a, b}, 100.0, 1.0), 19.0, 1e-5);
  reset();
  EXPECT_NEAR(clip_grad_norm({a, b}, 100.0, 3.0), std::cbrt(27.0 + 64.0 + 1728.0), 1e-4);
  reset();
  clip_grad_norm({a, b}, 6.0, INFINITY);
  EXPECT_TRUE(all_close(b.grad(), tensor({static_cast<float>(-12 * 6.0 / (12 + 1e-6))}, {1})));
}

TEST(ClipGradNorm, SkipsParametersWithoutGradientAndChecksArguments) {
  Tensor a = zeros({2}).set_requires_grad(true);
  EXPECT_EQ(clip_grad_norm({a}, 1.0), 0.0);
  EXPECT_TRUE(throws_error([&] { clip_grad_norm({a}, -1.0); }, "max_norm"));
  EXPECT_TRUE(throws_error([&] { clip_grad_norm({a}, 1.0, 0.0); }, "norm_type"));
  a.set_grad(tensor({NAN, 1}, {2}));
  EXPECT_TRUE(throws_error([&] { clip_grad_norm({a}, 1.0, 2.0, true); }, "cannot be clipped"));
}

}  // namespace
}  // namespace tessel::optim
