// Column and head copies: add_columns / take_columns (the fused add_columns
// op) and repeat_heads (grouped-query attention) with its backward.
#include <cstring>

#include "kernels.hpp"

namespace riftco_transformer::cpu {

Tensor add_columns(const Tensor& x, const Tensor& delta, std::int64_t offset) {
  const std::int64_t n = x.shape().back();
  const std::int64_t w = delta.shape().back();
  const std::int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor out = x.clone();
  float* po = out.data();
  const float* pd = delta.data();
#pragma omp parallel for schedule(static) if (rows * w > 32768)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < w; ++j) po[r * n + offset + j] += pd[r * w + j];
  }
  return out;
}

Tensor take_columns(const Tensor& x, std::int64_t offset, std::int64_t width) {
  const std::int64_t n = x.shape().back();
  const std::int64_t rows = n == 0 ? 0 : x.numel() / n;
  Shape shape = x.shape();
  shape.back() = width;
  Tensor out = Tensor::empty(shape);
  const float* px = x.data();
  float* po = out.data();
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(po + r * width, px + r * n + offset, static_cast<std::size_t>(width) * sizeof(float));
  }
  return out;
}

Tensor repeat_heads(const Tensor& x, std::int64_t groups) {
  const Shape& in = x.shape();  // (B, G, T, D)
  const std::int64_t rows = in[2] * in[3];  // floats per head
  Tensor out = Tensor::empty({in[0], in[1] * groups, in[2], in[3]});
  const float* px = x.data();
  float* po = out.data();
  for (std::int64_t i = 0; i < in[0] * in[1]; ++i) {
    for (std::int64_t r = 0; r < groups; ++r) {
      std::memcpy(po + (i * groups + r) * rows, px + i * rows, static_cast<std::size_t>(rows) * sizeof(float));
    }
  }
  return out;
}

Tensor repeat_heads_backward(const Tensor& g, std::int64_t groups) {
  const Shape& out = g.shape();  // (B, G·groups, T, D)
  const Shape in{out[0], out[1] / groups, out[2], out[3]};
  const std::int64_t rows = in[2] * in[3];
  Tensor dx = Tensor::zeros(in);
  const float* pg = g.data();
  float* pd = dx.data();
  for (std::int64_t i = 0; i < in[0] * in[1]; ++i) {
    for (std::int64_t r = 0; r < groups; ++r) {  // fixed order: deterministic
      const float* src = pg + (i * groups + r) * rows;
      float* dst = pd + i * rows;
      for (std::int64_t k = 0; k < rows; ++k) dst[k] += src[k];
    }
  }
  return dx;
}

}  // namespace riftco_transformer::cpu
