// matmul: forward C = op(A) op(B); backward dA = dC op(B)ᵀ, dB = op(A)ᵀ dC
// (summed over the batch when B is shared).
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

namespace {

/// Swaps the last two dims.
Tensor transpose_last(const backend::Kernels& kern, const Tensor& t) {
  const std::int64_t nd = t.dim();
  std::vector<std::int64_t> perm(static_cast<std::size_t>(nd));
  for (std::int64_t i = 0; i < nd; ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(nd - 1)], perm[static_cast<std::size_t>(nd - 2)]);
  return kern.permute(t, perm);
}

/// d op(A) = dC op(B)ᵀ; stored transposed when ta.
Tensor grad_lhs(const backend::Kernels& kern, const Tensor& dc, const Tensor& b, bool ta, bool tb) {
  if (!ta) return kern.matmul(dc, b, false, !tb);
  if (b.dim() == 2) return transpose_last(kern, kern.matmul(dc, b, false, !tb));
  return kern.matmul(b, dc, tb, true);  // op(B) dCᵀ
}

/// d op(B) = op(A)ᵀ dC; stored transposed when tb. A shared (2-D) B sums
/// over the batch: += per batch, in batch order.
Tensor grad_rhs(const backend::Kernels& kern, const Tensor& a, const Tensor& dc, const Tensor& b, bool ta, bool tb) {
  if (b.dim() != 2) return tb ? kern.matmul(dc, a, true, ta) : kern.matmul(a, dc, !ta, false);
  const std::int64_t k = ta ? a.size(-2) : a.size(-1);
  const std::int64_t m = ta ? a.size(-1) : a.size(-2);
  const std::int64_t n = dc.size(-1);
  const std::int64_t batch = dc.numel() / std::max<std::int64_t>(m * n, 1);
  Tensor db = Tensor::zeros(b.shape(), b.backend());
  if (!ta) {  // rows of A and dC are contiguous: one GEMM over batch * M rows
    const std::int64_t rows = batch * m;
    if (!tb) {
      kern.gemm(true, false, k, n, rows, 1.0F, a.device_data(), k, dc.device_data(), n, 0.0F, db.device_data(), n);
    } else {
      kern.gemm(true, false, n, k, rows, 1.0F, dc.device_data(), n, a.device_data(), k, 0.0F, db.device_data(), k);
    }
    return db;
  }
  for (std::int64_t i = 0; i < batch; ++i) {  // A_i stored (K, M)
    const float* pa = a.device_data() + i * m * k;
    const float* pd = dc.device_data() + i * m * n;
    if (!tb) {
      kern.gemm(false, false, k, n, m, 1.0F, pa, m, pd, n, 1.0F, db.device_data(), n);  // dB += A_i dC_i
    } else {
      kern.gemm(true, true, n, k, m, 1.0F, pd, n, pa, m, 1.0F, db.device_data(), k);  // dB += dC_iᵀ A_iᵀ
    }
  }
  return db;
}

}  // namespace

Variable matmul(const Variable& a, const Variable& b, bool ta, bool tb) {
  const char* op = "matmul";
  check_pair(op, "lhs", a, "rhs", b);
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  if (as.size() < 2 || bs.size() < 2) {
    throw ShapeError(tag(op) + "lhs " + shape_string(as) + " and rhs " + shape_string(bs) +
                     ": both need at least 2 dimensions");
  }
  const std::int64_t ka = ta ? as[as.size() - 2] : as.back();
  const std::int64_t kb = tb ? bs.back() : bs[bs.size() - 2];
  if (ka != kb) {
    throw ShapeError(tag(op) + "lhs " + shape_string(as) + (ta ? "ᵀ" : "") + " and rhs " + shape_string(bs) +
                     (tb ? "ᵀ" : "") + ": inner dimensions differ (" + std::to_string(ka) + " vs " +
                     std::to_string(kb) + ")");
  }
  const bool shared_b = bs.size() == 2;
  if (!shared_b && (bs.size() != as.size() || !std::equal(as.begin(), as.end() - 2, bs.begin()))) {
    throw ShapeError(tag(op) + "lhs " + shape_string(as) + " and rhs " + shape_string(bs) +
                     ": batch dimensions differ (rhs must be 2-D or have the same batch dimensions)");
  }
  const Tensor av = a.value();
  const Tensor bv = b.value();
  Tensor out = backend::kernels_for(op, av, bv).matmul(av, bv, ta, tb);
  return Variable::from_op(op, std::move(out), {a, b},
                           [op, av, bv, ta, tb](const Tensor& dc, const std::vector<bool>& needs) {
                             const backend::Kernels& kern = backend::kernels_for(op, dc, av, bv);
                             std::vector<Tensor> g(2);
                             if (needs[0]) g[0] = grad_lhs(kern, dc, bv, ta, tb);
                             if (needs[1]) g[1] = grad_rhs(kern, av, dc, bv, ta, tb);
                             return g;
                           },
                           {av, bv});
}

Variable linear(const Variable& x, const Variable& weight) {
  // Checked here so that errors name this op, x and weight (not matmul's
  // lhs and rhs).
  const char* op = "linear";
  check_pair(op, "x", x, "weight", weight);
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  if (ws.size() != 2 || xs.empty() || xs.back() != ws[1]) {
    throw ShapeError(tag(op) + "x " + shape_string(xs) + " and weight " + shape_string(ws) +
                     ": expected x (..., in) and weight (out, in) with the same in");
  }
  if (xs.size() == 1) return reshape(matmul(reshape(x, {1, xs[0]}), weight, false, true), {ws[0]});  // (in,) → (out,)
  return matmul(x, weight, false, true);
}

}  // namespace riftco_transformer
