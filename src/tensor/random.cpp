#include "riftco_transformer/random.hpp"

#include <cmath>

namespace riftco_transformer {
namespace {
constexpr std::uint64_t kMultiplier = 6364136223846793005ULL;
}

Random::Random(std::uint64_t seed) {
  // PCG32 seeding: fixed stream, state advanced through the seed.
  s_.increment = (0xda3e39cb94b95bdbULL << 1U) | 1U;
  s_.state = 0;
  next_u32();
  s_.state += seed;
  next_u32();
}

std::uint32_t Random::next_u32() {
  const std::uint64_t old = s_.state;
  s_.state = old * kMultiplier + s_.increment;
  const auto xorshifted = static_cast<std::uint32_t>(((old >> 18U) ^ old) >> 27U);
  const auto rot = static_cast<std::uint32_t>(old >> 59U);
  return (xorshifted >> rot) | (xorshifted << ((32U - rot) & 31U));
}

float Random::uniform() { return static_cast<float>(next_u32() >> 8U) * (1.0F / 16777216.0F); }

float Random::uniform(float low, float high) { return low + (high - low) * uniform(); }

float Random::normal(float mean, float std) {
  double z = 0.0;
  if (s_.has_spare_normal) {
    s_.has_spare_normal = false;
    z = s_.spare_normal;
  } else {
    // u1 in (0, 1], u2 in [0, 1), 32 bits each.
    const double u1 = (static_cast<double>(next_u32()) + 1.0) / 4294967296.0;
    const double u2 = static_cast<double>(next_u32()) / 4294967296.0;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586476925 * u2;
    z = radius * std::cos(angle);
    s_.spare_normal = radius * std::sin(angle);
    s_.has_spare_normal = true;
  }
  return static_cast<float>(static_cast<double>(mean) + static_cast<double>(std) * z);
}

std::uint32_t Random::below(std::uint32_t bound) {
  if (bound == 0) return 0;
  const std::uint32_t threshold = (0U - bound) % bound;
  for (;;) {
    const std::uint32_t r = next_u32();
    if (r >= threshold) return r % bound;
  }
}

Random::State Random::state() const { return s_; }
void Random::set_state(const State& state) { s_ = state; }

}  // namespace riftco_transformer
