// take_if_unique: a closure of a released graph's last run may overwrite a
// saved buffer with its gradient, only when nothing but the graph can read
// that buffer again. Adversarial holders (a Variable, a Tensor alias or view,
// a second node, a leaf, a checkpoint input, a Keep pass) must see no
// donation and no change; a failure after a donation commits nothing and the
// graph refuses another pass, a failure before one leaves a node the caller
// holds as it was; the fused SwiGLU backward keeps its bits.
#include <gtest/gtest.h>

#include <stdexcept>

#include "../../src/ops/fused.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/variable.hpp"

using namespace riftco_transformer;
using rt_test::randn;

namespace {

struct Probe {
  int took = 0;     // closures that got their saved buffer
  int ran = 0;      // closures that ran
  std::vector<bool> took_in_order;  // per closure run, in order
  bool fail = false;  // throw after the donation (and after writing into it)
  bool fail_first = false;  // throw before asking for the buffer
};

/// y = x (a copy); its backward saves x's value (or, with own_copy, a copy
/// no node holds) and, when handed it, writes the gradient into that buffer
/// and returns it.
Variable probe(const Variable& x, Probe* p, bool own_copy = false) {
  const Tensor xv = own_copy ? x.value().clone() : x.value();
  return Variable::from_op(
      "probe", xv.clone(), {x},
      [xv = Tensor(xv), p](const Tensor& g, const std::vector<bool>&) mutable {
        ++p->ran;
        if (p->fail_first) throw std::runtime_error("closure failed on purpose before asking for its buffer");
        Tensor over = take_if_unique(xv);
        p->took_in_order.push_back(over.defined());
        if (!over.defined()) return std::vector<Tensor>{g.clone()};
        ++p->took;
        over.copy_from(g);
        if (p->fail) throw std::runtime_error("closure failed on purpose after a donation");
        return std::vector<Tensor>{over};
      },
      {xv});
}

Tensor ones_like(const Tensor& t) { return Tensor::ones(t.shape()); }

}  // namespace

TEST(DonatedBuffers, AReleasedGraphHandsOverAnIntermediateOnlyItHolds) {
  Variable a(randn({4, 5}, 1), true), b(randn({4, 5}, 2), true);
  Probe p;
  Variable loss = sum(mul(probe(add(a, b), &p), Variable(Tensor::full({4, 5}, 3.0F))));
  loss.backward(GraphAfterBackward::Release);
  EXPECT_EQ(p.took, 1);
  EXPECT_TRUE(bit_equal(a.grad(), Tensor::full({4, 5}, 3.0F)));
  EXPECT_TRUE(bit_equal(b.grad(), Tensor::full({4, 5}, 3.0F)));
  EXPECT_THROW(loss.backward(GraphAfterBackward::Release), BackwardError);
}

TEST(DonatedBuffers, KeepNeverDonatesAndTheSecondPassGivesTheSameGradients) {
  Variable a(randn({4, 5}, 1), true), b(randn({4, 5}, 2), true);
  Probe p;
  Variable loss = sum(probe(add(a, b), &p));
  loss.backward(GraphAfterBackward::Keep);
  loss.backward(GraphAfterBackward::Keep);
  EXPECT_EQ(p.ran, 2);
  EXPECT_EQ(p.took, 0);
  EXPECT_TRUE(bit_equal(a.grad(), ones_like(a.value())));
}

TEST(DonatedBuffers, WhatTheCallerHoldsIsNeverHandedOverNorChanged) {
  const Tensor av = randn({4, 5}, 1), bv = randn({4, 5}, 2);
  Variable a(av.clone(), true), b(bv.clone(), true);
  const Tensor expected = add(Variable(av), Variable(bv)).value().clone();
  Probe p;
  {  // a Variable of the intermediate
    Variable held = add(a, b);
    sum(probe(held, &p)).backward(GraphAfterBackward::Release);
    EXPECT_TRUE(bit_equal(held.value(), expected));
  }
  {  // a Tensor alias of its value
    Variable x = add(a, b);
    const Tensor alias = x.value();
    Variable loss = sum(probe(x, &p));
    x = Variable();
    loss.backward(GraphAfterBackward::Release);
    EXPECT_TRUE(bit_equal(alias, expected));
  }
  {  // a view (reshape) of its value
    Variable x = add(a, b);
    const Tensor view = x.value().reshape({20});
    Variable loss = sum(probe(x, &p));
    x = Variable();
    loss.backward(GraphAfterBackward::Release);
    EXPECT_TRUE(bit_equal(view, expected.reshape({20})));
  }
  {  // a leaf (a parameter's value)
    sum(probe(a, &p)).backward(GraphAfterBackward::Release);
    EXPECT_TRUE(bit_equal(a.value(), av));
  }
  EXPECT_EQ(p.ran, 4);
  EXPECT_EQ(p.took, 0);
  EXPECT_TRUE(bit_equal(a.grad(), ones_like(av)));
}

/// Two nodes saved one buffer: the first to run must not get it (the other
/// still reads it); the last may, once the first was released.
TEST(DonatedBuffers, ABufferTwoNodesSavedGoesOnlyToTheLastReader) {
  Variable a(randn({4, 5}, 1), true), b(randn({4, 5}, 2), true);
  Probe p;
  Variable x = add(a, b);
  Variable loss = add(sum(probe(x, &p)), sum(probe(x, &p)));
  x = Variable();
  loss.backward(GraphAfterBackward::Release);
  EXPECT_EQ(p.took_in_order, (std::vector<bool>{false, true}));
  EXPECT_TRUE(bit_equal(a.grad(), Tensor::full({4, 5}, 2.0F)));
  EXPECT_TRUE(bit_equal(b.grad(), Tensor::full({4, 5}, 2.0F)));
}

TEST(DonatedBuffers, AFailureAfterADonationCommitsNothingAndTheGraphRefusesAnotherPass) {
  Variable a(randn({4, 5}, 1), true), b(randn({4, 5}, 2), true);
  sum(mul(a, b)).backward();
  const Tensor ga = a.grad().clone(), gb = b.grad().clone();
  Probe p;
  p.fail = true;
  Variable loss = sum(probe(add(a, b), &p));
  EXPECT_THROW(loss.backward(GraphAfterBackward::Release), std::runtime_error);
  EXPECT_EQ(p.took, 1);  // the buffer was handed over and written before the throw
  EXPECT_TRUE(bit_equal(a.grad(), ga));
  EXPECT_TRUE(bit_equal(b.grad(), gb));
  p.fail = false;
  EXPECT_THROW(loss.backward(GraphAfterBackward::Release), BackwardError);  // the closure's buffer is gone
  EXPECT_THROW(loss.backward(GraphAfterBackward::Keep), BackwardError);
  EXPECT_EQ(p.ran, 1);
}

/// A closure that throws before any donation leaves a node the caller
/// holds as it was: its saved tensors still listed (retained_nodes), its
/// closure able to run again, and then (its buffer held by the closure and
/// the node's list alone) handed its buffer.
TEST(DonatedBuffers, AFailureBeforeADonationKeepsTheNodeAndWhatItSaved) {
  Variable a(randn({4, 5}, 1), true), b(randn({4, 5}, 2), true);
  Probe p;
  p.fail_first = true;
  Variable y = probe(add(a, b), &p, true);
  Variable loss = sum(y);
  const auto probe_saved_bytes = [&] {
    for (const RetainedNode& row : y.retained_nodes()) {
      if (row.kind == "probe") return row.saved_bytes;
    }
    return std::int64_t{-1};
  };
  const std::int64_t bytes = 4 * 5 * static_cast<std::int64_t>(sizeof(float));
  EXPECT_EQ(probe_saved_bytes(), bytes);
  EXPECT_THROW(loss.backward(GraphAfterBackward::Release), std::runtime_error);
  EXPECT_EQ(p.ran, 1);
  EXPECT_EQ(p.took, 0);
  EXPECT_EQ(probe_saved_bytes(), bytes);
  EXPECT_FALSE(a.has_grad());
  p.fail_first = false;
  y.backward(Tensor::ones({4, 5}), GraphAfterBackward::Release);
  EXPECT_EQ(p.ran, 2);
  EXPECT_EQ(p.took, 1);
  EXPECT_TRUE(bit_equal(a.grad(), ones_like(a.value())));
  EXPECT_TRUE(bit_equal(b.grad(), ones_like(b.value())));
}

TEST(DonatedBuffers, ACheckpointReplayDonatesOnlyUnderRelease) {
  for (const GraphAfterBackward graph : {GraphAfterBackward::Keep, GraphAfterBackward::Release}) {
    Variable x(randn({4, 5}, 3), true), w(randn({4, 5}, 4), true);
    Probe p;
    const std::vector<Variable> deps{w};
    // The block's input is a checkpoint input: its replay leaf is never handed over.
    Variable y = checkpoint(x, deps, [&](const Variable& in) { return sum(probe(add(probe(in, &p), w), &p)); });
    const Tensor x_before = x.value().clone();
    y.backward(graph);
    EXPECT_EQ(p.took, graph == GraphAfterBackward::Release ? 1 : 0);
    EXPECT_TRUE(bit_equal(x.value(), x_before));
    EXPECT_TRUE(bit_equal(x.grad(), ones_like(x_before)));
    EXPECT_TRUE(bit_equal(w.grad(), ones_like(x_before)));
  }
}

/// The fused SwiGLU backward writes the gate/up gradient over gate/up when
/// the released graph holds it alone: the same bits as Keep, one (rows, F)
/// buffer less at the peak; a caller holding gate/up keeps its values.
TEST(DonatedBuffers, FusedSwigluWritesTheGateUpGradientOverGateUp) {
  const std::int64_t rows = 512, c = 4, f = 64;
  const std::int64_t f_bytes = rows * f * static_cast<std::int64_t>(sizeof(float));
  const Tensor xv = randn({rows, c}, 141), wg = randn({2 * f, c}, 142), wd = randn({c, f}, 143);
  const Tensor seed = randn({rows, c}, 144);
  struct Run {
    std::vector<Tensor> grads;
    std::int64_t peak = 0;
  };
  for (const bool frozen_down : {false, true}) {
    const auto run = [&](GraphAfterBackward graph, bool hold) {
      Variable x(xv.clone(), true), w_gu(wg.clone(), true), w_down(wd.clone(), !frozen_down);
      Variable gate_up = fused::linear_packed(x, {w_gu});
      const Tensor gu_before = gate_up.value().clone();
      Variable out = fused::swiglu_linear_residual(x, gate_up, w_down);
      Tensor alias;
      if (hold) alias = gate_up.value();
      gate_up = Variable();
      const std::int64_t live = memory_stats().live_bytes;
      reset_peak_memory();
      out.backward(seed, graph);
      Run r;
      r.peak = memory_stats().peak_bytes - live;
      if (hold) EXPECT_TRUE(bit_equal(alias, gu_before));
      r.grads = {x.grad(), w_gu.grad()};
      if (!frozen_down) r.grads.push_back(w_down.grad());
      return r;
    };
    const Run keep = run(GraphAfterBackward::Keep, false);
    const Run released = run(GraphAfterBackward::Release, false);
    const Run held = run(GraphAfterBackward::Release, true);
    for (std::size_t i = 0; i < keep.grads.size(); ++i) {
      EXPECT_TRUE(bit_equal(keep.grads[i], released.grads[i])) << i;
      EXPECT_TRUE(bit_equal(keep.grads[i], held.grads[i])) << i;
    }
    RecordProperty(frozen_down ? "frozen_peaks" : "peaks",
                   std::to_string(keep.peak) + " " + std::to_string(released.peak) + " " + std::to_string(held.peak));
    EXPECT_LE(released.peak + f_bytes, held.peak) << "frozen " << frozen_down;
  }
}
