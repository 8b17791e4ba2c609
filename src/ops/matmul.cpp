// matmul: forward C = op(A) op(B); backward dA = dC op(B)ᵀ, dB = op(A)ᵀ dC
// (summed over the batch when B is shared).
#include "../backend/cpu/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

namespace {

/// Swaps the last two dims.
Tensor transpose_last(const Tensor& t) {
  const std::int64_t nd = t.dim();
  std::vector<std::int64_t> perm(static_cast<std::size_t>(nd));
  for (std::int64_t i = 0; i < nd; ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(nd - 1)], perm[static_cast<std::size_t>(nd - 2)]);
  return cpu::permute(t, perm);
}

/// d op(A) = dC op(B)ᵀ; stored transposed when ta.
Tensor grad_lhs(const Tensor& dc, const Tensor& b, bool ta, bool tb) {
  if (!ta) return cpu::matmul(dc, b, false, !tb);
  if (b.dim() == 2) return transpose_last(cpu::matmul(dc, b, false, !tb));
  return cpu::matmul(b, dc, tb, true);  // op(B) dCᵀ
}

/// d op(B) = op(A)ᵀ dC; stored transposed when tb. A shared (2-D) B sums
/// over the batch: += per batch, in batch order.
Tensor grad_rhs(const Tensor& a, const Tensor& dc, const Tensor& b, bool ta, bool tb) {
  if (b.dim() != 2) return tb ? cpu::matmul(dc, a, true, ta) : cpu::matmul(a, dc, !ta, false);
  const std::int64_t k = ta ? a.size(-2) : a.size(-1);
  const std::int64_t m = ta ? a.size(-1) : a.size(-2);
  const std::int64_t n = dc.size(-1);
  const std::int64_t batch = dc.numel() / std::max<std::int64_t>(m * n, 1);
  Tensor db = Tensor::zeros(b.shape());
  if (!ta) {  // rows of A and dC are contiguous: one GEMM over batch * M rows
    const std::int64_t rows = batch * m;
    if (!tb) {
      cpu::gemm(true, false, k, n, rows, 1.0F, a.data(), k, dc.data(), n, 0.0F, db.data(), n);
    } else {
      cpu::gemm(true, false, n, k, rows, 1.0F, dc.data(), n, a.data(), k, 0.0F, db.data(), k);
    }
    return db;
  }
  for (std::int64_t i = 0; i < batch; ++i) {  // A_i stored (K, M)
    const float* pa = a.data() + i * m * k;
    const float* pd = dc.data() + i * m * n;
    if (!tb) {
      cpu::gemm(false, false, k, n, m, 1.0F, pa, m, pd, n, 1.0F, db.data(), n);  // dB += A_i dC_i
    } else {
      cpu::gemm(true, true, n, k, m, 1.0F, pd, n, pa, m, 1.0F, db.data(), k);  // dB += dC_iᵀ A_iᵀ
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
  Tensor out = cpu::matmul(a.value(), b.value(), ta, tb);
  const Tensor av = a.value();
  const Tensor bv = b.value();
  return Variable::from_op(
      op, std::move(out), {a, b},
      [av, bv, ta, tb](const Tensor& dc, const std::vector<bool>& needs) {
        std::vector<Tensor> g(2);
        if (needs[0]) g[0] = grad_lhs(dc, bv, ta, tb);
        if (needs[1]) g[1] = grad_rhs(av, dc, bv, ta, tb);
        return g;
      },
      {av, bv});
}

Variable linear(const Variable& x, const Variable& weight) { return matmul(x, weight, false, true); }

}  // namespace riftco_transformer
