// What the vision model parity tests share: running tests/golden/make_golden_vision.py for a
// reference step and comparing one training or evaluation step of a Tessel model with it
// (logits, loss, every gradient, the buffers after the step).
#pragma once

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/autograd.h"
#include "core/safetensors.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel::models {

using testing::all_close;
using testing::golden_tensor;

inline bool torch_available() {
  static const bool available =
      std::system("/usr/bin/python3 -c 'import torch, torchvision' > /dev/null 2>&1") == 0;
  return available;
}

#define SKIP_WITHOUT_TORCH()                                                               \
  if (!torch_available())                                                                  \
  GTEST_SKIP() << "/usr/bin/python3 cannot import torch and torchvision (Debian packages " \
                  "python3-torch, python3-torchvision): the PyTorch parity check did not run"

inline std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// Runs make_golden_vision.py; returns "" on success, otherwise the command and its output.
inline std::string run_golden_script(const std::string& arguments) {
  const std::string log = temp_path("make_golden_vision.log");
  const std::string command =
      "/usr/bin/python3 tests/golden/make_golden_vision.py " + arguments + " > " + log + " 2>&1";
  if (std::system(command.c_str()) == 0) return "";
  std::ifstream output(log);
  std::stringstream text;
  text << output.rdbuf();
  return "failed: " + command + "\n" + text.str();
}

// The entries of `tensors` whose names start with `prefix`, with the prefix removed.
inline std::map<std::string, Tensor> with_prefix(const std::map<std::string, Tensor>& tensors,
                                                 const std::string& prefix) {
  std::map<std::string, Tensor> selected;
  for (const auto& [name, tensor] : tensors)
    if (name.compare(0, prefix.size(), prefix) == 0) selected[name.substr(prefix.size())] = tensor;
  return selected;
}

// f32 against a reference computed in f64 (the script's default), so the reference carries no
// rounding of its own: the closeness rule for whole f32 models (tests/testing.h).
constexpr double kF32Rtol = 1e-4, kF32Atol = 1e-6;
// f64 against f64: only the order of summation differs.
constexpr double kF64Rtol = 1e-7, kF64Atol = 1e-10;

// How f32 gradients are compared. A ReLU whose input lies within f32 rounding of zero (one in a
// million values) flips between f32 and exact arithmetic and moves every gradient below it by
// about a percent: with the many activations of ResNet-50 or ShuffleNet, PyTorch's own f32
// gradients differ from its f64 ones by far more than 1e-4 at some element (up to 50% in
// ResNet-50). There the f64 run checks every gradient to 1e-7 and f32 gradients are checked in
// norm (a wrong kernel is off by 100%, not a few).
enum class F32Gradients { kElementwise, kNorm };
constexpr double kF32GradientNormRtol = 0.1;

// ||actual - expected||_2 <= rtol * ||expected||_2 + atol * sqrt(n).
inline ::testing::AssertionResult norm_close(const Tensor& actual, const Tensor& expected,
                                             double rtol, double atol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(actual.sizes()) << " vs " << shape_str(expected.sizes());
  const auto a = actual.to_vector<double>();
  const auto b = expected.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
  diff = std::sqrt(diff), norm = std::sqrt(norm);
  if (diff <= rtol * norm + atol * std::sqrt(static_cast<double>(a.size())))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "||diff|| " << diff << " vs ||expected|| " << norm;
}

// Loads the reference state dict into `model` (strict), runs the script's step in `dtype` and
// compares logits, loss, every parameter's gradient and every buffer with the reference.
inline void expect_step_matches(nn::Module& model, const std::map<std::string, Tensor>& golden,
                                bool train, DType dtype, F32Gradients f32_gradients) {
  const bool f64 = dtype == DType::kFloat64;
  const double rtol = f64 ? kF64Rtol : kF32Rtol, atol = f64 ? kF64Atol : kF32Atol;
  model.to(dtype);
  model.load_state_dict(with_prefix(golden, "state."), /*strict=*/true);
  model.train(train);
  model.zero_grad();
  Tensor logits = model.forward(to_dtype(golden_tensor(golden, "input"), dtype));
  Tensor loss = cross_entropy(logits, golden_tensor(golden, "labels"));
  loss.backward();
  EXPECT_TRUE(all_close(logits, golden_tensor(golden, "logits"), rtol, atol)) << "logits";
  EXPECT_TRUE(all_close(loss, golden_tensor(golden, "loss"), rtol, atol)) << "loss";

  const auto reference_grads = with_prefix(golden, "grad.");
  const auto parameters = model.named_parameters();
  EXPECT_EQ(parameters.size(), reference_grads.size());
  for (const auto& [name, parameter] : parameters) {
    ASSERT_TRUE(parameter.grad().defined()) << name << " got no gradient";
    const Tensor& expected = golden_tensor(reference_grads, name);
    if (f64 || f32_gradients == F32Gradients::kElementwise) {
      EXPECT_TRUE(all_close(parameter.grad(), expected, rtol, atol)) << "grad." << name;
    } else {
      EXPECT_TRUE(norm_close(parameter.grad(), expected, kF32GradientNormRtol, atol))
          << "grad." << name;
    }
  }
  // Train mode: running statistics and counters after the step. Eval mode: untouched.
  const auto buffers_after = with_prefix(golden, train ? "after." : "state.");
  for (const auto& [name, buffer] : model.named_buffers()) {
    EXPECT_TRUE(all_close(buffer, golden_tensor(buffers_after, name), rtol, atol)) << name;
  }
}

}  // namespace tessel::models
