#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011; Random123), the counter-based generator behind dropout on
// every backend. One source for host and device: with nvcc the functions are
// __host__ __device__, so the CPU kernel and the CUDA kernel compute the same
// mask bits from the same code. Integer-only: no platform or compiler
// differences. The known-answer vectors of Random123's kat_vectors are in
// tests/cpp/test_dropout_philox.cpp.
#include <cstdint>

#if defined(__CUDACC__)
#define RIFTCO_HOST_DEVICE __host__ __device__
#else
#define RIFTCO_HOST_DEVICE
#endif

namespace riftco_transformer::backend {

struct PhiloxCounter {
  std::uint32_t word[4];
};
struct PhiloxKey {
  std::uint32_t word[2];
};

namespace philox_detail {
inline constexpr std::uint32_t kM0 = 0xD2511F53U;
inline constexpr std::uint32_t kM1 = 0xCD9E8D57U;
inline constexpr std::uint32_t kW0 = 0x9E3779B9U;  // golden ratio
inline constexpr std::uint32_t kW1 = 0xBB67AE85U;  // sqrt(3) - 1

RIFTCO_HOST_DEVICE inline PhiloxCounter single_round(PhiloxCounter c, PhiloxKey k) {
  const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c.word[0];
  const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c.word[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32U);
  const auto lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32U);
  const auto lo1 = static_cast<std::uint32_t>(p1);
  return PhiloxCounter{{hi1 ^ c.word[1] ^ k.word[0], lo1, hi0 ^ c.word[3] ^ k.word[1], lo0}};
}
}  // namespace philox_detail

/// Philox4x32 with 10 rounds: four random words of `counter` under `key`.
RIFTCO_HOST_DEVICE inline PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  counter = philox_detail::single_round(counter, key);
  for (int r = 1; r < 10; ++r) {
    key.word[0] += philox_detail::kW0;
    key.word[1] += philox_detail::kW1;
    counter = philox_detail::single_round(counter, key);
  }
  return counter;
}

/// The 32-bit words a dropout of probability p drops: those below
/// ceil(p·2^32). p·2^32 is exact in double (a float times a power of two),
/// so the drop probability is exactly p whenever p·2^32 is a whole number
/// (every float p ≥ 2^-9), and above p by less than 2^-32 otherwise. (A
/// 24-bit uniform compared with p, as before, was biased by up to 2^-24 for
/// p < 0.5: p = 0.1 dropped 96 words in 2^32 too many.) p in [0, 1).
RIFTCO_HOST_DEVICE inline std::uint64_t dropout_threshold(float p) {
  const double scaled = static_cast<double>(p) * 4294967296.0;
  auto threshold = static_cast<std::uint64_t>(scaled);
  if (static_cast<double>(threshold) < scaled) ++threshold;  // ceil, without libm on the device
  return threshold;
}

/// The dropout mask as a pure function of (seed, element index): element i
/// takes word i % 4 of Philox4x32-10 at counter (i / 4, 0) under key `seed`;
/// it is dropped (0) when that word is below dropout_threshold(p), else kept
/// with `keep_scale` (1/(1-p)). Writes the (up to 4) values of group `group`
/// (elements 4·group ...) that lie below `numel`.
RIFTCO_HOST_DEVICE inline void dropout_mask_group(std::uint64_t seed, std::int64_t group, std::int64_t numel,
                                                  float p, float keep_scale, float* out) {
  const auto g = static_cast<std::uint64_t>(group);
  const PhiloxCounter counter{{static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(g >> 32U), 0U, 0U}};
  const PhiloxKey key{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32U)}};
  const PhiloxCounter bits = philox4x32_10(counter, key);
  const std::uint64_t threshold = dropout_threshold(p);
  const std::int64_t first = group * 4;
  for (int lane = 0; lane < 4 && first + lane < numel; ++lane) {
    out[first + lane] = bits.word[lane] < threshold ? 0.0F : keep_scale;
  }
}

}  // namespace riftco_transformer::backend
