#pragma once
// A seeded, platform-independent random generator.
//
// The core is PCG32 (XSH-RR, 64-bit state, O'Neill 2014): integer-only, so the
// same seed gives the same bit stream on every machine and compiler. Floats are
// made from the top 24 bits; normals use Box–Muller computed in double and
// rounded once to float, so libm's last-bit differences do not reach the
// float32 result in practice.
#include <cstdint>

namespace riftco_transformer {

class Random {
 public:
  explicit Random(std::uint64_t seed = 0);

  std::uint32_t next_u32();
  /// Uniform in [0, 1) with 24 random bits.
  float uniform();
  /// Uniform in [low, high).
  float uniform(float low, float high);
  /// Standard normal times `std` plus `mean`.
  float normal(float mean = 0.0F, float std = 1.0F);
  /// Uniform integer in [0, bound); bound > 0. Unbiased (rejection).
  std::uint32_t below(std::uint32_t bound);

  /// The full generator state, for saving/restoring (checkpoint replay,
  /// training resume). Restoring a state reproduces the same stream.
  struct State {
    std::uint64_t state = 0;
    std::uint64_t increment = 0;
    bool has_spare_normal = false;
    double spare_normal = 0.0;
    bool operator==(const State&) const = default;
  };
  State state() const;
  void set_state(const State& state);

 private:
  State s_;
};

}  // namespace riftco_transformer
