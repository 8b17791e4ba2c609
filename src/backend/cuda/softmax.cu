// Softmax over the last axis (forward, backward) and the causal fill: one
// block per row, row reductions by a fixed tree (device_util.cuh).
#include <cmath>

#include "cuda_common.hpp"
#include "device_util.cuh"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

constexpr int kRowThreads = 256;

__global__ void softmax_forward_kernel(const float* x, float* y, std::int64_t c) {
  __shared__ float scratch[kRowThreads];
  const std::int64_t r = blockIdx.x;
  const float* xr = x + r * c;
  float* yr = y + r * c;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) m = m < xr[j] ? xr[j] : m;
  m = device::block_max(m, scratch);
  if (m == -INFINITY) {  // fully masked row: all zeros
    for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) yr[j] = 0.0F;
    return;
  }
  float total = 0.0F;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float e = expf(xr[j] - m);
    yr[j] = e;
    total += e;
  }
  total = device::block_sum(total, scratch);
  const float inv = 1.0F / total;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) yr[j] *= inv;
}

__global__ void softmax_backward_kernel(const float* y, const float* g, float* dx, std::int64_t c) {
  __shared__ float scratch[kRowThreads];
  const std::int64_t r = blockIdx.x;
  const float* yr = y + r * c;
  const float* gr = g + r * c;
  float dot = 0.0F;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) dot += yr[j] * gr[j];
  dot = device::block_sum(dot, scratch);
  float* dr = dx + r * c;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) dr[j] = yr[j] * (gr[j] - dot);
}

__global__ void causal_fill_kernel(const float* x, float* out, std::int64_t n, std::int64_t tq, std::int64_t tk,
                                   std::int64_t offset, float fill) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = e % tk;
    const std::int64_t i = (e / tk) % tq;
    out[e] = j > i + offset ? fill : x[e];
  }
}

}  // namespace

Tensor softmax_forward(const Tensor& x) {
  constexpr const char* op = "softmax_forward";
  detail::require_cuda(x, op, "x");
  const std::int64_t c = x.dim() == 0 ? 1 : x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  Tensor out = detail::empty(x.shape());
  if (rows == 0) return out;
  softmax_forward_kernel<<<detail::checked_int(rows, op, "rows"), kRowThreads>>>(x.device_data(), out.device_data(), c);
  detail::check_launch(op, "softmax_forward_kernel");
  return out;
}

Tensor softmax_backward(const Tensor& y, const Tensor& g) {
  constexpr const char* op = "softmax_backward";
  detail::require_cuda(y, op, "y");
  detail::require_cuda(g, op, "g");
  const std::int64_t c = y.dim() == 0 ? 1 : y.size(-1);
  const std::int64_t rows = c == 0 ? 0 : y.numel() / c;
  Tensor out = detail::empty(y.shape());
  if (rows == 0) return out;
  softmax_backward_kernel<<<detail::checked_int(rows, op, "rows"), kRowThreads>>>(y.device_data(), g.device_data(),
                                                                                  out.device_data(), c);
  detail::check_launch(op, "softmax_backward_kernel");
  return out;
}

Tensor causal_fill(const Tensor& x, std::int64_t offset, float fill) {
  constexpr const char* op = "causal_fill";
  detail::require_cuda(x, op, "x");
  const std::int64_t tk = x.size(-1);
  const std::int64_t tq = x.size(-2);
  Tensor out = detail::empty(x.shape());
  const std::int64_t n = x.numel();
  if (n == 0) return out;
  causal_fill_kernel<<<detail::grid_for(n), detail::kThreads>>>(x.device_data(), out.device_data(), n, tq, tk, offset,
                                                                fill);
  detail::check_launch(op, "causal_fill_kernel");
  return out;
}

}  // namespace riftco_transformer::cuda
