#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/variable.hpp"

using namespace riftco_transformer;

namespace {

/// An op whose backward throws on demand: exercises exception atomicity.
Variable throwing_identity(const Variable& x, const bool* should_throw) {
  return Variable::from_op("throwing_identity", x.value().clone(), {x},
                           [should_throw](const Tensor& g, const std::vector<bool>&) {
                             if (*should_throw) throw std::runtime_error("closure failed on purpose");
                             return std::vector<Tensor>{g};
                           });
}

Variable leaf(std::initializer_list<float> v, const char* name) {
  return Variable(Tensor::from_data({static_cast<std::int64_t>(v.size())}, v), true, name);
}

}  // namespace

TEST(Autograd, SimpleChainRule) {
  Variable x = leaf({1, 2, 3}, "x");
  Variable y = leaf({4, 5, 6}, "y");
  Variable loss = sum(mul(x, y));  // dL/dx = y, dL/dy = x
  loss.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(y.grad().to_vector(), (std::vector<float>{1, 2, 3}));
  EXPECT_FLOAT_EQ(loss.value().item(), 32.0F);
}

TEST(Autograd, RepeatedBackwardGivesIdenticalGradients) {
  Variable x = leaf({1, 2, 3}, "x");
  Variable loss = sum(mul(x, x));
  loss.backward();
  const Tensor first = x.grad().clone();
  loss.backward();
  EXPECT_TRUE(bit_equal(first, x.grad()));  // replaced, not accumulated
  EXPECT_EQ(first.to_vector(), (std::vector<float>{2, 4, 6}));
}

TEST(Autograd, SharedSubexpressionGetsEveryContributionOnce) {
  Variable x = leaf({1, 2}, "x");
  Variable h = scale(x, 3.0F);          // h = 3x
  Variable loss = sum(add(h, mul(h, h)));  // L = Σ h + h², dL/dx = 3(1 + 2h)
  loss.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{3 * (1 + 2 * 3), 3 * (1 + 2 * 6)}));
  // x used twice directly: add(x, x) → gradient 2.
  Variable y = leaf({5}, "y");
  sum(add(y, y)).backward();
  EXPECT_EQ(y.grad().to_vector(), (std::vector<float>{2}));
}

TEST(Autograd, IntermediateGradientsAreFreedUnlessRetained) {
  Variable x = leaf({1, 2}, "x");
  Variable h = scale(x, 2.0F);
  Variable k = scale(h, 2.0F);
  k.retain_grad();
  sum(mul(h, k)).backward();
  EXPECT_FALSE(h.has_grad());
  ASSERT_TRUE(k.has_grad());
  EXPECT_EQ(k.grad().to_vector(), (std::vector<float>{2, 4}));  // dL/dk = h
}

TEST(Autograd, StaleGraphRejectedBeforeAnyGradientChanges) {
  Variable x = leaf({1, 2}, "x");
  Variable w = leaf({3, 4}, "w");
  sum(mul(x, w)).backward();
  const Tensor gx = x.grad().clone();
  const Tensor gw = w.grad().clone();
  Variable loss = sum(mul(scale(x, 2.0F), w));
  w.set_value(Tensor::from_data({2}, {9, 9}));  // value change bumps the version
  try {
    loss.backward();
    FAIL() << "expected StaleGraphError";
  } catch (const StaleGraphError& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(bit_equal(gx, x.grad()));
  EXPECT_TRUE(bit_equal(gw, w.grad()));
}

TEST(Autograd, InPlaceUpdateAndRequiresGradChangeAreStale) {
  Variable w = leaf({1, 2}, "w");
  Variable loss = sum(mul(w, w));
  w.mutable_value().data()[0] = 5.0F;
  EXPECT_THROW(loss.backward(), StaleGraphError);
  Variable loss2 = sum(mul(w, w));
  Variable x = leaf({1, 1}, "x");
  Variable loss3 = sum(mul(w, x));
  x.set_requires_grad(false);  // structural change
  EXPECT_THROW(loss3.backward(), StaleGraphError);
  EXPECT_NO_THROW(loss2.backward());
}

TEST(Autograd, ThrowingClosureLeavesEveryPublicGradientUntouched) {
  Variable x = leaf({1, 2, 3}, "x");
  Variable y = leaf({1, 1, 1}, "y");
  bool should_throw = false;
  Variable loss = sum(add(mul(x, y), throwing_identity(y, &should_throw)));
  loss.backward();
  const Tensor gx = x.grad().clone();
  const Tensor gy = y.grad().clone();
  EXPECT_EQ(gy.to_vector(), (std::vector<float>{2, 3, 4}));
  // Change a leaf's gradient via a different graph, then fail mid-pass.
  should_throw = true;
  EXPECT_THROW(loss.backward(), std::runtime_error);
  EXPECT_TRUE(bit_equal(gx, x.grad()));
  EXPECT_TRUE(bit_equal(gy, y.grad()));
  // A leaf that had no gradient still has none.
  Variable z = leaf({1}, "z");
  Variable lz = sum(throwing_identity(z, &should_throw));
  EXPECT_THROW(lz.backward(), std::runtime_error);
  EXPECT_FALSE(z.has_grad());
}

TEST(Autograd, GraphOutlivesTheVariablesThatBuiltIt) {
  Variable loss;
  Variable keep_x;
  {
    Variable x = leaf({1, 2}, "x");
    Variable w = leaf({3, 4}, "w");
    keep_x = x;
    loss = sum(mul(x, w));
  }  // w's handle is gone; the graph still holds its node
  loss.backward();
  EXPECT_EQ(keep_x.grad().to_vector(), (std::vector<float>{3, 4}));
  const std::vector<Variable> parents = loss.parents()[0].parents();
  EXPECT_EQ(parents[1].grad().to_vector(), (std::vector<float>{1, 2}));
}

TEST(Autograd, NonScalarOutputNeedsSeed) {
  Variable x = leaf({1, 2}, "x");
  Variable y = scale(x, 2.0F);
  try {
    y.backward();
    FAIL();
  } catch (const BackwardError& e) {
    EXPECT_NE(std::string(e.what()).find("(2,)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(y.backward(Tensor::ones({3})), ShapeError);
  y.backward(Tensor::from_data({2}, {1, 10}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 20}));
}

TEST(Autograd, OutputWithoutGradIsRejected) {
  Variable c(Tensor::ones({1}), false, "c");
  EXPECT_THROW(sum(c).backward(), BackwardError);
  NoGradGuard guard;
  Variable x = leaf({1}, "x");
  Variable y = scale(x, 2.0F);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.parents().empty());
}

TEST(Autograd, LeafReachedWithoutContributionGetsZeros) {
  Variable x = leaf({1, 2}, "x");
  Variable y = leaf({1, 2}, "y");
  // An op whose backward sends no gradient to its input: x is reached, but
  // nothing arrives. Leaves always receive a committed gradient: zeros.
  Variable blocked = Variable::from_op("blocked", x.value(), {x}, [](const Tensor&, const std::vector<bool>&) {
    return std::vector<Tensor>{Tensor()};
  });
  sum(add(blocked, y)).backward();
  ASSERT_TRUE(x.has_grad());
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{0, 0}));
  EXPECT_EQ(y.grad().to_vector(), (std::vector<float>{1, 1}));
}

TEST(Autograd, GraphStatisticsCountNodesAndElements) {
  Variable x(Tensor::ones({2, 3}), true, "x");
  Variable w(Tensor::ones({3, 4}), true, "w");
  Variable h = matmul(x, w);  // (2, 4)
  Variable loss = sum(h);     // ()
  GraphStatistics s = loss.graph_statistics();
  EXPECT_EQ(s.node_count, 4);
  EXPECT_EQ(s.element_count, 6 + 12 + 8 + 1);
  loss.backward();
  s = loss.graph_statistics();
  EXPECT_EQ(s.element_count, 6 + 12 + 8 + 1 + 6 + 12);  // committed leaf gradients
  const std::vector<RetainedNode> rows = loss.retained_nodes();
  EXPECT_EQ(rows.size(), 4U);
  const std::string report = loss.retained_report();
  EXPECT_NE(report.find("matmul"), std::string::npos);
  EXPECT_NE(report.find("4 nodes"), std::string::npos);
}

TEST(Autograd, GraphStatisticsCountASharedBufferOnce) {
  Variable x(Tensor::ones({10, 100}), true, "x");
  const Variable r = reshape(reshape(reshape(x, {1000}), {100, 10}), {4, 250});  // views of x's buffer
  const GraphStatistics s = sum(r).graph_statistics();
  EXPECT_EQ(s.node_count, 5);
  EXPECT_EQ(s.element_count, 1000 + 1);
}

TEST(Autograd, DeepChainDoesNotOverflowTheStack) {
  Variable x = leaf({1}, "x");
  Variable h = x;
  for (int i = 0; i < 200000; ++i) h = scale(h, 1.0F);
  sum(h).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1}));
}

TEST(Autograd, MemoryReturnsToBaselineAfterBackward) {
  const std::int64_t base = memory_stats().live_bytes;
  {
    Variable x(Tensor::ones({16, 16}), true, "x");
    Variable w(Tensor::ones({16, 16}), true, "w");
    for (int i = 0; i < 3; ++i) sum(matmul(x, w)).backward();
  }
  EXPECT_EQ(memory_stats().live_bytes, base);
}

TEST(Autograd, OnlyLeavesCanBeChanged) {
  Variable x = leaf({1}, "x");
  Variable y = scale(x, 2.0F);
  EXPECT_THROW(y.set_value(Tensor::ones({1})), ValueError);
  EXPECT_THROW(y.mutable_value(), ValueError);
}

TEST(Autograd, BackendTransferOfALeaf) {
  Variable w = leaf({1, 2}, "w");
  const std::uint64_t v = w.version();
  w.to(Backend::Cpu);  // already there: nothing moves, nothing goes stale
  EXPECT_EQ(w.version(), v);
  if (backend_available(Backend::Cuda)) GTEST_SKIP() << "covered by the GPU tests";
  // Without the CUDA backend the transfer throws and changes nothing; with
  // it, a transfer bumps the version (Variable::to) and stales old graphs.
  Variable loss = sum(mul(w, w));
  EXPECT_THROW(w.to(Backend::Cuda), BackendError);
  EXPECT_EQ(w.version(), v);
  EXPECT_EQ(w.backend(), Backend::Cpu);
  EXPECT_NO_THROW(loss.backward());
}

TEST(Autograd, CommittedGradientsAliasNothing) {
  Variable x = leaf({1, 2}, "x");
  Variable y = leaf({3, 4}, "y");
  Variable h = add(x, y);  // add hands the same gradient buffer to both parents
  h.retain_grad();
  const Tensor seed = Tensor::ones({2});
  h.backward(seed);
  const Tensor* all[] = {&x.grad(), &y.grad(), &h.grad(), &seed, &x.value(), &y.value(), &h.value()};
  for (std::size_t i = 0; i < 7; ++i)
    for (std::size_t j = i + 1; j < 7; ++j) EXPECT_FALSE(all[i]->shares_storage(*all[j])) << i << " vs " << j;
  const Tensor held = x.grad();  // a handle from an earlier pass keeps its values
  scale(h, 5.0F).backward(seed);
  EXPECT_EQ(held.to_vector(), (std::vector<float>{1, 1}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{5, 5}));
}

TEST(Autograd, FailedPassKeepsRetainedIntermediateGradients) {
  Variable x = leaf({1, 2}, "x");
  bool fail = false;
  Variable h = scale(x, 2.0F);
  h.retain_grad();
  Variable loss = sum(throwing_identity(h, &fail));
  loss.backward();
  const Tensor gh = h.grad().clone();
  fail = true;
  EXPECT_THROW(loss.backward(), std::runtime_error);
  EXPECT_TRUE(bit_equal(gh, h.grad()));
}

// Variable::from_op refuses a custom op's mistakes before any node exists,
// naming the op: an undefined parent (dereferenced later), an undefined
// value, an empty backward function when a parent requires grad (it threw
// std::bad_function_call from inside a pass).
TEST(Autograd, FromOpRefusesUndefinedPartsAndAnEmptyBackward) {
  const Variable a(Tensor::ones({2}), true, "a");
  const BackwardFn identity = [](const Tensor& g, const std::vector<bool>&) { return std::vector<Tensor>{g, g}; };
  const auto refusal = [](const std::function<void()>& make) -> std::string {
    try {
      make();
    } catch (const ValueError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(refusal([&] { Variable::from_op("custom", Tensor::ones({2}), {a, Variable()}, identity); })
                .find("[custom] Variable::from_op: parent 1 of 2 is an undefined Variable"),
            std::string::npos);
  const Variable constant(Tensor::ones({2}));
  EXPECT_NE(refusal([&] { Variable::from_op("custom", Tensor::ones({2}), {constant, Variable()}, identity); })
                .find("parent 1 of 2"),
            std::string::npos);
  EXPECT_NE(refusal([&] { Variable::from_op("custom", Tensor(), {a}, identity); }).find("the value is an undefined"),
            std::string::npos);
  EXPECT_NE(refusal([&] { Variable::from_op("custom", Tensor::ones({2}), {a}, BackwardFn()); })
                .find("the backward function is empty"),
            std::string::npos);
  {
    NoGradGuard off;  // a constant: no closure needed
    EXPECT_FALSE(Variable::from_op("custom", Tensor::ones({2}), {a}, BackwardFn()).requires_grad());
  }
  EXPECT_FALSE(Variable::from_op("custom", Tensor::ones({2}), {constant}, BackwardFn()).requires_grad());
}
