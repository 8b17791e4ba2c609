// Row softmax, its backward and the causal mask. Rows are independent, so
// the bits do not depend on the thread count (softmax_rows.hpp: the same
// bits as the scalar loops on every instruction set).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.hpp"
#include "parallel.hpp"
#include "softmax_rows.hpp"

namespace riftco_transformer::cpu {

Tensor softmax_forward(const Tensor& x) {
  const std::int64_t c = x.dim() == 0 ? 1 : x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data();
  float* po = out.data();
  const int threads = threads_for(x.numel(), kMinStreamPerThread);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * c;
    float* orow = po + r * c;
    const float m = row_max(xr, c);
    if (m == -std::numeric_limits<float>::infinity()) {  // fully masked row: all zeros
      std::fill(orow, orow + c, 0.0F);
      continue;
    }
    const float total = exp_shifted_row(xr, m, orow, c);
    scale_row(orow, 1.0F / total, orow, c);
  }
  return out;
}

Tensor softmax_backward(const Tensor& y, const Tensor& g) {
  const std::int64_t c = y.dim() == 0 ? 1 : y.size(-1);
  const std::int64_t rows = c == 0 ? 0 : y.numel() / c;
  Tensor out = Tensor::empty(y.shape());
  const float* py = y.data();
  const float* pg = g.data();
  float* po = out.data();
#pragma omp parallel for schedule(static) if (y.numel() > 16384)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* yr = py + r * c;
    const float* gr = pg + r * c;
    float dot = 0.0F;
    for (std::int64_t j = 0; j < c; ++j) dot += yr[j] * gr[j];
    float* orow = po + r * c;
    for (std::int64_t j = 0; j < c; ++j) orow[j] = yr[j] * (gr[j] - dot);
  }
  return out;
}

Tensor causal_fill(const Tensor& x, std::int64_t offset, float fill) {
  const std::int64_t tk = x.size(-1);
  const std::int64_t tq = x.size(-2);
  const std::int64_t mats = tq * tk == 0 ? 0 : x.numel() / (tq * tk);
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data();
  float* po = out.data();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
  for (std::int64_t b = 0; b < mats; ++b) {
    for (std::int64_t i = 0; i < tq; ++i) {
      const float* xr = px + (b * tq + i) * tk;
      float* orow = po + (b * tq + i) * tk;
      for (std::int64_t j = 0; j < tk; ++j) orow[j] = j > i + offset ? fill : xr[j];
    }
  }
  return out;
}

}  // namespace riftco_transformer::cpu
