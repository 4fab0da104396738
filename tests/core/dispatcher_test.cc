#include "core/autograd.h"
#include "core/op.h"
#include "core/rng.h"
#include "gtest/gtest.h"
#include "ops/elementwise.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::throws_error;

TEST(Attrs, AreSortedComparableAndPrintable) {
  Attrs a{{"stride", std::vector<int64_t>{2, 2}}, {"groups", int64_t{1}}, {"eps", 1e-5}};
  Attrs b{{"eps", 1e-5}, {"groups", int64_t{1}}, {"stride", std::vector<int64_t>{2, 2}}};
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.str(), "{eps=1e-05, groups=1, stride=[2, 2]}");
  EXPECT_EQ(a.get<int64_t>("groups"), 1);
  EXPECT_EQ(a.get_or<double>("missing", 3.0), 3.0);
  b.set("groups", int64_t{2});
  EXPECT_NE(a, b);
  EXPECT_TRUE(
      throws_error([&] { a.get<double>("groups"); }, "attribute 'groups' has another type"));
  EXPECT_TRUE(throws_error([&] { a.get<double>("alpha"); }, "missing attribute 'alpha'"));
}

TEST(Registry, UnknownOpsAndDuplicateNamesAreErrors) {
  EXPECT_TRUE(
      throws_error([] { OpRegistry::get().find("no_such_op"); }, "unknown op 'no_such_op'"));
  EXPECT_TRUE(throws_error([] { OpRegistry::get().define(ops::add); }, "registered twice"));
}

TEST(Registry, AHandleIsTheRegisteredOp) {
  EXPECT_EQ(&ops::add.def(), &OpRegistry::get().find("add"));
  EXPECT_STREQ(ops::add.name(), "add");
}

// A backend may attach its kernel before the op's own library registers it (static initialisers
// run in link order): the definition keeps it.
TEST(Registry, AKernelAttachedBeforeRegistrationIsKept) {
  static const OpHandle late{"registry_test_late_op"};
  static int runs = 0;
  late.set_kernel(DeviceType::kCpu, [](KernelContext&) { ++runs; });
  EXPECT_EQ(OpRegistry::get().find_or_null("registry_test_late_op"), nullptr);
  EXPECT_TRUE(throws_error([] { dispatch(late, {ones({2})}); }, "is not registered"));

  OpDef& op = OpRegistry::get().define(late);
  op.kind = OpKind::kPointwise;
  op.autocast = AutocastPolicy::kWiden;
  op.shape = [](const std::vector<Tensor>& inputs, const Attrs&) {
    return std::vector<OutputSpec>{{inputs.at(0).sizes(), inputs[0].dtype()}};
  };
  dispatch(late, {ones({2})});
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(OpRegistry::get().find_or_null("registry_test_late_op"), &late.def());
}

TEST(Registry, EveryOpHasAShapeRuleAndACpuKernelOrView) {
  for (const auto& name : OpRegistry::get().names()) {
    const OpDef& op = OpRegistry::get().find(name);
    if (op.flags.view) {
      EXPECT_TRUE(op.view_fn != nullptr) << name;
      continue;
    }
    EXPECT_TRUE(op.shape != nullptr) << name;
    EXPECT_TRUE(op.kernels[static_cast<int>(DeviceType::kCpu)] != nullptr) << name;
    if (op.flags.random) {
      EXPECT_TRUE(op.rng_counters != nullptr) << name;
    }
  }
}

TEST(Dispatcher, InputsOnDifferentDevicesAreRefused) {
  Tensor on_cpu = ones({2});
  Tensor on_meta = empty({2}, TensorOptions().device(Device::meta()));
  EXPECT_TRUE(
      throws_error([&] { add(on_cpu, on_meta); }, "input 1 is on meta but input 0 is on cpu"));
}

TEST(Dispatcher, OutTensorsAreCheckedAndWrittenInPlace) {
  Tensor a = ones({3});
  Tensor b = full({3}, 2.0);
  const OpDef& add_op = ops::add;
  uint64_t version = a.version();
  dispatch(add_op, {a, b}, {}, {a});
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{3, 3, 3}));
  EXPECT_EQ(a.version(), version + 1);
  Tensor wrong_shape = zeros({4});
  EXPECT_TRUE(throws_error(
      [&] {
        dispatch(add_op, {a, b}, {}, {wrong_shape});
      },
      "out= tensor 0 has shape [4]"));
  Tensor expanded = expand(zeros({1}), {3});
  EXPECT_TRUE(throws_error([&] { dispatch(add_op, {a, b}, {}, {expanded}); }, "expanded view"));
}

TEST(Dispatcher, InPlaceWritesIntoAutogradTensorsAreRefused) {
  Tensor w = ones({3}).set_requires_grad(true);
  EXPECT_TRUE(throws_error([&] { w.add_(ones({3})); }, "use the out-of-place form"));
  {
    NoGradGuard no_grad;
    w.add_(ones({3}));
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(Dispatcher, MetaDeviceTracesShapesWithoutData) {
  std::vector<std::string> traced;
  TraceHook previous = set_trace_hook(
      [&](const OpDef& op, const std::vector<Tensor>&, const std::vector<Tensor>& outs,
          const Attrs&) { traced.push_back(op.name + shape_str(outs[0].sizes())); });
  auto meta = TensorOptions().device(Device::meta());
  Tensor x = empty({64, 512}, meta);
  Tensor w = empty({1024, 512}, meta);
  Tensor y = relu(linear(x, w));
  set_trace_hook(previous);
  EXPECT_EQ(y.sizes(), (Shape{64, 1024}));
  EXPECT_EQ(y.device(), Device::meta());
  ASSERT_EQ(traced.size(), 2u);
  EXPECT_EQ(traced[0], "linear[64, 1024]");
  EXPECT_EQ(traced[1], "relu[64, 1024]");
}

TEST(Dispatcher, RandomOpsRecordTheirRngStateInAttrs) {
  manual_seed(11);
  std::vector<Attrs> seen;
  TraceHook previous = set_trace_hook([&](const OpDef& op, const std::vector<Tensor>&,
                                          const std::vector<Tensor>&, const Attrs& attrs) {
    if (op.flags.random) seen.push_back(attrs);
  });
  randn({10});
  randn({10});
  set_trace_hook(previous);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].get<int64_t>("rng_seed"), 11);
  EXPECT_EQ(seen[0].get<int64_t>("rng_offset"), 0);
  EXPECT_EQ(seen[1].get<int64_t>("rng_offset"), 3);  // ceil(10 / 4) counters consumed
}

}  // namespace
}  // namespace tessel
