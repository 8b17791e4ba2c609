// The pointwise, normalisation, loss and optimizer kernels that run in
// AVX-512F / AVX2 / baseline builds chosen at run time, each against the
// plain scalar loop it replaced (this file's baseline build, ISO C++ without
// FMA contraction), bit for bit: sizes below, at and above the vector
// widths (8 and 16 lanes) with ragged tails, rows shorter than a vector,
// large rows, extreme values, and 1, 2 and 3 threads.
#include <gnu/libc-version.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../../src/backend/cpu/kernels.hpp"
#include "../../src/backend/cpu/softmax_rows.hpp"
#include "riftco_transformer/tensor.hpp"

using namespace riftco_transformer;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// Extents around 8 and 16 lanes, a row shorter than a vector, large rows.
const std::vector<std::int64_t> kWidths = {1, 2, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 255, 257, 1000};

Tensor randn(const Shape& shape, std::uint64_t seed, float std = 1.0F) {
  Random r(seed);
  return Tensor::normal(shape, r, 0.0F, std);
}

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

/// Every element equal bit for bit (NaN payloads included).
void expect_same_bits(const float* got, const float* want, std::int64_t n, const std::string& what) {
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits(got[i]), bits(want[i])) << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}
void expect_same_bits(const Tensor& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<std::int64_t>(want.size())) << what;
  expect_same_bits(got.data(), want.data(), got.numel(), what);
}

/// Runs body() with OpenMP limited to 1, 2 and 3 threads.
template <class F>
void for_thread_counts(F&& body) {
  const int before = omp_get_max_threads();
  for (const int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    body(t);
  }
  omp_set_num_threads(before);
}

// ---- scalar references (the loops the kernels replaced) --------------------

/// Softmax of one row as cross_entropy_forward / softmax_forward wrote it.
float softmax_row_reference(const float* x, float* out, std::int64_t n, float& max_out) {
  float m = -kInf;
  for (std::int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  float total = 0.0F;
  for (std::int64_t j = 0; j < n; ++j) {
    out[j] = std::exp(x[j] - m);
    total += out[j];
  }
  const float inv = 1.0F / total;
  for (std::int64_t j = 0; j < n; ++j) out[j] *= inv;
  max_out = m;
  return total;
}

/// Σ a·b(·c) as norm.cpp's dot3: 8 lanes (element j in lane j mod 8), the
/// lanes folded as ((0+1)+(2+3))+((4+5)+(6+7)), then the tail in order.
float dot3_reference(const float* a, const float* b, const float* c, std::int64_t n) {
  float lane[8] = {};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += c == nullptr ? a[j + l] * b[j + l] : a[j + l] * b[j + l] * c[j + l];
  }
  float total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; j < n; ++j) total += c == nullptr ? a[j] * b[j] : a[j] * b[j] * c[j];
  return total;
}

/// Logits with ties, ±100 (exp arguments beyond glibc's ±88 main path) and,
/// when `specials`, −inf.
Tensor hard_logits(std::int64_t rows, std::int64_t v, std::uint64_t seed, bool specials) {
  Tensor x = randn({rows, v}, seed, 3.0F);
  float* p = x.data();
  for (std::int64_t i = 0; i < rows * v; i += 7) p[i] = p[i] > 0 ? 100.0F : -100.0F;
  if (specials) {
    for (std::int64_t i = 3; i < rows * v; i += 11) p[i] = -kInf;
  }
  if (rows * v > 1) p[1] = p[0];  // a tie for the max
  return x;
}

}  // namespace

// ---- exp / softmax rows ----------------------------------------------------

TEST(PointwiseExp, EveryVectorBuildIsLibmExpOnASweepOfEveryFloatRange) {
  // About a million bit patterns spread over all 2^32 (every sign, subnormals,
  // the ±88 edge of glibc's main path, infinities, NaNs), through each
  // vector build this CPU has, in rows of 1000 (ragged tails; the row sums
  // compared too) against the scalar loop.
  constexpr std::uint64_t kStride = 4093;
  std::vector<float> x;
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += kStride) {
    x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
  }
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> slow(x.size());
  std::vector<float> slow_totals;
  for (std::int64_t r = 0; r < n; r += 1000) {
    const std::int64_t len = std::min<std::int64_t>(1000, n - r);
    slow_totals.push_back(cpu::exp_shifted_row_scalar(x.data() + r, 0.0F, slow.data() + r, len));
  }
  int builds_run = 0;
  for (const cpu::ExpRowBuild build : {cpu::ExpRowBuild::Avx512f, cpu::ExpRowBuild::Avx2Fma}) {
    if (!cpu::exp_row_build_supported(build)) continue;
    ++builds_run;
    std::vector<float> fast(x.size());
    for (std::int64_t r = 0; r < n; r += 1000) {
      const std::int64_t len = std::min<std::int64_t>(1000, n - r);
      const float total = cpu::exp_shifted_row_with(build, x.data() + r, 0.0F, fast.data() + r, len);
      const float want = slow_totals[static_cast<std::size_t>(r / 1000)];
      // A NaN sum's payload depends on which operand the compiler put first.
      if (!(std::isnan(total) && std::isnan(want))) ASSERT_EQ(bits(total), bits(want)) << "row at " << r;
    }
    expect_same_bits(fast.data(), slow.data(), n, "exp build " + std::to_string(static_cast<int>(build)));
  }
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) EXPECT_GE(builds_run, 1);
}

TEST(PointwiseExp, TheFastestBuildRunsWhereTheCpuAndLibmHaveIt) {
  // glibc ≥ 2.28 picks the FMA build of its expf on CPUs with AVX2 and FMA:
  // the vector builds must have passed their self-check there (a failure
  // here means the fast path silently fell back to the scalar loop).
  __builtin_cpu_init();
  int major = 0;
  int minor = 0;
  ASSERT_EQ(std::sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor), 2);
  const bool glibc_fma_expf = major > 2 || (major == 2 && minor >= 28);
  cpu::ExpRowBuild expected = cpu::ExpRowBuild::Scalar;
  if (glibc_fma_expf && __builtin_cpu_supports("avx512f")) {
    expected = cpu::ExpRowBuild::Avx512f;
  } else if (glibc_fma_expf && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    expected = cpu::ExpRowBuild::Avx2Fma;
  }
  EXPECT_EQ(static_cast<int>(cpu::exp_row_build()), static_cast<int>(expected));
}

TEST(PointwiseExp, RowPiecesEqualTheScalarLoopsOnRaggedRows) {
  for (const std::int64_t n : kWidths) {
    for (const bool hard : {false, true}) {  // plain logits (no exp underflows to 0), then ±100, −inf and ties
      const Tensor x = hard ? hard_logits(1, n, 10 + static_cast<std::uint64_t>(n), true)
                            : randn({1, n}, 20 + static_cast<std::uint64_t>(n), 3.0F);
      const float* px = x.data();
      std::vector<float> got(static_cast<std::size_t>(n)), want(static_cast<std::size_t>(n));
      float want_max = 0.0F;
      const float want_total = softmax_row_reference(px, want.data(), n, want_max);
      const float m = cpu::row_max(px, n);
      ASSERT_EQ(bits(m), bits(want_max)) << "n " << n;
      const float total = cpu::exp_shifted_row(px, m, got.data(), n);
      ASSERT_EQ(bits(total), bits(want_total)) << "n " << n;
      cpu::scale_row(got.data(), 1.0F / total, got.data(), n);
      expect_same_bits(got.data(), want.data(), n, "softmax row n " + std::to_string(n));
    }
  }
  // NaNs are never taken as the max; an empty row's max is −inf.
  const std::vector<float> with_nan{std::nanf(""), 1.0F, std::nanf(""), -2.0F, 3.0F, std::nanf(""), 0.5F, 2.0F, 1.0F};
  EXPECT_EQ(cpu::row_max(with_nan.data(), 9), 3.0F);
  EXPECT_EQ(cpu::row_max(with_nan.data(), 0), -kInf);
}

TEST(PointwiseCrossEntropy, ForwardAndBackwardEqualTheScalarLoopsBitForBit) {
  for (const std::int64_t rows : {1, 3, 17, 40}) {  // 40 x 1000: parallel rows
    for (const std::int64_t v : kWidths) {
      const Tensor logits = hard_logits(rows, v, 100 + static_cast<std::uint64_t>(rows * v), false);
      std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
      for (std::int64_t r = 0; r < rows; ++r)
        targets[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 5) % v);
      if (rows > 1) targets[1] = -100;  // an ignored row
      // Reference.
      std::vector<float> probs(static_cast<std::size_t>(rows * v));
      double loss = 0.0;
      std::int64_t count = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        float m = 0.0F;
        const float* lr = logits.data() + r * v;
        const float total = softmax_row_reference(lr, probs.data() + r * v, v, m);
        const std::int32_t t = targets[static_cast<std::size_t>(r)];
        if (t == -100) continue;
        loss += static_cast<double>(m + std::log(total) - lr[t]);
        ++count;
      }
      const float want_loss = static_cast<float>(loss / static_cast<double>(count));
      const float k = 0.75F / static_cast<float>(count);
      std::vector<float> want_d(probs.size());
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int32_t t = targets[static_cast<std::size_t>(r)];
        for (std::int64_t j = 0; j < v; ++j)
          want_d[static_cast<std::size_t>(r * v + j)] =
              t == -100 ? 0.0F : probs[static_cast<std::size_t>(r * v + j)] * k;
        if (t != -100) want_d[static_cast<std::size_t>(r * v + t)] -= k;
      }
      for_thread_counts([&](int threads) {
        const std::string what =
            std::to_string(rows) + "x" + std::to_string(v) + ", " + std::to_string(threads) + " threads";
        Tensor got_probs;
        std::int64_t got_count = 0;
        const float got_loss = cpu::cross_entropy_forward(logits, targets, -100, got_probs, got_count);
        ASSERT_EQ(got_count, count) << what;
        ASSERT_EQ(bits(got_loss), bits(want_loss)) << what;
        expect_same_bits(got_probs, probs, "probs " + what);
        expect_same_bits(cpu::cross_entropy_backward(got_probs, targets, -100, got_count, 0.75F), want_d,
                         "dlogits " + what);
      });
    }
  }
}

TEST(PointwiseSoftmax, ForwardEqualsTheScalarLoopWithMaskedRows) {
  for (const std::int64_t c : kWidths) {
    const std::int64_t rows = 40;  // 40 x 1000: parallel rows
    Tensor x = hard_logits(rows, c, 200 + static_cast<std::uint64_t>(c), true);
    for (std::int64_t j = 0; j < c; ++j) x.data()[2 * c + j] = -kInf;  // row 2 fully masked
    std::vector<float> want(static_cast<std::size_t>(rows * c));
    for (std::int64_t r = 0; r < rows; ++r) {
      float m = 0.0F;
      std::vector<float> row(static_cast<std::size_t>(c));
      softmax_row_reference(x.data() + r * c, row.data(), c, m);
      if (m == -kInf) continue;  // every entry −inf (row 2, and short rows the −inf pattern covers): zeros
      std::copy(row.begin(), row.end(), want.begin() + r * c);
    }
    for_thread_counts([&](int threads) {
      expect_same_bits(cpu::softmax_forward(x), want,
                       "softmax C " + std::to_string(c) + ", " + std::to_string(threads) + " threads");
    });
  }
}

// ---- RMSNorm ----------------------------------------------------------------

TEST(PointwiseRmsNorm, ForwardAndBackwardEqualTheScalarLoopsBitForBit) {
  const float eps = 1e-5F;
  // 100 rows of the wider widths reach several threads (the backward's dx
  // rows and dw columns are tasks of one region); 0 rows: dw is all zeros.
  for (const std::int64_t rows : {0, 1, 3, 33, 100}) {
    for (const std::int64_t c : kWidths) {
      const Tensor x = randn({rows, c}, 300 + static_cast<std::uint64_t>(c));
      const Tensor w = randn({c}, 301);
      const Tensor g = randn({rows, c}, 302);
      const float *px = x.data(), *pw = w.data(), *pg = g.data();
      std::vector<float> y(static_cast<std::size_t>(rows * c)), rstd(static_cast<std::size_t>(rows));
      std::vector<float> dx(y.size()), dw(static_cast<std::size_t>(c), 0.0F);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = px + r * c;
        const float s = 1.0F / std::sqrt(dot3_reference(xr, xr, nullptr, c) / static_cast<float>(c) + eps);
        rstd[static_cast<std::size_t>(r)] = s;
        for (std::int64_t j = 0; j < c; ++j) y[static_cast<std::size_t>(r * c + j)] = xr[j] * s * pw[j];
        const float* gr = pg + r * c;
        const float k = s * s * s * dot3_reference(gr, pw, xr, c) / static_cast<float>(c);
        for (std::int64_t j = 0; j < c; ++j) dx[static_cast<std::size_t>(r * c + j)] = s * gr[j] * pw[j] - xr[j] * k;
        for (std::int64_t j = 0; j < c; ++j) dw[static_cast<std::size_t>(j)] += gr[j] * xr[j] * s;
      }
      for_thread_counts([&](int threads) {
        const std::string what =
            std::to_string(rows) + "x" + std::to_string(c) + ", " + std::to_string(threads) + " threads";
        Tensor got_rstd;
        expect_same_bits(cpu::rms_norm_forward(x, w, eps, got_rstd), y, "y " + what);
        expect_same_bits(got_rstd, rstd, "rstd " + what);
        for (const auto& [need_dx, need_dw] : {std::pair{true, true}, {true, false}, {false, true}}) {
          Tensor got_dx, got_dw;
          cpu::rms_norm_backward(x, w, got_rstd, g, got_dx, got_dw, need_dx, need_dw);
          EXPECT_EQ(got_dx.defined(), need_dx) << what;
          EXPECT_EQ(got_dw.defined(), need_dw) << what;
          if (need_dx) expect_same_bits(got_dx, dx, "dx " + what);
          if (need_dw) expect_same_bits(got_dw, dw, "dw " + what);
        }
      });
    }
  }
}

// ---- RoPE -------------------------------------------------------------------

TEST(PointwiseRope, ApplyAndPackedEqualTheScalarRotationBitForBit) {
  const float base = 10000.0F;
  for (const std::int64_t d : {2, 6, 8, 14, 16, 32, 64}) {
    const std::int64_t mats = d == 32 ? 8 : 3, t = d == 32 ? 300 : 13, offset = 5;  // D 32: parallel rows
    const Tensor x = randn({mats, t, d}, 400 + static_cast<std::uint64_t>(d));
    for (const bool inverse : {false, true}) {
      std::vector<float> want(static_cast<std::size_t>(mats * t * d));
      for (std::int64_t m = 0; m < mats; ++m) {
        for (std::int64_t p = 0; p < t; ++p) {
          for (std::int64_t i = 0; i < d / 2; ++i) {
            const double theta =
                std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(d));
            const double angle = static_cast<double>(offset + p) * theta;
            const auto c = static_cast<float>(std::cos(angle));
            const float s = inverse ? -static_cast<float>(std::sin(angle)) : static_cast<float>(std::sin(angle));
            const std::int64_t at = (m * t + p) * d + 2 * i;
            const float a = x.data()[at];
            const float b = x.data()[at + 1];
            want[static_cast<std::size_t>(at)] = a * c - b * s;
            want[static_cast<std::size_t>(at + 1)] = a * s + b * c;
          }
        }
      }
      for_thread_counts([&](int threads) {
        const std::string what =
            "D " + std::to_string(d) + (inverse ? " inverse, " : ", ") + std::to_string(threads) + " threads";
        expect_same_bits(cpu::rope_apply(x, offset, base, inverse), want, what);
      });
    }
  }
}

TEST(PointwiseRope, PackedRowsInPlaceAndStridedMatchRopeApply) {
  // (B, T, H·D) rows with a wider stride (a fused q/k/v buffer), rotated in
  // place and into another buffer: every head equals rope_apply's rows.
  const std::int64_t b = 2, t = 11, heads = 3, d = 10, stride = 3 * heads * d;
  const Tensor src = randn({b * t, stride}, 500);
  for (const bool inverse : {false, true}) {
    for_thread_counts([&](int threads) {
      Tensor in_place = src.clone();
      Tensor out = Tensor::zeros({b * t, 2 * heads * d});
      cpu::rope_packed(src.data(), stride, out.data(), 2 * heads * d, b, t, heads * d, d, 10000.0F, inverse);
      cpu::rope_packed(in_place.data(), stride, in_place.data(), stride, b, t, heads * d, d, 10000.0F, inverse);
      for (std::int64_t h = 0; h < heads; ++h) {
        Tensor head = Tensor::empty({b, t, d});
        for (std::int64_t r = 0; r < b * t; ++r) {
          for (std::int64_t j = 0; j < d; ++j) head.data()[r * d + j] = src.data()[r * stride + h * d + j];
        }
        const Tensor want = cpu::rope_apply(head, 0, 10000.0F, inverse);
        for (std::int64_t r = 0; r < b * t; ++r) {
          const std::string what =
              "row " + std::to_string(r) + " head " + std::to_string(h) + ", " + std::to_string(threads) + " threads";
          expect_same_bits(out.data() + r * 2 * heads * d + h * d, want.data() + r * d, d, what);
          expect_same_bits(in_place.data() + r * stride + h * d, want.data() + r * d, d, "in place " + what);
        }
      }
      // Columns past the rotated width are left alone.
      expect_same_bits(in_place.data() + heads * d, src.data() + heads * d, 2 * heads * d, "untouched columns");
    });
  }
}

// ---- embedding --------------------------------------------------------------

TEST(PointwiseEmbedding, BackwardAccumulatesRepeatedIdsInOrder) {
  for (const std::int64_t c : kWidths) {
    const std::int64_t vocab = 7;
    std::vector<std::int32_t> ids;
    for (std::int32_t i = 0; i < 40; ++i) ids.push_back((i * i) % 5);  // repeats, ids 5 and 6 never used
    const Tensor g = randn({static_cast<std::int64_t>(ids.size()), c}, 600 + static_cast<std::uint64_t>(c));
    std::vector<float> want(static_cast<std::size_t>(vocab * c), 0.0F);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (std::int64_t j = 0; j < c; ++j)
        want[static_cast<std::size_t>(ids[i] * c + j)] += g.data()[static_cast<std::int64_t>(i) * c + j];
    }
    for_thread_counts([&](int threads) {
      expect_same_bits(cpu::embedding_backward({vocab, c}, ids, g), want,
                       "C " + std::to_string(c) + ", " + std::to_string(threads) + " threads");
    });
  }
  // Large enough to run in parallel (16384 elements per thread).
  const std::int64_t c = 1000;
  std::vector<std::int32_t> ids(200, 3);
  ids[7] = 0;
  const Tensor g = randn({200, c}, 601);
  std::vector<float> want(static_cast<std::size_t>(4 * c), 0.0F);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    for (std::int64_t j = 0; j < c; ++j)
      want[static_cast<std::size_t>(ids[i] * c + j)] += g.data()[static_cast<std::int64_t>(i) * c + j];
  }
  for_thread_counts([&](int threads) {
    expect_same_bits(cpu::embedding_backward({4, c}, ids, g), want, "large, " + std::to_string(threads) + " threads");
  });
}

// ---- Adam -------------------------------------------------------------------

TEST(PointwiseAdam, UpdateAndSquaresEqualTheScalarLoopsBitForBit) {
  const std::vector<std::int64_t> sizes = {1, 7, 15, 16, 17, 33, 32768 + 9, 5};
  const backend::AdamCoefficients co{0.9F, 0.999F, 0.19F, 0.002F, 0.01F, 1e-8F, 0.7F};
  for_thread_counts([&](int threads) {
    std::vector<Tensor> theta, m, v, grad;
    std::vector<std::vector<float>> want_theta, want_m, want_v;
    std::vector<backend::AdamUpdate> updates;
    std::vector<std::span<const float>> spans;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::int64_t n = sizes[i];
      theta.push_back(randn({n}, 700 + i));
      m.push_back(randn({n}, 710 + i, 0.1F));
      Tensor vi = randn({n}, 720 + i, 0.01F);
      for (std::int64_t j = 0; j < n; ++j) vi.data()[j] = std::abs(vi.data()[j]);
      v.push_back(vi);
      grad.push_back(randn({n}, 730 + i));
    }
    double want_squares = 0.0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      // sum_of_squares: chunks of backend::kNormChunk, each over 8 double
      // lanes folded in a fixed order (tail into lane 0), chunks in order.
      const float* gp = grad[i].data();
      for (std::int64_t b0 = 0; b0 < sizes[i]; b0 += backend::kNormChunk) {
        const std::int64_t len = std::min(sizes[i] - b0, backend::kNormChunk);
        double lane[8] = {};
        std::int64_t j = 0;
        for (; j + 8 <= len; j += 8) {
          for (int l = 0; l < 8; ++l)
            lane[l] += static_cast<double>(gp[b0 + j + l]) * static_cast<double>(gp[b0 + j + l]);
        }
        for (; j < len; ++j) lane[0] += static_cast<double>(gp[b0 + j]) * static_cast<double>(gp[b0 + j]);
        want_squares += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      }
      std::vector<float> t(theta[i].data(), theta[i].data() + sizes[i]);
      std::vector<float> mm(m[i].data(), m[i].data() + sizes[i]);
      std::vector<float> vv(v[i].data(), v[i].data() + sizes[i]);
      const float decay = 1.0F - 0.01F * 0.1F * static_cast<float>(i % 2);
      for (std::int64_t j = 0; j < sizes[i]; ++j) {
        const auto k = static_cast<std::size_t>(j);
        const float gj = grad[i].data()[j] * co.clip;
        mm[k] = co.beta1 * mm[k] + (1.0F - co.beta1) * gj;
        vv[k] = co.beta2 * vv[k] + (1.0F - co.beta2) * gj * gj;
        t[k] = t[k] * decay - co.learning_rate * (mm[k] / co.bias1) / (std::sqrt(vv[k] / co.bias2) + co.epsilon);
      }
      want_theta.push_back(t);
      want_m.push_back(mm);
      want_v.push_back(vv);
      updates.push_back({theta[i].data(), m[i].data(), v[i].data(), grad[i].data(), sizes[i], decay});
      spans.emplace_back(grad[i].data(), static_cast<std::size_t>(sizes[i]));
    }
    const std::string what = std::to_string(threads) + " threads";
    EXPECT_EQ(cpu::sum_of_squares(spans), want_squares) << what;
    cpu::adam_update(updates, co);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      expect_same_bits(theta[i], want_theta[i], "theta " + std::to_string(i) + ", " + what);
      expect_same_bits(m[i], want_m[i], "m " + std::to_string(i) + ", " + what);
      expect_same_bits(v[i], want_v[i], "v " + std::to_string(i) + ", " + what);
    }
  });
}

// ---- SwiGLU (packed rows) ----------------------------------------------------

TEST(PointwiseSwiglu, PackedRowsEqualTheUnpackedKernelsOnRaggedWidths) {
  // The packed kernels run the spans per row of F: rows shorter than a
  // vector and ragged tails at every width must give the unpacked bits.
  for (const std::int64_t f : kWidths) {
    const std::int64_t rows = 9;
    const Tensor gate_up = randn({rows, 2 * f}, 800 + static_cast<std::uint64_t>(f), 3.0F);
    const Tensor g = randn({rows, f}, 801);
    Tensor gate = Tensor::empty({rows, f});
    Tensor up = Tensor::empty({rows, f});
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < f; ++j) {
        gate.data()[r * f + j] = gate_up.data()[r * 2 * f + j];
        up.data()[r * f + j] = gate_up.data()[r * 2 * f + f + j];
      }
    }
    const Tensor want = cpu::swiglu_forward(gate, up);
    Tensor d_gate, d_up;
    cpu::swiglu_backward(gate, up, g, d_gate, d_up);
    for_thread_counts([&](int threads) {
      const std::string what = "F " + std::to_string(f) + ", " + std::to_string(threads) + " threads";
      const Tensor out = cpu::swiglu_packed_forward(gate_up);
      expect_same_bits(out.data(), want.data(), rows * f, "out " + what);
      const Tensor d = cpu::swiglu_packed_backward(gate_up, g);
      for (std::int64_t r = 0; r < rows; ++r) {
        expect_same_bits(d.data() + r * 2 * f, d_gate.data() + r * f, f, "d gate " + what);
        expect_same_bits(d.data() + r * 2 * f + f, d_up.data() + r * f, f, "d up " + what);
      }
    });
  }
}

TEST(PointwiseSwiglu, InPlaceBackwardGivesTheOutOfPlaceBits) {
  // d holds g in columns [0, F) of each row and NaN in [F, 2F) (never read):
  // on return it must hold swiglu_packed_backward's bits, for every ragged
  // width, no rows, one row and several, at every thread count.
  for (const std::int64_t f : kWidths) {
    for (const std::int64_t rows : {std::int64_t{0}, std::int64_t{1}, std::int64_t{9}}) {
      const Tensor gate_up = randn({rows, 2 * f}, 820 + static_cast<std::uint64_t>(f), 3.0F);
      const Tensor g = randn({rows, f}, 821);
      for_thread_counts([&](int threads) {
        const std::string what =
            "F " + std::to_string(f) + ", rows " + std::to_string(rows) + ", " + std::to_string(threads) + " threads";
        const Tensor want = cpu::swiglu_packed_backward(gate_up, g);
        Tensor d = Tensor::full({rows, 2 * f}, std::numeric_limits<float>::quiet_NaN());
        for (std::int64_t r = 0; r < rows; ++r) {
          std::copy_n(g.data() + r * f, f, d.data() + r * 2 * f);
        }
        cpu::swiglu_packed_backward_inplace(gate_up, d);
        expect_same_bits(d.data(), want.data(), rows * 2 * f, what);
        Tensor over = gate_up.clone();  // written over gate_up itself (a donated buffer)
        cpu::swiglu_packed_backward_over(over, g);
        expect_same_bits(over.data(), want.data(), rows * 2 * f, what + ", over gate_up");
      });
    }
  }
}
