#pragma once
// Vectorizable float helpers shared by the CPU kernels (private to backend/cpu).
//
// `v8` is a GCC vector of 8 floats: kernels written with it compile to AVX2
// in their `target_clones("avx2", "default")` clone and to pairs of SSE
// operations in the default one. Products and sums are written as separate
// multiplies and adds; the AVX2 and default targets have no FMA, so those
// clones give the same bits. A file that adds an AVX-512F build (which has
// FMA: flash_attention.cpp, activation.cpp) is compiled with
// -ffp-contract=off (CMakeLists.txt) so GCC does not contract a·b + c there
// either. A kernel that wants fused multiply-adds asks for them explicitly
// (`fmadd`, `exp2_fma`): one rounding in every build, a vfmadd
// where the caller's target has FMA and libm's fmaf where it does not, so
// those clones give the same bits too. Reductions use 8 fixed lanes summed
// in a fixed order, so results never depend on the thread count or the
// vector width.
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>

// Every helper is inlined into its caller's clone; the ABI note GCC gives for
// 32-byte vectors in the default (SSE) target does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace riftco_transformer::cpu::vec {

using v8 = float __attribute__((vector_size(32)));
constexpr std::int64_t kLanes = 8;

[[gnu::always_inline]] inline v8 load(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }
[[gnu::always_inline]] inline v8 splat(float x) { return v8{x, x, x, x, x, x, x, x}; }
/// Lanes summed in a fixed order.
[[gnu::always_inline]] inline float sum_lanes(v8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
/// (a < b ? b : a) per lane: std::max's semantics (a NaN in b is never taken).
[[gnu::always_inline]] inline v8 max_lanes(v8 a, v8 b) { return a < b ? b : a; }
[[gnu::always_inline]] inline float max_of_lanes(v8 v) {
  float m = v[0];
  for (int i = 1; i < 8; ++i) m = m < v[i] ? v[i] : m;
  return m;
}
constexpr std::int64_t round_up(std::int64_t n, std::int64_t to) { return (n + to - 1) / to * to; }

/// exp(a): the Cephes expf polynomial after reducing by n·ln2 (max relative
/// error 8.2e-8 against double exp on [-87, 5]). Arguments are clamped to
/// [-87.34, 88]: below that the result is 1.2e-38 instead of a denormal or 0;
/// NaN stays NaN. The clamps and the NaN test work on the bit patterns (no
/// float branches), so loops calling it vectorize.
[[gnu::always_inline]] inline float exp_approx(float x) {
  constexpr std::uint32_t kSign = 0x80000000U;
  constexpr std::uint32_t kLowBits = 0xC2AEAC4FU;   // -87.33654f
  constexpr std::uint32_t kHighBits = 0x42B00000U;  // 88.0f
  constexpr std::uint32_t kInfBits = 0x7F800000U;
  constexpr std::uint32_t kQuietNanBits = 0x7FC00000U;  // OR-ed into any float: a NaN
  const std::uint32_t raw = std::bit_cast<std::uint32_t>(x);
  // Floats of one sign order like their bit patterns (by magnitude).
  const std::uint32_t limit = raw < kSign ? kHighBits : kLowBits;
  const std::uint32_t bits = raw < limit ? raw : limit;
  const float a = std::bit_cast<float>(bits);
  const float t = a * 1.44269504088896341F + 12582912.0F;  // adding 1.5·2^23 rounds a·log2(e) to an integer
  const float fn = t - 12582912.0F;
  const std::int32_t n2 = std::bit_cast<std::int32_t>(t) - 0x4B400000;  // that integer, in [-126, 127]
  const float r = (a - fn * 0.693359375F) + fn * 2.12194440e-4F;          // a - n·ln2 in two parts
  float y = 1.9875691500e-4F;
  y = y * r + 1.3981999507e-3F;
  y = y * r + 8.3334519073e-3F;
  y = y * r + 4.1665795894e-2F;
  y = y * r + 1.6666665459e-1F;
  y = y * r + 5.0000001201e-1F;
  y = y * r * r + r + 1.0F;
  const float result = y * std::bit_cast<float>(static_cast<std::uint32_t>(n2 + 127) << 23);  // · 2^n
  const bool nan = (raw & ~kSign) > kInfBits;
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(result) | (nan ? kQuietNanBits : 0U));
}

/// a·b + c with one rounding (std::fma's bits on every target).
[[gnu::always_inline]] inline float fmadd(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

/// log2(e): exp(x) = 2^(x·log2(e)), so a kernel can fold it into a scale.
constexpr float kLog2e = 1.44269504088896341F;
constexpr float kLn2 = 0.693147180559945309F;

/// 2^x: x rounded to an integer n and r = x − n in [-0.5, 0.5] (both
/// exact), 2^r by a degree-6 minimax polynomial in Horner form with fused
/// multiply-adds (max relative error 8.0e-8 against double exp2 over
/// every float in [-126, 127]; exp_approx: 8.3e-8), times 2^n built from
/// n's bits. x is clamped to [-126, 127] (below, the result is 2^-126, never a
/// denormal or 0); NaN stays NaN. Branch-free, so loops calling it vectorize;
/// about 18 vector operations against exp_approx's ~30.
[[gnu::always_inline]] inline float exp2_fma(float x) {
  // The clamps compare bit patterns (floats of one sign order like them),
  // which GCC vectorizes at every width; float selects it leaves as branches
  // in AVX2 loops. They send NaN to a bound; the end puts the NaN back.
  constexpr std::uint32_t kSign = 0x80000000U;
  constexpr std::uint32_t kHighBits = 0x42FE0000U;  // 127.0f
  constexpr std::uint32_t kLowBits = 0xC2FC0000U;   // -126.0f
  constexpr std::uint32_t kInfBits = 0x7F800000U;
  constexpr std::uint32_t kQuietNanBits = 0x7FC00000U;  // OR-ed into any float: a NaN
  const std::uint32_t raw = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t limit = raw < kSign ? kHighBits : kLowBits;
  const float a = std::bit_cast<float>(raw < limit ? raw : limit);
  constexpr float kShift = 12583039.0F;  // 1.5·2^23 + 127: the sum's low bits are round(a) + 127
  const float t = a + kShift;
  const float n = t - kShift;
  const float r = a - n;
  float y = 1.5345812426e-4F;
  y = fmadd(y, r, 1.3399930904e-3F);
  y = fmadd(y, r, 9.6184890717e-3F);
  y = fmadd(y, r, 5.5503286421e-2F);
  y = fmadd(y, r, 2.4022646248e-1F);
  y = fmadd(y, r, 6.9314718246e-1F);
  y = fmadd(y, r, 1.0F);
  // t's bits are 0x4B400000 + n + 127; shifting by 23 drops the first term
  // and leaves (n + 127) in the exponent field: 2^n, n in [-126, 127].
  const float result = y * std::bit_cast<float>(std::bit_cast<std::uint32_t>(t) << 23);
  const bool nan = (raw & ~kSign) > kInfBits;
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(result) | (nan ? kQuietNanBits : 0U));
}

/// 1 / (1 + exp(-x)) through exp_approx: exactly 1 for large x, 0 below
/// -88.72284 (where float exp(-x) overflows, as PyTorch's sigmoid does:
/// exp_approx clamps at 88, which left about 6e-39 there, so silu(-1e30)
/// was -6e-9 and swiglu(-1e30, -1e30) 6e21); about 6e-39 on (-88.72284,
/// -88] (the clamp); NaN stays NaN. Branch-free: the test compares bit
/// patterns (negative floats order by magnitude like theirs).
[[gnu::always_inline]] inline float sigmoid_approx(float x) {
  constexpr std::uint32_t kOverflowBits = 0xC2B17218U;  // -88.72284f, the first float whose exp(-x) overflows
  constexpr std::uint32_t kMinusInfBits = 0xFF800000U;  // above: negative NaNs
  const std::uint32_t raw = std::bit_cast<std::uint32_t>(x);
  const bool below = raw >= kOverflowBits && raw <= kMinusInfBits;
  const float s = 1.0F / (1.0F + exp_approx(-x));
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(s) & (below ? 0U : ~0U));
}

}  // namespace riftco_transformer::cpu::vec

#pragma GCC diagnostic pop
