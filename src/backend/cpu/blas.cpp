#include <cblas.h>

#include "kernels.hpp"

namespace riftco_transformer::cpu {

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0F ? 0.0F : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const std::int64_t ad = a.dim();
  const std::int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const std::int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const std::int64_t n = trans_b ? b.size(-2) : b.size(-1);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = Tensor::empty(out_shape);
  const std::int64_t batch = shape_numel(Shape(out_shape.begin(), out_shape.end() - 2));
  const std::int64_t lda = a.size(-1);
  const std::int64_t ldb = b.size(-1);
  if (b.dim() == 2 && !trans_a) {
    // One GEMM: fold the batch into M.
    const std::int64_t rows = ad == 2 ? m : shape_numel(Shape(a.shape().begin(), a.shape().end() - 1));
    gemm(false, trans_b, rows, n, k, 1.0F, a.data(), lda, b.data(), ldb, 0.0F, out.data(), n);
    return out;
  }
  const bool shared_b = b.dim() == 2;
  const float* pa = a.data();
  const float* pb = b.data();
  float* pc = out.data();
  for (std::int64_t i = 0; i < batch; ++i) {
    gemm(trans_a, trans_b, m, n, k, 1.0F, pa + i * m * k, lda, pb + (shared_b ? 0 : i * k * n), ldb, 0.0F,
         pc + i * m * n, n);
  }
  return out;
}

}  // namespace riftco_transformer::cpu
