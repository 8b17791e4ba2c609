// Adversarial tests of checkpoint() and versions (issue 10's review), public API only:
// writes into captured state, cached constants replaced or refrozen, nested
// watches, constant inputs, LoRA and decode interplay, threads, memory.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::randn;
using Violation = CheckpointContractError::Violation;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {
using Fn = std::function<Variable(const Variable&)>;
}  // namespace

// ---- item 3 generalised: callable writes into an outside constant it reads ----
// Forward writes m (m: 1 -> 2), replay writes it again (2 -> 3): the replay
// uses another value than the forward; an ordinary node built after the
// checkpoint that saved m gets the wrong value too. No error.
TEST(CheckpointAttack, CallableWritesIntoCapturedOutsideConstant) {
  // A write into a captured outside buffer is refused at the forward: its
  // replay would write again, behind the back of every node that read it.
  Variable x(Tensor::from_data({2}, {1, 1}), true, "x");
  Variable m(Tensor::from_data({2}, {1, 1}), false, "m");
  Tensor captured = Tensor::from_data({2}, {5, 5});
  const std::vector<std::function<void()>> writes = {
      [&] {
        Variable mm = m;
        mm.mutable_value("bump").data()[0] += 1.0F;
      },
      [&] { captured.fill(0.0F); },  // not even read by the callable
      [&] { Tensor(m.value()).copy_from(Tensor::zeros({2})); },
  };
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const Tensor m_before = m.value().clone();
    Fn f = [&, i](const Variable& in) {
      writes[i]();
      return mul(in, m);
    };
    try {
      checkpoint(x, {}, f);
      ADD_FAILURE() << "write " << i << ": expected BoundaryModified";
    } catch (const CheckpointContractError& e) {
      EXPECT_EQ(e.violation(), Violation::BoundaryModified) << e.what();
      EXPECT_NE(std::string(e.what()).find("made outside it"), std::string::npos) << e.what();
    }
    m.mutable_value().copy_from(m_before);
    captured.fill(5.0F);
  }
}

// ---- item 2 variant: cached constant replaced with set_value (not in place) ----
TEST(CheckpointAttack, CachedConstantReplacedBySetValueIsNotStale) {
  Variable x(Tensor::from_data({2}, {1, 2}), true, "x");
  std::optional<Variable> cached;
  Fn f = [&](const Variable& in) {
    if (!cached) cached = Variable(Tensor::from_data({2}, {3, 3}), false, "table");
    return mul(in, *cached);
  };
  // Ordinary graph rejects it:
  {
    Variable loss = sum(f(x));
    cached->set_value(Tensor::from_data({2}, {42, 42}));
    EXPECT_THROW(loss.backward(), StaleGraphError);
    cached.reset();
  }
  Variable loss = sum(checkpoint(x, {}, f));
  cached->set_value(Tensor::from_data({2}, {42, 42}));
  bool threw = false;
  try {
    loss.backward();
  } catch (const StaleGraphError&) {
    threw = true;
  }
  EXPECT_TRUE(threw) << "checkpoint replayed with the replaced constant; x.grad[0] = " << x.grad().at({0})
                     << " (forward used 3)";
}

// ---- item 2 variant: nested, the inner callable caches the constant ----
TEST(CheckpointAttack, NestedInnerCachedConstantWrittenInPlace) {
  Variable x(Tensor::from_data({2}, {1, 2}), true, "x");
  std::optional<Variable> cached;
  Fn inner = [&](const Variable& in) {
    if (!cached) cached = Variable(Tensor::from_data({2}, {3, 3}), false, "table");
    return mul(in, *cached);
  };
  Fn outer = [&](const Variable& in) { return checkpoint(scale(in, 1.0F), {}, inner); };
  Variable loss = sum(checkpoint(x, {}, outer));
  Tensor t = cached->value();
  t.fill(42.0F);  // un-nested (and ordinary) graphs reject this
  bool threw = false;
  try {
    loss.backward();
  } catch (const StaleGraphError&) {
    threw = true;
  }
  EXPECT_TRUE(threw) << "nested replay used the overwritten constant; x.grad[0] = " << x.grad().at({0});
}

// ---- callable that writes a cached scratch buffer each call; backward twice ----
TEST(CheckpointAttack, ScratchBufferBackwardTwice) {
  // A scratch buffer the callable made on its first call is its own then,
  // but captured state at every replay: rewriting it there is a contract
  // violation, reported at the first backward (not a confusing stale graph
  // at the second), and no gradient is published.
  Variable x(Tensor::from_data({2}, {1, 2}), true, "x");
  std::optional<Variable> scratch;
  Fn f = [&](const Variable& in) {
    if (!scratch) scratch = Variable(Tensor::zeros({2}), false, "scratch");
    scratch->mutable_value().fill(3.0F);  // same contents every call
    return mul(in, *scratch);
  };
  Variable loss = sum(checkpoint(x, {}, f));
  try {
    loss.backward();
    ADD_FAILURE() << "expected BoundaryModified";
  } catch (const CheckpointContractError& e) {
    EXPECT_EQ(e.violation(), Violation::BoundaryModified) << e.what();
  }
  EXPECT_FALSE(x.has_grad());
}

// ---- identity / reshape callables ----
TEST(CheckpointAttack, IdentityAndReshapeCallables) {
  Variable w(randn({2, 3}, 1), true, "w");
  for (int v = 0; v < 3; ++v) {
    Variable x(randn({2, 3}, 2), true, "x");
    Fn f = [&](const Variable& in) -> Variable {
      if (v == 0) return in;
      if (v == 1) return reshape(in, {3, 2});
      return reshape(reshape(in, {6}), {2, 3});
    };
    Variable y = checkpoint(x, {}, f);
    Variable loss = sum(mul(reshape(y, {2, 3}), w));
    ASSERT_NO_THROW(loss.backward()) << v;
    EXPECT_TRUE(bit_equal(x.grad(), w.value())) << v;
    ASSERT_NO_THROW(loss.backward()) << v;
    EXPECT_TRUE(bit_equal(x.grad(), w.value())) << v;
  }
  // Identity on a non-leaf input, input is a view that shares storage with the output.
  Variable x(randn({2, 3}, 3), true, "x");
  Variable h = scale(x, 2.0F);
  Variable y = checkpoint(h, {}, [](const Variable& in) { return in; });
  EXPECT_TRUE(y.value().shares_storage(h.value()));
  Variable loss = sum(mul(y, w));
  ASSERT_NO_THROW(loss.backward());
  EXPECT_LT(max_abs_diff(x.grad(), scale(w, 2.0F).value()), 1e-6F);
}

// ---- no op writes into its inputs (a bump would be a false StaleGraphError) ----
TEST(CheckpointAttack, OpsNeverBumpTheirInputs) {
  Variable a(randn({2, 4, 8}, 4), true, "a");
  Variable b(randn({2, 4, 8}, 5), true, "b");
  Variable w(randn({8, 8}, 6), true, "w");
  Variable n(randn({8}, 7), true, "n");
  Random r(3);
  const std::vector<std::int32_t> ids{1, 2, 3, 4, 5, 6, 7, 0};
  const std::vector<std::int32_t> targets{1, 2, 3, 4, 5, 6, 7, 0};
  Variable table(randn({9, 8}, 8), true, "table");
  const auto va = a.version(), vb = b.version(), vw = w.version(), vn = n.version(), vt = table.version();
  std::vector<Variable> outs;
  outs.push_back(matmul(a, w));
  outs.push_back(matmul(a, w, false, true));
  outs.push_back(linear(a, w));
  outs.push_back(add(a, b));
  outs.push_back(sub(a, b));
  outs.push_back(mul(a, b));
  outs.push_back(scale(a, 3.0F));
  outs.push_back(silu(a));
  outs.push_back(gelu(a));
  outs.push_back(swiglu(a, b));
  outs.push_back(sum(a));
  outs.push_back(mean(a));
  outs.push_back(reshape(a, {8, 8}));
  outs.push_back(transpose(a, 1, 2));
  outs.push_back(permute(a, {2, 0, 1}));
  outs.push_back(rms_norm(a, n, 1e-5F));
  outs.push_back(softmax(a));
  Variable q(randn({1, 2, 4, 4}, 9), true, "q");
  outs.push_back(causal_mask(matmul(q, q, false, true)));
  outs.push_back(rope(q));
  outs.push_back(causal_attention(q, q, q, FullSequenceAttentionKind::Materialized));
  outs.push_back(causal_attention(q, q, q, FullSequenceAttentionKind::Flash));
  outs.push_back(embedding(table, ids, {1, 8}));
  const std::vector<std::int32_t> ce_targets{1, 2, 3, 4, 5, 6, 7, 0, 1};
  outs.push_back(cross_entropy(table, ce_targets));
  outs.push_back(dropout(a, 0.5F, r));
  const auto vq = q.version();
  Variable total = sum(outs[0]);
  for (std::size_t i = 1; i < outs.size(); ++i) total = add(total, sum(outs[i]));
  EXPECT_EQ(a.version(), va);
  EXPECT_EQ(b.version(), vb);
  EXPECT_EQ(w.version(), vw);
  EXPECT_EQ(n.version(), vn);
  EXPECT_EQ(table.version(), vt);
  EXPECT_NO_THROW(total.backward());
  EXPECT_NO_THROW(total.backward());
  EXPECT_EQ(q.version(), vq);
  EXPECT_EQ(a.version(), va);
}

// ---- reading the input through a non-const Tensor copy, but via const accessors ----
TEST(CheckpointAttack, ReadingInputThroughConstAccessorsIsFine) {
  Variable x(randn({2, 3}, 10), true, "x");
  Fn f = [](const Variable& in) {
    Tensor t = in.value();  // non-const handle
    float s = 0;
    for (float v : t.values()) s += v;
    s += t.at({0, 0}) + std::as_const(t).data()[1];
    (void)t.clone();
    return scale(in, 1.0F + 0.0F * s);
  };
  Variable loss = sum(checkpoint(x, {}, f));
  EXPECT_NO_THROW(loss.backward());
  // Non-const data() is documented as a write: BoundaryModified expected.
  Fn g = [](const Variable& in) {
    Tensor t = in.value();
    (void)t.data();
    return scale(in, 2.0F);
  };
  try {
    checkpoint(x, {}, g);
    ADD_FAILURE() << "expected BoundaryModified";
  } catch (const CheckpointContractError& e) {
    EXPECT_EQ(e.violation(), Violation::BoundaryModified);
  }
}

// ---- memory: watched temporaries/caches do not keep buffers alive ----
TEST(CheckpointAttack, MemoryReturnsToBaselineWithCachedAndTemporaryConstants) {
  release_cached_memory();
  const std::int64_t base = memory_stats().live_bytes;
  {
    Variable x(randn({64, 64}, 11), true, "x");
    Variable w(randn({64, 64}, 12), true, "w");
    std::optional<Variable> cached;
    std::int64_t after_forward = 0;
    {
      Fn f = [&](const Variable& in) {
        if (!cached) cached = scale(Variable(Tensor::full({64, 64}, 1.0F)), 0.5F);
        const Variable big(Tensor::full({512, 512}, 2.0F), false, "temporary");  // 1 MiB, dies each call
        return add(mul(matmul(in, w), *cached), reshape(sum(big), {1}));
      };
      const std::vector<Variable> deps{w};
      const std::int64_t before = memory_stats().live_bytes;
      Variable loss = sum(checkpoint(x, deps, f));
      after_forward = memory_stats().live_bytes - before;
      EXPECT_LT(after_forward, 512 * 512 * 4) << "the temporary is kept alive";
      loss.backward();
      loss.backward();
    }
    cached.reset();
  }
  EXPECT_EQ(memory_stats().live_bytes, base);
}

// ---- dropout: nested checkpoints, mutable lambda owning its generator ----
TEST(CheckpointAttack, DropoutWithGeneratorOwnedByTheCallable) {
  Variable w(randn({8, 8}, 13), true, "w");
  const std::vector<Variable> deps{w};
  auto make = [&](std::uint64_t seed) {
    return Fn([&w, r = Random(seed)](const Variable& h) mutable { return dropout(matmul(h, w), 0.5F, r); });
  };
  Variable x1(randn({4, 8}, 14), true, "x");
  Fn plain = make(9);
  Variable lo = sum(plain(x1));
  lo.backward();
  const Tensor gx = x1.grad().clone();
  Variable x2(x1.value().clone(), true, "x2");
  Variable l = sum(checkpoint(x2, deps, make(9)));
  l.backward();
  EXPECT_TRUE(bit_equal(l.value(), lo.value()));
  EXPECT_TRUE(bit_equal(x2.grad(), gx)) << "replay drew a different mask";
}

TEST(CheckpointAttack, NestedCheckpointsDropoutMatchOrdinary) {
  Variable w(randn({8, 8}, 15), true, "w");
  const std::vector<Variable> deps{w};
  Random* rp = nullptr;
  bool ck = false;
  Fn inner = [&](const Variable& h) { return dropout(silu(matmul(h, w)), 0.4F, *rp); };
  Fn outer = [&](const Variable& h) {
    Variable a = dropout(h, 0.3F, *rp);
    Variable b = ck ? checkpoint(a, deps, inner) : inner(a);
    Variable c = ck ? checkpoint(b, deps, inner) : inner(b);
    return dropout(c, 0.2F, *rp);
  };
  auto run = [&](bool use) {
    Random r(77);
    rp = &r;
    ck = use;
    Variable x(randn({4, 8}, 16), true, "x");
    Variable loss = sum(use ? checkpoint(x, deps, outer) : outer(x));
    NoGradGuard g;  // backward under a live no-grad guard too
    loss.backward();
    return std::pair{x.grad().clone(), w.grad().clone()};
  };
  auto a = run(false);
  auto b = run(true);
  EXPECT_TRUE(bit_equal(a.first, b.first));
  EXPECT_TRUE(bit_equal(a.second, b.second));
}

// ---- LoRA + block checkpointing + changes between forward and backward ----
TEST(CheckpointAttack, LoraCheckpointChangesBetweenForwardAndBackward) {
  const auto b = random_batch(1, 6, 32, 3);
  for (int change = 0; change < 5; ++change) {
    for (const auto policy : {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock,
                              ActivationCheckpointingKind::BlockSegments}) {
      Random random(4);
      DecoderOnlyTransformer model(tiny_dims(2), random, 1e-5F, FullSequenceAttentionKind::Materialized, policy);
      model.set_dropout(0.1F, 3);
      LoraConfig config;
      config.rank = 2;
      config.targets = {LoraTarget::Query, LoraTarget::Down};
      model.add_lora(config, random);
      model.set_base_trainable(false);
      const Variable loss = model.loss(b.tokens, b.targets, 1);
      reset_checkpoint_replay_count();
      switch (change) {
        case 0: model.set_lora_active(false); break;
        case 1: model.set_base_trainable(true); break;
        case 2: model.merge_lora(); break;
        case 3: model.remove_lora(); break;
        case 4: {
          Variable a = model.lora_parameters()[0].variable;
          Tensor t = a.value();
          t.fill(0.5F);
          break;
        }
      }
      EXPECT_THROW(loss.backward(), StaleGraphError) << change << " policy " << static_cast<int>(policy);
      EXPECT_EQ(checkpoint_replay_count(), 0);
    }
  }
}

TEST(CheckpointAttack, LoraFrozenBaseCheckpointedEqualsOrdinary) {
  const auto b = random_batch(2, 8, 32, 5);
  std::vector<Tensor> ref;
  for (const auto policy : {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock,
                            ActivationCheckpointingKind::BlockSegments}) {
    Random random(6);
    DecoderOnlyTransformer model(tiny_dims(3), random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
    model.set_dropout(0.25F, 8);
    LoraConfig config;
    config.rank = 2;
    config.targets = {LoraTarget::Query, LoraTarget::Value, LoraTarget::Output, LoraTarget::Up, LoraTarget::Down};
    model.add_lora(config, random);
    model.set_base_trainable(false);
    Adam adam([&] {
      std::vector<Variable> v;
      for (auto& p : model.lora_parameters()) v.push_back(p.variable);
      return v;
    }());
    std::vector<Tensor> grads;
    for (int step = 0; step < 2; ++step) {
      Variable loss = model.loss(b.tokens, b.targets, 2);
      loss.retain_grad();
      loss.backward();
      (void)loss.graph_statistics();
      (void)loss.retained_nodes();
      adam.step();
    }
    for (auto& p : model.lora_parameters()) grads.push_back(p.variable.value().clone());
    if (ref.empty()) {
      ref = grads;
    } else {
      for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], ref[i])) << i;
    }
  }
}

// ---- DecodeSession after load_model_state ----
TEST(CheckpointAttack, DecodeSessionAfterLoadModelState) {
  Random random(7);
  DecoderOnlyTransformer model(tiny_dims(1), random);
  Random random2(8);
  DecoderOnlyTransformer other(tiny_dims(1), random2);
  const auto file = std::filesystem::temp_directory_path() / ("rt_review_other_" + std::to_string(::getpid()) + ".safetensors");
  save_model_state(other, file);
  DecodeSession session(model);
  session.decode_token(1);
  load_model_state(model, file);
  EXPECT_THROW(session.decode_token(2), StaleGraphError);
  session.reset();
  DecodeSession fresh(other);
  fresh.decode_token(1);
  session.decode_token(1);
  EXPECT_TRUE(bit_equal(session.decode_token(2), fresh.decode_token(2)));
  std::filesystem::remove(file);
}

// ---- Adam: param sharing a buffer via Variable(w.value()), Adam + no-grad view ----
TEST(CheckpointAttack, AdamStepStalesEveryAliasGraph) {
  Variable w(randn({3, 3}, 20), true, "w");
  Variable alias(w.value(), false, "alias");
  Variable x(randn({3, 3}, 21), true, "x");
  Variable g1 = sum(mul(x, alias));
  Variable g2;
  {
    NoGradGuard ng;
    g2 = reshape(w, {9});
  }
  Variable g3 = sum(mul(reshape(x, {9}), g2));
  sum(mul(w, w)).backward();
  Adam({w}).step();
  EXPECT_THROW(g1.backward(), StaleGraphError);
  EXPECT_THROW(g3.backward(), StaleGraphError);
  // set_value shares a buffer; writing via the original handle.
  Variable v(Tensor::zeros({3, 3}), false, "v");
  Tensor buf = randn({3, 3}, 22);
  v.set_value(buf);
  Variable g4 = sum(mul(x, v));
  buf.copy_from(randn({3, 3}, 23));
  EXPECT_THROW(g4.backward(), StaleGraphError);
}

// ---- threads: independent models, checkpoint + dropout, thread-local recorders ----
TEST(CheckpointAttack, TwoThreadsCheckpointDropoutOwnModels) {
  const auto b = random_batch(2, 8, 32, 40);
  auto train = [&](std::vector<Tensor>& out) {
    Random random(41);
    DecoderOnlyTransformer model(tiny_dims(2), random, 1e-5F, FullSequenceAttentionKind::Flash,
                                 ActivationCheckpointingKind::TransformerBlock);
    model.set_dropout(0.3F, 2);
    for (int i = 0; i < 5; ++i) model.loss(b.tokens, b.targets, 2).backward();
    for (auto& p : model.parameters()) out.push_back(p.variable.grad().clone());
  };
  std::vector<Tensor> ref, t0, t1;
  train(ref);
  std::thread a(train, std::ref(t0));
  std::thread c(train, std::ref(t1));
  a.join();
  c.join();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(bit_equal(t0[i], ref[i]));
    EXPECT_TRUE(bit_equal(t1[i], ref[i]));
  }
}

// ---- no differentiable path: nested, and as the loss itself ----
TEST(CheckpointAttack, NoDifferentiablePathVariants) {
  Variable x(randn({2, 3}, 30), true, "x");
  Variable w(randn({3, 3}, 31), true, "w");
  const std::vector<Variable> deps{w};
  Fn teacher = [&](const Variable& h) {
    NoGradGuard g;
    return matmul(h, w);
  };
  Fn outer = [&](const Variable& h) { return add(checkpoint(h, deps, teacher), matmul(h, w)); };
  Variable loss = sum(checkpoint(x, deps, outer));
  Variable ref = sum(outer(x));
  ref.backward();
  const Tensor gx = x.grad().clone(), gw = w.grad().clone();
  ASSERT_NO_THROW(loss.backward());
  EXPECT_TRUE(bit_equal(x.grad(), gx));
  EXPECT_TRUE(bit_equal(w.grad(), gw));
  Variable c = checkpoint(x, deps, teacher);
  EXPECT_FALSE(c.requires_grad());
  EXPECT_THROW(sum(c).backward(), BackwardError);
}

// A callable that loses its differentiable path only when replaying: under
// no_grad then, its replay's zeros were committed as the input's and the
// dependency's gradients; now OutputChanged. A constant returned is the
// unused-input rule's. Every gradient is left as it was.
TEST(CheckpointAttack, AReplayWithoutTheForwardsDifferentiablePathIsOutputChanged) {
  Variable x(randn({2, 3}, 32), true, "x");
  Variable w(randn({3, 3}, 33), true, "w");
  const std::vector<Variable> deps{w};
  struct Case {
    const char* what;
    Fn fn;
    Violation violation;
    const char* message;
  };
  const std::vector<Case> callables{
      {"no_grad when replaying",
       [&](const Variable& h) {
         std::optional<NoGradGuard> off;
         if (checkpoint_replaying()) off.emplace();
         return matmul(h, w);
       },
       Violation::OutputChanged, "does not require grad but the forward's did"},
      {"a constant when replaying",
       [&](const Variable& h) {
         const Variable y = matmul(h, w);
         return checkpoint_replaying() ? Variable(y.value().clone()) : y;
       },
       Violation::InputUnused, "does not depend on the input"},
  };
  for (const auto& [what, fn, violation, message] : callables) {
    sum(matmul(x, w)).backward();  // gradients a failed pass must keep
    const Tensor gx = x.grad().clone(), gw = w.grad().clone();
    const Variable loss = sum(checkpoint(x, deps, fn));
    try {
      loss.backward();
      ADD_FAILURE() << what << ": zeros were committed";
    } catch (const CheckpointContractError& e) {
      EXPECT_EQ(e.violation(), violation) << what;
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bit_equal(x.grad(), gx)) << what;
    EXPECT_TRUE(bit_equal(w.grad(), gw)) << what;
  }
}

// ---- retain_grad inside the callable, and on the checkpoint output ----
TEST(CheckpointAttack, RetainGradInsideAndOnOutput) {
  Variable x(randn({2, 3}, 32), true, "x");
  Variable w(randn({3, 3}, 33), true, "w");
  const std::vector<Variable> deps{w};
  Fn f = [&](const Variable& h) {
    Variable y = matmul(h, w);
    y.retain_grad();
    return silu(y);
  };
  Variable y = checkpoint(x, deps, f);
  y.retain_grad();
  Variable loss = sum(y);
  loss.backward();
  ASSERT_TRUE(y.has_grad());
  EXPECT_TRUE(bit_equal(y.grad(), Tensor::ones({2, 3})));
  loss.backward();
  EXPECT_TRUE(bit_equal(y.grad(), Tensor::ones({2, 3})));
}

TEST(CheckpointAttack, CallableWriteCorruptsOrdinaryNodeInSamePass) {
  // A callable that writes into a buffer an ordinary node of the same graph
  // saved never gets to build a checkpoint, so it can never write during a
  // backward pass.
  Variable y(Tensor::from_data({2}, {1, 1}), true, "y");
  Variable x(Tensor::from_data({2}, {1, 1}), true, "x");
  Variable m(Tensor::from_data({2}, {1, 1}), false, "m");
  const Variable d = mul(y, m);
  Fn f = [m](const Variable& in) {
    Variable mm = m;
    mm.mutable_value("bump").data()[0] += 1.0F;
    return mul(in, mm);
  };
  EXPECT_THROW(checkpoint(x, {}, f), CheckpointContractError);
  // The refused call did write once (it is found afterwards): every graph
  // that read m knows, as after any in-place write.
  EXPECT_THROW(sum(d).backward(), StaleGraphError);
}

TEST(CheckpointAttack, CachedConstantRequiresGradTurnedOn) {
  Variable x(Tensor::from_data({2}, {1, 2}), true, "x");
  std::optional<Variable> cached;
  Fn f = [&](const Variable& in) {
    if (!cached) cached = Variable(Tensor::from_data({2}, {3, 3}), false, "table");
    return mul(in, *cached);
  };
  Variable loss = sum(checkpoint(x, {}, f));
  cached->set_requires_grad(true);
  try {
    loss.backward();
    ADD_FAILURE() << "no error; x.grad[0] = " << x.grad().at({0});
  } catch (const StaleGraphError&) {
  } catch (const Error& e) {
    ADD_FAILURE() << "not a StaleGraphError (ordinary graph gives one): " << e.what();
  }
}

TEST(CheckpointAttack, InnerCapturesOuterTeacherOutput) {
  Variable x(randn({2, 3}, 40), true, "x");
  Variable w(randn({3, 3}, 41), true, "w");
  const std::vector<Variable> deps{w};
  Fn teacher = [&](const Variable& h) {
    NoGradGuard g;
    return matmul(h, w);
  };
  auto body = [&](const Variable& h, bool ck) {
    Variable t = ck ? checkpoint(h, deps, teacher) : teacher(h);
    Fn inner = [t, &w](const Variable& v) { return mul(matmul(v, w), t); };
    return ck ? checkpoint(h, deps, inner) : inner(h);
  };
  Variable ref = sum(body(x, false));
  ref.backward();
  const Tensor gx = x.grad().clone(), gw = w.grad().clone();
  Variable loss;
  ASSERT_NO_THROW(loss = sum(checkpoint(x, deps, [&](const Variable& h) { return body(h, true); })));
  ASSERT_NO_THROW(loss.backward());
  EXPECT_TRUE(bit_equal(x.grad(), gx));
  EXPECT_TRUE(bit_equal(w.grad(), gw));
}

TEST(CheckpointAttack, SetDropoutBetweenForwardAndBackward) {
  const auto b = random_batch(2, 8, 32, 50);
  std::vector<Tensor> ref;
  for (const auto policy : {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock}) {
    Random random(51);
    DecoderOnlyTransformer model(tiny_dims(2), random, 1e-5F, FullSequenceAttentionKind::Materialized, policy);
    model.set_dropout(0.3F, 9);
    Variable loss = model.loss(b.tokens, b.targets, 2);
    model.set_dropout(0.6F, 123);  // reseeds the same generator object
    model.set_training(false);
    loss.backward();
    std::vector<Tensor> g;
    for (auto& p : model.parameters()) g.push_back(p.variable.grad().clone());
    if (ref.empty()) ref = g;
    else for (std::size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(bit_equal(g[i], ref[i])) << i;
  }
}

TEST(CheckpointAttack, ConstantInputSeenAsRequiringGradInside) {
  Variable k(randn({2, 3}, 60), false, "k");  // a constant input (data)
  Variable w(randn({3, 3}, 61), true, "w");
  const std::vector<Variable> deps{w};
  bool rg_in = false;
  auto body = [&](const Variable& in, bool ck) {
    rg_in = in.requires_grad();
    const Variable c = scale(in, 2.0F);  // a constant outside a checkpoint
    const Variable h = matmul(in, w);
    Fn inner = [c, &w](const Variable& v) { return mul(matmul(v, w), c); };
    return ck ? checkpoint(h, deps, inner) : inner(h);
  };
  Variable ref = sum(body(k, false));
  EXPECT_FALSE(rg_in);
  ref.backward();
  const Tensor gw = w.grad().clone();
  Variable loss;
  try {
    loss = sum(checkpoint(k, deps, [&](const Variable& in) { return body(in, true); }));
    EXPECT_FALSE(rg_in) << "the callable's input requires grad inside, not outside";
    loss.backward();
    EXPECT_TRUE(bit_equal(w.grad(), gw));
  } catch (const CheckpointContractError& e) {
    ADD_FAILURE() << "nested rejects what un-nested accepts: " << e.what();
  }
}

// ---- third pass: values that leave the callable, leaves it changes ----
// A value computed inside the callable and used outside it (an auxiliary
// loss handed out through a side variable) led to the callable's private
// input leaf: the pass committed that part of the gradient there and the
// real input silently missed it (max difference 4.05). Every pass that
// reaches such a value is refused before any gradient changes.
TEST(CheckpointAttack, AValueThatLeavesTheCallableIsRefusedByTheBackward) {
  Variable w(randn({3, 3}, 2), true, "w");
  Variable aux;  // the side channel
  const Fn block = [&](const Variable& h) {
    Variable y = matmul(h, w);
    aux = sum(mul(y, y));
    return silu(y);
  };
  for (const GraphAfterBackward graph : {GraphAfterBackward::Keep, GraphAfterBackward::Release}) {
    Variable x(randn({2, 3}, 1), true, "x");
    Variable y = checkpoint(scale(x, 1.0F), std::vector<Variable>{w}, block, {.name = "blockA"});
    Variable loss = add(sum(y), aux);
    const std::uint64_t wserial = w.grad_serial();
    try {
      loss.backward(graph);
      ADD_FAILURE() << "the escaped value was not refused";
    } catch (const CheckpointContractError& e) {
      EXPECT_EQ(e.violation(), Violation::InternalValueEscaped);
      EXPECT_NE(std::string(e.what()).find("blockA"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(x.grad().defined());  // nothing committed
    EXPECT_EQ(w.grad_serial(), wserial);
  }
  // The same value kept only inside (not used by the loss) is fine, and the
  // checkpointed gradients equal the ordinary ones.
  Variable x(randn({2, 3}, 1), true, "x");
  sum(block(x)).backward();
  const Tensor gx = x.grad().clone();
  const Tensor gw = w.grad().clone();
  sum(checkpoint(x, std::vector<Variable>{w}, block)).backward();
  EXPECT_TRUE(bit_equal(x.grad(), gx));
  EXPECT_TRUE(bit_equal(w.grad(), gw));
}

// A callable that replaced an outside variable's value with set_value (a
// running statistic, a step counter) was not noticed: every replay replaced
// it again (a counter of forwards read 2 after one checkpointed step). The
// in-place form was already refused; now every structural change of a
// variable made outside the callable is (set_value, to(), mark_changed,
// set_requires_grad), at the forward, and the variable is as it was after it.
TEST(CheckpointAttack, ACallableThatChangesAnOutsideVariableIsRefused) {
  Variable w(Tensor::from_data({2}, {1, 1}), true, "w");
  Variable running(Tensor::from_data({1}, {0}), false, "running_count");
  const std::vector<std::function<void()>> changes = {
      [&] { running.set_value(Tensor::from_data({1}, {running.value().at({0}) + 1})); },
      [&] { running.mark_changed("counted"); },
      [&] { running.set_requires_grad(true); },
  };
  for (const auto& change : changes) {
    running.set_requires_grad(false);
    const Fn f = [&](const Variable& in) {
      change();
      return mul(in, w);
    };
    Variable x(Tensor::from_data({2}, {1, 2}), true, "x");
    try {
      sum(checkpoint(x, std::vector<Variable>{w}, f)).backward();
      ADD_FAILURE() << "the change was not refused";
    } catch (const CheckpointContractError& e) {
      EXPECT_EQ(e.violation(), Violation::BoundaryModified);
      EXPECT_NE(std::string(e.what()).find("running_count"), std::string::npos) << e.what();
    }
  }
  // Variables the callable makes may change as they like.
  const Fn own = [&](const Variable& in) {
    Variable local(Tensor::from_data({2}, {2, 2}), false, "local");
    local.set_value(Tensor::from_data({2}, {3, 3}));
    return mul(mul(in, w), local);
  };
  Variable x(Tensor::from_data({2}, {1, 2}), true, "x");
  sum(checkpoint(x, std::vector<Variable>{w}, own)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{3, 3}));
}

// What "behaves exactly as the ordinary graph" means for a leaf used twice
// inside one checkpoint that also gets gradient from another: the same sum,
// in the nested context's order (the replay's own contributions first), so
// equal up to rounding; used once per checkpoint, bit for bit.
TEST(CheckpointAttack, ALeafUsedTwiceInsideGetsTheSameSumInAnotherOrder) {
  Variable w(randn({4, 4}, 3), true, "w");
  const Fn twice = [&](const Variable& h) { return add(h, matmul(silu(matmul(h, w)), w)); };
  const Fn once = [&](const Variable& h) { return add(h, silu(matmul(h, w))); };
  for (const bool use_twice : {true, false}) {
    const Fn& f = use_twice ? twice : once;
    Variable x(randn({3, 4}, 4), true, "x");
    sum(f(f(x))).backward();
    const Tensor gw = w.grad().clone();
    const Tensor gx = x.grad().clone();
    const std::vector<Variable> deps{w};
    sum(checkpoint(checkpoint(x, deps, f), deps, f)).backward();
    if (use_twice) {
      EXPECT_LT(max_abs_diff(w.grad(), gw), 1e-5F);
      EXPECT_LT(max_abs_diff(x.grad(), gx), 1e-5F);
    } else {
      EXPECT_TRUE(bit_equal(w.grad(), gw));
      EXPECT_TRUE(bit_equal(x.grad(), gx));
    }
  }
}

// A dependency (or the input) the callable reads only without gradient (a
// teacher or EMA weight, a detached scale) must be declared, and then got a
// committed zero gradient with a new grad_serial, where the ordinary graph
// does not reach it: Adam stepped it in the checkpointed run only (6.7e-4
// apart after one step). Its edge now keeps the version check and no pass
// follows it: no gradient, serial unmoved, the same Adam steps.
TEST(CheckpointAttack, ADependencyReadOnlyWithoutGradientGetsNoGradient) {
  const auto run = [](bool checkpointed) {
    Variable x(randn({2, 3}, 1), true, "x");
    Variable w(randn({3, 3}, 2), true, "w");
    Variable t(randn({3, 3}, 3), true, "t");
    Adam adam({w, t});
    sum(matmul(matmul(x, w), t)).backward();  // step 1: t trains
    adam.step();
    const Fn block = [&](const Variable& h) {  // step 2: t read detached, and h too in one factor
      Variable td;
      Variable hd;
      {
        NoGradGuard no_grad;
        td = scale(t, 1.0F);
        hd = scale(h, 0.5F);
      }
      return add(matmul(matmul(h, w), td), hd);
    };
    const std::uint64_t serial = t.grad_serial();
    Variable loss = checkpointed ? sum(checkpoint(x, std::vector<Variable>{w, t}, block)) : sum(block(x));
    EXPECT_EQ(loss.leaves().size(), 2U);  // x and w: t is not a leaf of this graph
    loss.backward();
    EXPECT_EQ(t.grad_serial(), serial) << checkpointed;
    const Tensor gx = x.grad().clone();
    adam.step();
    return std::pair{t.value().clone(), gx};
  };
  const auto [ordinary_t, ordinary_gx] = run(false);
  const auto [checkpointed_t, checkpointed_gx] = run(true);
  EXPECT_TRUE(bit_equal(ordinary_t, checkpointed_t));
  EXPECT_TRUE(bit_equal(ordinary_gx, checkpointed_gx));
}

// Only the input read without gradient: the checkpoint passes no gradient to
// it, as the ordinary graph (whose only path to it is detached) does not.
TEST(CheckpointAttack, AnInputReadOnlyWithoutGradientGetsNoGradient) {
  Variable w(randn({3, 3}, 2), true, "w");
  const Fn block = [&](const Variable& h) {
    Variable hd;
    {
      NoGradGuard no_grad;
      hd = scale(h, 2.0F);
    }
    return matmul(hd, w);
  };
  Variable x(randn({2, 3}, 1), true, "x");
  sum(block(x)).backward();
  EXPECT_FALSE(x.has_grad());
  const Tensor gw = w.grad().clone();
  Variable x2(randn({2, 3}, 1), true, "x2");
  sum(checkpoint(x2, std::vector<Variable>{w}, block)).backward();
  EXPECT_FALSE(x2.has_grad());
  EXPECT_TRUE(bit_equal(w.grad(), gw));
}

// A constant the callable caches, replaced (not changed) between forward and
// backward — a rebuilt mask or table: the ordinary graph differentiates with
// the values its forward read (x.grad 3), the replay read the new constant
// (x.grad 42) without a word. A replay that reads a constant made before it
// that its forward did not read is a stale graph, before any gradient.
TEST(CheckpointAttack, ACachedConstantReplacedBeforeTheBackwardIsAStaleGraph) {
  std::optional<Variable> cached;
  const Fn f = [&](const Variable& in) {
    if (!cached) cached = Variable(Tensor::from_data({2}, {3, 3}), false, "table");
    return mul(in, reshape(*cached, {2}));
  };
  Variable x(Tensor::from_data({2}, {1, 2}), true, "x");
  Variable loss = sum(checkpoint(x, {}, f));
  cached = Variable(Tensor::from_data({2}, {42, 42}), false, "table");  // the cache rebuilt
  try {
    loss.backward();
    ADD_FAILURE() << "the replay used the new table";
  } catch (const StaleGraphError& e) {
    EXPECT_NE(std::string(e.what()).find("table"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(x.has_grad());
  // Kept (not replaced), the cache is read again: the ordinary gradient.
  cached.reset();
  Variable again = sum(checkpoint(x, {}, f));
  again.backward(GraphAfterBackward::Keep);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{3, 3}));
  again.backward();  // a second replay reads the same constants
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{3, 3}));
}

// ---- a pass inside a pass (the fourth adversarial pass) ----
// A checkpoint function that calls backward() over the running pass's graph
// when its replay runs (or a hook that does) freed nodes the outer pass was
// still reading: SIGSEGV, SIGBUS or a garbled message. Now a BackwardError
// before the inner pass computes anything, and the outer pass fails
// committing nothing; an optimizer step from the replay is a ValueError
// before any weight moves. A pass over another graph stays allowed.
TEST(CheckpointAttack, APassOverTheRunningGraphOrAStepInsideAReplayIsRefusedBeforeAnythingChanges) {
  for (const int what : {0, 1, 2, 3, 4}) {
    Variable x(Tensor::from_data({3}, {1, 2, 3}), true, "x");
    Variable w(Tensor::from_data({3}, {0.5F, -1, 2}), true, "w");
    Adam adam({w});
    Variable outer;                        // the loss whose pass runs the replay
    const Variable h = scale(x, 2.0F);     // an interior node of that pass: the checkpoint's input
    const Variable side = sum(mul(w, x));  // another graph, sharing only leaves
    bool misbehave = true;
    Fn f = [&](const Variable& in) {
      Variable out = mul(in, w);
      if (checkpoint_replaying() && misbehave) {
        if (what == 0) outer.backward(GraphAfterBackward::Release);
        if (what == 1) sum(h).backward(GraphAfterBackward::Release);
        if (what == 2) adam.step();
        if (what == 3) side.backward();
        if (what == 4) outer.backward();  // Keep inside Keep: it replayed this checkpoint without end
      }
      return out;
    };
    side.backward();  // a gradient for w, so the step would have something to apply
    const Tensor w_before = w.value().clone();
    const Tensor w_grad = w.grad();
    const std::vector<Variable> dependencies{w};
    const Variable loss = sum(checkpoint(h, dependencies, f));
    outer = loss;
    if (what == 3) {
      loss.backward();  // apart from the running pass's nodes: allowed
      EXPECT_NE(w.grad().storage_id(), w_grad.storage_id());
      continue;
    }
    try {
      loss.backward();
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      const std::string text = e.what();
      const bool named = what == 2 ? text.find("step() called from a checkpoint function") != std::string::npos
                                   : text.find("a pass cannot run inside another over the same nodes") !=
                                         std::string::npos;
      EXPECT_TRUE(named) << what << ": " << text;
    }
    EXPECT_TRUE(bit_equal(w.value(), w_before)) << what;
    EXPECT_EQ(w.grad().storage_id(), w_grad.storage_id()) << what;  // nothing committed
    EXPECT_EQ(adam.step_count(), 0);
    misbehave = false;
    loss.backward();  // the same graph still works: the failed pass released nothing
    EXPECT_NE(w.grad().storage_id(), w_grad.storage_id());
  }
}
