// Fused ops of the transformer block (src/ops/fused.hpp) against their
// composite references built from public ops: forward values, gradients,
// finite differences (gradcheck.hpp tolerances) and thread-count independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "../../src/ops/fused.hpp"
#include "gradcheck.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/attention.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::gradcheck;

namespace {

Tensor randn(const Shape& shape, std::uint64_t seed, float std = 1.0F) {
  Random r(seed);
  return Tensor::normal(shape, r, 0.0F, std);
}

/// Columns [begin, begin + width) of every row of x (..., N) as (..., width).
Tensor columns(const Tensor& x, std::int64_t begin, std::int64_t width) {
  const std::int64_t n = x.size(-1);
  const std::int64_t rows = x.numel() / n;
  Shape shape = x.shape();
  shape.back() = width;
  Tensor out = Tensor::empty(shape);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(out.data() + r * width, x.data() + r * n + begin, static_cast<std::size_t>(width) * sizeof(float));
  }
  return out;
}

/// The composite the packed attention replaces: split heads, rope(q),
/// rope(k), flash attention, merge heads.
Variable composite_attention(const Variable& q, const Variable& k, const Variable& v, std::int64_t heads) {
  const std::int64_t b = q.shape()[0], t = q.shape()[1], c = q.shape()[2], d = c / heads;
  auto split = [&](const Variable& x) { return permute(reshape(x, {b, t, heads, d}), {0, 2, 1, 3}); };
  const Variable a = causal_attention(rope(split(q)), rope(split(k)), split(v), FullSequenceAttentionKind::Flash);
  return reshape(permute(a, {0, 2, 1, 3}), {b, t, c});
}

struct PackedRun {
  Tensor out, dq, dk, dv;
};

PackedRun run_packed(const Tensor& qkv, std::int64_t heads, const Tensor& seed) {
  Variable x(qkv.clone(), true, "qkv");
  Variable out = fused::rope_attention_packed(x, heads);
  out.backward(seed);
  const std::int64_t c = qkv.size(-1) / 3;
  return {out.value().clone(), columns(x.grad(), 0, c), columns(x.grad(), c, c), columns(x.grad(), 2 * c, c)};
}

PackedRun run_composite(const Tensor& qkv, std::int64_t heads, const Tensor& seed) {
  const std::int64_t c = qkv.size(-1) / 3;
  Variable q(columns(qkv, 0, c), true, "q");
  Variable k(columns(qkv, c, c), true, "k");
  Variable v(columns(qkv, 2 * c, c), true, "v");
  Variable out = composite_attention(q, k, v, heads);
  out.backward(seed);
  return {out.value().clone(), q.grad().clone(), k.grad().clone(), v.grad().clone()};
}

}  // namespace

// ---- linear_packed ------------------------------------------------------------

TEST(FusedLinearPacked, MatchesSeparateLinearsSideBySide) {
  const Tensor x = randn({2, 70, 48}, 1);
  const Tensor w[3] = {randn({64, 48}, 2), randn({40, 48}, 3), randn({24, 48}, 4)};
  const Tensor seed = randn({2, 70, 128}, 5);
  Variable xf(x.clone(), true);
  std::vector<Variable> wf;
  for (const Tensor& t : w) wf.emplace_back(t.clone(), true);
  Variable packed = fused::linear_packed(xf, wf);
  ASSERT_EQ(packed.shape(), (Shape{2, 70, 128}));
  packed.backward(seed);

  Variable xc(x.clone(), true);
  std::vector<Variable> wc;
  for (const Tensor& t : w) wc.emplace_back(t.clone(), true);
  std::int64_t offset = 0;
  for (int i = 0; i < 3; ++i) {
    const std::int64_t n = w[i].size(0);
    Variable part = linear(xc, wc[static_cast<std::size_t>(i)]);
    // Each part's columns are the same GEMM as linear(): bit-identical.
    EXPECT_TRUE(bit_equal(part.value(), columns(packed.value(), offset, n))) << "part " << i;
    part.backward(columns(seed, offset, n));
    // dW_i = g_iᵀ x is one GEMM either way.
    EXPECT_TRUE(bit_equal(wc[static_cast<std::size_t>(i)].grad(), wf[static_cast<std::size_t>(i)].grad())) << i;
    offset += n;
  }
  // Composite dx: sum of three separate backward passes.
  Variable xs(x.clone(), true);
  Variable total = add(add(sum(mul(linear(xs, wc[0]), Variable(columns(seed, 0, 64)))),
                           sum(mul(linear(xs, wc[1]), Variable(columns(seed, 64, 40))))),
                       sum(mul(linear(xs, wc[2]), Variable(columns(seed, 104, 24)))));
  total.backward();
  EXPECT_LE(max_abs_diff(xs.grad(), xf.grad()), 1e-4F);
}

TEST(FusedLinearPacked, FiniteDifferencesAndFrozenWeights) {
  const auto f = [](const std::vector<Variable>& v) { return fused::linear_packed(v[0], {v[1], v[2]}); };
  EXPECT_EQ(gradcheck(f, {randn({2, 3, 4}, 11), randn({5, 4}, 12), randn({2, 4}, 13)}), 0);
  // A frozen weight gets no gradient; the input and the other weight do.
  Variable x(randn({3, 4}, 14), true);
  Variable a(randn({5, 4}, 15), false);
  Variable b(randn({2, 4}, 16), true);
  sum(fused::linear_packed(x, {a, b})).backward();
  EXPECT_FALSE(a.has_grad());
  EXPECT_TRUE(b.has_grad());
  EXPECT_TRUE(x.has_grad());
}

TEST(FusedLinearPacked, ErrorsNameTheOpAndShapes) {
  Variable x(Tensor::zeros({3, 4}), true);
  Variable bad(Tensor::zeros({5, 3}), true);
  try {
    fused::linear_packed(x, {bad});
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[linear_packed] input (3, 4) and weight 0 (5, 3)"), std::string::npos)
        << e.what();
  }
}

// ---- add_columns ----------------------------------------------------------------

TEST(FusedAddColumns, AddsIntoTheColumnRangeAndSplitsTheGradient) {
  const Tensor x = randn({2, 3, 10}, 21);
  const Tensor d = randn({2, 3, 4}, 22);
  const Tensor out = fused::add_columns(Variable(x), Variable(d), 5).value();
  for (std::int64_t r = 0; r < 6; ++r) {
    for (std::int64_t j = 0; j < 10; ++j) {
      const float expect = x.data()[r * 10 + j] + (j >= 5 && j < 9 ? d.data()[r * 4 + j - 5] : 0.0F);
      EXPECT_EQ(out.data()[r * 10 + j], expect);
    }
  }
  const auto f = [](const std::vector<Variable>& v) { return fused::add_columns(v[0], v[1], 2); };
  EXPECT_EQ(gradcheck(f, {randn({3, 7}, 23), randn({3, 4}, 24)}), 0);
  EXPECT_THROW(fused::add_columns(Variable(x), Variable(d), 7), ShapeError);
}

// ---- swiglu_packed ----------------------------------------------------------------

TEST(FusedSwigluPacked, BitIdenticalToSwigluOnTheHalves) {
  const Tensor gu = randn({3, 5, 2 * 37}, 31, 3.0F);
  const Tensor seed = randn({3, 5, 37}, 32);
  Variable packed_in(gu.clone(), true);
  Variable packed = fused::swiglu_packed(packed_in);
  packed.backward(seed);
  Variable gate(columns(gu, 0, 37), true);
  Variable up(columns(gu, 37, 37), true);
  Variable ref = swiglu(gate, up);
  ref.backward(seed);
  EXPECT_TRUE(bit_equal(packed.value(), ref.value()));
  EXPECT_TRUE(bit_equal(columns(packed_in.grad(), 0, 37), gate.grad()));
  EXPECT_TRUE(bit_equal(columns(packed_in.grad(), 37, 37), up.grad()));
  const auto f = [](const std::vector<Variable>& v) { return fused::swiglu_packed(v[0]); };
  EXPECT_EQ(gradcheck(f, {randn({3, 8}, 33)}), 0);
  EXPECT_THROW(fused::swiglu_packed(Variable(Tensor::zeros({2, 3}))), ShapeError);
}

TEST(FusedSwigluPacked, SigmoidSaturatesWithoutNaN) {
  const Tensor gu = Tensor::from_data({1, 8}, {-200.0F, -90.0F, 90.0F, 200.0F, 1.0F, 1.0F, 1.0F, 1.0F});
  const Tensor out = fused::swiglu_packed(Variable(gu)).value();
  EXPECT_NEAR(out.at({0, 0}), 0.0F, 1e-30);  // -200 · sigmoid(-200): the exp clamps at 88, ~-1e-36
  EXPECT_NEAR(out.at({0, 1}), 0.0F, 1e-30);
  EXPECT_EQ(out.at({0, 2}), 90.0F);
  EXPECT_EQ(out.at({0, 3}), 200.0F);
}

// ---- rope_attention_packed ----------------------------------------------------------

TEST(FusedRopeAttention, BitIdenticalToTheCompositeOnSeveralTiles) {
  // T = 130 spans three 64-row tiles; C = 3 heads × 8.
  const Tensor qkv = randn({2, 130, 72}, 41);
  const Tensor seed = randn({2, 130, 24}, 42);
  const PackedRun f = run_packed(qkv, 3, seed);
  const PackedRun c = run_composite(qkv, 3, seed);
  // Same kernels in the same order, only the layout differs.
  EXPECT_TRUE(bit_equal(f.out, c.out));
  EXPECT_TRUE(bit_equal(f.dq, c.dq));
  EXPECT_TRUE(bit_equal(f.dk, c.dk));
  EXPECT_TRUE(bit_equal(f.dv, c.dv));
}

TEST(FusedRopeAttention, FiniteDifferences) {
  const auto f = [](const std::vector<Variable>& v) { return fused::rope_attention_packed(v[0], 2); };
  EXPECT_EQ(gradcheck(f, {randn({1, 5, 24}, 51)}), 0);   // 2 heads of D = 4
  EXPECT_EQ(gradcheck(f, {randn({2, 3, 12}, 52)}), 0);   // 2 heads of D = 2
}

TEST(FusedRopeAttention, DoesNotDependOnTheThreadCount) {
  const Tensor qkv = randn({2, 70, 3 * 4 * 16}, 61);
  const Tensor seed = randn({2, 70, 64}, 62);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const PackedRun one = run_packed(qkv, 4, seed);
  omp_set_num_threads(3);
  const PackedRun three = run_packed(qkv, 4, seed);
  omp_set_num_threads(threads);
  EXPECT_TRUE(bit_equal(one.out, three.out));
  EXPECT_TRUE(bit_equal(one.dq, three.dq));
  EXPECT_TRUE(bit_equal(one.dk, three.dk));
  EXPECT_TRUE(bit_equal(one.dv, three.dv));
}

TEST(FusedRopeAttention, ErrorsNameTheOpAndShape) {
  try {
    fused::rope_attention_packed(Variable(Tensor::zeros({1, 4, 10})), 2);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[rope_attention_packed] qkv (1, 4, 10) with 2 heads"), std::string::npos)
        << e.what();
  }
}

// ---- the block as a whole -----------------------------------------------------------

TEST(FusedBlock, FlashModelMatchesTheMaterializedComposite) {
  // The flash kind runs the fused path (packed q/k/v, rope_attention_packed);
  // the materialized kind runs the composite ops. Same weights: logits and
  // gradients agree to float32 tolerance.
  TransformerDimensions dims = rt_test::tiny_dims();
  dims.context_length = 24;
  const auto b = rt_test::random_batch(2, 24, 32, 71);
  std::vector<Tensor> grads[2];
  Tensor logits[2];
  for (int i = 0; i < 2; ++i) {
    Random random(72);
    DecoderOnlyTransformer model(dims, random, 1e-5F,
                                 i == 0 ? FullSequenceAttentionKind::Flash : FullSequenceAttentionKind::Materialized);
    logits[i] = model.forward(b.tokens, 2).value().clone();
    model.loss(b.tokens, b.targets, 2).backward();
    for (const NamedParameter& p : model.parameters()) grads[i].push_back(p.variable.grad().clone());
  }
  EXPECT_LE(max_abs_diff(logits[0], logits[1]), 1e-5F);
  for (std::size_t j = 0; j < grads[0].size(); ++j) {
    float scale = 0.0F;
    for (const float g : grads[1][j].values()) scale = std::max(scale, std::fabs(g));
    EXPECT_LE(max_abs_diff(grads[0][j], grads[1][j]), 1e-4F * scale + 1e-7F) << "parameter " << j;
  }
}

// ---- projections fused with RMSNorm and the residual adds ------------------------

TEST(FusedNormLinear, BitIdenticalToRmsNormThenLinearPacked) {
  const Tensor h = randn({2, 9, 16}, 81);
  const Tensor n = randn({16}, 82);
  const Tensor w0 = randn({12, 16}, 83);
  const Tensor w1 = randn({8, 16}, 84);
  const Tensor seed = randn({2, 9, 20}, 85);
  Variable hf(h.clone(), true), nf(n.clone(), true), af(w0.clone(), true), bf(w1.clone(), true);
  Variable fused_out = fused::norm_linear_packed(hf, nf, 1e-5F, {af, bf});
  fused_out.backward(seed);
  Variable hc(h.clone(), true), nc(n.clone(), true), ac(w0.clone(), true), bc(w1.clone(), true);
  Variable composite = fused::linear_packed(rms_norm(hc, nc, 1e-5F), {ac, bc});
  composite.backward(seed);
  EXPECT_TRUE(bit_equal(fused_out.value(), composite.value()));
  EXPECT_TRUE(bit_equal(hf.grad(), hc.grad()));
  EXPECT_TRUE(bit_equal(nf.grad(), nc.grad()));
  EXPECT_TRUE(bit_equal(af.grad(), ac.grad()));
  EXPECT_TRUE(bit_equal(bf.grad(), bc.grad()));
  const auto f = [](const std::vector<Variable>& v) { return fused::norm_linear_packed(v[0], v[1], 1e-5F, {v[2], v[3]}); };
  EXPECT_EQ(gradcheck(f, {randn({2, 3, 4}, 86), randn({4}, 87), randn({5, 4}, 88), randn({3, 4}, 89)}), 0);
}

TEST(FusedLinearResidual, BitIdenticalToAddOfLinear) {
  const Tensor r = randn({3, 7, 10}, 91);
  const Tensor x = randn({3, 7, 6}, 92);
  const Tensor w = randn({10, 6}, 93);
  const Tensor seed = randn({3, 7, 10}, 94);
  Variable rf(r.clone(), true), xf(x.clone(), true), wf(w.clone(), true);
  Variable out = fused::linear_residual(rf, xf, wf);
  out.backward(seed);
  Variable rc(r.clone(), true), xc(x.clone(), true), wc(w.clone(), true);
  Variable ref = add(rc, linear(xc, wc));
  ref.backward(seed);
  EXPECT_TRUE(bit_equal(out.value(), ref.value()));
  EXPECT_TRUE(bit_equal(rf.grad(), rc.grad()));
  EXPECT_TRUE(bit_equal(xf.grad(), xc.grad()));
  EXPECT_TRUE(bit_equal(wf.grad(), wc.grad()));
  const auto f = [](const std::vector<Variable>& v) { return fused::linear_residual(v[0], v[1], v[2]); };
  EXPECT_EQ(gradcheck(f, {randn({2, 5}, 95), randn({2, 3}, 96), randn({5, 3}, 97)}), 0);
  EXPECT_THROW(fused::linear_residual(Variable(Tensor::zeros({2, 4})), Variable(x), Variable(w)), ShapeError);
}

/// The residual is added by the GEMM's own blocks (row blocks when the
/// product is taller than wide, column blocks otherwise): the bits of
/// add(r, linear(x, W)) at every thread count, for both cuts.
TEST(FusedLinearResidual, TheAddInsideTheGemmBlocksKeepsTheCompositeBitsAtAnyThreadCount) {
  const int threads_before = omp_get_max_threads();
  for (const auto& [rows, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{600, 96, 64},
                                   {48, 700, 40}, {1, 33, 5}}) {
    const Tensor r = randn({rows, n}, 131);
    const Tensor x = randn({rows, k}, 132);
    const Tensor w = randn({n, k}, 133);
    const Tensor gu = randn({rows, 2 * k}, 134);
    const Tensor wd = randn({n, k}, 135);
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const std::string what = std::to_string(rows) + "x" + std::to_string(n) + "x" + std::to_string(k) + ", " +
                               std::to_string(threads) + " threads";
      const Tensor fused_out = fused::linear_residual(Variable(r), Variable(x), Variable(w)).value();
      const Tensor ref = add(Variable(r), linear(Variable(x), Variable(w))).value();
      EXPECT_TRUE(bit_equal(fused_out, ref)) << what;
      const Tensor swiglu_out = fused::swiglu_linear_residual(Variable(r), Variable(gu), Variable(wd)).value();
      const Tensor swiglu_ref = add(Variable(r), linear(fused::swiglu_packed(Variable(gu)), Variable(wd))).value();
      EXPECT_TRUE(bit_equal(swiglu_out, swiglu_ref)) << what;
    }
  }
  omp_set_num_threads(threads_before);
}

/// A product over an empty K is zeros: a zero-width input gives the residual
/// itself (or zeros without one), never the bytes a reused block held.
TEST(FusedProjections, AZeroWidthInputGivesZerosOrTheResidual) {
  const Tensor r = randn({4, 64, 64}, 141);  // 64 KiB: a page-cache block, recycled
  const Variable x(Tensor::zeros({4, 64, 0}), true);
  const Variable w(Tensor::zeros({64, 0}), true);
  const Variable n(Tensor::zeros({0}), true);
  const auto dirty = [] { Tensor d = Tensor::full({4, 64, 64}, 7.0F); };  // freed: the next block may hold 7s
  dirty();
  const Tensor lin = linear(x, w).value();  // held: a range-for over a temporary's span would outlive it
  for (const float v : lin.values()) ASSERT_EQ(v, 0.0F) << "linear (the composite)";
  dirty();
  const Tensor lp = fused::linear_packed(x, {w}).value();
  for (const float v : lp.values()) ASSERT_EQ(v, 0.0F) << "linear_packed";
  dirty();
  const Tensor nlp = fused::norm_linear_packed(x, n, 1e-5F, {w}).value();
  for (const float v : nlp.values()) ASSERT_EQ(v, 0.0F) << "norm_linear_packed";
  dirty();
  EXPECT_TRUE(bit_equal(fused::linear_residual(Variable(r), x, w).value(), r)) << "linear_residual";
  dirty();
  EXPECT_TRUE(bit_equal(fused::swiglu_linear_residual(Variable(r), x, w).value(), r)) << "swiglu_linear_residual";
  // and the backward of each: gradients of the residual pass through, the rest are empty
  Variable rr(r.clone(), true);
  Variable out = fused::linear_residual(rr, x, w);
  out.backward(Tensor::full({4, 64, 64}, 1.0F));
  EXPECT_TRUE(bit_equal(rr.grad(), Tensor::full({4, 64, 64}, 1.0F)));
  EXPECT_EQ(x.grad().numel(), 0);
  EXPECT_EQ(w.grad().numel(), 0);
}

TEST(FusedSwigluLinearResidual, BitIdenticalToTheComposite) {
  const Tensor r = randn({2, 11, 8}, 101);
  const Tensor gu = randn({2, 11, 2 * 12}, 102);
  const Tensor w = randn({8, 12}, 103);
  const Tensor seed = randn({2, 11, 8}, 104);
  Variable rf(r.clone(), true), gf(gu.clone(), true), wf(w.clone(), true);
  Variable out = fused::swiglu_linear_residual(rf, gf, wf);
  out.backward(seed);
  Variable rc(r.clone(), true), gc(gu.clone(), true), wc(w.clone(), true);
  Variable ref = add(rc, linear(fused::swiglu_packed(gc), wc));
  ref.backward(seed);
  EXPECT_TRUE(bit_equal(out.value(), ref.value()));
  EXPECT_TRUE(bit_equal(rf.grad(), rc.grad()));
  EXPECT_TRUE(bit_equal(gf.grad(), gc.grad()));
  EXPECT_TRUE(bit_equal(wf.grad(), wc.grad()));
  const auto f = [](const std::vector<Variable>& v) { return fused::swiglu_linear_residual(v[0], v[1], v[2]); };
  EXPECT_EQ(gradcheck(f, {randn({2, 3}, 105), randn({2, 8}, 106), randn({3, 4}, 107)}), 0);
  EXPECT_THROW(fused::swiglu_linear_residual(Variable(r), Variable(gu), Variable(Tensor::zeros({8, 11}))), ShapeError);
}

/// The backward writes dm = g W into the gate/up gradient's own rows and
/// takes the SwiGLU backward in place: the composite's bits for every subset
/// of gradients asked for, with no rows, one row and an odd row count.
TEST(FusedSwigluLinearResidual, EveryGradientSubsetAndRowCountGivesTheCompositeBits) {
  const std::int64_t c = 5, f = 13;
  for (const std::int64_t rows : {std::int64_t{0}, std::int64_t{1}, std::int64_t{37}}) {
    const Tensor r = randn({rows, c}, 121);
    const Tensor gu = randn({rows, 2 * f}, 122, 2.0F);
    const Tensor w = randn({c, f}, 123);
    const Tensor seed = randn({rows, c}, 124);
    for (const bool need_gu : {true, false}) {
      for (const bool need_w : {true, false}) {
        const std::string what = "rows " + std::to_string(rows) + ", gate_up grad " + std::to_string(need_gu) +
                                 ", weight grad " + std::to_string(need_w);
        Variable rf(r.clone(), true), gf(gu.clone(), need_gu), wf(w.clone(), need_w);
        fused::swiglu_linear_residual(rf, gf, wf).backward(seed);
        Variable rc(r.clone(), true), gc(gu.clone(), need_gu), wc(w.clone(), need_w);
        add(rc, linear(fused::swiglu_packed(gc), wc)).backward(seed);
        EXPECT_TRUE(bit_equal(rf.grad(), rc.grad())) << what;
        EXPECT_EQ(gf.grad().defined(), need_gu) << what;
        EXPECT_EQ(wf.grad().defined(), need_w) << what;
        if (need_gu) EXPECT_TRUE(bit_equal(gf.grad(), gc.grad())) << what;
        if (need_w) EXPECT_TRUE(bit_equal(wf.grad(), wc.grad())) << what;
      }
    }
  }
}

/// Peak bytes of the backward (allocator counters): the gate/up gradient
/// (rows, 2F) is the only large buffer; the old backward held the whole dm
/// (rows, F) beside it, and before that dm beside the recomputed m.
TEST(FusedSwigluLinearResidual, BackwardNeverHoldsAWholeDmBesideTheGateUpGradient) {
  const std::int64_t rows = 512, c = 4, f = 64;
  const std::int64_t row_bytes = rows * f * static_cast<std::int64_t>(sizeof(float));  // one (rows, F) buffer
  Variable r(randn({rows, c}, 131), true), gu(randn({rows, 2 * f}, 132), true), w(randn({c, f}, 133), true);
  const Tensor seed = randn({rows, c}, 134);
  Variable out = fused::swiglu_linear_residual(r, gu, w);
  const std::int64_t live = memory_stats().live_bytes;
  reset_peak_memory();
  out.backward(seed, GraphAfterBackward::Release);
  const std::int64_t peak = memory_stats().peak_bytes - live;
  // d gate_up (2 row_bytes) + dW (c·f floats) + the residual's gradient (the
  // seed, copied into the leaf's slot: rows·c floats). A whole dm beside
  // d gate_up would be 3 row_bytes.
  const std::int64_t small = (c * f + rows * c) * static_cast<std::int64_t>(sizeof(float));
  EXPECT_GE(peak, 2 * row_bytes) << "the gate/up gradient is allocated";
  EXPECT_LE(peak, 2 * row_bytes + small) << "a (rows, F) buffer beside the gate/up gradient";
}

/// value_needed false (a checkpoint replay's final op): same shape, a NaN
/// value, and the gradients of value_needed true bit for bit.
TEST(FusedResidualProjections, ValueNotNeededGivesNaNAndTheSameGradients) {
  const Tensor r = randn({2, 11, 8}, 111);
  const Tensor gu = randn({2, 11, 2 * 12}, 112);
  const Tensor x = randn({2, 11, 12}, 113);
  const Tensor w = randn({8, 12}, 114);
  const Tensor seed = randn({2, 11, 8}, 115);
  using Op = Variable (*)(const Variable&, const Variable&, const Variable&, bool);
  for (const auto& [name, op, input] : {std::tuple<const char*, Op, Tensor>{"swiglu_linear_residual",
                                                                          &fused::swiglu_linear_residual, gu},
                                        std::tuple<const char*, Op, Tensor>{"linear_residual", &fused::linear_residual,
                                                                          x}}) {
    std::vector<Tensor> grads[2];
    for (const bool needed : {true, false}) {
      Variable rv(r.clone(), true), iv(input.clone(), true), wv(w.clone(), true);
      Variable out = op(rv, iv, wv, needed);
      EXPECT_EQ(out.shape(), r.shape()) << name;
      bool all_nan = true;
      for (std::int64_t i = 0; i < out.value().numel(); ++i) all_nan = all_nan && std::isnan(out.value().data()[i]);
      EXPECT_EQ(all_nan, !needed) << name;
      out.backward(seed);
      grads[needed ? 0 : 1] = {rv.grad().clone(), iv.grad().clone(), wv.grad().clone()};
    }
    for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(bit_equal(grads[0][i], grads[1][i])) << name << " grad " << i;
  }
}
