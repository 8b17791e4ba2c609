#include <cmath>

#include "kernels.hpp"

namespace riftco_transformer::cpu {

Tensor rope_apply(const Tensor& x, std::int64_t offset, float base, bool inverse) {
  const std::int64_t d = x.size(-1);
  const std::int64_t t = x.size(-2);
  const std::int64_t half = d / 2;
  const std::int64_t mats = t * d == 0 ? 0 : x.numel() / (t * d);
  // Angles in double, rounded once: identical for forward, replay and decode.
  std::vector<float> cos_table(static_cast<std::size_t>(t * half));
  std::vector<float> sin_table(static_cast<std::size_t>(t * half));
  for (std::int64_t p = 0; p < t; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double theta = std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(d));
      const double angle = static_cast<double>(offset + p) * theta;
      cos_table[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::cos(angle));
      sin_table[static_cast<std::size_t>(p * half + i)] =
          static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
    }
  }
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data();
  float* po = out.data();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
  for (std::int64_t m = 0; m < mats; ++m) {
    for (std::int64_t p = 0; p < t; ++p) {
      const float* xr = px + (m * t + p) * d;
      float* orow = po + (m * t + p) * d;
      const float* cr = cos_table.data() + p * half;
      const float* sr = sin_table.data() + p * half;
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = xr[2 * i];
        const float b = xr[2 * i + 1];
        orow[2 * i] = a * cr[i] - b * sr[i];
        orow[2 * i + 1] = a * sr[i] + b * cr[i];
      }
    }
  }
  return out;
}

}  // namespace riftco_transformer::cpu
