// Fused softmax + negative log-likelihood over rows of logits. Rows are
// independent and the loss is summed over rows in order, so the bits do not
// depend on the thread count; the row pieces (softmax_rows.hpp) give the
// bits of the scalar loops on every instruction set.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.hpp"
#include "parallel.hpp"
#include "softmax_rows.hpp"

namespace riftco_transformer::cpu {

float cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets, std::int32_t ignore,
                            Tensor& probs, std::int64_t& count) {
  const std::int64_t v = logits.size(-1);
  const auto rows = static_cast<std::int64_t>(targets.size());
  probs = Tensor::empty({rows, v});
  std::vector<double> row_loss(static_cast<std::size_t>(rows), 0.0);
  const float* pl = logits.data();
  float* pp = probs.data();
  const int threads = threads_for(rows * v, kMinStreamPerThread);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* lr = pl + r * v;
    float* prow = pp + r * v;
    const float m = row_max(lr, v);
    const float total = exp_shifted_row(lr, m, prow, v);
    scale_row(prow, 1.0F / total, prow, v);
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
  const int threads = threads_for(rows * v, kMinStreamPerThread);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t t = targets[static_cast<std::size_t>(r)];
    float* orow = po + r * v;
    if (t == ignore) {
      std::fill(orow, orow + v, 0.0F);
      continue;
    }
    scale_row(pp + r * v, k, orow, v);
    orow[t] -= k;
  }
  return out;
}

}  // namespace riftco_transformer::cpu
