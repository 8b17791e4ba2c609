// Row pieces of a softmax (softmax_rows.hpp says what each one guarantees).
#include "softmax_rows.hpp"

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "vec_math.hpp"

// v8 values live inside the clones only (see vec_math.hpp).
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12 flags the deliberately undefined pass-through operand of its own
// AVX-512 intrinsics (_mm512_undefined_pd in avx512fintrin.h) as maybe
// uninitialized once they are inlined; nothing of ours is.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace riftco_transformer::cpu {
namespace {

using vec::kLanes;
using vec::v8;

// ---- glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, FMA build), 8 lanes -----
// x·N/ln2 = k + r (N = 32), exp(x) = 2^(k/N) · (C0 r³ + C1 r² + C2 r + 1)
// with 2^(k/N) from a 32-entry table whose exponent bits take k / N.
// The constants are glibc's (__exp2f_data, EXP2F_TABLE_BITS = 5) by bit
// pattern; the operation order is that of its `__expf_fma` build:
//   kd' = fma(InvLn2N, xd, Shift); ki = bits(kd'); kd = kd' − Shift;
//   r = fma(InvLn2N, xd, −kd); s = bits(T[ki % 32] + (ki << 47));
//   z = fma(r, C0, C1); y = fma(r, C2, 1); y = fma(z, r·r, y); (float)(y·s).
constexpr std::uint64_t kExp2Table[32] = {
    0x3ff0000000000000ULL, 0x3fefd9b0d3158574ULL, 0x3fefb5586cf9890fULL, 0x3fef9301d0125b51ULL, 0x3fef72b83c7d517bULL,
    0x3fef54873168b9aaULL, 0x3fef387a6e756238ULL, 0x3fef1e9df51fdee1ULL, 0x3fef06fe0a31b715ULL, 0x3feef1a7373aa9cbULL,
    0x3feedea64c123422ULL, 0x3feece086061892dULL, 0x3feebfdad5362a27ULL, 0x3feeb42b569d4f82ULL, 0x3feeab07dd485429ULL,
    0x3feea47eb03a5585ULL, 0x3feea09e667f3bcdULL, 0x3fee9f75e8ec5f74ULL, 0x3feea11473eb0187ULL, 0x3feea589994cce13ULL,
    0x3feeace5422aa0dbULL, 0x3feeb737b0cdc5e5ULL, 0x3feec49182a3f090ULL, 0x3feed503b23e255dULL, 0x3feee89f995ad3adULL,
    0x3feeff76f2fb5e47ULL, 0x3fef199bdd85529cULL, 0x3fef3720dcef9069ULL, 0x3fef5818dcfba487ULL, 0x3fef7c97337b9b5fULL,
    0x3fefa4afa2a490daULL, 0x3fefd0765b6e4540ULL};
constexpr double kInvLn2N = std::bit_cast<double>(0x40471547652b82feULL);  // 32 / ln 2
constexpr double kShift = std::bit_cast<double>(0x4338000000000000ULL);    // 1.5 · 2^52
constexpr double kC0 = std::bit_cast<double>(0x3ebc6af84b912394ULL);
constexpr double kC1 = std::bit_cast<double>(0x3f2ebfce50fac4f3ULL);
constexpr double kC2 = std::bit_cast<double>(0x3f962e42ff0c52d6ULL);
/// glibc leaves its main path when top12(|x|) ≥ top12(88.0f) (|x| ≥ 88, inf, NaN).
constexpr int kSpecialTop = 0x42b;

/// 2^(i/32) table entry for each lane's ki (low 5 bits) plus ki << 47, as doubles.
__attribute__((target("avx512f"), always_inline)) inline __m512d scale_512(__m512i ki) {
  const auto* t = reinterpret_cast<const long long*>(kExp2Table);  // NOLINT: the table's 64-bit lanes
  const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
  const __m512i low = _mm512_permutex2var_epi64(_mm512_loadu_si512(t), idx, _mm512_loadu_si512(t + 8));
  const __m512i high = _mm512_permutex2var_epi64(_mm512_loadu_si512(t + 16), idx, _mm512_loadu_si512(t + 24));
  const __m512i entry = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), low, high);
  return _mm512_castsi512_pd(_mm512_add_epi64(entry, _mm512_slli_epi64(ki, 47)));
}

/// expf of 8 floats on glibc's main path, 8 double lanes (lanes outside it
/// are fixed by the caller).
__attribute__((target("avx512f"), always_inline)) inline __m256 exp8_avx512(__m256 x) {
  const __m512d xd = _mm512_cvtps_pd(x);
  const __m512d kd_shifted = _mm512_fmadd_pd(_mm512_set1_pd(kInvLn2N), xd, _mm512_set1_pd(kShift));
  const __m512i ki = _mm512_castpd_si512(kd_shifted);
  const __m512d kd = _mm512_sub_pd(kd_shifted, _mm512_set1_pd(kShift));
  const __m512d r = _mm512_fmsub_pd(_mm512_set1_pd(kInvLn2N), xd, kd);
  const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(kC0), _mm512_set1_pd(kC1));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(kC2), _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(z, r2, y);
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, scale_512(ki)));
}

/// The same on 4 double lanes (AVX2 + FMA: the other CPUs glibc's FMA build runs on).
__attribute__((target("avx2,fma"), always_inline)) inline __m128 exp4_avx2(__m128 x) {
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d kd_shifted = _mm256_fmadd_pd(_mm256_set1_pd(kInvLn2N), xd, _mm256_set1_pd(kShift));
  const __m256i ki = _mm256_castpd_si256(kd_shifted);
  const __m256d kd = _mm256_sub_pd(kd_shifted, _mm256_set1_pd(kShift));
  const __m256d r = _mm256_fmsub_pd(_mm256_set1_pd(kInvLn2N), xd, kd);
  const auto* t = reinterpret_cast<const long long*>(kExp2Table);  // NOLINT: the table's 64-bit lanes
  const __m256i entry = _mm256_i64gather_epi64(t, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
  const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(entry, _mm256_slli_epi64(ki, 47)));
  const __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(kC0), _mm256_set1_pd(kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(kC2), _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp8_avx2(__m256 x) {
  return _mm256_set_m128(exp4_avx2(_mm256_extractf128_ps(x, 1)), exp4_avx2(_mm256_castps256_ps128(x)));
}

/// Bit l set when lane l of a = x − shift is off glibc's main path (top12
/// of |a| ≥ 0x42b: |a| ≥ 88, inf, NaN); std::exp computes those lanes.
__attribute__((target("avx2"), always_inline)) inline int special_lanes(__m256 a) {
  const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(a), 20), _mm256_set1_epi32(0x7ff));
  return _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(kSpecialTop - 1))));
}

/// After 8 vector lanes are stored: the special lanes from std::exp, then the
/// 8 values added to `total` in order (as the scalar loop adds them).
[[gnu::always_inline]] inline float finish_block(const float* x, float shift, float* out, int special, float total) {
  if (special != 0) {
    for (int l = 0; l < 8; ++l) {
      if ((special >> l & 1) != 0) out[l] = std::exp(x[l] - shift);
    }
  }
  for (int l = 0; l < 8; ++l) total += out[l];
  return total;
}

/// The scalar loop from element j on, continuing `total`.
float scalar_from(const float* x, float shift, float* out, std::int64_t j, std::int64_t n, float total) {
  for (; j < n; ++j) {
    out[j] = std::exp(x[j] - shift);
    total += out[j];
  }
  return total;
}

__attribute__((target("avx512f,avx2,fma"))) float exp_row_avx512(const float* x, float shift, float* out,
                                                                  std::int64_t n) {
  const __m256 shift8 = _mm256_set1_ps(shift);
  float total = 0.0F;
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 a = _mm256_sub_ps(_mm256_loadu_ps(x + j), shift8);
    _mm256_storeu_ps(out + j, exp8_avx512(a));
    total = finish_block(x + j, shift, out + j, special_lanes(a), total);
  }
  return scalar_from(x, shift, out, j, n, total);
}

__attribute__((target("avx2,fma"))) float exp_row_avx2(const float* x, float shift, float* out, std::int64_t n) {
  const __m256 shift8 = _mm256_set1_ps(shift);
  float total = 0.0F;
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 a = _mm256_sub_ps(_mm256_loadu_ps(x + j), shift8);
    _mm256_storeu_ps(out + j, exp8_avx2(a));
    total = finish_block(x + j, shift, out + j, special_lanes(a), total);
  }
  return scalar_from(x, shift, out, j, n, total);
}

/// Probe values: an even sweep of the bit patterns of [−110, 110] (both
/// signs, subnormals included), the edges of glibc's main path, zeros,
/// infinities and NaN.
std::vector<float> exp_probe_values() {
  std::vector<float> probes{0.0F,
                            -0.0F,
                            88.0F,
                            -88.0F,
                            87.99999F,
                            -87.99999F,
                            88.72283F,
                            -103.27893F,
                            -103.97208F,
                            -104.0F,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min()};
  const std::uint32_t top = std::bit_cast<std::uint32_t>(110.0F);
  constexpr std::uint32_t kSteps = 8191;
  for (std::uint32_t i = 0; i <= kSteps; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<std::uint64_t>(top) * i / kSteps);
    probes.push_back(std::bit_cast<float>(bits));
    probes.push_back(std::bit_cast<float>(bits | 0x80000000U));
  }
  while (probes.size() % 8 != 3) probes.push_back(-1.0F);  // a scalar tail too
  return probes;
}

/// The build's results equal std::exp's bit for bit on the probes (and the
/// sum's, up to a NaN's payload).
bool matches_libm(ExpRowBuild build) {
  const std::vector<float> probes = exp_probe_values();
  std::vector<float> fast(probes.size()), slow(probes.size());
  const auto n = static_cast<std::int64_t>(probes.size());
  const float fast_total = exp_shifted_row_with(build, probes.data(), 0.0F, fast.data(), n);
  const float slow_total = exp_shifted_row_scalar(probes.data(), 0.0F, slow.data(), n);
  for (std::size_t i = 0; i < probes.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(fast[i]) != std::bit_cast<std::uint32_t>(slow[i])) return false;
  }
  // A NaN sum's payload depends on which operand the compiler put first.
  return std::bit_cast<std::uint32_t>(fast_total) == std::bit_cast<std::uint32_t>(slow_total) ||
         (std::isnan(fast_total) && std::isnan(slow_total));
}

ExpRowBuild pick_build() {
  for (const ExpRowBuild b : {ExpRowBuild::Avx512f, ExpRowBuild::Avx2Fma}) {
    if (exp_row_build_supported(b) && matches_libm(b)) return b;
  }
  return ExpRowBuild::Scalar;
}

ExpRowBuild chosen_build() {
  static const ExpRowBuild build = pick_build();
  return build;
}

}  // namespace

float exp_shifted_row_scalar(const float* x, float shift, float* out, std::int64_t n) {
  return scalar_from(x, shift, out, 0, n, 0.0F);
}

bool exp_row_build_supported(ExpRowBuild build) {
  __builtin_cpu_init();
  switch (build) {
    case ExpRowBuild::Avx512f:
      return __builtin_cpu_supports("avx512f");
    case ExpRowBuild::Avx2Fma:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case ExpRowBuild::Scalar:
      return true;
  }
  return false;
}

float exp_shifted_row_with(ExpRowBuild build, const float* x, float shift, float* out, std::int64_t n) {
  switch (build) {
    case ExpRowBuild::Avx512f:
      return exp_row_avx512(x, shift, out, n);
    case ExpRowBuild::Avx2Fma:
      return exp_row_avx2(x, shift, out, n);
    case ExpRowBuild::Scalar:
      break;
  }
  return exp_shifted_row_scalar(x, shift, out, n);
}

float exp_shifted_row(const float* x, float shift, float* out, std::int64_t n) {
  return exp_shifted_row_with(chosen_build(), x, shift, out, n);
}

ExpRowBuild exp_row_build() { return chosen_build(); }

namespace {

/// row_max's body: 16 lanes in two vectors, then the tail in order. Inlined
/// into each clone (a v8 never crosses a call: the baseline target passes
/// it differently).
[[gnu::always_inline]] inline float max_of(const float* x, std::int64_t n) {
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  v8 a = vec::splat(kLow);
  v8 b = a;
  std::int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    a = vec::max_lanes(a, vec::load(x + j));
    b = vec::max_lanes(b, vec::load(x + j + kLanes));
  }
  float m = vec::max_of_lanes(vec::max_lanes(a, b));
  for (; j < n; ++j) m = m < x[j] ? x[j] : m;
  return m;
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) float row_max(const float* x, std::int64_t n) {
  return max_of(x, n);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void scale_row(const float* x, float s, float* out,
                                                                            std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) out[j] = x[j] * s;
}

}  // namespace riftco_transformer::cpu
