// checkpoint() behaves as the ordinary graph does (spec: "the equations are
// identical to ordinary backpropagation"): constants the callable caches are
// version-checked, its input is read-only, grad mode and tracing never change
// what the callable sees or what backward does, nested checkpoints accept
// what un-nested ones accept, and random ops replay the forward's numbers by
// default.
#include <gtest/gtest.h>

#include <optional>

#include "model_fixtures.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::randn;
using Violation = CheckpointContractError::Violation;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {


using Fn = std::function<Variable(const Variable&)>;

/// Gradients of sum(g(f(x))) for x and w, ordinary or with f checkpointed.
struct Grads {
  Tensor loss, x, w;
};

Grads run(const Fn& f, bool checkpointed, const Variable& x, const Variable& w, const CheckpointOptions& options = {},
          const Fn& tail = nullptr) {
  const std::vector<Variable> deps{w};
  const Variable y = checkpointed ? checkpoint(x, deps, f, options) : f(x);
  const Variable loss = sum(tail ? tail(y) : y);
  loss.backward();
  return {loss.value().clone(), x.grad().clone(), w.grad().clone()};
}

void expect_same(const Grads& a, const Grads& b) {
  EXPECT_TRUE(bit_equal(a.loss, b.loss));
  EXPECT_TRUE(bit_equal(a.x, b.x));
  EXPECT_TRUE(bit_equal(a.w, b.w));
}

}  // namespace

// ---- 2. constants the callable makes and caches are version-checked -------

TEST(CheckpointCachedConstants, InPlaceChangeAfterForwardIsAStaleGraph) {
  for (int variant = 0; variant < 3; ++variant) {
    Variable x(randn({3, 4}, 1), true, "x");
    Variable w(randn({4, 4}, 2), true, "w");
    std::optional<Variable> cached;  // made by the callable on its first call
    Tensor captured = Tensor::full({3, 4}, 0.5F);
    Fn f = [&](const Variable& h) {
      Variable table;
      if (variant == 0) {  // a leaf cached on first call
        if (!cached) cached = Variable(Tensor::full({3, 4}, 0.5F), false, "table");
        table = *cached;
      } else if (variant == 1) {  // a new leaf over a captured buffer every call
        table = Variable(captured, false, "table");
      } else {  // a value computed from constants, cached
        if (!cached) cached = scale(Variable(Tensor::full({3, 4}, 1.0F)), 0.5F);
        table = *cached;
      }
      return mul(matmul(h, w), table);
    };
    const Grads reference = run(f, false, x, w);
    const std::vector<Variable> deps{w};
    const Variable loss = sum(checkpoint(x, deps, f));
    Tensor write = variant == 1 ? captured : cached->value();
    write.fill(7.0F);  // the ordinary graph rejects the same change
    const Tensor gx = x.grad().clone();
    reset_checkpoint_replay_count();
    EXPECT_THROW(loss.backward(), StaleGraphError) << "variant " << variant;
    EXPECT_EQ(checkpoint_replay_count(), 0);
    EXPECT_TRUE(bit_equal(x.grad(), gx));
    // Ordinary graph, same change: also stale.
    write.fill(0.5F);
    const Variable ordinary = sum(f(x));
    write.fill(7.0F);
    EXPECT_THROW(ordinary.backward(), StaleGraphError) << "variant " << variant;
    (void)reference;
  }
}

TEST(CheckpointCachedConstants, UnchangedOrTemporaryConstantsReplayExactly) {
  Variable x(randn({3, 4}, 3), true, "x");
  Variable w(randn({4, 4}, 4), true, "w");
  std::optional<Variable> cached;
  Fn f = [&](const Variable& h) {
    if (!cached) cached = Variable(randn({3, 4}, 5), false, "cached");
    const Variable temporary(Tensor::full({3, 4}, 2.0F), false, "temporary");  // gone after each call
    return mul(mul(matmul(h, w), *cached), temporary);
  };
  const Grads ordinary = run(f, false, x, w);
  expect_same(run(f, true, x, w), ordinary);
}

// ---- 3. the replay input is read-only ---------------------------------------

TEST(CheckpointReadOnlyInput, WritesThroughTheFreshLeafAreRefused) {
  for (const bool input_is_leaf : {false, true}) {
    Variable x(randn({2, 3}, 6), true, "x");
    Variable w(randn({3, 3}, 7), true, "w");
    const Variable input = input_is_leaf ? x : scale(x, 2.0F);
    const Variable other = sum(mul(input, input));  // saved the input's buffer
    const std::vector<Variable> deps{w};
    const std::vector<std::function<void(Variable&)>> writes = {
        [](Variable& a) { a.mutable_value().fill(0.0F); },
        [](Variable& a) { a.set_value(Tensor::zeros({2, 3})); },
        [](Variable& a) { a.mark_changed("test"); },
        [](Variable& a) { a.set_requires_grad(false); },
    };
    for (const auto& write : writes) {
      try {
        checkpoint(input, deps, [&](const Variable& v) {
          Variable a = v;
          write(a);
          return matmul(a, w);
        });
        ADD_FAILURE() << "expected ValueError";
      } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
      }
    }
    other.backward();  // the input's buffer is untouched
    EXPECT_TRUE(x.has_grad());
  }
}

TEST(CheckpointReadOnlyInput, RawWritesIntoTheInputOrADependencyAreAContractViolation) {
  const std::vector<std::function<void(const Variable&, const Variable&)>> writes = {
      [](const Variable& v, const Variable&) {
        Tensor t = v.value();
        t.fill(0.0F);
      },
      [](const Variable& v, const Variable&) {
        Tensor t = v.value();
        t.data()[0] = 1.0F;
      },
      [](const Variable&, const Variable& w) {
        Variable d = w;
        d.mutable_value().fill(0.0F);
      },
      [](const Variable&, const Variable& w) {
        Tensor t = w.value();
        t.copy_from(Tensor::zeros(t.shape()));
      },
  };
  for (std::size_t i = 0; i < writes.size(); ++i) {
    Variable x(randn({2, 3}, 8), true, "x");
    Variable w(randn({3, 3}, 9), true, "w");
    const Variable input = scale(x, 3.0F);
    const std::vector<Variable> deps{w};
    try {
      checkpoint(input, deps, [&](const Variable& v) {
        writes[i](v, w);
        return matmul(v, w);
      });
      ADD_FAILURE() << "expected BoundaryModified for write " << i;
    } catch (const CheckpointContractError& e) {
      EXPECT_EQ(e.violation(), Violation::BoundaryModified) << e.what();
      EXPECT_NE(std::string(e.what()).find(i < 2 ? "input" : "'w'"), std::string::npos) << e.what();
    }
  }
}

// ---- 5. grad mode of the caller does not reach the replay -------------------

TEST(CheckpointGradMode, BackwardUnderNoGradGuardEqualsTheOrdinaryGraph) {
  Variable x(randn({3, 4}, 10), true, "x");
  Variable w(randn({4, 4}, 11), true, "w");
  Fn f = [&](const Variable& h) { return silu(matmul(h, w)); };
  const Grads ordinary = run(f, false, x, w);
  const std::vector<Variable> deps{w};
  const Variable loss = sum(checkpoint(x, deps, f));
  {
    NoGradGuard guard;
    loss.backward();
  }
  EXPECT_TRUE(bit_equal(x.grad(), ordinary.x));
  EXPECT_TRUE(bit_equal(w.grad(), ordinary.w));
  // Nested: the inner replay runs inside the outer one, still under the guard.
  const Variable nested = sum(checkpoint(x, deps, [&](const Variable& h) { return checkpoint(h, deps, f); }));
  {
    NoGradGuard guard;
    nested.backward();
  }
  EXPECT_TRUE(bit_equal(x.grad(), ordinary.x));
  EXPECT_TRUE(bit_equal(w.grad(), ordinary.w));
}

TEST(CheckpointGradMode, ModelBackwardUnderNoGradGuardForEveryPolicy) {
  const auto b = random_batch(2, 8, 32, 12);
  std::vector<Tensor> reference;
  for (const auto policy : {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock,
                            ActivationCheckpointingKind::BlockSegments}) {
    for (const auto attention : {FullSequenceAttentionKind::Materialized, FullSequenceAttentionKind::Flash}) {
      Random random(13);
      DecoderOnlyTransformer model(tiny_dims(3), random, 1e-5F, attention, policy);
      const Variable loss = model.loss(b.tokens, b.targets, 2);
      {
        NoGradGuard guard;
        ASSERT_NO_THROW(loss.backward());
      }
      std::vector<Tensor> grads;
      for (const NamedParameter& p : model.parameters()) grads.push_back(p.variable.grad().clone());
      if (attention == FullSequenceAttentionKind::Flash && policy == ActivationCheckpointingKind::Disabled) {
        reference = grads;
      } else if (attention == FullSequenceAttentionKind::Flash) {
        for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], reference[i]));
      }
    }
  }
}

// ---- 6. an output with no differentiable path --------------------------------

TEST(CheckpointNoDifferentiablePath, OtherTermsStillTrainAsInTheOrdinaryGraph) {
  const std::vector<Fn> teachers = {
      [](const Variable& h) {  // everything under NoGradGuard
        NoGradGuard g;
        return silu(h);
      },
      [](const Variable& h) {  // a no-grad value of the input combined with a constant
        Variable c;
        {
          NoGradGuard g;
          c = scale(h, 0.5F);
        }
        return mul(c, Variable(Tensor::full(c.shape(), 2.0F)));
      },
  };
  for (std::size_t i = 0; i < teachers.size(); ++i) {
    for (const bool checkpointed : {false, true}) {
      Variable x(randn({2, 3}, 14), true, "x");
      Variable w(randn({3, 3}, 15), true, "w");
      const Variable teacher = checkpointed ? checkpoint(x, {}, teachers[i]) : teachers[i](x);
      EXPECT_FALSE(teacher.requires_grad());
      const Variable loss = add(sum(matmul(x, w)), sum(teacher));
      ASSERT_NO_THROW(loss.backward()) << "teacher " << i << (checkpointed ? " checkpointed" : "");
      const Variable plain = sum(matmul(x, w));
      Variable x2(x.value().clone(), true);
      Variable w2(w.value().clone(), true);
      sum(matmul(x2, w2)).backward();
      EXPECT_TRUE(bit_equal(x.grad(), x2.grad()));
      EXPECT_TRUE(bit_equal(w.grad(), w2.grad()));
      (void)plain;
    }
  }
}

TEST(CheckpointNoDifferentiablePath, DependenciesDeclaredButUnderNoGradReceiveZeros) {
  Variable x(randn({2, 3}, 16), true, "x");
  Variable w(randn({3, 3}, 17), true, "w");
  Variable v(randn({3, 3}, 18), true, "v");
  const std::vector<Variable> deps{w};
  const Variable teacher = checkpoint(x, deps, [&](const Variable& h) {
    NoGradGuard g;
    return matmul(h, w);
  });
  const Variable loss = add(sum(matmul(x, v)), sum(teacher));
  loss.backward();
  EXPECT_TRUE(v.has_grad());
  EXPECT_FALSE(w.has_grad());  // as in the ordinary graph: w is not reached
}

// ---- 7. nested checkpoints accept what un-nested ones accept -----------------

TEST(CheckpointNesting, InnerCheckpointMayCaptureConstantsTheOuterComputed) {
  const Tensor table_values = randn({3, 4}, 19);
  const std::vector<std::function<Variable(const Variable&, const Variable&)>> constants = {
      [&](const Variable&, const Variable&) { return scale(Variable(table_values), 0.25F); },
      [&](const Variable&, const Variable&) {
        return add(Variable(table_values), Variable(Tensor::full({3, 4}, 1.0F)));
      },
      [&](const Variable& h, const Variable&) {  // a no-grad value of the outer input
        NoGradGuard g;
        return scale(h, 0.5F);
      },
      [&](const Variable&, const Variable& w) {  // a no-grad value of a dependency
        NoGradGuard g;
        return reshape(sum(w), {1});
      },
  };
  for (std::size_t i = 0; i < constants.size(); ++i) {
    Variable x(randn({3, 4}, 20), true, "x");
    Variable w(randn({4, 4}, 21), true, "w");
    const std::vector<Variable> deps{w};
    auto body = [&](const Variable& h, bool nested) {
      const Variable c = constants[i](h, w);
      Fn inner = [c, &w](const Variable& v) { return mul(matmul(v, w), c); };
      return nested ? checkpoint(h, deps, inner) : inner(h);
    };
    Fn outer_nested = [&](const Variable& h) { return body(h, true); };
    Fn outer_plain = [&](const Variable& h) { return body(h, false); };
    const Grads ordinary = run(outer_plain, false, x, w);
    expect_same(run(outer_plain, true, x, w), ordinary);
    Grads nested;
    ASSERT_NO_THROW(nested = run(outer_nested, true, x, w)) << "constant " << i;
    expect_same(nested, ordinary);
  }
}

TEST(CheckpointNesting, InnerCheckpointStillRejectsCapturedGradNodes) {
  Variable x(randn({3, 4}, 22), true, "x");
  Variable w(randn({4, 4}, 23), true, "w");
  const std::vector<Variable> deps{w};
  try {
    checkpoint(x, deps, [&](const Variable& h) {
      const Variable captured = matmul(h, w);  // requires grad: a graph node, not a constant
      return checkpoint(h, deps, [&](const Variable& v) { return add(matmul(v, w), captured); });
    });
    ADD_FAILURE() << "expected CapturedExternalNode";
  } catch (const CheckpointContractError& e) {
    EXPECT_EQ(e.violation(), Violation::CapturedExternalNode);
  }
}

// ---- 8. tracing never changes what the callable sees -------------------------

TEST(CheckpointTracing, ValuesComputedFromConstantsAreLeavesInsideAsOutside) {
  const Tensor t = randn({2, 3}, 24);
  auto probe = [&](bool& leaf, bool& grad, bool& writable) {
    Variable c = scale(add(Variable(t), Variable(t)), 0.5F);
    Variable d;
    {
      NoGradGuard g;
      d = scale(c, 2.0F);
    }
    leaf = c.is_leaf() && d.is_leaf();
    grad = c.requires_grad() || d.requires_grad();
    writable = true;
    try {
      c.mutable_value().fill(1.0F);
      d.mutable_value().fill(1.0F);
    } catch (const ValueError&) {
      writable = false;
    }
    return c;
  };
  bool leaf_out = false, grad_out = true, writable_out = false;
  probe(leaf_out, grad_out, writable_out);
  bool leaf_in = false, grad_in = true, writable_in = false;
  Variable x(randn({2, 3}, 25), true, "x");
  checkpoint(x, {}, [&](const Variable& h) { return mul(h, probe(leaf_in, grad_in, writable_in)); });
  EXPECT_TRUE(leaf_out);
  EXPECT_FALSE(grad_out);
  EXPECT_TRUE(writable_out);
  EXPECT_EQ(leaf_in, leaf_out);
  EXPECT_EQ(grad_in, grad_out);
  EXPECT_EQ(writable_in, writable_out);
}

// ---- random streams -------------------------------------------------------------

TEST(CheckpointRandom, DropoutReplaysTheForwardMaskByDefault) {
  for (const float p : {0.1F, 0.5F, 0.9F}) {
    Variable x(randn({4, 8}, 26), true, "x");
    Variable w(randn({8, 8}, 27), true, "w");
    Random ordinary_random(99);
    Fn ordinary_f = [&](const Variable& h) { return dropout(silu(matmul(h, w)), p, ordinary_random); };
    const Grads ordinary = run(ordinary_f, false, x, w);

    Random random(99);
    Fn f = [&](const Variable& h) { return dropout(silu(matmul(h, w)), p, random); };
    const std::vector<Variable> deps{w};
    const Variable loss = sum(checkpoint(x, deps, f));
    const Random::State after_forward = random.state();
    loss.backward();
    EXPECT_EQ(random.state(), after_forward) << "backward moved the caller's stream";
    EXPECT_TRUE(bit_equal(loss.value(), ordinary.loss));
    EXPECT_TRUE(bit_equal(x.grad(), ordinary.x)) << "p = " << p;
    EXPECT_TRUE(bit_equal(w.grad(), ordinary.w)) << "p = " << p;
    loss.backward();  // a second backward replays the same mask again
    EXPECT_TRUE(bit_equal(x.grad(), ordinary.x));
    EXPECT_EQ(random.state(), after_forward);
  }
}

TEST(CheckpointRandom, SeveralCheckpointsNestedAndNoiseShareOneGenerator) {
  Variable x(randn({4, 8}, 28), true, "x");
  Variable w(randn({8, 8}, 29), true, "w");
  // The callables live as long as the graphs that replay them.
  const std::vector<Variable> deps{w};
  Random* random = nullptr;
  bool checkpointed = false;
  Fn block = [&](const Variable& h) {
    const Variable noise(Tensor::normal(h.shape(), *random, 0.0F, 0.1F));  // drawn inside too
    return add(dropout(silu(matmul(h, w)), 0.3F, *random), noise);
  };
  Fn two = [&](const Variable& h) {
    return checkpointed ? checkpoint(checkpoint(h, deps, block), deps, block) : block(block(h));
  };
  auto build = [&](Random& r, bool use_checkpoints) {
    random = &r;
    checkpointed = use_checkpoints;
    Variable h = x;
    h = checkpointed ? checkpoint(h, deps, block) : block(h);
    h = checkpointed ? checkpoint(h, deps, two) : two(h);
    return sum(h);
  };
  Random r1(5);
  const Variable ordinary = build(r1, false);
  ordinary.backward();
  const Tensor gx = x.grad().clone();
  const Tensor gw = w.grad().clone();
  Random r2(5);
  const Variable loss = build(r2, true);
  const Random::State live = r2.state();
  EXPECT_EQ(live, r1.state());
  loss.backward();
  EXPECT_EQ(r2.state(), live);
  EXPECT_TRUE(bit_equal(loss.value(), ordinary.value()));
  EXPECT_TRUE(bit_equal(x.grad(), gx));
  EXPECT_TRUE(bit_equal(w.grad(), gw));
}

TEST(CheckpointRandom, OptOutDrawsFreshNumbersFromTheLiveStream) {
  Variable x(randn({4, 8}, 30), true, "x");
  Variable w(randn({8, 8}, 31), true, "w");
  Random random(7);
  Fn f = [&](const Variable& h) { return dropout(matmul(h, w), 0.5F, random); };
  CheckpointOptions options;
  options.preserve_random_state = false;
  const std::vector<Variable> deps{w};
  const Variable loss = sum(checkpoint(x, deps, f, options));
  const Random::State live = random.state();
  loss.backward();
  EXPECT_NE(random.state(), live);  // the replay drew from the live stream
}

TEST(CheckpointRandom, TheModelsDropoutNeedsNoExplicitGenerator) {
  const auto b = random_batch(2, 8, 32, 32);
  std::vector<Tensor> reference;
  for (const auto policy : {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock,
                            ActivationCheckpointingKind::BlockSegments}) {
    Random random(33);
    DecoderOnlyTransformer model(tiny_dims(3), random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
    model.set_dropout(0.2F, 4);
    const Variable loss = model.loss(b.tokens, b.targets, 2);
    const Random::State live = model.dropout_random().state();
    loss.backward();
    EXPECT_EQ(model.dropout_random().state(), live);
    std::vector<Tensor> grads;
    for (const NamedParameter& p : model.parameters()) grads.push_back(p.variable.grad().clone());
    if (reference.empty()) {
      reference = grads;
    } else {
      for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], reference[i]));
    }
  }
}

TEST(CheckpointTracing, ACachedTracedConstantDoesNotKeepTheInputAlive) {
  const std::int64_t baseline = memory_stats().live_bytes;
  std::optional<Variable> cached;  // outlives everything below
  {
    Variable x(Tensor::full({256, 256}, 1.0F), true, "x");  // 256 KiB
    Variable w(Tensor::full({256, 256}, 0.5F), true, "w");
    const std::vector<Variable> deps{w};
    const Variable loss = sum(checkpoint(x, deps, [&](const Variable& h) {
      if (!cached) {
        NoGradGuard g;
        cached = scale(h, 2.0F);  // a constant traced from the input, cached, never used
      }
      return matmul(h, w);
    }));
    loss.backward();
  }
  // Only the cached constant's own buffer is left, not the input it was
  // computed from (nor the input's fresh leaf).
  EXPECT_EQ(memory_stats().live_bytes - baseline, 256 * 256 * 4);
}
