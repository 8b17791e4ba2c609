// backward(GraphAfterBackward::Release): the graph is freed as the pass goes
// (issue 16's peak-memory fix). Same gradients as Keep, bit for bit, on every
// checkpointing policy; a released graph refuses a second pass with a typed
// error; a failing pass commits nothing; what the caller holds survives; and
// allocator counters (not timings) pin the memory it saves.
#include <gtest/gtest.h>

#include <stdexcept>

#include "model_fixtures.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"
#include "riftco_transformer/variable.hpp"

using namespace riftco_transformer;
using rt_test::randn;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {

/// An op whose backward throws on demand.
Variable throwing_identity(const Variable& x, const bool* should_throw) {
  return Variable::from_op("throwing_identity", x.value().clone(), {x},
                           [should_throw](const Tensor& g, const std::vector<bool>&) {
                             if (*should_throw) throw std::runtime_error("closure failed on purpose");
                             return std::vector<Tensor>{g};
                           });
}

struct ModelStep {
  float loss = 0;
  std::vector<Tensor> grads;
};

ModelStep model_step(ActivationCheckpointingKind policy, GraphAfterBackward graph, float drop) {
  Random random(31);
  DecoderOnlyTransformer model(tiny_dims(3), random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
  if (drop > 0.0F) model.set_dropout(drop, 7);
  const auto b = random_batch(2, 12, 32, 32);
  ModelStep r;
  Variable loss = model.loss(b.tokens, b.targets, 2);
  r.loss = loss.value().item();
  loss.backward(graph);
  for (const NamedParameter& p : model.parameters()) r.grads.push_back(p.variable.grad().clone());
  return r;
}

struct Failing : BackwardHooks {
  void gradient_final(const Variable&, const Tensor&) override {}
  std::vector<std::pair<Variable, Tensor>> finish() override {
    throw CommunicationError("[test] the all-reduce failed");
  }
};

}  // namespace

TEST(ReleaseGraph, GradientsEqualKeepBitForBitOnEveryPolicy) {
  for (const ActivationCheckpointingKind policy :
       {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock,
        ActivationCheckpointingKind::BlockSegments, ActivationCheckpointingKind::AttentionSubBlock,
        ActivationCheckpointingKind::MlpSubBlock}) {
    for (const float drop : {0.0F, 0.3F}) {
      const ModelStep keep = model_step(policy, GraphAfterBackward::Keep, drop);
      const ModelStep released = model_step(policy, GraphAfterBackward::Release, drop);
      const std::string what = std::string(activation_checkpointing_name(policy)) + " dropout " + std::to_string(drop);
      EXPECT_EQ(keep.loss, released.loss) << what;
      ASSERT_EQ(keep.grads.size(), released.grads.size());
      for (std::size_t i = 0; i < keep.grads.size(); ++i) {
        EXPECT_TRUE(bit_equal(keep.grads[i], released.grads[i])) << what << " gradient " << i;
      }
    }
  }
}

TEST(ReleaseGraph, ASecondPassThroughAReleasedGraphIsABackwardError) {
  Variable x(randn({4, 4}, 1), true, "x");
  Variable loss = sum(mul(silu(x), x));
  loss.backward(GraphAfterBackward::Release);
  const Tensor first = x.grad().clone();
  try {
    loss.backward();
    FAIL() << "a second pass through a released graph ran";
  } catch (const BackwardError& e) {
    EXPECT_NE(std::string(e.what()).find("released by an earlier backward"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(bit_equal(first, x.grad()));  // the refused pass committed nothing
  // A graph built again differentiates again, with the same gradients.
  sum(mul(silu(x), x)).backward(GraphAfterBackward::Release);
  EXPECT_TRUE(bit_equal(first, x.grad()));
}

TEST(ReleaseGraph, AFailingPassCommitsNothingAndTheGraphIsNotReusable) {
  Variable x(randn({3, 5}, 2), true, "x");
  Variable w(randn({3, 5}, 3), true, "w");
  sum(mul(x, w)).backward();  // public gradients to compare against
  const Tensor x_before = x.grad().clone();
  const Tensor w_before = w.grad().clone();
  bool should_throw = true;
  // w's branch runs (and is released) before the throwing node: the pass
  // fails after gradients were computed and parts of the graph freed.
  Variable loss = add(sum(mul(w, w)), sum(throwing_identity(mul(x, w), &should_throw)));
  EXPECT_THROW(loss.backward(GraphAfterBackward::Release), std::runtime_error);
  ASSERT_TRUE(x.has_grad());
  ASSERT_TRUE(w.has_grad());
  EXPECT_TRUE(bit_equal(x_before, x.grad()));
  EXPECT_TRUE(bit_equal(w_before, w.grad()));
  should_throw = false;
  EXPECT_THROW(loss.backward(GraphAfterBackward::Release), BackwardError);  // partly released: refused whole
  EXPECT_TRUE(bit_equal(x_before, x.grad()));
  Variable again = add(sum(mul(w, w)), sum(throwing_identity(mul(x, w), &should_throw)));
  again.backward(GraphAfterBackward::Release);
  EXPECT_TRUE(bit_equal(x.grad(), w.value()));  // d/dx Σ x·w = w
}

TEST(ReleaseGraph, AHookThatThrowsAfterEveryGradientWasComputedCommitsNothing) {
  Variable x(randn({4, 4}, 4), true, "x");
  Variable loss = sum(mul(silu(x), x));
  loss.backward();
  const Tensor before = x.grad().clone();
  Variable changed = sum(mul(scale(x, 3.0F), x));  // a different gradient, computed and then dropped
  Failing hooks;
  EXPECT_THROW(changed.backward(hooks, GraphAfterBackward::Release), CommunicationError);
  ASSERT_TRUE(x.has_grad());  // not moved from, not emptied
  EXPECT_TRUE(bit_equal(before, x.grad()));
}

TEST(ReleaseGraph, WhatTheCallerHoldsSurvives) {
  Variable x(randn({2, 6}, 5), true, "x");
  Variable h = silu(x);  // held by the caller
  h.retain_grad();
  const Tensor h_value = h.value().clone();
  Variable loss = sum(mul(h, h));
  loss.backward(GraphAfterBackward::Release);
  EXPECT_TRUE(bit_equal(h.value(), h_value));
  ASSERT_TRUE(h.has_grad());
  EXPECT_TRUE(bit_equal(h.grad(), scale(h, 2.0F).value()));  // d/dh Σ h² = 2h
  EXPECT_EQ(loss.value().numel(), 1);
}

TEST(ReleaseGraph, LeavesThroughAReleasedNodeAreABackwardErrorNotAShortList) {
  Variable x(randn({3, 4}, 6), true, "x");
  Variable w(randn({3, 4}, 7), true, "w");
  Variable y = mul(x, w);  // shared by two losses
  y.set_name("y");
  Variable other = sum(add(y, w));  // reaches w directly too
  ASSERT_EQ(other.leaves().size(), 2U);
  Variable loss = sum(silu(y));
  loss.backward(GraphAfterBackward::Release);  // releases y (held, so its value stays)
  for (const Variable* v : {&other, &loss, &y}) {
    try {
      (void)v->leaves();
      ADD_FAILURE() << "leaves() through a released node returned a list";
    } catch (const BackwardError& e) {
      EXPECT_NE(std::string(e.what()).find("[leaves]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("released by an earlier backward"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(y.parents().empty());
  EXPECT_EQ(sum(add(mul(x, w), w)).leaves().size(), 2U);  // a graph built again lists both
}

// A chain of N ops, each keeping a buffer of n floats: Keep holds all N of
// them until the graph goes; Release frees each once its node ran, so while
// the caller still holds the loss only the leaf's gradient is left, and the
// pass never holds more than what it started with plus a few buffers.
TEST(ReleaseGraph, AChainIsFreedAsThePassGoes) {
  constexpr std::int64_t n = 1 << 14;
  constexpr int depth = 24;
  constexpr std::int64_t buffer = n * 4;
  Variable x(randn({n}, 8), true, "x");
  auto run = [&](GraphAfterBackward graph, std::int64_t* kept_after, std::int64_t* pass_peak) {
    const std::int64_t start = memory_stats().live_bytes;
    Variable h = x;
    for (int i = 0; i < depth; ++i) h = silu(h);
    Variable loss = sum(h);
    h = Variable();
    const std::int64_t before_backward = memory_stats().live_bytes;
    reset_peak_memory();
    loss.backward(graph);
    *pass_peak = memory_stats().peak_bytes - before_backward;
    *kept_after = memory_stats().live_bytes - start;  // the loss is still held here
    x.clear_grad();
  };
  std::int64_t keep_after = 0;
  std::int64_t keep_peak = 0;
  std::int64_t release_after = 0;
  std::int64_t release_peak = 0;
  run(GraphAfterBackward::Keep, &keep_after, &keep_peak);
  run(GraphAfterBackward::Release, &release_after, &release_peak);
  RecordProperty("keep_after", std::to_string(keep_after));
  RecordProperty("release_after", std::to_string(release_after));
  RecordProperty("release_peak", std::to_string(release_peak));
  EXPECT_GE(keep_after, depth * buffer);       // every activation, and the gradient
  EXPECT_LE(release_after, buffer + 4096);     // the gradient (and the scalar loss)
  EXPECT_LE(release_peak, 4 * buffer + 4096);  // the seed's expansion, a gradient in, a temporary, one out
}

// A node that only the graph holds is destroyed after its backward anyway;
// its value goes before the backward runs (closures keep what they read),
// so its output and its gradients are never alive together. A node the
// caller holds keeps its value.
TEST(ReleaseGraph, ANodeOnlyTheGraphHoldsGivesUpItsValueBeforeItsBackward) {
  constexpr std::int64_t n = 1 << 14;
  constexpr std::int64_t buffer = n * 4;
  Variable x(randn({n}, 10), true, "x");
  Variable w(randn({n}, 11), true, "w");
  auto pass_peak = [&](const Variable& loss) {
    const std::int64_t before = memory_stats().live_bytes;
    reset_peak_memory();
    loss.backward(GraphAfterBackward::Release);
    return memory_stats().peak_bytes - before;
  };
  // sum's gradient (n), then mul's two (2n) once its output (n) is gone.
  Variable loss = sum(mul(x, w));  // mul's node: held by sum's edge only (the temporary is gone)
  const std::int64_t dropped = pass_peak(loss);
  Variable y = mul(x, w);
  const Tensor y_before = y.value().clone();
  const std::int64_t held = pass_peak(sum(y));
  RecordProperty("peak_dropped", std::to_string(dropped));
  RecordProperty("peak_held", std::to_string(held));
  EXPECT_LE(dropped, 2 * buffer + 4096);
  EXPECT_GE(held, 3 * buffer);  // here the output stays: the caller reads it
  EXPECT_LT(dropped, held);
  EXPECT_TRUE(bit_equal(y.value(), y_before));
}

// A checkpoint's replay graph is private: its nested pass always releases
// it. As in a transformer block, each replayed step reads a weight (a
// dependency), so the weights' gradients pile up while the pass runs; the
// replayed activations go one by one meanwhile, so the pass never holds the
// whole replay and all the weight gradients at once (kept, it would: about
// 2 · depth buffers).
TEST(ReleaseGraph, ACheckpointReplayIsFreedAsItsBackwardGoes) {
  constexpr std::int64_t n = 1 << 14;
  constexpr int depth = 16;
  constexpr std::int64_t buffer = n * 4;
  Variable x(randn({n}, 9), true, "x");
  std::vector<Variable> weights;
  for (int i = 0; i < depth; ++i) weights.emplace_back(randn({n}, 40 + static_cast<std::uint64_t>(i)), true);
  const std::int64_t start = memory_stats().live_bytes;
  Variable loss = sum(checkpoint(x, weights, [&weights](const Variable& input) {
    Variable h = input;
    for (const Variable& w : weights) h = mul(h, w);
    return h;
  }));
  const std::int64_t before_backward = memory_stats().live_bytes;
  reset_peak_memory();
  loss.backward();  // the outer graph is kept; the replay is released regardless
  const std::int64_t pass_peak = memory_stats().peak_bytes - before_backward;
  RecordProperty("replay_peak", std::to_string(pass_peak));
  // The replay's depth activations, then as many weight gradients replacing
  // them, plus a few buffers in flight (kept, the replay would reach 2 · depth + 2).
  EXPECT_LE(pass_peak, (depth + 6) * buffer + 4096);
  // Afterwards: the gradients of x and of every weight, nothing of the replay.
  EXPECT_LE(memory_stats().live_bytes - before_backward, (depth + 1) * buffer + 4096);
  EXPECT_GE(memory_stats().live_bytes - start, (depth + 1) * buffer);
}

// The training step issue 16 measured, on a wide and short model whose
// gradients outweigh its activations (as S3's do). Kept, the graph holds
// every activation until the gradients are all made: the peak above the
// step's start is gradients + activations. Released, the activations go as
// the gradients come: the peak stays within half the activations of the
// gradients' size (what remains is the first block's activations and the
// pass's temporaries), with or without block checkpointing.
TEST(ReleaseGraph, AStepPeaksAtTheGradientsNotGradientsPlusActivations) {
  TransformerDimensions d = tiny_dims(6);
  d.model_width = 64;
  d.heads = 4;
  d.feed_forward_width = 128;
  const auto b = random_batch(2, 8, 32, 33);
  struct Figures {
    std::int64_t gradients = 0;   // one set, the parameters' size
    std::int64_t activations = 0;  // live after the forward, above the step's start
    std::int64_t peak = 0;         // above the step's start, forward and backward
  };
  auto step = [&](ActivationCheckpointingKind policy, GraphAfterBackward graph) {
    Random random(34);
    DecoderOnlyTransformer model(d, random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
    Figures f;
    for (const NamedParameter& p : model.parameters()) f.gradients += p.variable.value().nbytes();
    const std::int64_t start = memory_stats().live_bytes;
    reset_peak_memory();
    Variable loss = model.loss(b.tokens, b.targets, 2);
    f.activations = memory_stats().live_bytes - start;
    loss.backward(graph);
    f.peak = memory_stats().peak_bytes - start;
    return f;
  };
  const Figures keep = step(ActivationCheckpointingKind::Disabled, GraphAfterBackward::Keep);
  const Figures released = step(ActivationCheckpointingKind::Disabled, GraphAfterBackward::Release);
  const Figures block = step(ActivationCheckpointingKind::TransformerBlock, GraphAfterBackward::Release);
  RecordProperty("gradients", std::to_string(keep.gradients));
  RecordProperty("activations", std::to_string(keep.activations));
  RecordProperty("peak_keep", std::to_string(keep.peak));
  RecordProperty("peak_release", std::to_string(released.peak));
  RecordProperty("peak_block_release", std::to_string(block.peak));
  ASSERT_GT(keep.gradients, keep.activations);  // the regime this test is about
  EXPECT_GE(keep.peak, keep.gradients + keep.activations);
  EXPECT_LE(released.peak, released.gradients + released.activations / 2)
      << "gradients " << released.gradients << ", activations " << released.activations;
  EXPECT_LE(block.peak, block.gradients + released.activations / 2)
      << "gradients " << block.gradients << ", activations of the disabled step " << released.activations;
}
