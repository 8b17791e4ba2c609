// RMSNorm forward/backward. One block per row for y, rstd and dx (row sums
// by a fixed tree, device_util.cuh); dw by one thread per column summing the
// rows in row order (the CPU kernel's order). No atomics.
#include "cuda_common.hpp"
#include "device_util.cuh"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

constexpr int kRowThreads = 256;

/// y = x·rstd·w, rstd = 1/sqrt(mean(x²) + eps) per row of c.
__global__ void rms_forward_kernel(const float* x, const float* w, float* y, float* rstd, std::int64_t c, float eps) {
  __shared__ float scratch[kRowThreads];
  const std::int64_t r = blockIdx.x;
  const float* xr = x + r * c;
  float ss = 0.0F;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) ss += xr[j] * xr[j];
  ss = device::block_sum(ss, scratch);
  const float s = 1.0F / sqrtf(ss / static_cast<float>(c) + eps);
  if (threadIdx.x == 0) rstd[r] = s;
  float* yr = y + r * c;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) yr[j] = xr[j] * s * w[j];
}

/// dx_j = s·g_j·w_j − x_j·s³/C·Σ_k g_k w_k x_k per row.
__global__ void rms_backward_dx_kernel(const float* x, const float* w, const float* rstd, const float* g, float* dx,
                                       std::int64_t c) {
  __shared__ float scratch[kRowThreads];
  const std::int64_t r = blockIdx.x;
  const float* xr = x + r * c;
  const float* gr = g + r * c;
  const float s = rstd[r];
  float dot = 0.0F;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) dot += gr[j] * w[j] * xr[j];
  dot = device::block_sum(dot, scratch);
  const float k = s * s * s * dot / static_cast<float>(c);
  float* dr = dx + r * c;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) dr[j] = s * gr[j] * w[j] - xr[j] * k;
}

/// dw_j = Σ_rows g_j·x_j·s, rows in order.
__global__ void rms_backward_dw_kernel(const float* x, const float* rstd, const float* g, float* dw, std::int64_t rows,
                                       std::int64_t c) {
  const std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (j >= c) return;
  float acc = 0.0F;
  for (std::int64_t r = 0; r < rows; ++r) acc += g[r * c + j] * x[r * c + j] * rstd[r];
  dw[j] = acc;
}

}  // namespace

Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd) {
  constexpr const char* op = "rms_norm_forward";
  detail::require_cuda(x, op, "x");
  detail::require_cuda(w, op, "w");
  const std::int64_t c = x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  Tensor out = detail::empty(x.shape());
  rstd = detail::empty({rows});
  if (rows == 0) return out;
  rms_forward_kernel<<<detail::checked_int(rows, op, "rows"), kRowThreads>>>(x.device_data(), w.device_data(),
                                                                             out.device_data(), rstd.device_data(), c,
                                                                             eps);
  detail::check_launch(op, "rms_forward_kernel");
  return out;
}

void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx, Tensor& dw,
                       bool need_dx, bool need_dw) {
  constexpr const char* op = "rms_norm_backward";
  detail::require_cuda(x, op, "x");
  detail::require_cuda(w, op, "w");
  detail::require_cuda(rstd, op, "rstd");
  detail::require_cuda(g, op, "g");
  const std::int64_t c = x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  if (need_dx) {
    dx = detail::empty(x.shape());
    if (rows > 0) {
      rms_backward_dx_kernel<<<detail::checked_int(rows, op, "rows"), kRowThreads>>>(
          x.device_data(), w.device_data(), rstd.device_data(), g.device_data(), dx.device_data(), c);
      detail::check_launch(op, "rms_backward_dx_kernel");
    }
  }
  if (need_dw) {
    dw = detail::empty(w.shape());
    if (c > 0) {
      rms_backward_dw_kernel<<<detail::grid_for(c), detail::kThreads>>>(x.device_data(), rstd.device_data(),
                                                                        g.device_data(), dw.device_data(), rows, c);
      detail::check_launch(op, "rms_backward_dw_kernel");
    }
  }
}

}  // namespace riftco_transformer::cuda
