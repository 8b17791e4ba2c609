#pragma once
// A seeded, platform-independent random generator.
//
// The core is PCG32 (XSH-RR, 64-bit state, O'Neill 2014): integer-only, so the
// same seed gives the same bit stream on every machine and compiler. Floats are
// made from the top 24 bits; normals use Box–Muller computed in double and
// rounded once to float, so libm's last-bit differences do not reach the
// float32 result in practice.
#include <cstdint>
#include <vector>

namespace riftco_transformer {

class Random {
 public:
  explicit Random(std::uint64_t seed = 0);
  /// A copy continues the same stream but is a generator of its own (a new
  /// id()); assignment keeps the target's id and takes the source's state.
  Random(const Random& other);
  Random& operator=(const Random& other);

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

  /// Unique for the life of this object (never reused, never copied), so a
  /// recorded stream is never replayed into a different generator that
  /// happens to live at the same address.
  std::uint64_t id() const { return id_; }

 private:
  State s_;
  std::uint64_t id_;
};

/// Random-stream capture for checkpoint replay (PyTorch's preserve_rng_state).
/// The library's random ops (dropout, Tensor::normal/uniform) call
/// announce_random_use() once before they draw; checkpoint() records the
/// state every generator had at its first use inside the callable, and a
/// replay rewinds each one to that state at its first use and puts the live
/// state back afterwards, so the replay draws the same numbers and the
/// caller's stream does not move.
struct RandomStreamStart {
  Random* generator = nullptr;  // identity only; dereferenced only while the op that announced it runs
  std::uint64_t id = 0;
  Random::State state;
};

/// Library random ops call this before drawing from `random`.
void announce_random_use(Random& random);

/// While alive (on this thread), records the first-use state of every
/// generator announced. Scopes nest: every live recorder records.
class RandomStreamRecorder {
 public:
  RandomStreamRecorder();
  ~RandomStreamRecorder();
  RandomStreamRecorder(const RandomStreamRecorder&) = delete;
  RandomStreamRecorder& operator=(const RandomStreamRecorder&) = delete;
  /// Moves the recorded starts out (call before the scope ends or after).
  std::vector<RandomStreamStart> take() { return std::move(starts_); }

 private:
  friend void announce_random_use(Random& random);
  std::vector<RandomStreamStart> starts_;
};

/// While alive (on this thread), a generator that `starts` recorded is set to
/// its recorded state at its first announced use; on destruction every
/// rewound generator gets the state it had just before its rewind back. Only
/// the innermost live replay acts.
class RandomStreamReplay {
 public:
  explicit RandomStreamReplay(const std::vector<RandomStreamStart>& starts);
  ~RandomStreamReplay();
  RandomStreamReplay(const RandomStreamReplay&) = delete;
  RandomStreamReplay& operator=(const RandomStreamReplay&) = delete;

 private:
  friend void announce_random_use(Random& random);
  const std::vector<RandomStreamStart>& starts_;
  std::vector<bool> rewound_;
  std::vector<Random::State> live_;  // per start: the state to put back
};

}  // namespace riftco_transformer
