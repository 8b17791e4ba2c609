// Optimizer kernels: the global gradient norm and the fused Adam update.
// Both walk all parameters in one parallel region of fixed-size chunks, so
// small parameters (norm weights) do not each pay a fork and big ones are
// split across threads. The spans run in AVX-512F, AVX2 and baseline
// clones; the file is built with -ffp-contract=off, so all give the same bits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.hpp"

namespace riftco_transformer::cpu {
namespace {

/// Elements per chunk: a chunk's partial sum is one term of the total, so
/// this constant (not the thread count) fixes the summation order.
constexpr std::int64_t kChunk = backend::kNormChunk;

struct Chunk {
  std::size_t span;
  std::int64_t begin;
  std::int64_t end;
};

template <class Sizes>
std::vector<Chunk> cut_into_chunks(std::size_t count, Sizes&& size_of) {
  std::vector<Chunk> chunks;
  for (std::size_t s = 0; s < count; ++s) {
    const std::int64_t n = size_of(s);
    for (std::int64_t b = 0; b < n; b += kChunk) chunks.push_back({s, b, std::min(n, b + kChunk)});
  }
  return chunks;
}

/// Σ x² with 8 independent double accumulators summed in a fixed order.
__attribute__((target_clones("avx512f", "avx2", "default"))) double squares_span(const float* x, std::int64_t n) {
  double acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const auto xl = static_cast<double>(x[i + l]);
      acc[l] += xl * xl;
    }
  }
  for (; i < n; ++i) {
    const auto xl = static_cast<double>(x[i]);
    acc[0] += xl * xl;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void adam_span(float* __restrict theta,
                                                                            float* __restrict m, float* __restrict v,
                                                                            const float* __restrict grad,
                                                                            std::int64_t n, AdamCoefficients c,
                                                                            float decay) {
  const float one_minus_b1 = 1.0F - c.beta1;
  const float one_minus_b2 = 1.0F - c.beta2;
  for (std::int64_t j = 0; j < n; ++j) {
    const float g = grad[j] * c.clip;
    const float mj = c.beta1 * m[j] + one_minus_b1 * g;
    const float vj = c.beta2 * v[j] + one_minus_b2 * g * g;
    m[j] = mj;
    v[j] = vj;
    const float m_hat = mj / c.bias1;
    const float v_hat = vj / c.bias2;
    theta[j] = theta[j] * decay - c.learning_rate * m_hat / (std::sqrt(v_hat) + c.epsilon);
  }
}

}  // namespace

std::vector<double> sum_of_squares_partials(std::span<const std::span<const float>> spans) {
  const std::vector<Chunk> chunks =
      cut_into_chunks(spans.size(), [&](std::size_t s) { return static_cast<std::int64_t>(spans[s].size()); });
  std::vector<double> partial(chunks.size(), 0.0);
  const auto count = static_cast<std::int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic, 4) if (count > 1)
  for (std::int64_t i = 0; i < count; ++i) {
    const Chunk& ch = chunks[static_cast<std::size_t>(i)];
    partial[static_cast<std::size_t>(i)] = squares_span(spans[ch.span].data() + ch.begin, ch.end - ch.begin);
  }
  return partial;
}

double sum_of_squares(std::span<const std::span<const float>> spans) {
  double total = 0.0;
  for (const double p : sum_of_squares_partials(spans)) total += p;
  return total;
}

void adam_update(std::span<const AdamUpdate> params, const AdamCoefficients& c) {
  const std::vector<Chunk> chunks = cut_into_chunks(params.size(), [&](std::size_t s) { return params[s].n; });
  const auto count = static_cast<std::int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic, 4) if (count > 1)
  for (std::int64_t i = 0; i < count; ++i) {
    const Chunk& ch = chunks[static_cast<std::size_t>(i)];
    const AdamUpdate& p = params[ch.span];
    adam_span(p.theta + ch.begin, p.m + ch.begin, p.v + ch.begin, p.grad + ch.begin, ch.end - ch.begin, c, p.decay);
  }
}

bool all_finite(std::span<const float> values) {
  for (const float x : values) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

}  // namespace riftco_transformer::cpu
