#include "core/autograd.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "gtest/gtest.h"
#include "ops/ops.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::throws_error;

TEST(Autograd, ChainRuleThroughSeveralOps) {
  Tensor x = tensor({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor y = sum(mul(exp(x), x));  // d/dx = exp(x) * (x + 1)
  y.backward();
  auto g = x.grad().to_vector<float>();
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(g[i], std::exp(i + 1.0) * (i + 2.0), 1e-4 * std::exp(i + 1.0));
}

TEST(Autograd, GradientsAccumulateOverUsesAndCalls) {
  Tensor x = tensor({2}, {1}).set_requires_grad(true);
  Tensor y = add(mul(x, x), x);  // 2x + 1 = 5
  y.backward(Tensor(), /*retain_graph=*/true);
  EXPECT_EQ(x.grad().item<float>(), 5.0f);
  y.backward();
  EXPECT_EQ(x.grad().item<float>(), 10.0f);
}

TEST(Autograd, BackwardTwiceWithoutRetainGraphIsAClearError) {
  Tensor x = tensor({2}, {1}).set_requires_grad(true);
  Tensor y = mul(x, x);
  y.backward();
  EXPECT_TRUE(throws_error([&] { y.backward(); }, "retain_graph=true"));
}

TEST(Autograd, QueuedCallbacksRunAfterEveryGradientInQueueOrder) {
  Tensor a = tensor({2}, {1}).set_requires_grad(true);
  Tensor b = tensor({3}, {1}).set_requires_grad(true);
  std::vector<std::string> events;
  // Queued from the first gradient hook that fires; by then b's gradient is not accumulated yet.
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    events.push_back("a");
    queue_backward_callback([&] {
      events.push_back("first callback sees b.grad = " + std::to_string(b.grad().item<float>()));
      queue_backward_callback([&] { events.push_back("queued by a callback"); });
    });
    queue_backward_callback([&] { events.push_back("second callback"); });
  });
  b.register_post_accumulate_grad_hook([&](const Tensor&) {
    events.push_back("b");
    EXPECT_TRUE(in_backward_pass());
  });
  mul(a, b).backward();
  EXPECT_FALSE(in_backward_pass());
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[3], "second callback");
  EXPECT_EQ(events[2], "first callback sees b.grad = 2.000000");
  EXPECT_EQ(events[4], "queued by a callback");
}

TEST(Autograd, QueueingACallbackOutsideBackwardIsAClearError) {
  EXPECT_TRUE(throws_error([] { queue_backward_callback([] {}); },
                           "no backward pass is running in this thread"));
}

TEST(Autograd, ACallbackThatThrowsEndsBackwardWithItsError) {
  Tensor x = tensor({2}, {1}).set_requires_grad(true);
  x.register_post_accumulate_grad_hook(
      [](const Tensor&) { queue_backward_callback([] { TESSEL_FAIL("reduction failed"); }); });
  EXPECT_TRUE(throws_error([&] { mul(x, x).backward(); }, "reduction failed"));
  EXPECT_FALSE(in_backward_pass());
  EXPECT_EQ(x.grad().item<float>(), 4.0f);  // the pass itself completed
}

TEST(Autograd, ModifyingASavedTensorInPlaceIsDetected) {
  Tensor a = tensor({1, 2}, {2});
  Tensor w = tensor({3, 4}, {2}).set_requires_grad(true);
  Tensor y = sum(mul(a, w));  // saves a
  a.mul_(2.0);
  EXPECT_TRUE(throws_error([&] { y.backward(); }, "modified in place after it was saved"));
}

TEST(Autograd, NoGradGuardAndDetachStopRecording) {
  Tensor x = ones({2}).set_requires_grad(true);
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(mul(x, x).requires_grad());
  }
  EXPECT_TRUE(mul(x, x).requires_grad());
  Tensor detached = x.detach();
  EXPECT_FALSE(detached.requires_grad());
  EXPECT_EQ(detached.storage(), x.storage());
  EXPECT_FALSE(mul(detached, detached).requires_grad());
}

TEST(Autograd, InferenceModeStopsRecordingAndNests) {
  Tensor x = ones({2}).set_requires_grad(true);
  EXPECT_FALSE(InferenceMode::is_enabled());
  {
    InferenceMode inference;
    EXPECT_TRUE(InferenceMode::is_enabled());
    EXPECT_FALSE(GradMode::is_enabled());
    Tensor y = mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    {
      InferenceMode recording_again(false);  // as libtorch's InferenceMode guard(false)
      EXPECT_TRUE(mul(x, x).requires_grad());
    }
    EXPECT_FALSE(mul(x, x).requires_grad());
  }
  EXPECT_FALSE(InferenceMode::is_enabled());
  EXPECT_TRUE(mul(x, x).requires_grad());
  {
    NoGradGuard no_grad;
    InferenceMode inference;
  }
  EXPECT_TRUE(GradMode::is_enabled());  // restored in reverse order
}

TEST(Autograd, NonScalarBackwardNeedsAnExplicitGradient) {
  Tensor x = ones({2}).set_requires_grad(true);
  Tensor y = mul(x, 3.0);
  EXPECT_TRUE(throws_error([&] { y.backward(); }, "one-element tensors"));
  y.backward(tensor({1, 2}, {2}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{3, 6}));
  EXPECT_TRUE(throws_error([&] { ones({2}).backward(); }, "does not require grad"));
}

TEST(Autograd, HooksCanReplaceGradients) {
  Tensor x = ones({2}).set_requires_grad(true);
  Tensor hidden = mul(x, 2.0);
  hidden.register_hook([](const Tensor& grad) { return mul(grad, 10.0); });
  x.register_hook([](const Tensor& grad) { return add(grad, 1.0); });
  sum(hidden).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{21, 21}));
}

TEST(Autograd, PostAccumulateHookFiresOnceAfterAllContributions) {
  Tensor tied = tensor({1, 2}, {2}).set_requires_grad(true);
  std::vector<std::vector<float>> seen;
  tied.register_post_accumulate_grad_hook(
      [&](const Tensor& leaf) { seen.push_back(leaf.grad().to_vector<float>()); });
  Tensor loss = add(sum(mul(tied, 3.0)), sum(mul(tied, tied)));  // used three times
  loss.backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<float>{5, 7}));
}

TEST(Autograd, GradReturnsGradientsWithoutTouchingDotGrad) {
  Tensor x = tensor({3}, {1}).set_requires_grad(true);
  Tensor y = mul(mul(x, x), x);
  auto grads = grad({y}, {x});
  EXPECT_EQ(grads[0].item<float>(), 27.0f);
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, RetainGradKeepsIntermediateGradients) {
  Tensor x = ones({2}).set_requires_grad(true);
  Tensor hidden = mul(x, 4.0);
  hidden.retain_grad();
  sum(mul(hidden, hidden)).backward();
  EXPECT_EQ(hidden.grad().to_vector<float>(), (std::vector<float>{8, 8}));
}

TEST(Autograd, BroadcastGradientsAreSummedToTheInputShape) {
  Tensor row = ones({1, 3}).set_requires_grad(true);
  Tensor column = ones({4, 1}).set_requires_grad(true);
  sum(mul(row, column)).backward();
  EXPECT_EQ(row.grad().sizes(), (Shape{1, 3}));
  EXPECT_EQ(row.grad().to_vector<float>(), (std::vector<float>{4, 4, 4}));
  EXPECT_EQ(column.grad().to_vector<float>(), (std::vector<float>{3, 3, 3, 3}));
}

TEST(Autograd, DeepChainsDoNotOverflowTheStack) {
  Tensor x = ones({1}).set_requires_grad(true);
  Tensor y = x;
  for (int i = 0; i < 20000; ++i) y = add(y, 0.0);
  y.backward();
  EXPECT_EQ(x.grad().item<float>(), 1.0f);
}

// The growth of the CPU allocator's peak while `loss` backpropagates.
int64_t backward_peak_growth(const Tensor& loss, bool retain_graph = false) {
  auto allocator = memory::allocator_for(Device::cpu());
  const int64_t before = allocator->stats().allocated_bytes;
  allocator->reset_peak();
  loss.backward(Tensor(), retain_graph);
  return allocator->stats().peak_allocated_bytes - before;
}

TEST(Autograd, ReluBackwardWritesIntoAGradientNobodyElseHolds) {
  constexpr int64_t kRows = 256, kColumns = 1024;  // 1 MiB per tensor
  constexpr int64_t kBytes = kRows * kColumns * 4;
  manual_seed(3);
  const Tensor x0 = randn({kRows, kColumns}), w = randn({kRows, kColumns});
  const Tensor expected = mul(w, gt(x0, 0.0).to(DType::kFloat32));

  // mul's backward makes y's gradient, which only the engine holds: relu_backward overwrites it.
  Tensor x = x0.clone().set_requires_grad(true);
  const int64_t reused_peak = backward_peak_growth(sum(mul(relu(x), w)));
  EXPECT_TRUE(all_close(x.grad(), expected, 0, 0));

  // Retained, the same gradient belongs to the user: relu_backward leaves it alone.
  Tensor x2 = x0.clone().set_requires_grad(true);
  Tensor y2 = relu(x2);
  y2.retain_grad();
  const int64_t kept_peak = backward_peak_growth(sum(mul(y2, w)));
  EXPECT_TRUE(all_close(x2.grad(), expected, 0, 0));
  EXPECT_TRUE(all_close(y2.grad(), w, 0, 0)) << "the retained gradient was overwritten";
  EXPECT_GE(kept_peak - reused_peak, kBytes);

  // Held by a hook: the same.
  Tensor x3 = x0.clone().set_requires_grad(true);
  Tensor y3 = relu(x3);
  Tensor seen;
  y3.register_hook([&seen](const Tensor& grad) {
    seen = grad;
    return grad;
  });
  sum(mul(y3, w)).backward();
  EXPECT_TRUE(all_close(seen, w, 0, 0)) << "the hook's gradient was overwritten";
  EXPECT_TRUE(all_close(x3.grad(), expected, 0, 0));
}

TEST(Autograd, GradientsMeetingAtATensorAreSummedInPlace) {
  constexpr int64_t kRows = 256, kColumns = 1024;  // 1 MiB per tensor
  constexpr int64_t kBytes = kRows * kColumns * 4;
  manual_seed(5);
  const Tensor x0 = randn({kRows, kColumns}), w1 = randn({kRows, kColumns}),
               w2 = randn({kRows, kColumns});
  // t's two contributions (g w1 and g w2) meet in the engine's buffer: the first, which only the
  // engine holds, takes the second in place, so no third tensor holds their sum.
  Tensor x = x0.clone().set_requires_grad(true);
  Tensor t = mul(x, 1.5);
  const int64_t peak = backward_peak_growth(sum(add(mul(t, w1), mul(t, w2))));
  EXPECT_TRUE(all_close(x.grad(), mul(add(w1, w2), 1.5), 0, 0));
  EXPECT_LE(peak, 2 * kBytes + 4096);
}

TEST(Autograd, AGradientSomeoneElseHoldsIsNotSummedInPlace) {
  manual_seed(6);
  const Tensor x0 = randn({64, 32}), w = randn({64, 32}), w2 = randn({64, 32});
  // add's backward hands y's gradient on to t as it is; y keeps it (retain_grad), so the second
  // contribution to t (through mul(t, w)) must not be added into it.
  Tensor x = x0.clone().set_requires_grad(true);
  Tensor t = mul(x, 1.5);
  Tensor y = add(t, mul(t, w));
  y.retain_grad();
  sum(mul(y, w2)).backward();
  EXPECT_TRUE(all_close(y.grad(), w2, 0, 0)) << "the retained gradient was summed into";
  EXPECT_TRUE(all_close(x.grad(), mul(add(w2, mul(w2, w)), 1.5), 1e-6, 1e-6));
}

TEST(Autograd, BatchNormBackwardWritesIntoAGradientNobodyElseHolds) {
  manual_seed(4);
  const Tensor x0 = randn({16, 8, 32, 32}), w = randn({16, 8, 32, 32});
  const int64_t bytes = x0.numel() * 4;
  auto run = [&](bool retain, Tensor* x_grad, Tensor* y_grad) {
    Tensor x = x0.clone().set_requires_grad(true);
    Tensor weight = ones({8}).set_requires_grad(true), bias = zeros({8}).set_requires_grad(true);
    Tensor y = batch_norm(x, weight, bias, Tensor(), Tensor(), /*training=*/true);
    if (retain) y.retain_grad();
    const int64_t peak = backward_peak_growth(sum(mul(y, w)));
    *x_grad = x.grad();
    if (retain) *y_grad = y.grad();
    return peak;
  };
  Tensor reused_grad, kept_grad, retained, unused;
  const int64_t reused_peak = run(false, &reused_grad, &unused);
  const int64_t kept_peak = run(true, &kept_grad, &retained);
  EXPECT_TRUE(all_close(reused_grad, kept_grad, 0, 0));
  EXPECT_TRUE(all_close(retained, w, 0, 0)) << "the retained gradient was overwritten";
  EXPECT_GE(kept_peak - reused_peak, bytes);
}

TEST(Autograd, BatchNormBackwardWritesOverAnInputOnlyItsNodeHolds) {
  manual_seed(7);
  const Tensor x0 = randn({16, 8, 32, 32}), g = randn({16, 8, 32, 32});
  // y's gradient g is the caller's, so batch norm cannot write into it; its saved input t, which
  // only the node holds, takes the input gradient instead, unless the graph is kept for another
  // pass. Where t's gradient lies shows which it was.
  auto run = [&](bool retain_graph, Tensor* x_grad) {
    Tensor x = x0.clone().set_requires_grad(true);
    Tensor weight = full({8}, 0.5).set_requires_grad(true);
    Tensor bias = zeros({8}).set_requires_grad(true);
    const void* t_storage = nullptr;
    const void* t_grad_storage = nullptr;
    Tensor y;
    {
      Tensor t = mul(x, 1.5);
      t_storage = t.storage().get();
      t.register_hook([&t_grad_storage](const Tensor& grad) {
        t_grad_storage = grad.storage().get();
        return Tensor();
      });
      y = batch_norm(t, weight, bias, Tensor(), Tensor(), /*training=*/true);
    }
    y.backward(g, retain_graph);
    *x_grad = x.grad();
    return t_grad_storage == t_storage;
  };
  const Tensor g_before = g.clone();
  Tensor written_over_input, fresh;
  EXPECT_TRUE(run(false, &written_over_input)) << "t's gradient was not written over t";
  EXPECT_FALSE(run(true, &fresh)) << "t was overwritten though the graph is kept";
  EXPECT_TRUE(all_close(written_over_input, fresh, 0, 0));
  EXPECT_TRUE(all_close(g, g_before, 0, 0)) << "the caller's gradient was overwritten";
}

TEST(Autograd, BatchNormBackwardLeavesAnInputTheCallerHoldsAlone) {
  manual_seed(8);
  const Tensor x0 = randn({4, 3, 5, 5}), w = randn({4, 3, 5, 5});
  Tensor x = x0.clone().set_requires_grad(true);
  Tensor t = mul(x, 1.5);  // held here as well as by batch norm's node
  Tensor y = batch_norm(t, ones({3}), zeros({3}), Tensor(), Tensor(), /*training=*/true);
  y.retain_grad();
  sum(mul(y, w)).backward();
  EXPECT_TRUE(all_close(t.detach(), mul(x0, 1.5), 0, 0)) << "the caller's tensor was overwritten";
  EXPECT_TRUE(all_close(y.grad(), w, 0, 0));
}

TEST(Autograd, NodesSaveOnlyWhatBackwardNeeds) {
  // add's backward needs nothing: dropping the inputs frees their storage.
  auto allocator = memory::allocator_for(Device::cpu());
  Tensor w = ones({1000}).set_requires_grad(true);
  int64_t before = allocator->stats().allocated_bytes;
  Tensor out;
  {
    Tensor big = mul(w, 2.0);  // saves nothing of its own inputs but the scalar
    out = add(big, 1.0);
  }
  // w's mul output was freed: only `out` (and the scalar operands) remain.
  EXPECT_LE(allocator->stats().allocated_bytes - before, 4000 + 64);
  sum(out).backward();
  EXPECT_TRUE(all_close(w.grad(), full({1000}, 2.0)));
}

}  // namespace
}  // namespace tessel
