// Test helpers shared by every suite: the one closeness rule, bitwise equality,
// finite-difference gradient checks in f64, and golden fixtures made by tests/golden/*.py.
//   EXPECT_TRUE(all_close(actual, expected));           // rtol 1e-5, atol 1e-6
//   EXPECT_TRUE(gradcheck([](auto& in) { return tanh(in[0]); }, {randn({3},
//   kF64).set_requires_grad(true)}));
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"

namespace tessel::testing {

constexpr DType kF64 = DType::kFloat64;

// max|actual - expected| <= atol + rtol * max|expected|, shapes equal.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected,
                                     double rtol = 1e-5, double atol = 1e-6);
// Same shape, dtype and bytes.
::testing::AssertionResult bitwise_equal(const Tensor& actual, const Tensor& expected);

using TensorFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;
// Compares autograd gradients of sum(fn(inputs) * r), r random, with central finite differences
// for every input that requires grad. Inputs should be f64; they may be non-contiguous views
// (but not expanded ones).
::testing::AssertionResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                                     double eps = 1e-6, double atol = 1e-5, double rtol = 1e-4);

// Tensors of tests/golden/<name>.safetensors (path relative to the workspace root).
std::map<std::string, Tensor> load_golden(const std::string& name);
// A tensor from a golden map, with a clear failure when the key is missing.
Tensor golden_tensor(const std::map<std::string, Tensor>& golden, const std::string& key);

// Runs `body`, expecting a tessel::Error whose message contains `fragment`.
::testing::AssertionResult throws_error(const std::function<void()>& body,
                                        const std::string& fragment);

}  // namespace tessel::testing
