#include <cmath>
#include <limits>

#include "kernels.hpp"

namespace riftco_transformer::cpu {

Tensor softmax_forward(const Tensor& x) {
  const std::int64_t c = x.dim() == 0 ? 1 : x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data();
  float* po = out.data();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * c;
    float* orow = po + r * c;
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, xr[j]);
    if (m == -std::numeric_limits<float>::infinity()) {  // fully masked row: all zeros
      for (std::int64_t j = 0; j < c; ++j) orow[j] = 0.0F;
      continue;
    }
    float total = 0.0F;
    for (std::int64_t j = 0; j < c; ++j) {
      orow[j] = std::exp(xr[j] - m);
      total += orow[j];
    }
    const float inv = 1.0F / total;
    for (std::int64_t j = 0; j < c; ++j) orow[j] *= inv;
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
