#include <cmath>
#include <limits>

#include "kernels.hpp"

namespace riftco_transformer::cpu {

float cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets, std::int32_t ignore,
                            Tensor& probs, std::int64_t& count) {
  const std::int64_t v = logits.size(-1);
  const auto rows = static_cast<std::int64_t>(targets.size());
  probs = Tensor::empty({rows, v});
  std::vector<double> row_loss(static_cast<std::size_t>(rows), 0.0);
  const float* pl = logits.data();
  float* pp = probs.data();
#pragma omp parallel for schedule(static) if (rows * v > 16384)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* lr = pl + r * v;
    float* prow = pp + r * v;
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < v; ++j) m = std::max(m, lr[j]);
    float total = 0.0F;
    for (std::int64_t j = 0; j < v; ++j) {
      prow[j] = std::exp(lr[j] - m);
      total += prow[j];
    }
    const float inv = 1.0F / total;
    for (std::int64_t j = 0; j < v; ++j) prow[j] *= inv;
    const std::int32_t t = targets[static_cast<std::size_t>(r)];
    if (t != ignore) row_loss[static_cast<std::size_t>(r)] = static_cast<double>(m + std::log(total) - lr[t]);
  }
  double loss = 0.0;  // rows summed in order: independent of the thread count
  count = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (targets[static_cast<std::size_t>(r)] == ignore) continue;
    loss += row_loss[static_cast<std::size_t>(r)];
    ++count;
  }
  return count == 0 ? 0.0F : static_cast<float>(loss / static_cast<double>(count));
}

Tensor cross_entropy_backward(const Tensor& probs, std::span<const std::int32_t> targets, std::int32_t ignore,
                              std::int64_t count, float g) {
  const std::int64_t v = probs.size(-1);
  const auto rows = static_cast<std::int64_t>(targets.size());
  Tensor out = Tensor::empty(probs.shape());
  const float* pp = probs.data();
  float* po = out.data();
  const float k = count == 0 ? 0.0F : g / static_cast<float>(count);
#pragma omp parallel for schedule(static) if (rows * v > 16384)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t t = targets[static_cast<std::size_t>(r)];
    float* orow = po + r * v;
    const float* prow = pp + r * v;
    if (t == ignore) {
      for (std::int64_t j = 0; j < v; ++j) orow[j] = 0.0F;
      continue;
    }
    for (std::int64_t j = 0; j < v; ++j) orow[j] = prow[j] * k;
    orow[t] -= k;
  }
  return out;
}

}  // namespace riftco_transformer::cpu
