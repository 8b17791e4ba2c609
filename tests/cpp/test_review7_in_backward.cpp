// Adversarial cases for the optimizer step in the backward pass and the
// early reports from a checkpoint's replay (review 7): a leaf that is both a
// checkpoint's input and one of its dependencies, a graph that reads a
// parameter's buffer through another handle (a constant sharing it), a
// closure failing inside a replay after an early report, a hook that runs
// a backward pass (with a checkpoint) itself.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/ops.hpp"

using namespace riftco_transformer;
using rt_test::randn;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() &&
         std::memcmp(a.values().data(), b.values().data(), static_cast<std::size_t>(a.nbytes())) == 0;
}

/// Records each report's gradient (a copy) and consumes nothing.
struct Recording : BackwardHooks {
  std::vector<std::pair<std::string, Tensor>> reports;
  void gradient_final(const Variable& leaf, const Tensor& gradient) override {
    reports.emplace_back(leaf.name(), gradient.defined() ? gradient.clone() : Tensor());
  }
  std::vector<std::pair<Variable, Tensor>> finish() override { return {}; }
};

/// y = checkpoint(w, {w}, in -> in @ w): w is the block's input and its
/// dependency; loss = sum(y * y).
Variable input_is_dependency_loss(const Variable& w) {
  const std::vector<Variable> deps{w};
  const Variable y = checkpoint(w, deps, [w](const Variable& in) { return matmul(in, w); });
  return sum(mul(y, y));
}

/// Adam's fused step over `loss` updates w (its only parameter), then a
/// node reads w's old bytes through another handle: a PartialStepError
/// saying stale graph and 1 of 1 updates, and x's gradient not committed.
void expect_stale_after_the_update(Variable& w, const Variable& x, const Variable& loss, const char* otherwise) {
  Adam adam({w});
  try {
    adam.backward_and_step(loss);
    ADD_FAILURE() << otherwise;
  } catch (const PartialStepError& e) {
    EXPECT_NE(std::string(e.what()).find("stale graph"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1 of 1"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(x.grad().defined()) << "nothing committed";
}

}  // namespace

TEST(Review7InBackward, ALeafThatIsACheckpointsInputAndDependencyIsReportedOnceWithItsWholeGradient) {
  const Tensor start = randn({4, 4}, 3);
  Variable reference(start.clone(), true, "w");
  input_is_dependency_loss(reference).backward();
  const Tensor expected = reference.grad().clone();

  Variable w(start.clone(), true, "w");
  Recording hooks;
  input_is_dependency_loss(w).backward(hooks);
  ASSERT_EQ(hooks.reports.size(), 1U);
  EXPECT_TRUE(same_bits(hooks.reports[0].second, expected)) << "the hook saw only the dependency's part";
  EXPECT_TRUE(same_bits(w.grad(), expected));
}

TEST(Review7InBackward, ALeafThatIsACheckpointsInputAndDependencyStepsBitIdentically) {
  const Tensor start = randn({4, 4}, 5);
  Variable a(start.clone(), true, "w");
  Adam plain({a});
  input_is_dependency_loss(a).backward();
  plain.step();

  Variable b(start.clone(), true, "w");
  Adam fused({b});
  fused.backward_and_step(input_is_dependency_loss(b));
  EXPECT_TRUE(same_bits(a.value(), b.value()));
  EXPECT_FALSE(b.grad().defined());
}

// A constant sharing a parameter's buffer, read by a node that runs after
// the parameter was updated in the pass: its gradient would silently use the
// new values. The node's versions are checked right before it runs in a pass
// with hooks, so it is a StaleGraphError there (a PartialStepError, the
// first parameter being updated already).
TEST(Review7InBackward, AConstantSharingAParametersBufferReadAfterItsUpdateIsAStaleGraph) {
  Variable w(randn({3, 3}, 7), true, "w");
  Variable x(randn({2, 3}, 8), true, "x");
  const Variable alias(w.value());  // the same buffer, no edge to w
  const Variable first = sum(matmul(x, w));      // w final once this branch ran
  const Variable second = sum(matmul(x, alias));  // reads alias (w's buffer) for x's gradient
  const Variable loss = add(second, first);       // first's branch runs first
  expect_stale_after_the_update(w, x, loss, "x's gradient was computed from the updated w");
}

// The same through a checkpoint: its callable makes a constant of w's buffer
// (watched by the checkpoint node, no edge to w); w is final and stepped
// before the checkpoint node runs, whose replay would read the new bytes.
TEST(Review7InBackward, ACheckpointsConstantOfAParametersBufferIsStaleAfterItsUpdate) {
  Variable w(randn({3, 3}, 21), true, "w");
  Variable x(randn({2, 3}, 22), true, "x");
  const std::vector<Variable> none;
  const Variable block = checkpoint(x, none, [&w](const Variable& in) { return matmul(in, Variable(w.value())); });
  const Variable loss = add(sum(block), sum(matmul(x, w)));  // w's branch runs first
  expect_stale_after_the_update(w, x, loss, "the replay read the updated w");
}

// A closure failing inside a replay's backward after the replay reported
// (and Adam stepped) a dependency: PartialStepError counting that one update;
// nothing committed; the channel is gone (a later pass without checkpoint
// hooks reports nothing stale).
TEST(Review7InBackward, AFailureInsideAReplayAfterAnEarlyStepIsAPartialStepAndCommitsNothing) {
  Variable w1(randn({4, 4}, 11), true, "w1");
  Variable w2(randn({4, 4}, 12), true, "w2");
  Variable other(randn({4, 4}, 13), true, "other");
  Variable x(randn({2, 4}, 14), true, "x");
  bool fail = true;
  auto block = [&](const Variable& in) {
    const Variable h = matmul(in, w1);
    const Variable gate = Variable::from_op("gate", h.value().clone(), {h},
                                            [&fail](const Tensor& g, const std::vector<bool>&) {
                                              if (fail) throw ValueError("[gate] boom");
                                              return std::vector<Tensor>{g};
                                            });
    return matmul(gate, w2);
  };
  const std::vector<Variable> deps{w1, w2};
  const Variable loss = sum(mul(checkpoint(x, deps, block), matmul(x, other)));
  const Tensor w1_before = w1.value().clone();
  const Tensor w2_before = w2.value().clone();
  Adam adam({w1, w2});
  try {
    adam.backward_and_step(loss, GraphAfterBackward::Keep);
    FAIL() << "no error";
  } catch (const PartialStepError& e) {
    EXPECT_NE(std::string(e.what()).find("after updating 1 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_bits(w1.value(), w1_before));
  EXPECT_FALSE(same_bits(w2.value(), w2_before));  // stepped inside the replay
  EXPECT_FALSE(other.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w2.grad().defined());
  // No channel left behind: a fresh pass with ordinary hooks reports each leaf once.
  fail = false;
  Variable v(randn({4, 4}, 15), true, "v");
  const std::vector<Variable> vdeps{v};
  Recording hooks;
  sum(checkpoint(x, vdeps, [v](const Variable& in) { return matmul(in, v); })).backward(hooks);
  int v_reports = 0;
  for (const auto& [name, g] : hooks.reports) v_reports += name == "v" ? 1 : 0;
  EXPECT_EQ(v_reports, 1);
}

// A hook that runs a whole backward pass (through a checkpoint, with hooks
// of its own) while the outer pass is inside a replay: neither pass sees the
// other's leaves, each leaf of each is reported once.
TEST(Review7InBackward, AHookRunningABackwardPassWithACheckpointInsideAReplayKeepsBothPassesApart) {
  struct Reentrant : Recording {
    Recording inner;
    Variable u{randn({4, 4}, 21), true, "u"};
    Variable z{randn({2, 4}, 22), true, "z"};
    void gradient_final(const Variable& leaf, const Tensor& gradient) override {
      Recording::gradient_final(leaf, gradient);
      const std::vector<Variable> deps{u};
      const Variable inner_u = u;
      sum(checkpoint(z, deps, [inner_u](const Variable& in) { return matmul(in, inner_u); })).backward(inner);
    }
  };
  Variable w(randn({4, 4}, 23), true, "w");
  Variable x(randn({2, 4}, 24), true, "x");
  const std::vector<Variable> deps{w};
  Reentrant hooks;
  sum(checkpoint(x, deps, [w](const Variable& in) { return matmul(in, w); })).backward(hooks);
  std::vector<std::string> outer;
  for (const auto& [name, g] : hooks.reports) outer.push_back(name);
  EXPECT_EQ(outer, (std::vector<std::string>{"w", "x"}));
  std::vector<std::string> inner;
  for (const auto& [name, g] : hooks.inner.reports) inner.push_back(name);
  EXPECT_EQ(inner, (std::vector<std::string>{"u", "z", "u", "z"}));  // two inner passes, each u then z
  EXPECT_TRUE(w.grad().defined());
  EXPECT_TRUE(hooks.u.grad().defined());
}

namespace {

/// Steps a fresh copy of `starts` both ways on `loss_of` and says whether
/// every parameter ends bit-identical.
template <typename LossOf>
bool fused_matches_plain(const std::vector<Tensor>& starts, LossOf loss_of, GraphAfterBackward graph) {
  std::vector<Variable> a;
  std::vector<Variable> b;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    a.emplace_back(starts[i].clone(), true, "p" + std::to_string(i));
    b.emplace_back(starts[i].clone(), true, "p" + std::to_string(i));
  }
  Adam plain(a);
  Adam fused(b);
  for (int step = 0; step < 2; ++step) {
    loss_of(a).backward();
    plain.step();
    fused.backward_and_step(loss_of(b), graph);
  }
  for (std::size_t i = 0; i < starts.size(); ++i) {
    if (!same_bits(a[i].value(), b[i].value())) return false;
  }
  return true;
}

}  // namespace

// A checkpoint inside a checkpoint's replay whose input is the outer block's
// dependency; a parameter used twice in one block and once outside it.
TEST(Review7InBackward, NestedInputDependencyAndAParameterUsedTwiceStepBitIdentically) {
  const std::vector<Tensor> starts{randn({4, 4}, 31), randn({4, 4}, 32), randn({2, 4}, 33)};
  auto nested = [](const std::vector<Variable>& p) {
    const Variable w = p[0];
    const Variable v = p[1];
    const std::vector<Variable> outer_deps{w, v};
    auto block = [w, v](const Variable& in) {
      const std::vector<Variable> inner_deps{w, v};  // w: the inner block's input and dependency
      const Variable inner = checkpoint(w, inner_deps, [w, v](const Variable& x) { return matmul(x, mul(w, v)); });
      return matmul(in, inner);
    };
    return sum(mul(checkpoint(p[2], outer_deps, block), p[2]));
  };
  auto twice = [](const std::vector<Variable>& p) {
    const Variable w = p[0];
    const std::vector<Variable> deps{w, p[1]};
    const Variable y = checkpoint(p[2], deps, [w, v = p[1]](const Variable& in) {
      return matmul(matmul(in, w), add(w, v));
    });
    return sum(mul(y, matmul(p[2], w)));  // w outside the block too
  };
  for (const GraphAfterBackward graph : {GraphAfterBackward::Release, GraphAfterBackward::Keep}) {
    EXPECT_TRUE(fused_matches_plain(starts, nested, graph));
    EXPECT_TRUE(fused_matches_plain(starts, twice, graph));
  }
}

// A second fused step on a kept graph: the first one updated its
// parameters, so the graph is stale; refused before anything changes.
TEST(Review7InBackward, ASecondFusedStepOnAKeptGraphIsAStaleGraphAndChangesNothing) {
  Variable w(randn({4, 4}, 41), true, "w");
  Variable x(randn({2, 4}, 42), true, "x");
  const std::vector<Variable> deps{w};
  const Variable loss = sum(checkpoint(x, deps, [w](const Variable& in) { return matmul(in, w); }));
  Adam adam({w});
  adam.backward_and_step(loss, GraphAfterBackward::Keep);
  const Tensor after_first = w.value().clone();
  EXPECT_THROW(adam.backward_and_step(loss, GraphAfterBackward::Keep), StaleGraphError);
  EXPECT_TRUE(same_bits(w.value(), after_first));
  EXPECT_EQ(adam.step_count(), 1);
}

// consumes() throwing for a leaf reported inside a replay: the pass fails
// with that error, commits nothing, and the next pass reports every leaf once.
TEST(Review7InBackward, ConsumesThrowingInsideAReplayFailsThePassAndTheNextOneWorks) {
  struct Throwing : Recording {
    bool armed = true;
    bool consumes(const Variable& leaf) const override {
      if (armed && leaf.name() == "w") throw ValueError("[consumes] refused " + leaf.name());
      return false;
    }
  };
  Variable w(randn({4, 4}, 51), true, "w");
  Variable x(randn({2, 4}, 52), true, "x");
  const std::vector<Variable> deps{w};
  const Variable loss = sum(checkpoint(x, deps, [w](const Variable& in) { return matmul(in, w); }));
  Throwing hooks;
  EXPECT_THROW(loss.backward(hooks), ValueError);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  hooks.armed = false;
  hooks.reports.clear();
  loss.backward(hooks);
  ASSERT_EQ(hooks.reports.size(), 2U);
  EXPECT_EQ(hooks.reports[0].first, "w");  // inside the replay, before its input
  EXPECT_TRUE(same_bits(hooks.reports[0].second, w.grad()));
}

// A hook reached inside a replay starts a hooked pass on another thread: the
// channel is per thread, so that pass's leaves stay its own.
TEST(Review7InBackward, APassOnAnotherThreadStartedFromInsideAReplayKeepsItsOwnReports) {
  struct Spawning : Recording {
    Recording other;
    Variable u{randn({4, 4}, 61), true, "u"};
    Variable z{randn({2, 4}, 62), true, "z"};
    void gradient_final(const Variable& leaf, const Tensor& gradient) override {
      Recording::gradient_final(leaf, gradient);
      if (leaf.name() != "w") return;
      std::thread([this] {
        const std::vector<Variable> deps{u};
        const Variable inner_u = u;
        sum(checkpoint(z, deps, [inner_u](const Variable& in) { return matmul(in, inner_u); })).backward(other);
      }).join();
    }
  };
  Variable w(randn({4, 4}, 63), true, "w");
  Variable x(randn({2, 4}, 64), true, "x");
  const std::vector<Variable> deps{w};
  Spawning hooks;
  sum(checkpoint(x, deps, [w](const Variable& in) { return matmul(in, w); })).backward(hooks);
  ASSERT_EQ(hooks.reports.size(), 2U);
  ASSERT_EQ(hooks.other.reports.size(), 2U);
  EXPECT_EQ(hooks.other.reports[0].first, "u");
  EXPECT_TRUE(same_bits(hooks.other.reports[0].second, hooks.u.grad()));
}
