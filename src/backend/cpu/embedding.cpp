// Embedding lookup and its backward (a scatter-add in id order).
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels.hpp"
#include "parallel.hpp"

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

namespace {

/// dW[ids[i], j0..j1) += g[i, j0..j1) for every i in order.
__attribute__((target_clones("avx512f", "avx2", "default"))) void accumulate_columns(float* pd, const float* pg,
                                                                                     std::span<const std::int32_t> ids,
                                                                                     std::int64_t c, std::int64_t j0,
                                                                                     std::int64_t j1) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    float* drow = pd + static_cast<std::int64_t>(ids[i]) * c;
    const float* grow = pg + static_cast<std::int64_t>(i) * c;
    for (std::int64_t j = j0; j < j1; ++j) drow[j] += grow[j];
  }
}

}  // namespace

Tensor embedding_backward(const Shape& weight_shape, std::span<const std::int32_t> ids, const Tensor& g) {
  const std::int64_t c = weight_shape[1];
  Tensor dw = Tensor::zeros(weight_shape);
  const float* pg = g.data();
  float* pd = dw.data();
  // Column blocks of 16 floats (a cache line) per thread; every element
  // visits the ids in order, so repeated ids accumulate in a fixed order
  // whatever the thread count, and rows are read whole, not a column at a time.
  constexpr std::int64_t kBlock = 16;
  const std::int64_t blocks = (c + kBlock - 1) / kBlock;
  const auto threads = static_cast<int>(
      std::clamp<std::int64_t>(threads_for(static_cast<std::int64_t>(ids.size()) * c, kMinStreamPerThread), 1,
                               std::max<std::int64_t>(blocks, 1)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const std::int64_t n = omp_get_num_threads();
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t j0 = std::min(c, blocks * t / n * kBlock);
    const std::int64_t j1 = std::min(c, blocks * (t + 1) / n * kBlock);
    if (j0 < j1) accumulate_columns(pd, pg, ids, c, j0, j1);
  }
  return dw;
}

}  // namespace riftco_transformer::cpu
