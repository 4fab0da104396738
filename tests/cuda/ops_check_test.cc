// The backend-ops checker: every registered op runs on CUDA against the CPU result computed in
// the same process from the same fresh random inputs, forward outputs and input gradients
// (through autograd), with the closeness rule of tests/testing.h. Inputs include transposed, sliced
// and broadcast views. Every op of the registry needs a case here or an explicit skip reason.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/op.h"
#include "core/rng.h"
#include "cuda/runtime.h"
#include "ops/dropout.h"
#include "ops/ops.h"
#include "ops/optimizer_updates.h"
#include "tests/gpu_skip.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using Inputs = std::vector<Tensor>;

// One check: inputs made on the CPU, then the same computation on each device.
struct OpCase {
  std::string label;
  std::vector<std::string> ops;  // registry ops this case runs (forward, backward)
  std::function<Inputs()> make;  // fresh CPU inputs (undefined allowed)
  std::function<Inputs(const Inputs&, Device)> run;  // the outputs, on the inputs' device
  std::vector<int> grad_inputs;                      // inputs whose gradients are compared
  bool exact = false;                                // outputs must match bit for bit
  double rtol = 1e-5, atol = 1e-6;
};

// Ops with no CUDA kernel of their own, and why.
const std::map<std::string, std::string>& skip_reasons() {
  static const std::map<std::string, std::string> reasons{
      {"to_device", "the device copy itself: every case moves its inputs with it"},
      {"tp_copy", "tensor-parallel communication: checked by the parallel tests"},
      {"tp_reduce", "tensor-parallel communication: checked by the parallel tests"},
      {"tp_gather", "tensor-parallel communication: checked by the parallel tests"},
      {"tp_scatter", "tensor-parallel communication: checked by the parallel tests"},
      {"tp_all_to_all", "tensor-parallel communication: checked by the parallel tests"},
      {"tp_reduce_scatter", "tensor-parallel communication: checked by the parallel tests"},
  };
  return reasons;
}

// ---- CPU input makers ----

Tensor uniform(const Shape& sizes, double low, double high, DType dtype = DType::kFloat32) {
  Tensor result = rand(sizes, dtype);
  return add(mul(result, high - low), low);
}
Tensor normal(const Shape& sizes, DType dtype = DType::kFloat32) { return randn(sizes, dtype); }
Tensor integers(const Shape& sizes, int64_t low, int64_t high, DType dtype = DType::kInt64) {
  return randint(low, high, sizes, dtype);
}
Tensor booleans(const Shape& sizes) { return lt(rand(sizes), full({}, 0.5)); }
// Integers as floats: comparisons and extrema see ties.
Tensor small_integers_f32(const Shape& sizes) {
  return to_dtype(integers(sizes, 0, 3), DType::kFloat32);
}

Tensor on(const Tensor& tensor, Device device) {
  if (!tensor.defined()) return tensor;
  return tensor.device() == device ? tensor : tensor.to(device);
}

TensorOptions options(DType dtype, Device device) { return TensorOptions(dtype).device(device); }

// ---- the case table ----

std::vector<OpCase> binary_cases() {
  std::vector<OpCase> cases;
  struct Binary {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
    double low, high;  // range of the second operand (away from 0 for div, positive for pow)
    bool integer, boolean;
  };
  const std::vector<Binary> ops{
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); }, -1, 1, true, true},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, -1, 1, true, false},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, -1, 1, true, true},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, 0.5, 2, true, false},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, -1, 1, true, false},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, -1, 1, true,
       true},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, -1, 1, true,
       true},
  };
  for (const auto& op : ops) {
    const std::string name = op.name;
    const bool is_pow = name == "pow";
    std::vector<std::string> covered{name};
    // Transposed left operand, broadcast right operand, gradients for both.
    cases.push_back({name + " f32 transposed and broadcast",
                     covered,
                     [op, is_pow] {
                       return Inputs{is_pow ? uniform({4, 3}, 0.5, 2) : normal({4, 3}),
                                     uniform({4}, op.low, op.high)};
                     },
                     [op](const Inputs& in, Device) { return Inputs{op.fn(in[0].t(), in[1])}; },
                     {0, 1}});
    cases.push_back({name + " f64 and f32 promote to f64",
                     covered,
                     [op, is_pow] {
                       return Inputs{is_pow ? uniform({2, 3}, 0.5, 2, DType::kFloat64)
                                            : normal({2, 3}, DType::kFloat64),
                                     uniform({2, 1}, op.low, op.high)};
                     },
                     [op](const Inputs& in, Device) { return Inputs{op.fn(in[0], in[1])}; },
                     {0, 1}});
    if (op.integer) {
      cases.push_back({name + " i64 and i32",
                       covered,
                       [is_pow] {
                         return Inputs{integers({3, 4}, is_pow ? 0 : -5, 6),
                                       integers({4}, 1, is_pow ? 4 : 6, DType::kInt32)};
                       },
                       [op](const Inputs& in, Device) { return Inputs{op.fn(in[0], in[1])}; },
                       {},
                       /*exact=*/name != "div"});
    }
    if (op.boolean) {
      cases.push_back({name + " bool",
                       covered,
                       [] {
                         return Inputs{booleans({3, 4}), booleans({3, 4})};
                       },
                       [op](const Inputs& in, Device) { return Inputs{op.fn(in[0], in[1])}; },
                       {},
                       true});
    }
  }
  return cases;
}

std::vector<OpCase> scalar_and_unary_cases() {
  std::vector<OpCase> cases;
  struct Unary {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
    double low, high;
    bool integer;
  };
  const std::vector<Unary> ops{
      {"add_scalar", [](const Tensor& x) { return add(x, 1.5); }, -2, 2, true},
      {"mul_scalar", [](const Tensor& x) { return mul(x, -3.0); }, -2, 2, true},
      {"div_scalar", [](const Tensor& x) { return div(x, 4.0); }, -2, 2, true},
      {"pow_scalar", [](const Tensor& x) { return pow(x, 3.0); }, -2, 2, true},
      {"neg", [](const Tensor& x) { return neg(x); }, -2, 2, true},
      {"abs", [](const Tensor& x) { return abs(x); }, -2, 2, true},
      {"exp", [](const Tensor& x) { return exp(x); }, -2, 2, false},
      {"log", [](const Tensor& x) { return log(x); }, 0.1, 3, false},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.1, 3, false},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.1, 3, false},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -3, 3, false},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -4, 4, false},
      {"relu", [](const Tensor& x) { return relu(x); }, -2, 2, true},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }, -2, 2, true},
  };
  for (const auto& op : ops) {
    const std::string name = op.name;
    std::vector<std::string> covered{name};
    if (name == "relu") covered.push_back("relu_backward");
    cases.push_back({name + " f32 transposed",
                     covered,
                     [op] {
                       return Inputs{uniform({5, 3}, op.low, op.high)};
                     },
                     [op](const Inputs& in, Device) { return Inputs{op.fn(in[0].t())}; },
                     {0}});
    cases.push_back(
        {name + " f64 sliced",
         covered,
         [op] {
           return Inputs{uniform({4, 6}, op.low, op.high, DType::kFloat64)};
         },
         [op](const Inputs& in, Device) { return Inputs{op.fn(in[0].slice(1, 1, 6, 2))}; },
         {0}});
    if (op.integer) {
      cases.push_back({name + " i64",
                       {name},
                       [] {
                         return Inputs{integers({3, 4}, -4, 5)};
                       },
                       [op](const Inputs& in, Device) { return Inputs{op.fn(in[0])}; },
                       {},
                       true});
    }
  }
  cases.push_back({"pow_scalar square and root",
                   {"pow_scalar"},
                   [] {
                     return Inputs{uniform({3, 4}, 0.2, 2)};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{pow(in[0], 2.0), pow(in[0], 0.5)};
                   },
                   {0}});
  for (const char* approximate : {"none", "tanh"}) {
    cases.push_back(
        {std::string("gelu ") + approximate,
         {"gelu", "gelu_backward"},
         [] {
           return Inputs{normal({6, 5})};
         },
         [approximate](const Inputs& in, Device) { return Inputs{gelu(in[0].t(), approximate)}; },
         {0}});
  }
  return cases;
}

std::vector<OpCase> selection_cases() {
  std::vector<OpCase> cases;
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>>
      comparisons{{"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
                  {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
                  {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
                  {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
                  {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
                  {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }}};
  for (const auto& [name, fn] : comparisons) {
    auto compare = fn;
    cases.push_back(
        {name + " f32 with ties, broadcast",
         {name},
         [] {
           return Inputs{small_integers_f32({4, 3}), small_integers_f32({4})};
         },
         [compare](const Inputs& in, Device) { return Inputs{compare(in[0].t(), in[1])}; },
         {},
         true});
    cases.push_back(
        {name + " i64 against f64",
         {name},
         [] {
           return Inputs{integers({3, 4}, 0, 3), to_dtype(integers({3, 1}, 0, 3), DType::kFloat64)};
         },
         [compare](const Inputs& in, Device) { return Inputs{compare(in[0], in[1])}; },
         {},
         true});
  }
  cases.push_back({"where broadcast condition",
                   {"where"},
                   [] {
                     return Inputs{booleans({3, 1}), normal({4, 3}), normal({4})};
                   },
                   [](const Inputs& in, Device) { return Inputs{where(in[0], in[1].t(), in[2])}; },
                   {1, 2}});
  cases.push_back({"where i64 with u8 condition",
                   {"where"},
                   [] {
                     return Inputs{to_dtype(booleans({2, 5}), DType::kUInt8),
                                   integers({2, 5}, -9, 9), integers({5}, -9, 9)};
                   },
                   [](const Inputs& in, Device) { return Inputs{where(in[0], in[1], in[2])}; },
                   {},
                   true});
  cases.push_back(
      {"masked_fill broadcast mask",
       {"masked_fill"},
       [] {
         return Inputs{normal({5, 4}), booleans({1, 5})};
       },
       [](const Inputs& in, Device) { return Inputs{masked_fill(in[0].t(), in[1], -7.25)}; },
       {0}});
  cases.push_back({"masked_fill i32",
                   {"masked_fill"},
                   [] {
                     return Inputs{integers({3, 4}, -5, 5, DType::kInt32), booleans({3, 4})};
                   },
                   [](const Inputs& in, Device) { return Inputs{masked_fill(in[0], in[1], 3)}; },
                   {},
                   true});
  return cases;
}

std::vector<OpCase> reduction_cases() {
  std::vector<OpCase> cases;
  // [3, 4, 5] read through a permutation of a [5, 4, 3] tensor: non-contiguous.
  auto permuted = [](const Tensor& x) { return x.permute({2, 1, 0}); };
  const std::vector<std::pair<std::string, std::vector<int64_t>>> dim_sets{
      {"dim 1 keepdim", {1}}, {"dims 0 and 2", {0, 2}}, {"all", {}}};
  for (const auto& [label, dims] : dim_sets) {
    const bool keepdim = label == "dim 1 keepdim";
    std::vector<int64_t> reduce_dims = dims;
    cases.push_back({"sum " + label,
                     {"sum"},
                     [] {
                       return Inputs{normal({5, 4, 3})};
                     },
                     [=](const Inputs& in, Device) {
                       return Inputs{sum(permuted(in[0]), reduce_dims, keepdim)};
                     },
                     {0}});
    cases.push_back({"mean " + label,
                     {"mean"},
                     [] {
                       return Inputs{normal({5, 4, 3})};
                     },
                     [=](const Inputs& in, Device) {
                       return Inputs{mean(permuted(in[0]), reduce_dims, keepdim)};
                     },
                     {0}});
    cases.push_back({"var " + label,
                     {"var"},
                     [] {
                       return Inputs{normal({5, 4, 3}, DType::kFloat64)};
                     },
                     [=](const Inputs& in, Device) {
                       return Inputs{var(permuted(in[0]), reduce_dims, !keepdim, keepdim)};
                     },
                     {0}});
  }
  cases.push_back({"sum long rows",
                   {"sum"},
                   [] {
                     return Inputs{normal({3, 5000})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{sum(in[0], {1}), sum(in[0], {0})};
                   },
                   {0}});
  cases.push_back({"sum integers and bools",
                   {"sum"},
                   [] {
                     return Inputs{integers({4, 6}, -50, 50), booleans({4, 6})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{sum(in[0], {0}), sum(in[1]), sum(in[0])};
                   },
                   {},
                   true});
  for (bool is_max : {true, false}) {
    const std::string name = is_max ? "max" : "min";
    cases.push_back(
        {name + " along dims",
         {name},
         [] {
           return Inputs{normal({5, 4, 3})};
         },
         [is_max](const Inputs& in, Device) {
           const Tensor x = in[0].permute({2, 1, 0});
           const OpDef& op = OpRegistry::get().find(is_max ? "max" : "min");
           Inputs outputs = dispatch(op, {x}, Attrs{{"dim", int64_t{1}}, {"keepdim", false}});
           Inputs more = dispatch(op, {x}, Attrs{{"dim", int64_t{-1}}, {"keepdim", true}});
           outputs.insert(outputs.end(), more.begin(), more.end());
           return outputs;
         },
         {0},
         /*exact=*/true});
    cases.push_back({name + " with ties picks the first index",
                     {name},
                     [] {
                       return Inputs{small_integers_f32({6, 7})};
                     },
                     [is_max](const Inputs& in, Device) {
                       const OpDef& op = OpRegistry::get().find(is_max ? "max" : "min");
                       return dispatch(op, {in[0]}, Attrs{{"dim", int64_t{1}}, {"keepdim", false}});
                     },
                     {},
                     true});
    cases.push_back({name + "_all",
                     {name + "_all"},
                     [] {
                       return Inputs{normal({4, 5})};
                     },
                     [is_max](const Inputs& in, Device) {
                       return Inputs{is_max ? max(in[0].t()) : min(in[0].t())};
                     },
                     {0},
                     true});
  }
  cases.push_back({"argmax",
                   {"argmax"},
                   [] {
                     return Inputs{small_integers_f32({5, 6}), integers({4, 3}, 0, 4)};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{argmax(in[0], 1), argmax(in[0].t(), 1, true), argmax(in[1], 0)};
                   },
                   {},
                   true});
  for (bool log_form : {false, true}) {
    const std::string name = log_form ? "log_softmax" : "softmax";
    for (int64_t dim : {-1, 0}) {
      cases.push_back({name + " dim " + std::to_string(dim),
                       {name},
                       [] {
                         return Inputs{mul(normal({6, 4, 5}), 3.0)};
                       },
                       [=](const Inputs& in, Device) {
                         const Tensor x = in[0].transpose(0, 2);
                         return Inputs{log_form ? log_softmax(x, dim) : softmax(x, dim)};
                       },
                       {0}});
    }
  }
  return cases;
}

std::vector<OpCase> creation_and_copy_cases() {
  std::vector<OpCase> cases;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64, DType::kBool}) {
    cases.push_back({std::string("full ") + dtype_name(dtype),
                     {"full"},
                     [] { return Inputs{}; },
                     [dtype](const Inputs&, Device device) {
                       return Inputs{full({3, 5}, 2.75, options(dtype, device))};
                     },
                     {},
                     true});
  }
  cases.push_back({"arange",
                   {"arange"},
                   [] { return Inputs{}; },
                   [](const Inputs&, Device device) {
                     return Inputs{arange(7, options(DType::kInt64, device)),
                                   arange(-1.0, 2.0, 0.25, options(DType::kFloat32, device)),
                                   arange(0.0, 3.0, 0.5, options(DType::kFloat64, device))};
                   },
                   {},
                   true});
  // The same Philox stream on both devices: uniform numbers and integers bit for bit.
  cases.push_back({"rand",
                   {"rand"},
                   [] { return Inputs{}; },
                   [](const Inputs&, Device device) {
                     manual_seed(77);
                     Tensor strided = zeros({6, 5}, options(DType::kFloat32, device)).t();
                     uniform_(strided, -2, 3);
                     return Inputs{rand({7, 3}, options(DType::kFloat32, device)),
                                   rand({5}, options(DType::kFloat64, device)),
                                   rand({9}, options(DType::kBFloat16, device)), strided};
                   },
                   {},
                   true});
  cases.push_back({"randn",
                   {"randn"},
                   [] { return Inputs{}; },
                   [](const Inputs&, Device device) {
                     manual_seed(78);
                     Tensor strided = zeros({4, 6}, options(DType::kFloat32, device)).t();
                     normal_(strided, 1.0, 2.0);
                     return Inputs{randn({7, 3}, options(DType::kFloat32, device)),
                                   randn({5}, options(DType::kFloat64, device)), strided};
                   },
                   {}});
  cases.push_back({"randint",
                   {"randint"},
                   [] { return Inputs{}; },
                   [](const Inputs&, Device device) {
                     manual_seed(79);
                     return Inputs{randint(-5, 1000, {11}, options(DType::kInt64, device)),
                                   randint(0, 7, {3, 3}, options(DType::kInt32, device))};
                   },
                   {},
                   true});
  cases.push_back({"dropout",
                   {"dropout"},
                   [] {
                     return Inputs{normal({6, 7})};
                   },
                   [](const Inputs& in, Device) {
                     manual_seed(80);
                     return dispatch(ops::dropout, {in[0].t()}, Attrs{{"p", 0.3}});
                   },
                   {0},
                   true});
  // Non-negative values: a negative float cast to u8 is undefined behaviour in C++.
  for (DType target : {DType::kBFloat16, DType::kFloat16, DType::kInt32, DType::kFloat64,
                       DType::kBool, DType::kUInt8}) {
    cases.push_back(
        {std::string("to_dtype f32 to ") + dtype_name(target),
         {"to_dtype"},
         [] {
           return Inputs{uniform({4, 3}, 0, 250)};
         },
         [target](const Inputs& in, Device) { return Inputs{to_dtype(in[0].t(), target)}; },
         {},
         true});
  }
  cases.push_back({"to_dtype from 16-bit, integers and bools",
                   {"to_dtype"},
                   [] {
                     return Inputs{to_dtype(normal({3, 4}), DType::kBFloat16),
                                   to_dtype(normal({3, 4}), DType::kFloat16),
                                   integers({3, 4}, -100, 100), booleans({3, 4})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{
                         to_dtype(in[0], DType::kFloat32), to_dtype(in[1], DType::kFloat64),
                         to_dtype(in[2], DType::kFloat32), to_dtype(in[3], DType::kInt64)};
                   },
                   {},
                   true});
  cases.push_back(
      {"to_dtype gradient",
       {"to_dtype"},
       [] {
         return Inputs{normal({3, 4})};
       },
       [](const Inputs& in, Device) { return Inputs{to_dtype(in[0].t(), DType::kFloat64)}; },
       {0}});
  cases.push_back({"clone and contiguous",
                   {"clone", "contiguous"},
                   [] {
                     return Inputs{normal({4, 5})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{clone(in[0].t()), contiguous(in[0].slice(1, 0, 5, 2))};
                   },
                   {0},
                   true});
  cases.push_back({"copy_ broadcast and convert",
                   {"copy_"},
                   [] {
                     return Inputs{normal({4}, DType::kFloat64), normal({3, 3})};
                   },
                   [](const Inputs& in, Device device) {
                     NoGradGuard no_grad;
                     Tensor destination = zeros({3, 4}, options(DType::kFloat32, device));
                     destination.copy_(in[0]);
                     // Overlapping views: the transpose is read before it is overwritten.
                     Tensor square = clone(in[1]);
                     square.copy_(square.t());
                     return Inputs{destination, square};
                   },
                   {},
                   true});
  cases.push_back({"fill_ strided",
                   {"fill_"},
                   [] { return Inputs{}; },
                   [](const Inputs&, Device device) {
                     NoGradGuard no_grad;
                     Tensor base = zeros({4, 6}, options(DType::kFloat32, device));
                     Tensor view = base.slice(1, 1, 6, 2);
                     view.fill_(-1.5);
                     return Inputs{base};
                   },
                   {},
                   true});
  return cases;
}

std::vector<OpCase> indexing_cases() {
  std::vector<OpCase> cases;
  cases.push_back({"cat dim 0 and 1",
                   {"cat"},
                   [] {
                     return Inputs{normal({2, 3}), normal({3, 4}), normal({1, 3})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{cat({in[0], in[1].t(), in[2]}, 0), cat({in[0].t(), in[1]}, 1)};
                   },
                   {0, 1, 2},
                   true});
  cases.push_back({"slice and select gradients",
                   {"slice_backward"},
                   [] {
                     return Inputs{normal({5, 6})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{in[0].slice(1, 1, 6, 2), in[0].select(0, 3)};
                   },
                   {0},
                   true});
  cases.push_back({"index_select",
                   {"index_select", "index_select_backward"},
                   [] {
                     return Inputs{normal({5, 6}), integers({7}, 0, 5)};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{index_select(in[0].t(), 1, in[1]),
                                   index_select(in[0], 0, to_dtype(in[1], DType::kInt32))};
                   },
                   {0}});
  cases.push_back({"gather",
                   {"gather", "gather_backward"},
                   [] {
                     return Inputs{normal({4, 5}), integers({4, 3}, 0, 5), integers({2, 5}, 0, 4)};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{gather(in[0], 1, in[1]), gather(in[0], 0, in[2]),
                                   gather(in[0].t(), 0, in[1].t())};
                   },
                   {0}});
  cases.push_back({"embedding",
                   {"embedding", "embedding_backward"},
                   [] {
                     return Inputs{normal({10, 5}), integers({3, 4}, 0, 10)};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{embedding(in[0], in[1]),
                                   embedding(in[0], to_dtype(in[1], DType::kInt32), 2)};
                   },
                   {0}});
  return cases;
}

std::vector<OpCase> nn_cases() {
  std::vector<OpCase> cases;
  cases.push_back({"layer_norm with affine",
                   {"layer_norm", "layer_norm_backward"},
                   [] {
                     return Inputs{normal({6, 3, 4}), normal({6}), normal({6})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{layer_norm(in[0].permute({1, 2, 0}), {6}, in[1], in[2])};
                   },
                   {0, 1, 2}});
  cases.push_back({"layer_norm over two dims, no affine",
                   {"layer_norm", "layer_norm_backward"},
                   [] {
                     return Inputs{add(mul(normal({2, 3, 8}, DType::kFloat64), 5.0), 3.0)};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{layer_norm(in[0], {3, 8})};
                   },
                   {0}});
  // Targets with some ignored positions.
  auto targets = [](const Shape& sizes, int64_t classes) {
    return where(lt(rand(sizes), full({}, 0.25)), full({}, -100.0, DType::kInt64),
                 integers(sizes, 0, classes));
  };
  for (const char* reduction : {"mean", "sum", "none"}) {
    cases.push_back({std::string("cross_entropy ") + reduction,
                     {"cross_entropy", "cross_entropy_backward"},
                     [targets] {
                       return Inputs{normal({7, 5}), targets({5}, 7)};
                     },
                     [reduction](const Inputs& in, Device) {
                       return Inputs{cross_entropy(in[0].t(), in[1], -100, 0.0, reduction)};
                     },
                     {0}});
    cases.push_back({std::string("nll_loss ") + reduction,
                     {"nll_loss", "nll_loss_backward"},
                     [targets] {
                       return Inputs{normal({2, 4, 3}), targets({2, 3}, 4)};
                     },
                     [reduction](const Inputs& in, Device) {
                       return Inputs{nll_loss(in[0], in[1], -100, reduction)};
                     },
                     {0}});
    cases.push_back({std::string("mse_loss ") + reduction,
                     {"mse_loss"},
                     [] {
                       return Inputs{normal({4, 3}), normal({3, 4})};
                     },
                     [reduction](const Inputs& in, Device) {
                       return Inputs{mse_loss(in[0].t(), in[1], reduction)};
                     },
                     {0, 1}});
  }
  cases.push_back({"cross_entropy spatial with label smoothing",
                   {"cross_entropy", "cross_entropy_backward"},
                   [] {
                     return Inputs{normal({2, 5, 3, 2}), integers({2, 3, 2}, 0, 5)};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{cross_entropy(in[0], in[1], -100, 0.1, "mean")};
                   },
                   {0}});
  cases.push_back({"cross_entropy one sample",
                   {"cross_entropy", "cross_entropy_backward"},
                   [] {
                     return Inputs{normal({6}, DType::kFloat64), integers({}, 0, 6)};
                   },
                   [](const Inputs& in, Device) { return Inputs{cross_entropy(in[0], in[1])}; },
                   {0}});
  return cases;
}

// Cases for the ops backed by cuBLAS and cuDNN (looser: their summation order differs).
std::vector<OpCase> library_cases() {
  std::vector<OpCase> cases;
  cases.push_back(
      {"matmul and bmm",
       {"matmul", "bmm"},
       [] {
         return Inputs{normal({4, 3}), normal({4, 5}), normal({2, 3, 4}), normal({2, 4, 2})};
       },
       [](const Inputs& in, Device) {
         return Inputs{matmul(in[0].t(), in[1]), bmm(in[2], in[3])};
       },
       {0, 1, 2, 3},
       false,
       1e-4,
       1e-5});
  cases.push_back({"linear",
                   {"linear"},
                   [] {
                     return Inputs{normal({5, 3}), normal({4, 3}), normal({4})};
                   },
                   [](const Inputs& in, Device) { return Inputs{linear(in[0], in[1], in[2])}; },
                   {0, 1, 2},
                   false,
                   1e-4,
                   1e-5});
  cases.push_back({"addmm",
                   {"addmm"},
                   [] {
                     return Inputs{normal({4, 5}), normal({3, 4}), normal({3, 5})};
                   },
                   [](const Inputs& in, Device) {
                     // out of place with a transposed operand, then in place into a copy of c
                     Tensor sum = clone(in[0]);
                     {
                       NoGradGuard no_grad;
                       sum.addmm_(in[1].t(), in[2]);
                     }
                     return Inputs{addmm(in[0], in[1].t(), in[2]), sum};
                   },
                   {0, 1, 2},
                   false,
                   1e-4,
                   1e-5});
  cases.push_back({"conv2d",
                   {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"},
                   [] {
                     return Inputs{normal({2, 4, 7, 6}), normal({6, 2, 3, 3}), normal({6})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{conv2d(in[0], in[1], in[2], {2, 1}, {1, 1}, {1, 1}, 2)};
                   },
                   {0, 1, 2},
                   false,
                   1e-4,
                   1e-5});
  cases.push_back({"pools",
                   {"max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
                    "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward"},
                   [] {
                     return Inputs{normal({2, 3, 8, 7})};
                   },
                   [](const Inputs& in, Device) {
                     return Inputs{max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}),
                                   avg_pool2d(in[0], {2, 2}), adaptive_avg_pool2d(in[0], {3, 2})};
                   },
                   {0},
                   false,
                   1e-4,
                   1e-5});
  cases.push_back({"batch_norm training and eval",
                   {"batch_norm", "batch_norm_backward", "batch_norm_eval"},
                   [] {
                     return Inputs{normal({4, 3, 5, 2}), normal({3}), normal({3})};
                   },
                   [](const Inputs& in, Device device) {
                     Tensor running_mean = zeros({3}, options(DType::kFloat32, device));
                     Tensor running_var = ones({3}, options(DType::kFloat32, device));
                     Tensor y = batch_norm(in[0], in[1], in[2], running_mean, running_var, true);
                     Tensor y_eval =
                         batch_norm(in[0], in[1], in[2], running_mean, running_var, false);
                     return Inputs{y, y_eval, running_mean, running_var};
                   },
                   {0, 1, 2},
                   false,
                   1e-4,
                   1e-5});
  return cases;
}

std::vector<OpCase> optimizer_cases() {
  std::vector<OpCase> cases;
  cases.push_back({"sgd_update momentum, nesterov, weight decay",
                   {"sgd_update"},
                   [] {
                     return Inputs{normal({5, 4}), normal({5, 4}), normal({5, 4})};
                   },
                   [](const Inputs& in, Device) {
                     NoGradGuard no_grad;
                     Tensor param = clone(in[0]), buffer = clone(in[2]);
                     Attrs attrs{{"lr", 0.1},          {"momentum", 0.9},      {"dampening", 0.1},
                                 {"nesterov", true},   {"weight_decay", 1e-2}, {"maximize", false},
                                 {"first_step", false}};
                     dispatch(ops::sgd_update, {param, in[1], buffer}, attrs, {param, buffer});
                     // Strided parameter, no momentum.
                     Tensor strided = clone(in[0]).t();
                     attrs.set("momentum", 0.0);
                     dispatch(ops::sgd_update, {strided, in[1].t(), Tensor()}, attrs, {strided});
                     return Inputs{param, buffer, strided};
                   },
                   {}});
  for (bool decoupled : {false, true}) {
    cases.push_back(
        {std::string("adam_update ") + (decoupled ? "AdamW" : "amsgrad"),
         {"adam_update"},
         [] {
           return Inputs{normal({6, 3}), normal({6, 3}), normal({6, 3}), abs(normal({6, 3})),
                         abs(normal({6, 3}))};
         },
         [decoupled](const Inputs& in, Device) {
           NoGradGuard no_grad;
           Tensor param = clone(in[0]), m = clone(in[2]), v = clone(in[3]);
           Tensor v_max = clone(in[4]);
           Attrs attrs{{"lr", 1e-2},
                       {"beta1", 0.9},
                       {"beta2", 0.999},
                       {"eps", 1e-8},
                       {"weight_decay", 0.1},
                       {"decoupled", decoupled},
                       {"amsgrad", !decoupled},
                       {"maximize", false},
                       {"step", int64_t{3}}};
           if (decoupled) {
             dispatch(ops::adam_update, {param, in[1], m, v, Tensor()}, attrs, {param, m, v});
             return Inputs{param, m, v};
           }
           dispatch(ops::adam_update, {param, in[1], m, v, v_max}, attrs, {param, m, v, v_max});
           return Inputs{param, m, v, v_max};
         },
         {}});
  }
  return cases;
}

const std::vector<OpCase>& all_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> result;
    for (auto make :
         {binary_cases, scalar_and_unary_cases, selection_cases, reduction_cases,
          creation_and_copy_cases, indexing_cases, nn_cases, library_cases, optimizer_cases}) {
      std::vector<OpCase> part = make();
      result.insert(result.end(), part.begin(), part.end());
    }
    return result;
  }();
  return cases;
}

struct DeviceRun {
  Inputs outputs;
  std::vector<Tensor> grads;  // one per OpCase::grad_inputs entry (undefined: none)
};

// Runs `c` on `device` from copies of the CPU inputs; the loss for gradients weights every
// floating output by fixed random values.
DeviceRun run_case(const OpCase& c, const Inputs& cpu_inputs, const Inputs& cpu_weights,
                   Device device) {
  Inputs inputs;
  for (size_t i = 0; i < cpu_inputs.size(); ++i) {
    Tensor input = on(cpu_inputs[i], device);
    if (input.defined() && input.is_same(cpu_inputs[i])) input = input.detach();
    inputs.push_back(input);
  }
  for (int i : c.grad_inputs) inputs[i].set_requires_grad(true);
  manual_seed(4242);
  DeviceRun run;
  run.outputs = c.run(inputs, device);
  if (!c.grad_inputs.empty()) {
    Tensor loss;
    for (size_t k = 0; k < run.outputs.size() && k < cpu_weights.size(); ++k) {
      const Tensor& output = run.outputs[k];
      if (!output.defined() || !output.requires_grad()) continue;
      Tensor term = sum(mul(output, on(cpu_weights[k], device)));
      loss = loss.defined() ? add(loss, term) : term;
    }
    if (loss.defined()) loss.backward();
    for (int i : c.grad_inputs) run.grads.push_back(inputs[i].grad());
  }
  return run;
}

::testing::AssertionResult outputs_match(const OpCase& c, const Tensor& actual,
                                         const Tensor& expected) {
  if (!actual.defined() || !expected.defined()) {
    if (actual.defined() == expected.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "defined on one device only";
  }
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(actual.dtype()) << " vs " << dtype_name(expected.dtype());
  if (!actual.device().is_cuda())
    return ::testing::AssertionFailure() << "result is on " << actual.device().str();
  if (c.exact || !is_floating(expected.dtype())) return bitwise_equal(actual, expected);
  return all_close(actual, expected, c.rtol, c.atol);
}

// Every op is a view (no kernel), has a skip reason, or has a CUDA kernel and a case.
TEST(CudaOps, EveryRegisteredOpHasACaseOrASkipReason) {
  std::set<std::string> covered;
  for (const auto& c : all_cases()) covered.insert(c.ops.begin(), c.ops.end());
  for (const std::string& name : OpRegistry::get().names()) {
    const OpDef& op = OpRegistry::get().find(name);
    if (op.flags.view || skip_reasons().count(name)) continue;
    EXPECT_TRUE(op.kernels[static_cast<int>(DeviceType::kCuda)] != nullptr)
        << name << ": no CUDA kernel and no skip reason";
    EXPECT_TRUE(covered.count(name)) << name << ": no case in tests/cuda/ops_check_test.cc";
  }
}

TEST(CudaOps, ForwardAndBackwardMatchCpu) {
  TESSEL_SKIP_IF_NO_GPU();
  // Which ops each case actually ran on the GPU.
  std::set<std::string> ran_on_cuda;
  TraceHook previous = set_trace_hook([&](const OpDef& op, const std::vector<Tensor>&,
                                          const std::vector<Tensor>& outputs, const Attrs&) {
    if (!outputs.empty() && outputs[0].defined() && outputs[0].device().is_cuda())
      ran_on_cuda.insert(op.name);
  });
  const Device gpu = Device::cuda(0);
  int index = 0;
  for (const auto& c : all_cases()) {
    SCOPED_TRACE(c.label);
    ran_on_cuda.clear();
    manual_seed(1000 + index++);
    const Inputs cpu_inputs = c.make();
    DeviceRun expected;
    try {
      expected = run_case(c, cpu_inputs, {}, Device::cpu());
    } catch (const Error& error) {
      ADD_FAILURE() << "CPU run threw: " << error.what();
      continue;
    }
    Inputs weights;
    for (const auto& output : expected.outputs)
      weights.push_back(output.defined() && is_floating(output.dtype())
                            ? randn(output.sizes(), output.dtype())
                            : Tensor());
    expected = run_case(c, cpu_inputs, weights, Device::cpu());
    DeviceRun actual;
    try {
      actual = run_case(c, cpu_inputs, weights, gpu);
    } catch (const Error& error) {
      ADD_FAILURE() << "CUDA run threw: " << error.what();
      continue;
    }
    ASSERT_EQ(actual.outputs.size(), expected.outputs.size());
    for (size_t k = 0; k < expected.outputs.size(); ++k)
      EXPECT_TRUE(outputs_match(c, actual.outputs[k], expected.outputs[k])) << "output " << k;
    for (size_t g = 0; g < expected.grads.size(); ++g) {
      if (!expected.grads[g].defined()) {
        EXPECT_FALSE(actual.grads[g].defined()) << "gradient of input " << c.grad_inputs[g];
        continue;
      }
      ASSERT_TRUE(actual.grads[g].defined()) << "no gradient for input " << c.grad_inputs[g];
      EXPECT_TRUE(all_close(actual.grads[g], expected.grads[g], std::max(c.rtol, 1e-5), c.atol))
          << "gradient of input " << c.grad_inputs[g];
    }
    for (const auto& name : c.ops)
      EXPECT_TRUE(ran_on_cuda.count(name)) << name << " did not run on CUDA in this case";
  }
  set_trace_hook(previous);
}

TEST(CudaOps, BadIndicesGiveTheCpuMessage) {
  TESSEL_SKIP_IF_NO_GPU();
  const Device gpu = Device::cuda(0);
  Tensor weight = randn({4, 3}).to(gpu);
  Tensor indices = from_vector<int64_t>({0, 7}, {2}).to(gpu);
  // Checked on the device: the op returns, and the next synchronisation raises the bad index.
  Tensor rows = embedding(weight, indices);
  EXPECT_TRUE(testing::throws_error([&] { rows.to(Device::cpu()); },
                                    "embedding: index 7 is out of range for an embedding table of "
                                    "size 4 (valid: 0..3"));
  // Reported once: the next synchronisation is clean, and the good row was gathered.
  EXPECT_TRUE(bitwise_equal(rows.to(Device::cpu()).narrow(0, 0, 1),
                            weight.to(Device::cpu()).narrow(0, 0, 1)));
  Tensor logits = randn({2, 3}).to(gpu);
  Tensor target = from_vector<int64_t>({1, 5}, {2}).to(gpu);
  Tensor loss = cross_entropy(logits, target);
  EXPECT_TRUE(testing::throws_error([&] { loss.item<float>(); },
                                    "cross_entropy: target 5 (at flat index 1)"));
  // The first bad index in stream order is the one reported, at its lowest position.
  Tensor selected = index_select(weight, 0, from_vector<int64_t>({9, 1, -3}, {3}).to(gpu));
  Tensor gathered = embedding(weight, from_vector<int64_t>({4}, {1}).to(gpu));
  EXPECT_TRUE(testing::throws_error([&] { cuda::synchronize(0); },
                                    "index_select: index 9 is out of range for dimension 0"));
  cuda::synchronize(0);
}

TEST(CudaOps, DropoutMaskIsTheCpuMaskForTheSameSeed) {
  TESSEL_SKIP_IF_NO_GPU();
  const OpDef& op = ops::dropout;
  Tensor x = randn({1000, 3});
  Attrs attrs{{"p", 0.5}, {"rng_seed", int64_t{123}}, {"rng_offset", int64_t{456}}};
  Inputs cpu = dispatch(op, {x}, attrs);
  Inputs gpu = dispatch(op, {x.to(Device::cuda(0))}, attrs);
  EXPECT_TRUE(bitwise_equal(gpu[1], cpu[1]));
  EXPECT_TRUE(bitwise_equal(gpu[0], cpu[0]));
}

}  // namespace
}  // namespace tessel
