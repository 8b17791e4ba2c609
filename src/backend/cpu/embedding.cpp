#include <cstring>

#include "kernels.hpp"

namespace riftco_transformer::cpu {

Tensor embedding_forward(const Tensor& weight, std::span<const std::int32_t> ids, const Shape& out_shape) {
  const std::int64_t c = weight.size(1);
  Tensor out = Tensor::empty(out_shape);
  const float* pw = weight.data();
  float* po = out.data();
  const auto n = static_cast<std::int64_t>(ids.size());
#pragma omp parallel for schedule(static) if (n * c > 16384)
  for (std::int64_t i = 0; i < n; ++i) {
    std::memcpy(po + i * c, pw + static_cast<std::int64_t>(ids[static_cast<std::size_t>(i)]) * c,
                static_cast<std::size_t>(c) * sizeof(float));
  }
  return out;
}

Tensor embedding_backward(const Shape& weight_shape, std::span<const std::int32_t> ids, const Tensor& g) {
  const std::int64_t c = weight_shape[1];
  Tensor dw = Tensor::zeros(weight_shape);
  const float* pg = g.data();
  float* pd = dw.data();
  // Parallel over columns; every column visits the ids in order, so repeated
  // ids accumulate in a fixed order.
#pragma omp parallel for schedule(static) if (static_cast<std::int64_t>(ids.size()) * c > 16384)
  for (std::int64_t j = 0; j < c; ++j) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      pd[static_cast<std::int64_t>(ids[i]) * c + j] += pg[static_cast<std::int64_t>(i) * c + j];
    }
  }
  return dw;
}

}  // namespace riftco_transformer::cpu
