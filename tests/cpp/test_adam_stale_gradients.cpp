// A committed gradient an optimizer already stepped with is not applied
// again. backward() replaces only the gradients of the leaves it reaches; a
// parameter frozen since, an inactive adapter or an unused branch kept its
// previous gradient, and every later step() moved it with that gradient
// again (PyTorch's loop, whose zero_grad() leaves such a .grad None, keeps
// it still). Same for the fused step and ShardedAdam.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/zero_adam.hpp"

using namespace riftco_transformer;

namespace {

std::vector<float> values_of(const Variable& v) { return v.value().to_vector(); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Variable param(float start, const char* name) { return Variable(Tensor::full({3}, start), true, name); }

/// sum(p ∘ p) over the given parameters.
Variable loss_of(std::initializer_list<Variable> ps) {
  Variable total;
  for (const Variable& p : ps) {
    const Variable term = sum(mul(p, p));
    total = total.defined() ? add(total, term) : term;
  }
  return total;
}

}  // namespace

TEST(AdamStaleGradients, AParameterThePassDidNotReachKeepsStill) {
  for (const bool frozen : {false, true}) {
    Variable a = param(1.0F, "a");
    Variable b = param(2.0F, "b");
    Adam adam({a, b});
    loss_of({a, b}).backward();
    adam.step();
    if (frozen) b.set_requires_grad(false);
    const std::vector<float> b_after_first = values_of(b);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> a_before = values_of(a);
      loss_of({a}).backward();  // b not in this pass: it holds the first pass's gradient
      adam.step();
      EXPECT_FALSE(same_bits(values_of(a), a_before)) << step;
      EXPECT_TRUE(same_bits(values_of(b), b_after_first)) << "frozen " << frozen << ", step " << step;
    }
    EXPECT_EQ(adam.step_count(), 4);
  }
}

TEST(AdamStaleGradients, ASecondStepWithoutABackwardChangesNothing) {
  Variable a = param(1.0F, "a");
  Adam adam({a});
  loss_of({a}).backward();
  adam.step();
  const std::vector<float> once = values_of(a);
  adam.step();
  EXPECT_TRUE(same_bits(values_of(a), once));
  EXPECT_EQ(adam.step_count(), 1);
  loss_of({a}).backward();  // a new gradient is used
  adam.step();
  EXPECT_FALSE(same_bits(values_of(a), once));
  EXPECT_EQ(adam.step_count(), 2);
}

TEST(AdamStaleGradients, AGradientFromAPassBeforeTheStepIsStillUsedOnce) {
  // Two passes, then one step: both parameters' gradients are new.
  Variable a = param(1.0F, "a");
  Variable b = param(2.0F, "b");
  Adam adam({a, b});
  loss_of({b}).backward();
  loss_of({a}).backward();
  const std::vector<float> b_before = values_of(b);
  adam.step();
  EXPECT_FALSE(same_bits(values_of(b), b_before));
}

TEST(AdamStaleGradients, TheFusedStepSkipsAGradientAlreadyStepped) {
  // backward() + step() and backward_and_step() give the same bits when a
  // parameter is left out of later passes.
  Variable a1 = param(1.0F, "a");
  Variable b1 = param(2.0F, "b");
  Variable a2 = param(1.0F, "a");
  Variable b2 = param(2.0F, "b");
  Adam split({a1, b1});
  Adam fused({a2, b2});
  loss_of({a1, b1}).backward();
  split.step();
  loss_of({b2}).backward();  // b2 holds a gradient the fused Adam has not stepped with...
  fused.backward_and_step(loss_of({a2, b2}));  // ...replaced here: same as the split step
  for (int step = 0; step < 3; ++step) {
    loss_of({a1}).backward();
    split.step();
    fused.backward_and_step(loss_of({a2}));
    ASSERT_TRUE(same_bits(values_of(a1), values_of(a2))) << step;
    ASSERT_TRUE(same_bits(values_of(b1), values_of(b2))) << step;
  }
  // A gradient a plain backward() gave and no step used yet is stepped once.
  loss_of({b1}).backward();
  loss_of({b2}).backward();
  const std::vector<float> b_before = values_of(b2);
  loss_of({a1}).backward();
  split.step();
  fused.backward_and_step(loss_of({a2}));
  EXPECT_FALSE(same_bits(values_of(b2), b_before));
  EXPECT_TRUE(same_bits(values_of(b1), values_of(b2)));
  EXPECT_TRUE(same_bits(values_of(a1), values_of(a2)));
}

TEST(AdamStaleGradients, ShardedAdamKeepsAParameterThePassDidNotReachStill) {
  const auto comm = make_single_process_communicator();
  Variable a = param(1.0F, "a");
  Variable b = param(2.0F, "b");
  ShardedAdam adam(*comm, {a, b});
  loss_of({a, b}).backward();
  adam.step();
  const std::vector<float> b_after_first = values_of(b);
  for (int step = 0; step < 2; ++step) {
    loss_of({a}).backward();
    adam.step();
    EXPECT_TRUE(same_bits(values_of(b), b_after_first)) << step;
  }
  const std::vector<float> a_now = values_of(a);
  adam.step();  // nothing new
  EXPECT_TRUE(same_bits(values_of(a), a_now));
  EXPECT_EQ(adam.step_count(), 3);
}

TEST(AdamStaleGradients, AFusedStepOverNoParametersCountsNoStep) {
  Variable x = param(1.0F, "x");
  Adam none(std::vector<Variable>{});
  none.backward_and_step(loss_of({x}));
  EXPECT_EQ(none.step_count(), 0);
  loss_of({x}).backward();
  none.step();
  EXPECT_EQ(none.step_count(), 0);  // the same as backward() then step()
}
