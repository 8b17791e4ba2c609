#include "riftco_transformer/random.hpp"

#include <atomic>
#include <cmath>

namespace riftco_transformer {
namespace {
constexpr std::uint64_t kMultiplier = 6364136223846793005ULL;
std::atomic<std::uint64_t> g_next_random_id{1};

thread_local std::vector<RandomStreamRecorder*> t_recorders;
thread_local std::vector<RandomStreamReplay*> t_replays;
}  // namespace

Random::Random(const Random& other) : s_(other.s_), id_(g_next_random_id.fetch_add(1)) {}

Random& Random::operator=(const Random& other) {
  s_ = other.s_;  // id_ stays: this is still the same generator object
  return *this;
}

Random::Random(std::uint64_t seed) : id_(g_next_random_id.fetch_add(1)) {
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

void announce_random_use(Random& random) {
  if (!t_replays.empty()) {  // rewind first, so recorders below see the replayed state
    RandomStreamReplay& replay = *t_replays.back();
    for (std::size_t i = 0; i < replay.starts_.size(); ++i) {
      const RandomStreamStart& start = replay.starts_[i];
      if (replay.rewound_[i] || start.generator != &random || start.id != random.id()) continue;
      replay.live_[i] = random.state();
      random.set_state(start.state);
      replay.rewound_[i] = true;
    }
  }
  for (RandomStreamRecorder* recorder : t_recorders) {
    bool seen = false;
    for (const RandomStreamStart& start : recorder->starts_) {
      seen = seen || (start.generator == &random && start.id == random.id());
    }
    if (!seen) recorder->starts_.push_back({&random, random.id(), random.state()});
  }
}

RandomStreamRecorder::RandomStreamRecorder() { t_recorders.push_back(this); }
RandomStreamRecorder::~RandomStreamRecorder() { std::erase(t_recorders, this); }

RandomStreamReplay::RandomStreamReplay(const std::vector<RandomStreamStart>& starts)
    : starts_(starts), rewound_(starts.size(), false), live_(starts.size()) {
  t_replays.push_back(this);
}

RandomStreamReplay::~RandomStreamReplay() {
  std::erase(t_replays, this);
  // Put live streams back in reverse order of the starts (a generator is in
  // `starts` once, so the order only matters for readability).
  for (std::size_t i = starts_.size(); i-- > 0;) {
    if (rewound_[i]) starts_[i].generator->set_state(live_[i]);
  }
}

}  // namespace riftco_transformer
