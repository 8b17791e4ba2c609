#include "decode_attention.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace riftco_transformer::cpu {

Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values, std::int64_t length) {
  const std::int64_t heads = q.size(0);
  const std::int64_t d = q.size(1);
  const std::int64_t cap = keys.size(1);
  const std::int64_t groups = heads / keys.size(0);  // query heads per cached key/value head
  const float scale = 1.0F / std::sqrt(static_cast<float>(d));
  Tensor out = Tensor::zeros({heads, d});
  const float* pq = q.data();
  const float* pk = keys.data();
  const float* pv = values.data();
  float* po = out.data();
#pragma omp parallel for schedule(static) if (heads * length * d > 65536)
  for (std::int64_t h = 0; h < heads; ++h) {
    std::vector<float> p(static_cast<std::size_t>(length));
    const float* qh = pq + h * d;
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < length; ++j) {
      const float* kj = pk + ((h / groups) * cap + j) * d;
      float s = 0.0F;
      for (std::int64_t i = 0; i < d; ++i) s += qh[i] * kj[i];
      p[static_cast<std::size_t>(j)] = s * scale;
      m = std::max(m, s * scale);
    }
    float total = 0.0F;
    for (float& x : p) {
      x = std::exp(x - m);
      total += x;
    }
    float* oh = po + h * d;
    for (std::int64_t j = 0; j < length; ++j) {
      const float w = p[static_cast<std::size_t>(j)] / total;
      const float* vj = pv + ((h / groups) * cap + j) * d;
      for (std::int64_t i = 0; i < d; ++i) oh[i] += w * vj[i];
    }
  }
  return out;
}

void cache_write(Tensor& cache, const Tensor& rows, std::int64_t position) {
  const std::int64_t heads = cache.size(0);
  const std::int64_t cap = cache.size(1);
  const std::int64_t d = cache.size(2);
  float* pc = cache.data();
  const float* pr = rows.data();
  for (std::int64_t h = 0; h < heads; ++h) {
    std::memcpy(pc + (h * cap + position) * d, pr + h * d, static_cast<std::size_t>(d) * sizeof(float));
  }
}

}  // namespace riftco_transformer::cpu
