#include <cmath>

#include "kernels.hpp"

namespace riftco_transformer::cpu {

Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd) {
  const std::int64_t c = x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  Tensor out = Tensor::empty(x.shape());
  rstd = Tensor::empty({rows});
  const float* px = x.data();
  const float* pw = w.data();
  float* po = out.data();
  float* pr = rstd.data();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * c;
    float ss = 0.0F;
    for (std::int64_t j = 0; j < c; ++j) ss += xr[j] * xr[j];
    const float s = 1.0F / std::sqrt(ss / static_cast<float>(c) + eps);
    pr[r] = s;
    float* orow = po + r * c;
    for (std::int64_t j = 0; j < c; ++j) orow[j] = xr[j] * s * pw[j];
  }
  return out;
}

void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx, Tensor& dw,
                       bool need_dx, bool need_dw) {
  // y_j = x_j s w_j, s = (mean(x²) + eps)^(-1/2)
  // dx_j = s (g_j w_j) - x_j s³ / C * Σ_k g_k w_k x_k ;  dw_j = Σ_rows g_j x_j s
  const std::int64_t c = x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  const float* px = x.data();
  const float* pw = w.data();
  const float* pr = rstd.data();
  const float* pg = g.data();
  if (need_dx) {
    dx = Tensor::empty(x.shape());
    float* pd = dx.data();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = px + r * c;
      const float* gr = pg + r * c;
      const float s = pr[r];
      float dot = 0.0F;
      for (std::int64_t j = 0; j < c; ++j) dot += gr[j] * pw[j] * xr[j];
      const float k = s * s * s * dot / static_cast<float>(c);
      float* dr = pd + r * c;
      for (std::int64_t j = 0; j < c; ++j) dr[j] = s * gr[j] * pw[j] - xr[j] * k;
    }
  }
  if (need_dw) {
    dw = Tensor::empty(w.shape());
    float* pdw = dw.data();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
    for (std::int64_t j = 0; j < c; ++j) {
      float acc = 0.0F;
      for (std::int64_t r = 0; r < rows; ++r) acc += pg[r * c + j] * px[r * c + j] * pr[r];
      pdw[j] = acc;
    }
  }
}

}  // namespace riftco_transformer::cpu
