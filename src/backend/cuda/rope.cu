// Rotary embedding: one thread per pair (2i, 2i+1) of a head row. The angle
// (position · base^(-2i/D)) and its cos/sin are computed in double and
// rounded once, like the CPU's table (backend/cpu/rope.cpp), so forward,
// replay and decode rotate by the same floats. An odd last element is
// copied through unrotated.
#include "cuda_common.hpp"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

/// Rotates the pair at x[2i], x[2i+1] for position p into out.
__device__ inline void rotate_pair(const float* x, float* out, std::int64_t p, std::int64_t i, std::int64_t d,
                                   double base, bool inverse) {
  const double theta = pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  const double angle = static_cast<double>(p) * theta;
  const float c = static_cast<float>(cos(angle));
  const float s0 = static_cast<float>(sin(angle));
  const float s = inverse ? -s0 : s0;
  const float a = x[2 * i];
  const float b = x[2 * i + 1];
  out[2 * i] = a * c - b * s;
  out[2 * i + 1] = a * s + b * c;
}

/// x (mats, t, d): one thread per (row, pair), plus the odd tail element.
__global__ void rope_apply_kernel(const float* x, float* out, std::int64_t rows, std::int64_t t, std::int64_t d,
                                  std::int64_t offset, double base, bool inverse) {
  const std::int64_t half = d / 2;
  const std::int64_t per_row = half + (d % 2);
  const std::int64_t n = rows * per_row;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = e / per_row;
    const std::int64_t i = e % per_row;
    const float* xr = x + row * d;
    float* orow = out + row * d;
    if (i == half) {
      orow[d - 1] = xr[d - 1];
    } else {
      rotate_pair(xr, orow, offset + row % t, i, d, base, inverse);
    }
  }
}

/// Rows r = b·T + t of `heads` heads of d floats at src + r·src_stride.
__global__ void rope_packed_kernel(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride,
                                   std::int64_t rows, std::int64_t t, std::int64_t heads, std::int64_t d, double base,
                                   bool inverse) {
  const std::int64_t half = d / 2;
  const std::int64_t n = rows * heads * half;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = e % half;
    const std::int64_t h = (e / half) % heads;
    const std::int64_t r = e / (half * heads);
    rotate_pair(src + r * src_stride + h * d, dst + r * dst_stride + h * d, r % t, i, d, base, inverse);
  }
}

}  // namespace

Tensor rope_apply(const Tensor& x, std::int64_t offset, float base, bool inverse) {
  constexpr const char* op = "rope_apply";
  detail::require_cuda(x, op, "x");
  const std::int64_t d = x.size(-1);
  const std::int64_t t = x.size(-2);
  Tensor out = detail::empty(x.shape());
  const std::int64_t rows = d == 0 ? 0 : x.numel() / d;
  if (rows == 0 || t == 0) return out;
  const std::int64_t work = rows * (d / 2 + d % 2);
  rope_apply_kernel<<<detail::grid_for(work), detail::kThreads>>>(x.device_data(), out.device_data(), rows, t, d,
                                                                  offset, static_cast<double>(base), inverse);
  detail::check_launch(op, "rope_apply_kernel");
  return out;
}

void rope_packed(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride, std::int64_t batch,
                 std::int64_t t, std::int64_t width, std::int64_t d, float base, bool inverse) {
  constexpr const char* op = "rope_packed";
  if (batch * t * width == 0 || d < 2) return;
  const std::int64_t heads = width / d;
  const std::int64_t work = batch * t * heads * (d / 2);
  if (work == 0) return;
  rope_packed_kernel<<<detail::grid_for(work), detail::kThreads>>>(src, src_stride, dst, dst_stride, batch * t, t,
                                                                   heads, d, static_cast<double>(base), inverse);
  detail::check_launch(op, "rope_packed_kernel");
}

}  // namespace riftco_transformer::cuda
