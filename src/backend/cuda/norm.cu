// RMSNorm forward/backward. One block per row for y, rstd and dx (row sums
// by a fixed tree, device_util.cuh); dw in two fixed-order stages: each
// chunk of kDwChunkRows rows gives one partial sum per column (rows in
// order), then each column adds its chunks' partials in chunk order. The
// chunking depends only on the shape, so the bits are the same every run.
// No atomics.
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

/// Rows per dw partial: enough chunks to fill the device (16384 rows -> 256 chunks), few enough to add cheaply;
/// more rows per chunk where the chunks would pass the grid's 65535 limit in y.
constexpr std::int64_t kDwChunkRows = 64;
constexpr std::int64_t kMaxChunks = 65535;

/// partial[k·c + j] = Σ over rows r of chunk k (in order) of g_rj·x_rj·s_r. Grid x: column tiles, y: chunks.
__global__ void rms_dw_partial_kernel(const float* x, const float* rstd, const float* g, float* partial,
                                      std::int64_t rows, std::int64_t c, std::int64_t chunk_rows) {
  const std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (j >= c) return;
  const std::int64_t begin = blockIdx.y * chunk_rows;
  const std::int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float acc = 0.0F;
  for (std::int64_t r = begin; r < end; ++r) acc += g[r * c + j] * x[r * c + j] * rstd[r];
  partial[blockIdx.y * c + j] = acc;
}

/// dw_j = Σ_k partial[k·c + j], chunks in order.
__global__ void rms_dw_sum_kernel(const float* partial, float* dw, std::int64_t chunks, std::int64_t c) {
  const std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (j >= c) return;
  float acc = 0.0F;
  for (std::int64_t k = 0; k < chunks; ++k) acc += partial[k * c + j];
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
    if (c > 0 && rows == 0) dw = Tensor::zeros(w.shape(), Backend::Cuda);
    if (c > 0 && rows > 0) {
      std::int64_t chunk_rows = kDwChunkRows;
      if ((rows + chunk_rows - 1) / chunk_rows > kMaxChunks) chunk_rows = (rows + kMaxChunks - 1) / kMaxChunks;
      const std::int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
      const detail::DeviceArray<float> partial(static_cast<std::size_t>(chunks * c), op);  // (chunks, c)
      const dim3 grid(detail::grid_for(c), static_cast<unsigned>(detail::checked_int(chunks, op, "row chunks")));
      rms_dw_partial_kernel<<<grid, detail::kThreads>>>(x.device_data(), rstd.device_data(), g.device_data(),
                                                        partial.get(), rows, c, chunk_rows);
      detail::check_launch(op, "rms_dw_partial_kernel");
      rms_dw_sum_kernel<<<detail::grid_for(c), detail::kThreads>>>(partial.get(), dw.device_data(), chunks, c);
      detail::check_launch(op, "rms_dw_sum_kernel");
    }
  }
}

}  // namespace riftco_transformer::cuda
