// Column and head copies on CUDA (backend/cpu/layout.cpp's math): add_columns,
// take_columns, repeat_heads and its backward, and the K/V cache write.
// Copies are strided cudaMemcpy2D calls on the default stream; the sums are
// one thread per output element adding in a fixed order.
#include <string>

#include "cuda_common.hpp"
#include "decode_attention.hpp"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                                       \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

/// out (rows, n) += delta (rows, w) on columns [offset, offset + w).
__global__ void add_columns_kernel(float* out, const float* delta, std::int64_t rows, std::int64_t n,
                                   std::int64_t w, std::int64_t offset) {
  GRID_STRIDE(i, rows * w) {
    const std::int64_t r = i / w;
    const std::int64_t j = i - r * w;
    out[r * n + offset + j] += delta[i];
  }
}

/// dx (outer, rows) = Σ_r g (outer · groups + r, rows) in copy order.
__global__ void repeat_heads_backward_kernel(const float* g, float* dx, std::int64_t outer, std::int64_t groups,
                                             std::int64_t rows) {
  GRID_STRIDE(i, outer * rows) {
    const std::int64_t o = i / rows;
    const std::int64_t k = i - o * rows;
    float acc = 0.0F;
    for (std::int64_t r = 0; r < groups; ++r) acc += g[(o * groups + r) * rows + k];
    dx[i] = acc;
  }
}

/// Copies `rows` rows of `width` floats between strided device buffers.
void copy_rows(float* dst, std::int64_t dst_stride, const float* src, std::int64_t src_stride, std::int64_t width,
               std::int64_t rows, const char* op) {
  if (rows == 0 || width == 0) return;
  detail::check(cudaMemcpy2D(dst, static_cast<std::size_t>(dst_stride) * sizeof(float), src,
                             static_cast<std::size_t>(src_stride) * sizeof(float),
                             static_cast<std::size_t>(width) * sizeof(float), static_cast<std::size_t>(rows),
                             cudaMemcpyDeviceToDevice),
                op, "cudaMemcpy2D (device to device)");
}

}  // namespace

Tensor add_columns(const Tensor& x, const Tensor& delta, std::int64_t offset) {
  constexpr const char* op = "add_columns";
  detail::require_cuda(x, op, "x");
  detail::require_cuda(delta, op, "delta");
  const std::int64_t n = x.shape().back();
  const std::int64_t w = delta.shape().back();
  const std::int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor out = x.clone();
  if (rows * w == 0) return out;
  add_columns_kernel<<<detail::grid_for(rows * w), detail::kThreads>>>(out.device_data(), delta.device_data(), rows,
                                                                         n, w, offset);
  detail::check_launch(op, "add_columns_kernel");
  return out;
}

Tensor take_columns(const Tensor& x, std::int64_t offset, std::int64_t width) {
  constexpr const char* op = "take_columns";
  detail::require_cuda(x, op, "x");
  const std::int64_t n = x.shape().back();
  const std::int64_t rows = n == 0 ? 0 : x.numel() / n;
  Shape shape = x.shape();
  shape.back() = width;
  Tensor out = detail::empty(shape);
  copy_rows(out.device_data(), width, x.device_data() + offset, n, width, rows, op);
  return out;
}

Tensor repeat_heads(const Tensor& x, std::int64_t groups) {
  constexpr const char* op = "repeat_heads";
  detail::require_cuda(x, op, "x");
  const Shape& in = x.shape();  // (B, G, T, D)
  const std::int64_t rows = in[2] * in[3];  // floats per head
  Tensor out = detail::empty({in[0], in[1] * groups, in[2], in[3]});
  float* po = out.device_data();
  const float* px = x.device_data();
  // Copy r of every head: heads i of x to heads i·groups + r of out.
  for (std::int64_t r = 0; r < groups; ++r) copy_rows(po + r * rows, groups * rows, px, rows, rows, in[0] * in[1], op);
  return out;
}

Tensor repeat_heads_backward(const Tensor& g, std::int64_t groups) {
  constexpr const char* op = "repeat_heads_backward";
  detail::require_cuda(g, op, "g");
  const Shape& out = g.shape();  // (B, G·groups, T, D)
  const Shape in{out[0], out[1] / groups, out[2], out[3]};
  const std::int64_t rows = in[2] * in[3];
  const std::int64_t outer = in[0] * in[1];
  Tensor dx = detail::empty(in);
  if (outer * rows == 0) return dx;
  repeat_heads_backward_kernel<<<detail::grid_for(outer * rows), detail::kThreads>>>(g.device_data(),
                                                                                      dx.device_data(), outer, groups,
                                                                                      rows);
  detail::check_launch(op, "repeat_heads_backward_kernel");
  return dx;
}

void cache_write(Tensor& cache, const Tensor& rows, std::int64_t position) {
  constexpr const char* op = "cache_write";
  detail::require_cuda(cache, op, "cache");
  detail::require_cuda(rows, op, "rows");
  const std::int64_t heads = cache.size(0);
  const std::int64_t cap = cache.size(1);
  const std::int64_t d = cache.size(2);
  copy_rows(cache.device_data() + position * d, cap * d, rows.device_data(), d, d, heads, op);
}

}  // namespace riftco_transformer::cuda
