// checkpoint(): mechanics, the replay contract, exception atomicity, nesting.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model_fixtures.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/ops.hpp"

using namespace riftco_transformer;
using rt_test::randn;
using Violation = CheckpointContractError::Violation;

namespace {


/// A small "block": h + silu(h W1) W2 with two parameters.
Variable block(const Variable& h, const Variable& w1, const Variable& w2) {
  return add(h, matmul(silu(matmul(h, w1)), w2));
}

struct Params {
  Variable w1{randn({4, 6}, 1), true, "w1"};
  Variable w2{randn({6, 4}, 2), true, "w2"};
  std::vector<Variable> deps() const { return {w1, w2}; }
};

template <typename F>
Violation violation_of(F&& f) {
  try {
    f();
  } catch (const CheckpointContractError& e) {
    return e.violation();
  }
  ADD_FAILURE() << "expected a CheckpointContractError";
  return Violation::OutputChanged;
}

}  // namespace

TEST(Checkpoint, SameValueAndGradientsAsOrdinaryBackward) {
  Params p;
  Variable x(randn({3, 4}, 3), true, "x");
  const Variable ordinary = sum(block(x, p.w1, p.w2));
  ordinary.backward();
  const Tensor gx = x.grad().clone();
  const Tensor g1 = p.w1.grad().clone();
  const Tensor g2 = p.w2.grad().clone();

  const auto deps = p.deps();
  reset_checkpoint_replay_count();
  const Variable out = checkpoint(x, deps, [&p](const Variable& h) { return block(h, p.w1, p.w2); });
  EXPECT_EQ(checkpoint_replay_count(), 0);
  EXPECT_EQ(out.op(), "checkpoint");
  EXPECT_EQ(out.parents().size(), 3U);  // input + 2 dependencies
  const Variable loss = sum(out);
  EXPECT_TRUE(bit_equal(loss.value(), ordinary.value()));
  loss.backward();
  EXPECT_EQ(checkpoint_replay_count(), 1);
  EXPECT_TRUE(bit_equal(x.grad(), gx));
  EXPECT_TRUE(bit_equal(p.w1.grad(), g1));
  EXPECT_TRUE(bit_equal(p.w2.grad(), g2));
  loss.backward();  // a fresh pass: same gradients, one more replay
  EXPECT_EQ(checkpoint_replay_count(), 2);
  EXPECT_TRUE(bit_equal(p.w1.grad(), g1));
}

TEST(Checkpoint, RetainsFarLessGraph) {
  Params p;
  Variable x(randn({3, 4}, 3), true, "x");
  Variable h = x;
  Variable hc = x;
  const auto deps = p.deps();
  for (int i = 0; i < 4; ++i) {
    h = block(h, p.w1, p.w2);
    hc = checkpoint(hc, deps, [&p](const Variable& v) { return block(v, p.w1, p.w2); });
  }
  const GraphStatistics ordinary = sum(h).graph_statistics();
  const GraphStatistics checkpointed = sum(hc).graph_statistics();
  EXPECT_EQ(checkpointed.node_count, 1 + 4 + 3);  // sum, 4 checkpoints, x, w1, w2
  EXPECT_LT(checkpointed.node_count, ordinary.node_count);
  EXPECT_LT(checkpointed.element_count, ordinary.element_count);
}

TEST(Checkpoint, SharedParametersGetEveryContributionOnce) {
  Params p;
  Variable x(randn({3, 4}, 4), true, "x");
  const auto deps = p.deps();
  auto f = [&p](const Variable& v) { return block(v, p.w1, p.w2); };
  // Three checkpoints share w1/w2, plus a direct use of w1 outside them.
  const Variable a = checkpoint(x, deps, f);
  const Variable b = checkpoint(a, deps, f);
  const Variable c = checkpoint(b, deps, f);
  const Variable loss_ck = add(sum(c), sum(mul(p.w1, p.w1)));
  loss_ck.backward();
  const Tensor g1_ck = p.w1.grad().clone();
  const Tensor g2_ck = p.w2.grad().clone();
  const Variable loss = add(sum(f(f(f(x)))), sum(mul(p.w1, p.w1)));
  loss.backward();
  // Shared parameters sum contributions in a different order: equal within
  // float32 rounding, not bit for bit.
  EXPECT_LT(max_abs_diff(g1_ck, p.w1.grad()), 1e-5);
  EXPECT_LT(max_abs_diff(g2_ck, p.w2.grad()), 1e-5);
}

TEST(Checkpoint, NestedCheckpointsWork) {
  Params p;
  Variable x(randn({2, 4}, 5), true, "x");
  const auto deps = p.deps();
  auto inner = [&p, deps](const Variable& v) {
    return checkpoint(v, deps, [&p](const Variable& u) { return block(u, p.w1, p.w2); });
  };
  reset_checkpoint_replay_count();
  const Variable out = checkpoint(x, deps, [&](const Variable& v) { return inner(inner(v)); });
  sum(out).backward();
  // One outer replay; its nested pass replays both inner checkpoints.
  EXPECT_EQ(checkpoint_replay_count(), 3);
  const Tensor g1 = p.w1.grad().clone();
  const Tensor gx = x.grad().clone();
  sum(block(block(x, p.w1, p.w2), p.w1, p.w2)).backward();
  EXPECT_LT(max_abs_diff(g1, p.w1.grad()), 1e-5);
  EXPECT_TRUE(bit_equal(gx, x.grad()));
}

TEST(Checkpoint, ReplayingIsTrueOnlyInsideAReplayNestedCheckpointsIncluded) {
  Params p;
  Variable x(randn({2, 4}, 5), true, "x");
  const auto deps = p.deps();
  std::vector<std::string> seen;  // who ran, and what checkpoint_replaying() said
  auto inner = [&](const Variable& v) {
    return checkpoint(v, deps, [&](const Variable& u) {
      seen.push_back(std::string("inner ") + (checkpoint_replaying() ? "replay" : "forward"));
      return block(u, p.w1, p.w2);
    });
  };
  EXPECT_FALSE(checkpoint_replaying());
  const Variable out = checkpoint(x, deps, [&](const Variable& v) {
    const bool outer = checkpoint_replaying();
    Variable y = inner(v);
    EXPECT_EQ(checkpoint_replaying(), outer) << "an inner checkpoint puts the flag back";
    seen.push_back(std::string("outer ") + (outer ? "replay" : "forward"));
    return y;
  });
  EXPECT_FALSE(checkpoint_replaying());
  sum(out).backward();
  EXPECT_FALSE(checkpoint_replaying());
  // Forward: inner forward, outer forward. Backward: the outer replay runs the
  // inner checkpoint's forward call (false) and its nested pass replays it.
  const std::vector<std::string> expected{"inner forward", "outer forward", "inner forward", "outer replay",
                                          "inner replay"};
  EXPECT_EQ(seen, expected);
}

TEST(Checkpoint, ReplayingIsResetWhenTheReplayThrows) {
  Params p;
  Variable x(randn({2, 4}, 5), true, "x");
  int calls = 0;
  const Variable out = checkpoint(x, p.deps(), [&](const Variable& v) {
    if (++calls == 2) throw ValueError("replay fails");
    return block(v, p.w1, p.w2);
  });
  EXPECT_THROW(sum(out).backward(), ValueError);
  EXPECT_FALSE(checkpoint_replaying());
}

TEST(Checkpoint, FrozenDependencyAndInputWithoutGradWork) {
  Params p;
  p.w1.set_requires_grad(false);  // frozen (e.g. a LoRA base weight)
  Variable x(randn({2, 4}, 6), false, "x");  // input that does not require grad
  const auto deps = p.deps();
  const Variable out = checkpoint(x, deps, [&p](const Variable& h) { return block(h, p.w1, p.w2); });
  ASSERT_TRUE(out.requires_grad());
  sum(out).backward();
  EXPECT_FALSE(p.w1.has_grad());
  EXPECT_FALSE(x.has_grad());
  const Tensor g2 = p.w2.grad().clone();
  sum(block(x, p.w1, p.w2)).backward();
  EXPECT_TRUE(bit_equal(g2, p.w2.grad()));
  // Nothing requires grad at all: a constant, no replay.
  p.w2.set_requires_grad(false);
  const Variable constant = checkpoint(x, p.deps(), [&p](const Variable& h) { return block(h, p.w1, p.w2); });
  EXPECT_FALSE(constant.requires_grad());
}

TEST(CheckpointContract, DependencyRules) {
  Params p;
  Variable x(randn({2, 4}, 7), true, "x");
  auto f = [&p](const Variable& h) { return block(h, p.w1, p.w2); };
  const std::vector<Variable> missing = {p.w1};
  EXPECT_EQ(violation_of([&] { checkpoint(x, missing, f); }), Violation::MissingDependency);
  const std::vector<Variable> undefined = {p.w1, p.w2, Variable()};
  EXPECT_EQ(violation_of([&] { checkpoint(x, undefined, f); }), Violation::MissingDependency);
  const std::vector<Variable> duplicate = {p.w1, p.w2, p.w1};
  EXPECT_EQ(violation_of([&] { checkpoint(x, duplicate, f); }), Violation::DuplicateDependency);
  const Variable derived = scale(p.w1, 2.0F);
  const std::vector<Variable> not_leaf = {derived, p.w2};
  EXPECT_EQ(violation_of([&] { checkpoint(x, not_leaf, [&](const Variable& h) { return block(h, derived, p.w2); }); }),
            Violation::DependencyNotLeaf);
  const std::vector<Variable> extra = {p.w1, p.w2, Variable(Tensor::ones({1}), true, "unused")};
  EXPECT_EQ(violation_of([&] { checkpoint(x, extra, f); }), Violation::DependencyUnused);
  // A trainable leaf made outside and not declared is a missing dependency.
  Variable trainable(Tensor::ones({4}), true, "trainable");
  EXPECT_EQ(violation_of([&] { checkpoint(x, p.deps(), [&](const Variable& h) { return mul(f(h), trainable); }); }),
            Violation::MissingDependency);
  try {
    checkpoint(x, missing, f);
  } catch (const CheckpointContractError& e) {
    EXPECT_NE(std::string(e.what()).find("'w2'"), std::string::npos) << e.what();
  }
}

TEST(CheckpointContract, BoundaryRules) {
  Params p;
  Variable x(randn({2, 4}, 8), true, "x");
  const auto deps = p.deps();
  const Variable outside = scale(x, 3.0F);  // a graph node computed outside
  EXPECT_EQ(violation_of([&] {
              checkpoint(x, deps, [&](const Variable& h) { return add(block(h, p.w1, p.w2), outside); });
            }),
            Violation::CapturedExternalNode);
  EXPECT_EQ(violation_of([&] {
              checkpoint(x, deps, [&](const Variable& h) {
                Variable fresh(Tensor::ones({4}), true, "new_param");
                return mul(block(h, p.w1, p.w2), fresh);
              });
            }),
            Violation::UndeclaredLeaf);
  EXPECT_EQ(violation_of([&] {
              checkpoint(x, deps, [&](const Variable&) { return block(Variable(Tensor::ones({2, 4})), p.w1, p.w2); });
            }),
            Violation::InputUnused);
  // A constant made inside the callable is fine.
  EXPECT_NO_THROW(checkpoint(x, deps, [&](const Variable& h) {
    return mul(block(h, p.w1, p.w2), Variable(Tensor::full({4}, 0.5F)));
  }));
}

TEST(CheckpointContract, ReplayOutputShapeChangeIsRejectedAtomically) {
  Params p;
  Variable x(randn({2, 4}, 9), true, "x");
  int calls = 0;
  const Variable out = checkpoint(x, p.deps(), [&](const Variable& h) {
    ++calls;
    const Variable y = block(h, p.w1, p.w2);
    return calls == 1 ? y : reshape(y, {4, 2});
  });
  Variable other(Tensor::ones({1}), true, "other");
  const Variable loss = add(sum(out), sum(other));
  sum(mul(p.w1, p.w1)).backward();
  const Tensor g1 = p.w1.grad().clone();
  EXPECT_EQ(violation_of([&] { loss.backward(); }), Violation::OutputChanged);
  EXPECT_TRUE(bit_equal(g1, p.w1.grad()));
  EXPECT_FALSE(x.has_grad());
  EXPECT_FALSE(other.has_grad());
}

TEST(Checkpoint, ReplayExceptionLeavesEveryPublicGradientUnchanged) {
  Params p;
  Variable x(randn({2, 4}, 10), true, "x");
  bool fail = false;
  const Variable out = checkpoint(x, p.deps(), [&](const Variable& h) {
    if (fail) throw std::runtime_error("replay failed");
    return block(h, p.w1, p.w2);
  });
  const Variable loss = add(sum(out), sum(p.w2));
  loss.backward();
  const Tensor gx = x.grad().clone();
  const Tensor g1 = p.w1.grad().clone();
  const Tensor g2 = p.w2.grad().clone();
  fail = true;
  EXPECT_THROW(loss.backward(), std::runtime_error);
  EXPECT_TRUE(bit_equal(gx, x.grad()));
  EXPECT_TRUE(bit_equal(g1, p.w1.grad()));
  EXPECT_TRUE(bit_equal(g2, p.w2.grad()));
}

TEST(Checkpoint, StaleDependencyRejectedBeforeReplay) {
  Params p;
  Variable x(randn({2, 4}, 11), true, "x");
  reset_checkpoint_replay_count();
  const Variable out = checkpoint(x, p.deps(), [&p](const Variable& h) { return block(h, p.w1, p.w2); });
  p.w2.mutable_value().data()[0] += 1.0F;
  EXPECT_THROW(sum(out).backward(), StaleGraphError);
  EXPECT_EQ(checkpoint_replay_count(), 0);
  EXPECT_FALSE(p.w1.has_grad());
  // A parameter replaced by one of another shape: stale too.
  const Variable out2 = checkpoint(x, p.deps(), [&p](const Variable& h) { return block(h, p.w1, p.w2); });
  p.w1.set_value(randn({4, 5}, 12));
  EXPECT_THROW(sum(out2).backward(), StaleGraphError);
}

TEST(Checkpoint, RandomStateRestoredForReplay) {
  Params p;
  Variable x(randn({8, 4}, 13), true, "x");
  Random random(99);
  auto f = [&](const Variable& h) { return dropout(block(h, p.w1, p.w2), 0.5F, random); };
  CheckpointOptions options;
  options.random = &random;
  const Variable out = checkpoint(x, p.deps(), f, options);
  const Random::State after_forward = random.state();
  sum(out).backward();
  EXPECT_EQ(random.state(), after_forward);  // replay put the live stream back
  const Tensor g1 = p.w1.grad().clone();
  Random again(99);
  Variable ordinary = dropout(block(x, p.w1, p.w2), 0.5F, again);
  EXPECT_TRUE(bit_equal(ordinary.value(), out.value()));
  sum(ordinary).backward();
  EXPECT_TRUE(bit_equal(g1, p.w1.grad()));
}

TEST(Checkpoint, GraphOutlivesEverythingThatBuiltIt) {
  Variable loss;
  Variable x(randn({2, 4}, 14), true, "x");
  Variable w1_handle;
  {
    Params p;
    w1_handle = p.w1;
    Variable w1 = p.w1;
    Variable w2 = p.w2;
    loss = sum(checkpoint(x, p.deps(), [w1, w2](const Variable& h) { return block(h, w1, w2); }));
  }
  loss.backward();
  EXPECT_TRUE(w1_handle.has_grad());
  EXPECT_TRUE(x.has_grad());
}

TEST(Checkpoint, MemoryReturnsToBaseline) {
  const std::int64_t base = memory_stats().live_bytes;
  {
    Params p;
    Variable x(randn({2, 4}, 15), true, "x");
    for (int i = 0; i < 3; ++i) {
      sum(checkpoint(x, p.deps(), [&p](const Variable& h) { return block(h, p.w1, p.w2); })).backward();
    }
  }
  EXPECT_EQ(memory_stats().live_bytes, base);
}

TEST(Checkpoint, UndeclaredConstantsBecomeVersionCheckedParents) {
  Params p;
  Variable x(randn({2, 4}, 16), true, "x");
  Variable mask(Tensor::full({4}, 0.5F), false, "mask");  // a buffer, not a parameter
  const Variable out = checkpoint(x, p.deps(), [&](const Variable& h) { return mul(block(h, p.w1, p.w2), mask); });
  ASSERT_EQ(out.parents().size(), 4U);  // input, w1, w2, mask
  EXPECT_TRUE(out.parents()[3].same_node(mask));
  sum(out).backward();
  const Tensor g1 = p.w1.grad().clone();
  sum(mul(block(x, p.w1, p.w2), mask)).backward();
  EXPECT_TRUE(bit_equal(g1, p.w1.grad()));
  EXPECT_FALSE(mask.has_grad());
  const Variable again = checkpoint(x, p.deps(), [&](const Variable& h) { return mul(block(h, p.w1, p.w2), mask); });
  mask.set_value(Tensor::full({4}, 2.0F));
  EXPECT_THROW(sum(again).backward(), StaleGraphError);  // the replay would read another mask
}

TEST(Checkpoint, ConstantCachedOnFirstCallIsAcceptedAtForwardAndReplay) {
  Params p;
  Variable x(randn({2, 4}, 17), true, "x");
  Variable cache;  // built lazily inside the callable, reused afterwards
  auto f = [&](const Variable& h) {
    if (!cache.defined()) cache = Variable(Tensor::full({4}, 3.0F), false, "table");
    return mul(block(h, p.w1, p.w2), cache);
  };
  const Variable out = checkpoint(x, p.deps(), f);
  EXPECT_NO_THROW(sum(out).backward());
  EXPECT_NO_THROW(sum(checkpoint(x, p.deps(), f)).backward());
}

TEST(Checkpoint, NoGradInsideTheCallableMatchesTheOrdinaryGraph) {
  Params p;
  Variable x(randn({2, 4}, 18), true, "x");
  auto f = [&](const Variable& h) {
    Variable side;
    {
      NoGradGuard no_grad;
      side = matmul(h, p.w1);  // a value only: no gradient flows through it
    }
    return add(matmul(silu(side), p.w2), h);
  };
  sum(f(x)).backward();
  const Tensor gx = x.grad().clone();
  const Tensor g2 = p.w2.grad().clone();
  sum(checkpoint(x, p.deps(), f)).backward();
  EXPECT_TRUE(bit_equal(gx, x.grad()));
  EXPECT_TRUE(bit_equal(g2, p.w2.grad()));
  // Declared but read only without gradient: as in the ordinary graph, no
  // pass reaches it (it got committed zeros and a new grad_serial before).
  EXPECT_FALSE(p.w1.has_grad());
}
