// Elementwise arithmetic, broadcasting and its reduction, and permutes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels.hpp"
#include "parallel.hpp"
#include "softmax_rows.hpp"

namespace riftco_transformer::cpu {

namespace {

inline float apply(BinaryOp op, float x, float y) {
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

template <BinaryOp kOp>
[[gnu::always_inline]] inline void binary_loop(const float* a, const float* b, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = apply(kOp, a[i], b[i]);
}

/// out = a op b over n elements (out may not overlap a or b).
__attribute__((target_clones("avx512f", "avx2", "default"))) void binary_span(BinaryOp op, const float* a,
                                                                              const float* b, float* out,
                                                                              std::int64_t n) {
  switch (op) {
    case BinaryOp::Add:
      return binary_loop<BinaryOp::Add>(a, b, out, n);
    case BinaryOp::Sub:
      return binary_loop<BinaryOp::Sub>(a, b, out, n);
    case BinaryOp::Mul:
      return binary_loop<BinaryOp::Mul>(a, b, out, n);
  }
}

/// y += alpha · x over n elements (alpha = 1: y += x, bit for bit).
__attribute__((target_clones("avx512f", "avx2", "default"))) void axpy_span(float* y, float alpha, const float* x,
                                                                            std::int64_t n) {
  if (alpha == 1.0F) {
    for (std::int64_t i = 0; i < n; ++i) y[i] += x[i];
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }
}

}  // namespace

// The loops below run in AVX-512F / AVX2 / baseline clones over chunks
// handed out by parallel_spans; every element is one IEEE operation (the
// file is built with -ffp-contract=off), so the bits match a plain loop for
// any thread count and instruction set.

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b, a.shape()); }

void add_inplace(Tensor& a, const Tensor& b) { axpy_inplace(a, 1.0F, b); }

void axpy_inplace(Tensor& y, float alpha, const Tensor& x) {
  float* py = y.data();
  const float* px = x.data();
  parallel_spans(y.numel(), [&](std::int64_t b, std::int64_t e) { axpy_span(py + b, alpha, px + b, e - b); });
}

Tensor scale(const Tensor& a, float s) {
  Tensor out = Tensor::empty(a.shape());
  const float* pa = a.data();
  float* po = out.data();
  parallel_spans(a.numel(), [&](std::int64_t b, std::int64_t e) { scale_row(pa + b, s, po + b, e - b); });
  return out;
}

namespace {

/// Strides of `shape` aligned to the right of an `ndim`-dimensional output,
/// with 0 where the input broadcasts.
std::vector<std::int64_t> broadcast_strides(const Shape& shape, std::size_t ndim, const Shape& out_shape) {
  std::vector<std::int64_t> strides(ndim, 0);
  std::int64_t stride = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::size_t d = shape.size() - 1 - i;
    const std::size_t od = ndim - 1 - i;
    strides[od] = (shape[d] == 1 && out_shape[od] != 1) ? 0 : stride;
    stride *= shape[d];
  }
  return strides;
}

/// True when `shape` equals the trailing dims of `out_shape` (ignoring leading 1s).
bool is_suffix(const Shape& shape, const Shape& out_shape) {
  std::size_t lead = 0;
  while (lead < shape.size() && shape[lead] == 1 && shape.size() - lead > 0) ++lead;
  const std::size_t len = shape.size() - lead;
  if (len > out_shape.size()) return false;
  for (std::size_t i = 0; i < len; ++i) {
    if (shape[lead + i] != out_shape[out_shape.size() - len + i]) return false;
  }
  return true;
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape);
  const std::int64_t n = out.numel();
  const float* pa = a.data();
  const float* pb = b.data();
  float* po = out.data();
  if (a.shape() == out_shape && b.shape() == out_shape) {
    parallel_spans(n, [&](std::int64_t begin, std::int64_t end) {
      binary_span(op, pa + begin, pb + begin, po + begin, end - begin);
    });
    return out;
  }
  if (a.shape() == out_shape && is_suffix(b.shape(), out_shape)) {
    const std::int64_t inner = b.numel();
    const std::int64_t rows = inner == 0 ? 0 : n / inner;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < inner; ++j) po[r * inner + j] = apply(op, pa[r * inner + j], pb[j]);
    return out;
  }
  const std::size_t ndim = out_shape.size();
  const auto sa = broadcast_strides(a.shape(), ndim, out_shape);
  const auto sb = broadcast_strides(b.shape(), ndim, out_shape);
#pragma omp parallel for schedule(dynamic, 8192) if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t rem = i;
    std::int64_t oa = 0;
    std::int64_t ob = 0;
    for (std::size_t d = ndim; d-- > 0;) {
      const std::int64_t idx = rem % out_shape[d];
      rem /= out_shape[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    po[i] = apply(op, pa[oa], pb[ob]);
  }
  return out;
}

Tensor reduce_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  Tensor out = Tensor::zeros(shape);
  const Shape& gs = grad.shape();
  const std::int64_t n = grad.numel();
  const float* pg = grad.data();
  float* po = out.data();
  // Every sum in double, rounded once at the end: a float accumulator lost
  // digits with the row count (2^24 equal rows stop growing), where
  // PyTorch's float sums are cascaded.
  if (is_suffix(shape, gs)) {
    // Sum rows: column blocks in parallel, rows in order within each (a
    // column's sum does not depend on the thread count).
    constexpr std::int64_t kBlock = 256;
    const std::int64_t inner = out.numel();
    const std::int64_t rows = inner == 0 ? 0 : n / inner;
    const std::int64_t blocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t j0 = b * kBlock;
      const std::int64_t width = std::min(kBlock, inner - j0);
      double acc[kBlock] = {};
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = pg + r * inner + j0;
        for (std::int64_t j = 0; j < width; ++j) acc[j] += row[j];
      }
      for (std::int64_t j = 0; j < width; ++j) po[j0 + j] = static_cast<float>(acc[j]);
    }
    return out;
  }
  const std::size_t ndim = gs.size();
  const auto so = broadcast_strides(shape, ndim, gs);
  std::vector<double> sums(static_cast<std::size_t>(out.numel()), 0.0);
  for (std::int64_t i = 0; i < n; ++i) {  // serial: fixed order
    std::int64_t rem = i;
    std::int64_t off = 0;
    for (std::size_t d = ndim; d-- > 0;) {
      off += (rem % gs[d]) * so[d];
      rem /= gs[d];
    }
    sums[static_cast<std::size_t>(off)] += pg[i];
  }
  for (std::size_t k = 0; k < sums.size(); ++k) po[k] = static_cast<float>(sums[k]);
  return out;
}

double sum_all(const Tensor& x) {
  const float* p = x.data();
  double acc = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) acc += p[i];  // serial: fixed order
  return acc;
}

Tensor permute(const Tensor& in, std::span<const std::int64_t> perm) {
  const Shape& is = in.shape();
  const std::size_t nd = is.size();
  Shape os(nd);
  for (std::size_t d = 0; d < nd; ++d) os[d] = is[static_cast<std::size_t>(perm[d])];
  Tensor out = Tensor::empty(os);
  std::vector<std::int64_t> in_strides(nd, 1);
  for (std::size_t d = nd; d-- > 1;) in_strides[d - 1] = in_strides[d] * is[d];
  std::vector<std::int64_t> src_stride(nd);  // stride in `in` for out dim d
  for (std::size_t d = 0; d < nd; ++d) src_stride[d] = in_strides[static_cast<std::size_t>(perm[d])];
  const float* pi = in.data();
  float* po = out.data();
  if (nd == 0) {
    po[0] = pi[0];
    return out;
  }
  // Copy rows of the last output dim; parallel over rows.
  const std::int64_t last = os[nd - 1];
  const std::int64_t rows = last == 0 ? 0 : out.numel() / last;
  const std::int64_t ls = src_stride[nd - 1];
#pragma omp parallel for schedule(static) if (out.numel() > 32768)
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t rem = r;
    std::int64_t off = 0;
    for (std::size_t d = nd - 1; d-- > 0;) {
      off += (rem % os[d]) * src_stride[d];
      rem /= os[d];
    }
    float* dst = po + r * last;
    if (ls == 1) {
      std::memcpy(dst, pi + off, static_cast<std::size_t>(last) * sizeof(float));
    } else {
      for (std::int64_t j = 0; j < last; ++j) dst[j] = pi[off + j * ls];
    }
  }
  return out;
}

// Flat buffers (gradient buckets, ZeRO-1 shards): plain loops, one IEEE
// operation per element.
void copy_values(const float* src, float* dst, std::int64_t n) {
  if (n > 0) std::copy(src, src + n, dst);
}

void fill_values(float* dst, std::int64_t n, float value) {
  if (n > 0) std::fill(dst, dst + n, value);
}

void divide_values(const float* src, float* dst, std::int64_t n, float divisor) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i] / divisor;
}

}  // namespace riftco_transformer::cpu
