// Causal attention: materialized (composed ops) and flash (tiled kernel).
// Finite-difference gradients for both (gradcheck.hpp tolerances), flash vs
// materialized parity, causality, retained graph and allocator peak,
// determinism and errors. Tolerances are stated where they are asserted.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

#include "../../src/backend/cpu/flash_attention.hpp"
#include "gradcheck.hpp"
#include "riftco_transformer/attention.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/ops.hpp"

using namespace riftco_transformer;
using rt_test::gradcheck;

namespace {

constexpr auto kMaterialized = FullSequenceAttentionKind::Materialized;
constexpr auto kFlash = FullSequenceAttentionKind::Flash;

Tensor randn(const Shape& shape, std::uint64_t seed) {
  Random r(seed);
  return Tensor::normal(shape, r);
}

/// The flash kernel with explicit tiles, as a node (the op picks tiles from
/// D; tests force many small, non-dividing tiles through this wrapper).
Variable flash_with_tiles(const Variable& q, const Variable& k, const Variable& v, cpu::FlashTiles tiles) {
  const float s = 1.0F / std::sqrt(static_cast<float>(q.shape()[3]));
  Tensor lse;
  Tensor out = cpu::flash_attention_forward(q.value(), k.value(), v.value(), s, tiles, lse);
  const Tensor qv = q.value();
  const Tensor kv = k.value();
  const Tensor vv = v.value();
  const Tensor ov = out;
  return Variable::from_op("flash_attention_test", std::move(out), {q, k, v},
                           [=](const Tensor& g, const std::vector<bool>&) {
                             std::vector<Tensor> grads(3);
                             cpu::flash_attention_backward(qv, kv, vv, ov, lse, g, s, tiles, grads[0], grads[1],
                                                           grads[2]);
                             return grads;
                           });
}

struct Result {
  Tensor out, dq, dk, dv;
};

/// Forward, then backward with seed `seed`; fresh leaves each call.
template <typename F>
Result run(F&& attend, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seed) {
  Variable qv(q.clone(), true, "q");
  Variable kv(k.clone(), true, "k");
  Variable vv(v.clone(), true, "v");
  Variable out = attend(qv, kv, vv);
  out.backward(seed);
  return {out.value().clone(), qv.grad().clone(), kv.grad().clone(), vv.grad().clone()};
}

Result run_kind(FullSequenceAttentionKind kind, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seed) {
  return run([kind](auto& a, auto& b, auto& c) { return causal_attention(a, b, c, kind); }, q, k, v, seed);
}

struct Inputs {
  Tensor q, k, v, seed;
};

Inputs make_inputs(const Shape& shape, std::uint64_t seed) {
  return {randn(shape, seed), randn(shape, seed + 1), randn(shape, seed + 2), randn(shape, seed + 3)};
}

template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << parts.front();
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(AttentionKind, NamesRoundTripAndBadStringsAreValueErrors) {
  for (auto kind : {kMaterialized, kFlash}) EXPECT_EQ(parse_attention_kind(attention_kind_name(kind)), kind);
  EXPECT_STREQ(attention_kind_name(kFlash), "flash");
  EXPECT_STREQ(attention_kind_name(kMaterialized), "materialized");
  EXPECT_THROW(parse_attention_kind("Flash"), ValueError);
  expect_error([] { parse_attention_kind("Flash"); }, {"[attention]", "\"Flash\"", "\"materialized\"", "\"flash\""});
  expect_error([] { parse_attention_kind("", "model"); }, {"[model]", "\"\""});
}

// ---- finite differences (gradcheck.hpp: eps 1e-2, |a−n| ≤ 2e-3 + 2e-2·|n|) --

TEST(AttentionGradient, MaterializedFiniteDifferences) {
  const auto f = [](const std::vector<Variable>& x) { return causal_attention(x[0], x[1], x[2], kMaterialized); };
  EXPECT_EQ(gradcheck(f, {randn({1, 2, 5, 4}, 1), randn({1, 2, 5, 4}, 2), randn({1, 2, 5, 4}, 3)}), 0);
}

TEST(AttentionGradient, FlashFiniteDifferences) {
  const auto f = [](const std::vector<Variable>& x) { return causal_attention(x[0], x[1], x[2], kFlash); };
  EXPECT_EQ(gradcheck(f, {randn({1, 2, 5, 4}, 1), randn({1, 2, 5, 4}, 2), randn({1, 2, 5, 4}, 3)}), 0);
  EXPECT_EQ(gradcheck(f, {randn({2, 1, 9, 3}, 4), randn({2, 1, 9, 3}, 5), randn({2, 1, 9, 3}, 6)}), 0);
}

TEST(AttentionGradient, FlashFiniteDifferencesAcrossManyTiles) {
  // T = 11 with 4-row query tiles and 3-row key tiles: several tiles, none
  // dividing T, query and key tiles misaligned.
  const auto f = [](const std::vector<Variable>& x) { return flash_with_tiles(x[0], x[1], x[2], {4, 3}); };
  EXPECT_EQ(gradcheck(f, {randn({1, 2, 11, 4}, 7), randn({1, 2, 11, 4}, 8), randn({1, 2, 11, 4}, 9)}), 0);
}

// ---- flash vs materialized ----------------------------------------------------

TEST(AttentionParity, FlashMatchesMaterializedOnTwoAndAHalfTiles) {
  // N(0,1) inputs, B=2, H=3, T=130 (> 2 tiles of 64, not a multiple), D=16.
  // Tolerance: max |Δ| ≤ 1e-5 for outputs, ≤ 1e-4 for q/k/v gradients.
  const Inputs in = make_inputs({2, 3, 130, 16}, 11);
  const Result m = run_kind(kMaterialized, in.q, in.k, in.v, in.seed);
  const Result f = run_kind(kFlash, in.q, in.k, in.v, in.seed);
  const float d_out = max_abs_diff(m.out, f.out);
  const float d_q = max_abs_diff(m.dq, f.dq);
  const float d_k = max_abs_diff(m.dk, f.dk);
  const float d_v = max_abs_diff(m.dv, f.dv);
  std::cout << "[ parity   ] B=2 H=3 T=130 D=16 max|flash-materialized|: out " << d_out << " dq " << d_q << " dk "
            << d_k << " dv " << d_v << '\n';
  EXPECT_LE(d_out, 1e-5F);
  EXPECT_LE(d_q, 1e-4F);
  EXPECT_LE(d_k, 1e-4F);
  EXPECT_LE(d_v, 1e-4F);
}

TEST(AttentionParity, KernelTilesDoNotChangeTheResult) {
  // Same tolerances as above, T = 37, every tile shape from 1×1 to one tile.
  const Inputs in = make_inputs({1, 2, 37, 8}, 21);
  const Result m = run_kind(kMaterialized, in.q, in.k, in.v, in.seed);
  for (const cpu::FlashTiles tiles : {cpu::FlashTiles{1, 1}, cpu::FlashTiles{3, 5}, cpu::FlashTiles{5, 3},
                                      cpu::FlashTiles{16, 16}, cpu::FlashTiles{64, 64}, cpu::FlashTiles{8, 32}}) {
    const Result f = run([&](auto& a, auto& b, auto& c) { return flash_with_tiles(a, b, c, tiles); }, in.q, in.k,
                         in.v, in.seed);
    SCOPED_TRACE("tiles " + std::to_string(tiles.query_rows) + "x" + std::to_string(tiles.key_rows));
    EXPECT_LE(max_abs_diff(m.out, f.out), 1e-5F);
    EXPECT_LE(max_abs_diff(m.dq, f.dq), 1e-4F);
    EXPECT_LE(max_abs_diff(m.dk, f.dk), 1e-4F);
    EXPECT_LE(max_abs_diff(m.dv, f.dv), 1e-4F);
  }
}

TEST(AttentionParity, WideHeadsUseNarrowerKeyTiles) {
  // Every tile product has M·N·K = query_rows·key_rows·D <= 2^18 (keeps a
  // tile's operands and scratch small; see docs/attention.md).
  EXPECT_EQ(cpu::flash_default_tiles(16).key_rows, 64);
  EXPECT_EQ(cpu::flash_default_tiles(64).key_rows, 64);
  EXPECT_EQ(cpu::flash_default_tiles(128).key_rows, 32);
  EXPECT_EQ(cpu::flash_default_tiles(256).key_rows, 16);
  EXPECT_EQ(cpu::flash_default_tiles(256).query_rows, 64);
  EXPECT_EQ(cpu::flash_default_tiles(1024).query_rows, 16);
  // D = 128 (64×32 tiles), T = 100: same tolerances as above.
  const Inputs in = make_inputs({1, 2, 100, 128}, 25);
  const Result m = run_kind(kMaterialized, in.q, in.k, in.v, in.seed);
  const Result f = run_kind(kFlash, in.q, in.k, in.v, in.seed);
  EXPECT_LE(max_abs_diff(m.out, f.out), 1e-5F);
  EXPECT_LE(max_abs_diff(m.dq, f.dq), 1e-4F);
  EXPECT_LE(max_abs_diff(m.dk, f.dk), 1e-4F);
  EXPECT_LE(max_abs_diff(m.dv, f.dv), 1e-4F);
}

TEST(AttentionParity, FlashMatchesMaterializedAtEveryTileEdge) {
  // Lengths below, at and one past the tile sizes (key tiles of 64 and
  // 128), odd lengths, and head widths that read K, Q, dO in place (D a
  // multiple of 8) or pack them (3, 20): with the model's tiles and with
  // tiles whose query and key edges differ. A wrong ragged tail (last row
  // block, last column block, diagonal tile) changes some output or
  // gradient by far more than these bounds. Tolerances: |Δ| <= 1e-5 (out),
  // <= 1e-4 (gradients), relative to max(1, the largest reference value).
  for (const std::int64_t d : {3, 20, 32, 64, 72}) {
    for (const std::int64_t t : {1, 2, 7, 31, 63, 64, 65, 127, 128, 129, 200}) {
      const Inputs in = make_inputs({1, 2, t, d}, 200 + static_cast<std::uint64_t>(t * 7 + d));
      const Result m = run_kind(kMaterialized, in.q, in.k, in.v, in.seed);
      for (const cpu::FlashTiles tiles : {cpu::flash_default_tiles(d), cpu::FlashTiles{16, 128}, cpu::FlashTiles{40, 24}}) {
        const Result f = run([&](auto& a, auto& b, auto& c) { return flash_with_tiles(a, b, c, tiles); }, in.q, in.k,
                             in.v, in.seed);
        SCOPED_TRACE("T " + std::to_string(t) + ", D " + std::to_string(d) + ", tiles " +
                     std::to_string(tiles.query_rows) + "x" + std::to_string(tiles.key_rows));
        auto bound = [](const Tensor& ref, float tol) {
          float largest = 1.0F;
          for (std::int64_t i = 0; i < ref.numel(); ++i) largest = std::max(largest, std::fabs(ref.data()[i]));
          return tol * largest;
        };
        EXPECT_LE(max_abs_diff(m.out, f.out), bound(m.out, 1e-5F));
        EXPECT_LE(max_abs_diff(m.dq, f.dq), bound(m.dq, 1e-4F));
        EXPECT_LE(max_abs_diff(m.dk, f.dk), bound(m.dk, 1e-4F));
        EXPECT_LE(max_abs_diff(m.dv, f.dv), bound(m.dv, 1e-4F));
      }
    }
  }
}

TEST(AttentionKernel, StridedViewsGiveTheBitsOfContiguousTensors) {
  // The strided entry points (what the model calls on its packed (B, T, 3C)
  // projection, reading Q, K and dO rows in place when D is a multiple of 8)
  // against the contiguous tensor entry points: the same bits, forward and
  // backward. Packed layout (B, T, 3, H, D); outputs into (B, T, H, D).
  const std::int64_t B = 2, H = 3, T = 70;
  for (const std::int64_t D : {8, 12, 32, 64}) {
    for (const cpu::FlashTiles tiles : {cpu::flash_default_tiles(D), cpu::FlashTiles{16, 24}}) {
      const Tensor packed = randn({B, T, 3, H, D}, 300 + static_cast<std::uint64_t>(D));
      const Tensor d_out_rows = randn({B, T, H, D}, 400 + static_cast<std::uint64_t>(D));
      // Contiguous (B, H, T, D) copies.
      auto heads = [&](const Tensor& src, std::int64_t parts, std::int64_t part) {
        Tensor t = Tensor::empty({B, H, T, D});
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < T; ++i)
              for (std::int64_t d = 0; d < D; ++d)
                t.data()[((b * H + h) * T + i) * D + d] =
                    src.data()[(((b * T + i) * parts + part) * H + h) * D + d];
        return t;
      };
      const Tensor q = heads(packed, 3, 0), k = heads(packed, 3, 1), v = heads(packed, 3, 2);
      const Tensor g = heads(d_out_rows, 1, 0);
      const float scale = 1.0F / std::sqrt(static_cast<float>(D));
      Tensor lse;
      const Tensor out = cpu::flash_attention_forward(q, k, v, scale, tiles, lse);
      Tensor dq, dk, dv;
      cpu::flash_attention_backward(q, k, v, out, lse, g, scale, tiles, dq, dk, dv);

      const std::int64_t row3 = 3 * H * D, row1 = H * D;
      auto view3 = [&](const Tensor& t, std::int64_t part) {
        return cpu::HeadView{t.data() + part * H * D, T * row3, D, row3};
      };
      Tensor out_rows = Tensor::empty({B, T, H, D});
      Tensor lse_strided = Tensor::empty({B, H, T});
      cpu::flash_attention_forward(B, H, T, D, view3(packed, 0), view3(packed, 1), view3(packed, 2),
                                   {out_rows.data(), T * row1, D, row1}, lse_strided.data(), scale, tiles);
      Tensor grads = Tensor::empty({B, T, 3, H, D});
      auto mut3 = [&](std::int64_t part) { return cpu::MutableHeadView{grads.data() + part * H * D, T * row3, D, row3}; };
      cpu::flash_attention_backward(B, H, T, D, view3(packed, 0), view3(packed, 1), view3(packed, 2),
                                    {out_rows.data(), T * row1, D, row1}, {d_out_rows.data(), T * row1, D, row1},
                                    lse_strided.data(), mut3(0), mut3(1), mut3(2), scale, tiles);
      SCOPED_TRACE("D " + std::to_string(D) + ", tiles " + std::to_string(tiles.query_rows) + "x" +
                   std::to_string(tiles.key_rows));
      EXPECT_TRUE(bit_equal(lse, lse_strided));
      EXPECT_TRUE(bit_equal(out, heads(out_rows, 1, 0)));
      EXPECT_TRUE(bit_equal(dq, heads(grads, 3, 0)));
      EXPECT_TRUE(bit_equal(dk, heads(grads, 3, 1)));
      EXPECT_TRUE(bit_equal(dv, heads(grads, 3, 2)));
    }
  }
}

TEST(AttentionParity, SharedInputAccumulatesLikeMaterialized) {
  // Self-attention on one Variable used as q, k and v: its gradient is the sum.
  const Tensor x = randn({1, 2, 40, 8}, 31);
  const Tensor seed = randn({1, 2, 40, 8}, 32);
  Tensor grads[2];
  for (int i = 0; i < 2; ++i) {
    Variable xv(x.clone(), true, "x");
    causal_attention(xv, xv, xv, i == 0 ? kMaterialized : kFlash).backward(seed);
    grads[i] = xv.grad().clone();
  }
  EXPECT_LE(max_abs_diff(grads[0], grads[1]), 1e-4F);
}

TEST(AttentionForward, SingleTokenReturnsItsValue) {
  const Tensor q = randn({2, 2, 1, 5}, 41);
  const Tensor v = randn({2, 2, 1, 5}, 42);
  for (auto kind : {kMaterialized, kFlash}) {
    EXPECT_TRUE(bit_equal(causal_attention(Variable(q), Variable(q), Variable(v), kind).value(), v))
        << attention_kind_name(kind);
  }
}

TEST(AttentionForward, FlashNanInAQueryPoisonsOnlyItsRow) {
  // A NaN query makes its scores NaN: that output row must be NaN, not a
  // finite number (divergence stays visible). Flash only: the existing
  // softmax kernel's row max skips NaN, so it treats an all-NaN row as fully
  // masked and the materialized path returns zeros there.
  Tensor q = randn({1, 1, 70, 4}, 43);
  q.data()[66 * 4 + 1] = std::nanf("");
  const Tensor k = randn({1, 1, 70, 4}, 44);
  const Tensor v = randn({1, 1, 70, 4}, 45);
  const Tensor out = causal_attention(Variable(q), Variable(k), Variable(v), kFlash).value();
  for (std::int64_t i = 0; i < 70; ++i) EXPECT_EQ(std::isnan(out.at({0, 0, i, 0})), i == 66) << "row " << i;
}

// ---- causality ------------------------------------------------------------------

TEST(AttentionCausality, LaterKeysAndValuesDoNotChangeEarlierOutputs) {
  const Shape shape{1, 2, 130, 8};
  const Tensor q = randn(shape, 51);
  const Tensor k = randn(shape, 52);
  const Tensor v = randn(shape, 53);
  for (auto kind : {kMaterialized, kFlash}) {
    for (const std::int64_t j : {std::int64_t{1}, std::int64_t{70}, std::int64_t{129}}) {
      Tensor k2 = k.clone();
      Tensor v2 = v.clone();
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t d = 0; d < 8; ++d) {
          k2.data()[(h * 130 + j) * 8 + d] += 3.0F;
          v2.data()[(h * 130 + j) * 8 + d] -= 5.0F;
        }
      const Tensor a = causal_attention(Variable(q), Variable(k), Variable(v), kind).value();
      const Tensor b = causal_attention(Variable(q), Variable(k2), Variable(v2), kind).value();
      SCOPED_TRACE(std::string(attention_kind_name(kind)) + " j=" + std::to_string(j));
      for (std::int64_t h = 0; h < 2; ++h) {
        for (std::int64_t i = 0; i < 130; ++i) {
          bool same = true;
          for (std::int64_t d = 0; d < 8; ++d) same = same && a.at({0, h, i, d}) == b.at({0, h, i, d});
          if (i < j) {
            EXPECT_TRUE(same) << "output " << i << " changed";  // bit-identical: masked weights are exactly 0
          } else if (i == j) {
            EXPECT_FALSE(same) << "output " << i << " did not see its own key/value";
          }
        }
      }
    }
  }
}

TEST(AttentionCausality, FlashNonFiniteLaterKeysAndValuesDoNotReachEarlierRows) {
  // A masked weight is exactly 0, and 0·inf is NaN: the kernel must not even
  // multiply a later (masked) value or key into an earlier row, including the
  // rows that share its 4-row register block. Outputs and dq of every earlier
  // row stay bit-identical to the run with finite inputs. (Flash only: the
  // materialized path multiplies the whole masked P by V through BLAS.)
  const Shape shape{1, 2, 130, 8};
  const Tensor q = randn(shape, 54);
  const Tensor k = randn(shape, 55);
  const Tensor v = randn(shape, 56);
  const Tensor w = randn(shape, 57);
  auto run = [&](const Tensor& kk, const Tensor& vv, Tensor& dq) {
    Variable qv(q.clone(), true, "q");
    Variable out = causal_attention(qv, Variable(kk), Variable(vv), kFlash);
    sum(mul(out, Variable(w))).backward();
    dq = qv.grad().clone();
    return out.value().clone();
  };
  Tensor dq_finite;
  const Tensor finite = run(k, v, dq_finite);
  for (const std::int64_t j : {std::int64_t{1}, std::int64_t{66}, std::int64_t{67}, std::int64_t{129}}) {
    Tensor k2 = k.clone();
    Tensor v2 = v.clone();
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t d = 0; d < 8; ++d) {
        k2.data()[(h * 130 + j) * 8 + d] = std::nanf("");
        v2.data()[(h * 130 + j) * 8 + d] = d % 2 == 0 ? INFINITY : -INFINITY;
      }
    Tensor dq;
    const Tensor out = run(k2, v2, dq);
    SCOPED_TRACE("j=" + std::to_string(j));
    for (std::int64_t h = 0; h < 2; ++h) {
      for (std::int64_t i = 0; i < 130; ++i) {
        bool same = true;
        bool same_dq = true;
        for (std::int64_t d = 0; d < 8; ++d) {
          same = same && std::bit_cast<std::uint32_t>(out.at({0, h, i, d})) ==
                             std::bit_cast<std::uint32_t>(finite.at({0, h, i, d}));
          same_dq = same_dq && std::bit_cast<std::uint32_t>(dq.at({0, h, i, d})) ==
                                   std::bit_cast<std::uint32_t>(dq_finite.at({0, h, i, d}));
        }
        if (i < j) {
          EXPECT_TRUE(same) << "output " << i << " changed";
          EXPECT_TRUE(same_dq) << "dq " << i << " changed";
        } else if (i == j) {
          EXPECT_TRUE(std::isnan(out.at({0, h, i, 0}))) << "output " << i << " did not see its own key";
        }
      }
    }
  }
}

// ---- memory -------------------------------------------------------------------

TEST(AttentionMemory, MaterializedRetainsTheScoreMatricesFlashDoesNot) {
  const std::int64_t B = 2, H = 2, T = 48, D = 8;
  const Inputs in = make_inputs({B, H, T, D}, 61);
  GraphStatistics stats[2];
  for (int i = 0; i < 2; ++i) {
    Variable q(in.q, true), k(in.k, true), v(in.v, true);
    Variable loss = sum(causal_attention(q, k, v, i == 0 ? kMaterialized : kFlash));
    stats[i] = loss.graph_statistics();
    if (i == 1) {
      // The flash node keeps q, k, v, O (owned by graph nodes) and the LSE.
      std::int64_t saved = 0;
      for (const RetainedNode& r : loss.retained_nodes()) saved += r.saved_bytes;
      EXPECT_EQ(saved, B * H * T * static_cast<std::int64_t>(sizeof(float)));
    }
  }
  std::cout << "[ graph    ] B=2 H=2 T=48 D=8: materialized " << stats[0].node_count << " nodes "
            << stats[0].element_count << " elements; flash " << stats[1].node_count << " nodes "
            << stats[1].element_count << " elements; 2BHTT = " << 2 * B * H * T * T << '\n';
  EXPECT_GE(stats[0].element_count - stats[1].element_count, 2 * B * H * T * T);
  EXPECT_LT(stats[1].node_count, stats[0].node_count);
}

TEST(AttentionMemory, FlashPeakBytesAreLowerAtT256) {
  const Inputs in = make_inputs({1, 2, 256, 16}, 71);
  std::int64_t peak[2];
  for (int i = 0; i < 2; ++i) {
    Variable q(in.q, true), k(in.k, true), v(in.v, true);
    const std::int64_t live = memory_stats().live_bytes;
    reset_peak_memory();
    {
      Variable loss = sum(causal_attention(q, k, v, i == 0 ? kMaterialized : kFlash));
      loss.backward();
    }
    peak[i] = memory_stats().peak_bytes - live;
  }
  std::cout << "[ peak     ] B=1 H=2 T=256 D=16 forward+backward peak bytes above inputs: materialized " << peak[0]
            << ", flash " << peak[1] << '\n';
  EXPECT_LT(peak[1], peak[0]);
  EXPECT_LT(peak[1] * 4, peak[0]);  // T×T scores dominate the materialized peak
}

// ---- determinism --------------------------------------------------------------

TEST(AttentionDeterminism, TwoRunsAreBitIdentical) {
  const Inputs in = make_inputs({2, 3, 130, 16}, 81);
  for (auto kind : {kMaterialized, kFlash}) {
    const Result a = run_kind(kind, in.q, in.k, in.v, in.seed);
    const Result b = run_kind(kind, in.q, in.k, in.v, in.seed);
    SCOPED_TRACE(attention_kind_name(kind));
    EXPECT_TRUE(bit_equal(a.out, b.out));
    EXPECT_TRUE(bit_equal(a.dq, b.dq));
    EXPECT_TRUE(bit_equal(a.dk, b.dk));
    EXPECT_TRUE(bit_equal(a.dv, b.dv));
  }
}

TEST(AttentionDeterminism, FlashDoesNotDependOnTheThreadCount) {
  // Every output element is produced by one thread in a fixed order, so even
  // different thread counts agree bit for bit (stronger than DESIGN requires).
  const Inputs in = make_inputs({2, 3, 130, 16}, 91);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Result one = run_kind(kFlash, in.q, in.k, in.v, in.seed);
  omp_set_num_threads(3);
  const Result three = run_kind(kFlash, in.q, in.k, in.v, in.seed);
  omp_set_num_threads(threads);
  EXPECT_TRUE(bit_equal(one.out, three.out));
  EXPECT_TRUE(bit_equal(one.dq, three.dq));
  EXPECT_TRUE(bit_equal(one.dk, three.dk));
  EXPECT_TRUE(bit_equal(one.dv, three.dv));
}

TEST(AttentionDeterminism, FlashBuildsGiveTheSameBits) {
  // The AVX-512F (16-lane), AVX2 + FMA (8-lane) and baseline builds (8-lane
  // vectors as SSE pairs, libm fmaf) add the same terms in the same order
  // with explicit fused multiply-adds: the bits agree on every head width
  // (D = 8, 24 leave an 8-wide column block; 3, 20, 72 are packed) and on
  // many ragged tiles.
  EXPECT_THROW(cpu::flash_force_build(static_cast<cpu::FlashBuild>(4)), ValueError);
  std::vector<cpu::FlashBuild> others;
  for (const cpu::FlashBuild b : {cpu::FlashBuild::Avx2, cpu::FlashBuild::Avx512}) {
    if (cpu::flash_build_supported(b)) {
      others.push_back(b);
    } else {
      EXPECT_THROW(cpu::flash_force_build(b), ValueError);
    }
  }
  if (others.empty()) GTEST_SKIP() << "no AVX2 + FMA: only the baseline build runs here";
  for (const std::int64_t d : {3, 8, 16, 20, 24, 32, 40, 64, 72}) {
    for (const cpu::FlashTiles tiles : {cpu::flash_default_tiles(d), cpu::FlashTiles{24, 40}, cpu::FlashTiles{7, 9}}) {
      const Inputs in = make_inputs({2, 2, 77, d}, 101 + static_cast<std::uint64_t>(d));
      auto attend = [tiles](const Variable& q, const Variable& k, const Variable& v) {
        return flash_with_tiles(q, k, v, tiles);
      };
      cpu::flash_force_build(cpu::FlashBuild::Baseline);
      const Result base = run(attend, in.q, in.k, in.v, in.seed);
      for (const cpu::FlashBuild b : others) {
        cpu::flash_force_build(b);
        const Result other = run(attend, in.q, in.k, in.v, in.seed);
        SCOPED_TRACE("build " + std::to_string(static_cast<int>(b)) + ", D " + std::to_string(d) + ", tiles " +
                     std::to_string(tiles.query_rows) + "x" + std::to_string(tiles.key_rows));
        EXPECT_TRUE(bit_equal(base.out, other.out));
        EXPECT_TRUE(bit_equal(base.dq, other.dq));
        EXPECT_TRUE(bit_equal(base.dk, other.dk));
        EXPECT_TRUE(bit_equal(base.dv, other.dv));
      }
      cpu::flash_force_build(cpu::FlashBuild::Auto);
    }
  }
}

TEST(AttentionDeterminism, FlashBuildsAgreeOnExtremeInputsAndMaskFutureNaNs) {
  // Scores far past the base-2 exp's clamps (+-1e30 queries), subnormal
  // keys, infinite values, a NaN key and a NaN value at position `bad`:
  // every build gives the same bits (NaNs included) and propagates them as
  // before.
  std::vector<cpu::FlashBuild> builds{cpu::FlashBuild::Baseline};
  for (const cpu::FlashBuild b : {cpu::FlashBuild::Avx2, cpu::FlashBuild::Avx512}) {
    if (cpu::flash_build_supported(b)) builds.push_back(b);
  }
  for (const std::int64_t t : {1, 5, 33}) {
    for (const std::int64_t d : {5, 16, 20}) {
      Inputs in = make_inputs({1, 2, t, d}, 300 + static_cast<std::uint64_t>(t * d));
      float* q = in.q.data();
      float* k = in.k.data();
      float* v = in.v.data();
      q[0] = 1e30F;
      q[in.q.numel() - 1] = -1e30F;
      q[d] = -1e30F;  // a second row with scores far past the clamps
      k[d - 1] = 1e-40F;
      v[(2 * t - 1) * d] = std::numeric_limits<float>::infinity();  // head 1's last key
      const std::int64_t bad = t - 1;  // the last key of head 0
      k[bad * d] = std::numeric_limits<float>::quiet_NaN();
      v[bad * d + 1 % d] = std::numeric_limits<float>::quiet_NaN();  // a masked weight of 2^-126, not 0, would spread it
      v[in.v.numel() - 1] = -std::numeric_limits<float>::infinity();
      std::vector<Result> per_build;
      for (const cpu::FlashBuild b : builds) {
        cpu::flash_force_build(b);
        per_build.push_back(run_kind(kFlash, in.q, in.k, in.v, in.seed));
      }
      cpu::flash_force_build(cpu::FlashBuild::Auto);
      SCOPED_TRACE("T " + std::to_string(t) + ", D " + std::to_string(d));
      for (std::size_t i = 1; i < per_build.size(); ++i) {
        EXPECT_TRUE(bit_equal(per_build[0].out, per_build[i].out)) << "build " << static_cast<int>(builds[i]);
        EXPECT_TRUE(bit_equal(per_build[0].dq, per_build[i].dq));
        EXPECT_TRUE(bit_equal(per_build[0].dk, per_build[i].dk));
        EXPECT_TRUE(bit_equal(per_build[0].dv, per_build[i].dv));
      }
      // As before round 2c (pre-flash16b flash, checked): a NaN score makes its
      // row NaN; the causal mask keeps the NaN key and value and the -inf
      // value (head 1's last) out of every earlier row, whose weight for
      // them is 0, not exp2's 2^-126 floor.
      const float* fo = per_build[0].out.data();
      for (std::int64_t i = 0; i < 2 * t * d; ++i) {
        const std::int64_t row = i / d;
        if (row < bad || (row >= t && row < 2 * t - 1)) {
          EXPECT_TRUE(std::isfinite(fo[i])) << "element " << i;
        } else if (row == bad) {
          EXPECT_TRUE(std::isnan(fo[i])) << "element " << i;
        }
      }
      // Rows 0 and 1 (scores near +-1e29, far past exp2's clamps: one key
      // takes all the weight) agree with the materialized path where it is
      // finite (it lets a masked NaN value through: 0·NaN in its P·V).
      const Result m = run_kind(kMaterialized, in.q, in.k, in.v, in.seed);
      for (std::int64_t i = 0; i < std::min<std::int64_t>(2, bad) * d; ++i) {
        if (std::isfinite(m.out.data()[i])) EXPECT_NEAR(fo[i], m.out.data()[i], 1e-5F) << "element " << i;
      }
    }
  }
}

// ---- errors -------------------------------------------------------------------

TEST(AttentionErrors, NameTheOpAndEveryShape) {
  Variable q(Tensor::zeros({1, 2, 5, 4}), true);
  Variable k6(Tensor::zeros({1, 2, 6, 4}), true);
  Variable v(Tensor::zeros({1, 2, 5, 4}), true);
  Variable x3(Tensor::zeros({2, 5, 4}), true);
  for (auto kind : {kMaterialized, kFlash}) {
    expect_error([&] { causal_attention(q, k6, v, kind); },
                 {"[causal_attention]", "q (1, 2, 5, 4)", "k (1, 2, 6, 4)", "v (1, 2, 5, 4)", "same shape"});
    EXPECT_THROW(causal_attention(q, k6, v, kind), ShapeError);
    expect_error([&] { causal_attention(x3, x3, x3, kind); },
                 {"[causal_attention]", "q (2, 5, 4)", "k (2, 5, 4)", "v (2, 5, 4)", "4-D"});
    EXPECT_THROW(causal_attention(x3, x3, x3, kind), ShapeError);
    expect_error([&] { causal_attention(q, Variable(), v, kind); }, {"[causal_attention] k is an undefined"});
    Variable empty_d(Tensor::zeros({1, 2, 5, 0}));
    expect_error([&] { causal_attention(empty_d, empty_d, empty_d, kind); }, {"[causal_attention]", "(1, 2, 5, 0)"});
  }
  expect_error([&] { causal_attention(q, q, v, static_cast<FullSequenceAttentionKind>(7)); },
               {"[causal_attention]", "unknown attention kind 7"});
  EXPECT_THROW(causal_attention(q, q, v, static_cast<FullSequenceAttentionKind>(7)), ValueError);
  expect_error([&] { flash_with_tiles(q, q, v, {0, 4}); }, {"[flash_attention]", "0x4"});
}
