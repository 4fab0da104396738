#include "tests/testing.h"

#include <cmath>
#include <sstream>

#include "core/autograd.h"
#include "core/safetensors.h"
#include "ops/ops.h"

namespace tessel::testing {

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol,
                                     double atol) {
  if (!actual.defined() || !expected.defined())
    return ::testing::AssertionFailure() << "undefined tensor";
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.sizes()) << " vs expected "
                                         << shape_str(expected.sizes());
  }
  auto a = actual.to_vector<double>();
  auto b = expected.to_vector<double>();
  double max_diff = 0, max_ref = 0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    double diff = both_nan ? 0 : std::abs(a[i] - b[i]);
    if (std::isnan(diff)) diff = INFINITY;
    if (diff > max_diff) max_diff = diff, worst = i;
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  double tolerance = atol + rtol * max_ref;
  if (max_diff <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |diff| " << max_diff << " > tolerance " << tolerance << " at flat index " << worst
         << " (actual " << a[worst] << ", expected " << b[worst] << ")";
}

::testing::AssertionResult bitwise_equal(const Tensor& actual, const Tensor& expected) {
  if (actual.sizes() != expected.sizes() || actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << actual.str() << " vs " << expected.str();
  }
  auto a = actual.to_vector<double>();
  auto b = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) {
      return ::testing::AssertionFailure()
             << "differs at flat index " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

namespace {
// Offsets (in elements, from the storage start) of every element of `tensor`, row-major.
std::vector<int64_t> element_offsets(const Tensor& tensor) {
  std::vector<int64_t> offsets;
  Shape index(tensor.dim(), 0);
  for (int64_t linear = 0; linear < tensor.numel(); ++linear) {
    int64_t offset = tensor.storage_offset();
    for (int64_t d = 0; d < tensor.dim(); ++d) offset += index[d] * tensor.strides()[d];
    offsets.push_back(offset);
    for (int64_t d = tensor.dim() - 1; d >= 0; --d) {
      if (++index[d] < tensor.sizes()[d]) break;
      index[d] = 0;
    }
  }
  return offsets;
}

double weighted_sum(const Tensor& output, const Tensor& weights) {
  return sum(mul(output.to(kF64), weights)).item<double>();
}
}  // namespace

::testing::AssertionResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                                     double eps, double atol, double rtol) {
  Tensor output = fn(inputs);
  if (!output.requires_grad())
    return ::testing::AssertionFailure() << "output does not require grad";
  Tensor weights = randn(output.sizes(), kF64);
  std::vector<Tensor> wrt;
  for (const auto& input : inputs)
    if (input.defined() && input.requires_grad()) wrt.push_back(input);
  Tensor loss = sum(mul(output.to(kF64), weights));
  std::vector<Tensor> analytic = grad({loss}, wrt);

  NoGradGuard no_grad;
  for (size_t w = 0; w < wrt.size(); ++w) {
    const Tensor& input = wrt[w];
    if (input.dtype() != kF64)
      return ::testing::AssertionFailure() << "gradcheck inputs must be f64";
    if (input.has_internal_overlap())
      return ::testing::AssertionFailure() << "gradcheck input is an expanded view";
    std::vector<int64_t> offsets = element_offsets(input);
    std::vector<double> numeric(offsets.size());
    for (size_t i = 0; i < offsets.size(); ++i) {
      auto poke = [&](double delta) {
        StorageAccess access(*input.storage());
        static_cast<double*>(access.data())[offsets[i]] += delta;
      };
      poke(eps);
      double plus = weighted_sum(fn(inputs), weights);
      poke(-2 * eps);
      double minus = weighted_sum(fn(inputs), weights);
      poke(eps);
      numeric[i] = (plus - minus) / (2 * eps);
    }
    Tensor expected = from_vector<double>(numeric, input.sizes());
    Tensor actual = analytic[w].defined() ? analytic[w] : zeros(input.sizes(), kF64);
    auto result = all_close(actual, expected, rtol, atol);
    if (!result)
      return ::testing::AssertionFailure() << "gradient of input " << w << ": " << result.message();
  }
  return ::testing::AssertionSuccess();
}

std::map<std::string, Tensor> load_golden(const std::string& name) {
  return load_safetensors("tests/golden/" + name + ".safetensors");
}

Tensor golden_tensor(const std::map<std::string, Tensor>& golden, const std::string& key) {
  auto it = golden.find(key);
  TESSEL_CHECK(it != golden.end(), "golden fixture has no tensor '", key, "'");
  return it->second;
}

::testing::AssertionResult throws_error(const std::function<void()>& body,
                                        const std::string& fragment) {
  try {
    body();
  } catch (const Error& error) {
    if (std::string(error.what()).find(fragment) != std::string::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "error message '" << error.what() << "' lacks '" << fragment << "'";
  } catch (const std::exception& other) {
    return ::testing::AssertionFailure() << "threw a non-tessel exception: " << other.what();
  }
  return ::testing::AssertionFailure()
         << "no error thrown (expected one mentioning '" << fragment << "')";
}

}  // namespace tessel::testing
