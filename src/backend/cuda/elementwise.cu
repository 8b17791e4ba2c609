// Elementwise kernels, broadcasting, the reduction of a broadcast gradient
// and permute: one thread per output element (grid-stride loops).
#include <string>
#include <vector>

#include "cuda_common.hpp"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

/// Shapes of up to kMaxDims dimensions, passed to kernels by value.
constexpr int kMaxDims = 8;
struct Strides {
  int nd = 0;
  std::int64_t size[kMaxDims] = {};  // output dims
  std::int64_t a[kMaxDims] = {};     // stride of operand a per output dim (0: broadcast)
  std::int64_t b[kMaxDims] = {};     // stride of operand b per output dim
};

void check_dims(std::size_t nd, const char* op, const Shape& shape) {
  if (nd > static_cast<std::size_t>(kMaxDims)) {
    throw BackendError(std::string("[") + op + "] shape " + shape_string(shape) + " has more than " +
                       std::to_string(kMaxDims) + " dimensions, the cuda kernel's limit");
  }
}

/// Strides of `shape` aligned to the right of `out_shape`, 0 where it broadcasts.
void broadcast_strides(const Shape& shape, const Shape& out_shape, std::int64_t* strides) {
  const std::size_t ndim = out_shape.size();
  for (std::size_t d = 0; d < ndim; ++d) strides[d] = 0;
  std::int64_t stride = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::size_t d = shape.size() - 1 - i;
    const std::size_t od = ndim - 1 - i;
    strides[od] = (shape[d] == 1 && out_shape[od] != 1) ? 0 : stride;
    stride *= shape[d];
  }
}

#define GRID_STRIDE(i, n)                                                                       \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

__global__ void add_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void add_inplace_kernel(float* a, const float* b, std::int64_t n) {
  GRID_STRIDE(i, n) a[i] += b[i];
}
__global__ void axpy_kernel(float* y, float alpha, const float* x, std::int64_t n) {
  GRID_STRIDE(i, n) y[i] += alpha * x[i];
}
__global__ void scale_kernel(const float* a, float s, float* out, std::int64_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] * s;
}
__global__ void fill_kernel(float* out, std::int64_t n, float value) {
  GRID_STRIDE(i, n) out[i] = value;
}
__global__ void divide_kernel(const float* in, float* out, std::int64_t n, float divisor) {
  GRID_STRIDE(i, n) out[i] = in[i] / divisor;  // IEEE-rounded: -prec-div is on (no --use_fast_math)
}

__device__ inline float apply(BinaryOp op, float x, float y) {
  switch (op) {
    case BinaryOp::Add:
      return x + y;
    case BinaryOp::Sub:
      return x - y;
    case BinaryOp::Mul:
      return x * y;
  }
  return 0.0F;
}

__global__ void binary_kernel(BinaryOp op, const float* a, const float* b, float* out, std::int64_t n, Strides s) {
  GRID_STRIDE(i, n) {
    std::int64_t rem = i;
    std::int64_t oa = 0;
    std::int64_t ob = 0;
    for (int d = s.nd - 1; d >= 0; --d) {
      const std::int64_t idx = rem % s.size[d];
      rem /= s.size[d];
      oa += idx * s.a[d];
      ob += idx * s.b[d];
    }
    out[i] = apply(op, a[oa], b[ob]);
  }
}

/// One thread per output element: sums the gradient elements that broadcast
/// to it in increasing index order (the CPU kernel's order). `s.size`/`s.a`
/// are the kept dims (sizes, gradient strides) and `s.b`/reduced sizes the
/// summed dims, both in gradient dim order.
struct Reduction {
  int kept = 0;
  int summed = 0;
  std::int64_t kept_size[kMaxDims] = {};
  std::int64_t kept_stride[kMaxDims] = {};
  std::int64_t summed_size[kMaxDims] = {};
  std::int64_t summed_stride[kMaxDims] = {};
  std::int64_t terms = 1;  // product of summed sizes
};

__global__ void reduce_kernel(const float* g, float* out, std::int64_t n, Reduction r) {
  GRID_STRIDE(o, n) {
    std::int64_t rem = o;
    std::int64_t base = 0;
    for (int d = r.kept - 1; d >= 0; --d) {
      base += (rem % r.kept_size[d]) * r.kept_stride[d];
      rem /= r.kept_size[d];
    }
    float acc = 0.0F;
    for (std::int64_t t = 0; t < r.terms; ++t) {
      std::int64_t trem = t;
      std::int64_t off = base;
      for (int d = r.summed - 1; d >= 0; --d) {
        off += (trem % r.summed_size[d]) * r.summed_stride[d];
        trem /= r.summed_size[d];
      }
      acc += g[off];
    }
    out[o] = acc;
  }
}

__global__ void permute_kernel(const float* in, float* out, std::int64_t n, Strides s) {
  GRID_STRIDE(i, n) {
    std::int64_t rem = i;
    std::int64_t off = 0;
    for (int d = s.nd - 1; d >= 0; --d) {
      off += (rem % s.size[d]) * s.a[d];
      rem /= s.size[d];
    }
    out[i] = in[off];
  }
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  detail::require_cuda(a, "add", "a");
  detail::require_cuda(b, "add", "b");
  Tensor out = detail::empty(a.shape());
  const std::int64_t n = a.numel();
  if (n == 0) return out;
  add_kernel<<<detail::grid_for(n), detail::kThreads>>>(a.device_data(), b.device_data(), out.device_data(), n);
  detail::check_launch("add", "add_kernel");
  return out;
}

void add_inplace(Tensor& a, const Tensor& b) {
  detail::require_cuda(a, "add_inplace", "a");
  detail::require_cuda(b, "add_inplace", "b");
  const std::int64_t n = a.numel();
  float* pa = a.device_data();
  if (n == 0) return;
  add_inplace_kernel<<<detail::grid_for(n), detail::kThreads>>>(pa, b.device_data(), n);
  detail::check_launch("add_inplace", "add_inplace_kernel");
}

void axpy_inplace(Tensor& y, float alpha, const Tensor& x) {
  detail::require_cuda(y, "axpy_inplace", "y");
  detail::require_cuda(x, "axpy_inplace", "x");
  const std::int64_t n = y.numel();
  float* py = y.device_data();
  if (n == 0) return;
  axpy_kernel<<<detail::grid_for(n), detail::kThreads>>>(py, alpha, x.device_data(), n);
  detail::check_launch("axpy_inplace", "axpy_kernel");
}

Tensor scale(const Tensor& a, float s) {
  detail::require_cuda(a, "scale", "a");
  Tensor out = detail::empty(a.shape());
  const std::int64_t n = a.numel();
  if (n == 0) return out;
  scale_kernel<<<detail::grid_for(n), detail::kThreads>>>(a.device_data(), s, out.device_data(), n);
  detail::check_launch("scale", "scale_kernel");
  return out;
}

void copy_values(const float* src, float* dst, std::int64_t n) {
  if (n <= 0) return;
  // On the legacy default stream, ordered with every kernel (docs/cuda.md).
  detail::check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                cudaStreamLegacy),
                "copy_values", "cudaMemcpyAsync");
}

void fill_values(float* dst, std::int64_t n, float value) {
  if (n <= 0) return;
  fill_kernel<<<detail::grid_for(n), detail::kThreads>>>(dst, n, value);
  detail::check_launch("fill_values", "fill_kernel");
}

void divide_values(const float* src, float* dst, std::int64_t n, float divisor) {
  if (n <= 0) return;
  divide_kernel<<<detail::grid_for(n), detail::kThreads>>>(src, dst, n, divisor);
  detail::check_launch("divide_values", "divide_kernel");
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  detail::require_cuda(a, "binary", "a");
  detail::require_cuda(b, "binary", "b");
  check_dims(out_shape.size(), "binary", out_shape);
  Tensor out = detail::empty(out_shape);
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  Strides s;
  s.nd = static_cast<int>(out_shape.size());
  for (int d = 0; d < s.nd; ++d) s.size[d] = out_shape[static_cast<std::size_t>(d)];
  broadcast_strides(a.shape(), out_shape, s.a);
  broadcast_strides(b.shape(), out_shape, s.b);
  binary_kernel<<<detail::grid_for(n), detail::kThreads>>>(op, a.device_data(), b.device_data(), out.device_data(), n,
                                                           s);
  detail::check_launch("binary", "binary_kernel");
  return out;
}

Tensor reduce_to_shape(const Tensor& grad, const Shape& shape) {
  detail::require_cuda(grad, "reduce_to_shape", "grad");
  if (grad.shape() == shape) return grad;
  const Shape& gs = grad.shape();
  check_dims(gs.size(), "reduce_to_shape", gs);
  Tensor out = detail::empty(shape);
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  if (grad.numel() == 0) {
    out.fill(0.0F);
    return out;
  }
  // Gradient strides (row-major) and which gradient dims are summed: the
  // leading dims `shape` lacks and the dims where `shape` has 1 and grad not.
  const std::size_t ndim = gs.size();
  std::vector<std::int64_t> stride(ndim, 1);
  for (std::size_t d = ndim; d-- > 1;) stride[d - 1] = stride[d] * gs[d];
  const std::size_t lead = ndim - shape.size();
  Reduction r;
  for (std::size_t d = 0; d < ndim; ++d) {
    const bool summed = d < lead || (shape[d - lead] == 1 && gs[d] != 1);
    if (summed) {
      r.summed_size[r.summed] = gs[d];
      r.summed_stride[r.summed] = stride[d];
      r.terms *= gs[d];
      ++r.summed;
    } else {
      r.kept_size[r.kept] = gs[d];
      r.kept_stride[r.kept] = stride[d];
      ++r.kept;
    }
  }
  reduce_kernel<<<detail::grid_for(n), detail::kThreads>>>(grad.device_data(), out.device_data(), n, r);
  detail::check_launch("reduce_to_shape", "reduce_kernel");
  return out;
}

Tensor permute(const Tensor& in, std::span<const std::int64_t> perm) {
  detail::require_cuda(in, "permute", "in");
  const Shape& is = in.shape();
  const std::size_t nd = is.size();
  check_dims(nd, "permute", is);
  Shape os(nd);
  for (std::size_t d = 0; d < nd; ++d) os[d] = is[static_cast<std::size_t>(perm[d])];
  Tensor out = detail::empty(os);
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  std::vector<std::int64_t> in_strides(nd, 1);
  for (std::size_t d = nd; d-- > 1;) in_strides[d - 1] = in_strides[d] * is[d];
  Strides s;
  s.nd = static_cast<int>(nd);
  for (std::size_t d = 0; d < nd; ++d) {
    s.size[d] = os[d];
    s.a[d] = in_strides[static_cast<std::size_t>(perm[d])];
  }
  permute_kernel<<<detail::grid_for(n), detail::kThreads>>>(in.device_data(), out.device_data(), n, s);
  detail::check_launch("permute", "permute_kernel");
  return out;
}

}  // namespace riftco_transformer::cuda
