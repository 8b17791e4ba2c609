// Kernels changed for speed: the OpenMP-partitioned GEMM against a float64
// reference on ragged shapes, every transpose and strided C; rope_packed
// against rope_apply; gemm_group against one gemm() per product; the flash
// kernels' exp2_fma on every instruction set against its scalar form and
// double exp2. (The caching allocator's tests: test_allocator.cpp.)
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../../src/backend/cpu/kernels.hpp"
#include "../../src/backend/cpu/vec_math.hpp"
#include "riftco_transformer/tensor.hpp"

using namespace riftco_transformer;

namespace {

Tensor randn(const Shape& shape, std::uint64_t seed) {
  Random r(seed);
  return Tensor::normal(shape, r);
}

struct GemmCase {
  std::int64_t m, n, k;
  bool ta, tb;
};

/// C = alpha op(A) op(B) + beta C with C stored at row stride ldc >= n.
std::vector<double> reference(const GemmCase& g, const Tensor& a, const Tensor& b, const std::vector<float>& c0,
                              std::int64_t ldc, float alpha, float beta) {
  std::vector<double> c(c0.begin(), c0.end());
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t j = 0; j < g.n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        const double av = g.ta ? a.data()[p * g.m + i] : a.data()[i * g.k + p];
        const double bv = g.tb ? b.data()[j * g.k + p] : b.data()[p * g.n + j];
        acc += av * bv;
      }
      c[static_cast<std::size_t>(i * ldc + j)] = alpha * acc + beta * c0[static_cast<std::size_t>(i * ldc + j)];
    }
  }
  return c;
}

/// exp2_fma over a span as the flash kernels' loops run it: vectorized in
/// the AVX-512F and AVX2 builds (a vfmadd per fmadd), one element at a time
/// with libm's fmaf in the test's baseline build.
__attribute__((target("avx512f,fma"))) void exp2_span_avx512(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = cpu::vec::exp2_fma(x[i]);
}
__attribute__((target("avx2,fma"))) void exp2_span_avx2(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = cpu::vec::exp2_fma(x[i]);
}
__attribute__((optimize("no-tree-vectorize"))) void exp2_span_scalar(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = cpu::vec::exp2_fma(x[i]);
}

}  // namespace

TEST(PerfGemm, PartitionedGemmMatchesFloat64OnRaggedShapes) {
  // Above and below the parallel threshold (M·N·K = 2^18), rows or columns
  // split, extents that are not multiples of the 16-wide blocks.
  const GemmCase cases[] = {{300, 70, 20, false, false}, {70, 300, 20, false, true}, {301, 257, 13, true, false},
                            {257, 301, 13, true, true},   {33, 33, 400, false, false}, {5, 7, 3, false, false},
                            {1, 1000, 300, false, true},  {1000, 1, 300, true, false}};
  const int threads = omp_get_max_threads();
  for (const int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    for (const GemmCase& g : cases) {
      for (const bool strided : {false, true}) {
        const Tensor a = randn({g.m * g.k}, 1);
        const Tensor b = randn({g.k * g.n}, 2);
        const std::int64_t ldc = strided ? g.n + 5 : g.n;
        std::vector<float> c(static_cast<std::size_t>(g.m * ldc));
        Random r(3);
        for (float& x : c) x = r.normal();
        const float beta = strided ? 1.0F : 0.0F;
        const std::vector<double> want = reference(g, a, b, c, ldc, 0.5F, beta);
        std::vector<float> got = c;
        cpu::gemm(g.ta, g.tb, g.m, g.n, g.k, 0.5F, a.data(), g.ta ? g.m : g.k, b.data(), g.tb ? g.k : g.n, beta,
                  got.data(), ldc);
        std::vector<float> again = c;
        cpu::gemm(g.ta, g.tb, g.m, g.n, g.k, 0.5F, a.data(), g.ta ? g.m : g.k, b.data(), g.tb ? g.k : g.n, beta,
                  again.data(), ldc);
        SCOPED_TRACE(::testing::Message() << g.m << "x" << g.n << "x" << g.k << " ta " << g.ta << " tb " << g.tb
                                          << " strided " << strided << " threads " << t);
        int bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          const double tol = 1e-4 * std::sqrt(static_cast<double>(g.k)) * (1.0 + std::fabs(want[i]));
          if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ < 3) {
            ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
          }
        }
        EXPECT_EQ(bad, 0);
        EXPECT_EQ(got, again);  // reproducible for a fixed thread count
      }
    }
  }
  omp_set_num_threads(threads);
}

TEST(PerfGemm, GemmLeavesTheOpenMpThreadCountAlone) {
  // OpenBLAS's OpenMP build implements openblas_set_num_threads() with
  // omp_set_num_threads(): telling it to use one thread must not serialize
  // the rest of the process (run this test with that build through
  // LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp).
  const int before = omp_get_max_threads();
  const Tensor a = randn({256 * 256}, 8);
  std::vector<float> c(256 * 256);
  cpu::gemm(false, false, 256, 256, 256, 1.0F, a.data(), 256, a.data(), 256, 0.0F, c.data(), 256);
  EXPECT_EQ(omp_get_max_threads(), before);
}

TEST(PerfActivation, SwigluKernelsEqualTheScalarFormulaBitForBit) {
  // The spans run as an AVX-512F, AVX2 or baseline build (whichever the CPU
  // has; built without FMA contraction); the formula below is scalar code of
  // the test's baseline build. Same IEEE operations in the same order: the
  // same bits on every instruction set. 2·1000 + 37 elements: vector bodies
  // and scalar tails at every width; extreme values saturate the sigmoid.
  const std::int64_t n = 2037;
  Tensor gate = randn({n}, 61);
  const Tensor up = randn({n}, 62);
  const Tensor g = randn({n}, 63);
  gate.data()[0] = 100.0F;
  gate.data()[1] = -100.0F;
  const Tensor out = cpu::swiglu_forward(gate, up);
  Tensor d_gate, d_up;
  cpu::swiglu_backward(gate, up, g, d_gate, d_up);
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = gate.data()[i];
    const float s = cpu::vec::sigmoid_approx(a);
    const float expect_out = a * s * up.data()[i];
    const float expect_dg = g.data()[i] * up.data()[i] * s * (1.0F + a * (1.0F - s));
    const float expect_du = g.data()[i] * a * s;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(out.data()[i]), std::bit_cast<std::uint32_t>(expect_out)) << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(d_gate.data()[i]), std::bit_cast<std::uint32_t>(expect_dg)) << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(d_up.data()[i]), std::bit_cast<std::uint32_t>(expect_du)) << i;
  }
}

TEST(PerfExp2, VectorBuildsEqualTheScalarFormAndStayWithinTheBound) {
  // Every 997th float of magnitude below 130, both signs (2.3 M), the
  // integers there, the clamps and specials: the AVX-512F and AVX2 builds
  // give the scalar baseline's bits (NaN stays NaN), the result is within
  // 8.0e-8 of double exp2 on [-126, 127] and clamped outside it.
  std::vector<float> x;
  for (std::uint32_t b = 0; b < 0x43020000U; b += 997) {  // |x| < 130
    x.push_back(std::bit_cast<float>(b));
    x.push_back(-std::bit_cast<float>(b));
  }
  for (int i = -140; i <= 140; ++i) x.push_back(static_cast<float>(i));
  for (const float v : {-126.0F, -126.5F, 127.0F, 127.5F, 0.5F, -0.5F, std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()}) {
    x.push_back(v);
  }
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> scalar(x.size()), vector(x.size());
  exp2_span_scalar(x.data(), scalar.data(), n);
  double worst = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[static_cast<std::size_t>(i)];
    const float yi = scalar[static_cast<std::size_t>(i)];
    if (std::isnan(xi)) {
      ASSERT_TRUE(std::isnan(yi)) << xi;
    } else if (xi >= -126.0F && xi <= 127.0F) {
      const double ref = std::exp2(static_cast<double>(xi));
      worst = std::max(worst, std::fabs(yi - ref) / ref);
    } else {
      ASSERT_EQ(yi, xi < 0 ? std::ldexp(1.0F, -126) : std::ldexp(1.0F, 127)) << xi;  // clamped
    }
  }
  EXPECT_LE(worst, 8.0e-8);
  EXPECT_EQ(cpu::vec::exp2_fma(0.0F), 1.0F);
  EXPECT_EQ(cpu::vec::exp2_fma(-3.0F), 0.125F);
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma") != 0;
  auto same_bits = [&](const char* build) {
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (std::isnan(x[k])) {
        ASSERT_TRUE(std::isnan(vector[k])) << build << " " << x[k];
      } else {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(vector[k]), std::bit_cast<std::uint32_t>(scalar[k])) << build << " " << x[k];
      }
    }
  };
  int builds = 0;
  if (fma && __builtin_cpu_supports("avx2") != 0) {
    exp2_span_avx2(x.data(), vector.data(), n);
    same_bits("avx2");
    ++builds;
  }
  if (fma && __builtin_cpu_supports("avx512f") != 0) {
    exp2_span_avx512(x.data(), vector.data(), n);
    same_bits("avx512f");
    ++builds;
  }
  if (builds == 0) GTEST_SKIP() << "no FMA: only the scalar form runs here";
}

TEST(PerfGemm, BatchedMatmulMatchesPerItemProducts) {
  // Small batched products run one item per thread: same values as a loop.
  const Tensor a = randn({6, 17, 9}, 4);
  const Tensor b = randn({6, 9, 11}, 5);
  const Tensor c = cpu::matmul(a, b, false, false);
  for (std::int64_t i = 0; i < 6; ++i) {
    std::vector<float> one(17 * 11);
    cpu::gemm(false, false, 17, 11, 9, 1.0F, a.data() + i * 17 * 9, 9, b.data() + i * 9 * 11, 11, 0.0F, one.data(),
              11);
    for (std::int64_t j = 0; j < 17 * 11; ++j) EXPECT_EQ(c.data()[i * 17 * 11 + j], one[static_cast<std::size_t>(j)]);
  }
}

TEST(PerfGemm, GroupEqualsOneGemmPerProductInChainOrder) {
  // gemm_group runs chains (products accumulating into one C, in order) and
  // independent products in one parallel region: bit-identical to calling
  // gemm() for each product in order, for 1, 2 and 3 threads. Shapes: a
  // packed-projection backward (dx chain of three, three dW), plus a tiny
  // product that is not split and a k = 0 chain.
  const std::int64_t rows = 600, k = 520, w = 530, total = 3 * w;
  const Tensor g = randn({rows * total}, 11);
  const Tensor x = randn({rows * k}, 12);
  std::vector<Tensor> weights;
  for (int i = 0; i < 3; ++i) weights.push_back(randn({w * k}, 13 + static_cast<std::uint64_t>(i)));
  const Tensor small_a = randn({5 * 7}, 20), small_b = randn({7 * 3}, 21);
  const int before = omp_get_max_threads();
  for (const int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    auto problems = [&](std::vector<float>& dx, std::vector<std::vector<float>>& dw, std::vector<float>& small,
                        std::vector<float>& empty_k) {
      std::vector<cpu::GemmProblem> chain;
      std::vector<cpu::GemmProblem> singles;
      for (std::int64_t i = 0; i < 3; ++i) {
        chain.push_back({false, false, rows, k, w, 1.0F, g.data() + i * w, total, weights[static_cast<std::size_t>(i)].data(),
                         k, i == 0 ? 0.0F : 1.0F, dx.data(), k});
        singles.push_back({true, false, w, k, rows, 1.0F, g.data() + i * w, total, x.data(), k, 0.0F,
                           dw[static_cast<std::size_t>(i)].data(), k});
      }
      singles.push_back({false, false, 5, 3, 7, 0.5F, small_a.data(), 7, small_b.data(), 3, 0.0F, small.data(), 3});
      singles.push_back({false, false, 40, 40, 0, 1.0F, nullptr, 1, nullptr, 40, 0.5F, empty_k.data(), 40});
      return std::make_pair(chain, singles);
    };
    auto fresh = [&] {
      std::vector<std::vector<float>> dw(3, std::vector<float>(static_cast<std::size_t>(w * k), 7.0F));
      return dw;
    };
    std::vector<float> dx1(static_cast<std::size_t>(rows * k), 3.0F), dx2 = dx1;
    std::vector<std::vector<float>> dw1 = fresh(), dw2 = fresh();
    std::vector<float> small1(15, 1.0F), small2 = small1, empty1(1600, 2.0F), empty2 = empty1;
    {  // one gemm() per product
      auto [chain, singles] = problems(dx1, dw1, small1, empty1);
      for (const auto* list : {&chain, &singles}) {
        for (const cpu::GemmProblem& p : *list) {
          cpu::gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc);
        }
      }
    }
    {  // one group
      auto [chain, singles] = problems(dx2, dw2, small2, empty2);
      std::vector<std::span<const cpu::GemmProblem>> chains{chain};
      for (const cpu::GemmProblem& p : singles) chains.emplace_back(&p, 1);
      cpu::gemm_group(chains);
    }
    EXPECT_EQ(dx1, dx2) << t << " threads";
    EXPECT_EQ(dw1, dw2) << t << " threads";
    EXPECT_EQ(small1, small2) << t << " threads";
    EXPECT_EQ(empty1, empty2) << t << " threads";
    EXPECT_EQ(empty2[0], 1.0F);  // k = 0: C = beta C
    // And the chain really accumulated: dx = Σ_i g_i W_i, checked at one entry in double.
    double want = 0.0;
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < w; ++j)
        want += static_cast<double>(g.data()[5 * total + i * w + j]) * weights[static_cast<std::size_t>(i)].data()[j * k + 9];
    EXPECT_NEAR(dx2[5 * k + 9], want, 1e-3);
  }
  omp_set_num_threads(before);
}

TEST(PerfRope, PackedRowsMatchRopeApplyPerHead) {
  const std::int64_t b = 2, t = 9, heads = 3, d = 6;
  const Tensor x = randn({b, t, heads * d}, 7);  // (B, T, H·D)
  // Reference: (B, T, H, D) → (B, H, T, D), rope_apply, back.
  std::vector<std::int64_t> perm{0, 2, 1, 3};
  const Tensor bhtd = cpu::permute(x.reshape({b, t, heads, d}), perm);
  for (const bool inverse : {false, true}) {
    const Tensor ref = cpu::permute(cpu::rope_apply(bhtd, 0, 10000.0F, inverse), perm).reshape({b, t, heads * d});
    Tensor out = Tensor::empty(x.shape());
    cpu::rope_packed(x.data(), heads * d, out.data(), heads * d, b, t, heads * d, d, 10000.0F, inverse);
    EXPECT_TRUE(bit_equal(out, ref));
    Tensor in_place = x.clone();
    cpu::rope_packed(in_place.data(), heads * d, in_place.data(), heads * d, b, t, heads * d, d, 10000.0F, inverse);
    EXPECT_TRUE(bit_equal(in_place, ref));
  }
}
