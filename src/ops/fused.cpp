// Fused ops for the transformer block (see fused.hpp for each composite
// reference). Forward kernel and backward closure side by side, as in the
// other op files.
#include "fused.hpp"

#include <cmath>
#include <algorithm>
#include <cstring>

#include "../backend/cpu/flash_attention.hpp"
#include "../backend/cpu/kernels.hpp"
#include "op_util.hpp"

namespace riftco_transformer::fused {
using namespace ops_detail;

Variable linear_packed(const Variable& x, const std::vector<Variable>& weights) {
  const char* op = "linear_packed";
  check_defined(op, "input", x);
  if (weights.empty()) throw ValueError(tag(op) + "needs at least one weight");
  if (x.value().dim() < 1) throw ShapeError(tag(op) + "input " + shape_string(x.shape()) + " needs a last axis");
  const std::int64_t k = x.shape().back();
  std::vector<std::int64_t> widths;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    check_pair(op, "input", x, ("weight " + std::to_string(i)).c_str(), weights[i]);
    const Shape& ws = weights[i].shape();
    if (ws.size() != 2 || ws[1] != k) {
      throw ShapeError(tag(op) + "input " + shape_string(x.shape()) + " and weight " + std::to_string(i) + " " +
                       shape_string(ws) + ": weights must be (out, " + std::to_string(k) + ")");
    }
    widths.push_back(ws[0]);
    total += ws[0];
  }
  const Tensor xv = x.value();
  const std::int64_t rows = k == 0 ? 0 : xv.numel() / k;
  Shape out_shape = x.shape();
  out_shape.back() = total;
  Tensor out = Tensor::empty(out_shape);  // (..., Σ out_i): [x W_0ᵀ | x W_1ᵀ | ...]
  std::vector<Tensor> wv;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    wv.push_back(weights[i].value());
    cpu::gemm(false, true, rows, widths[i], k, 1.0F, xv.data(), k, wv[i].data(), k, 0.0F, out.data() + offset, total);
    offset += widths[i];
  }
  std::vector<Variable> parents{x};
  parents.insert(parents.end(), weights.begin(), weights.end());
  std::vector<Tensor> saved = wv;
  saved.push_back(xv);
  return Variable::from_op(
      op, std::move(out), std::move(parents),
      [xv, wv, widths, total, rows, k](const Tensor& g, const std::vector<bool>& needs) {
        std::vector<Tensor> grads(wv.size() + 1);
        const float* pg = g.data();
        if (needs[0]) {  // dx = Σ_i g_i W_i, accumulated in part order
          grads[0] = Tensor::empty(xv.shape());
          std::int64_t offset = 0;
          for (std::size_t i = 0; i < wv.size(); ++i) {
            cpu::gemm(false, false, rows, k, widths[i], 1.0F, pg + offset, total, wv[i].data(), k, i == 0 ? 0.0F : 1.0F,
                      grads[0].data(), k);
            offset += widths[i];
          }
        }
        std::int64_t offset = 0;
        for (std::size_t i = 0; i < wv.size(); ++i) {  // dW_i = g_iᵀ x
          if (needs[i + 1]) {
            grads[i + 1] = Tensor::empty(wv[i].shape());
            cpu::gemm(true, false, widths[i], k, rows, 1.0F, pg + offset, total, xv.data(), k, 0.0F,
                      grads[i + 1].data(), k);
          }
          offset += widths[i];
        }
        return grads;
      },
      std::move(saved));
}

Variable add_columns(const Variable& x, const Variable& delta, std::int64_t offset) {
  const char* op = "add_columns";
  check_pair(op, "input", x, "delta", delta);
  const Shape& xs = x.shape();
  const Shape& ds = delta.shape();
  if (xs.empty() || xs.size() != ds.size() || !std::equal(xs.begin(), xs.end() - 1, ds.begin()) || offset < 0 ||
      offset + ds.back() > xs.back()) {
    throw ShapeError(tag(op) + "input " + shape_string(xs) + " and delta " + shape_string(ds) + " at column " +
                     std::to_string(offset) + ": delta must fit inside the input's last dimension");
  }
  const std::int64_t n = xs.back();
  const std::int64_t w = ds.back();
  const std::int64_t rows = n == 0 ? 0 : x.value().numel() / n;
  Tensor out = x.value().clone();
  float* po = out.data();
  const float* pd = delta.value().data();
#pragma omp parallel for schedule(static) if (rows * w > 32768)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < w; ++j) po[r * n + offset + j] += pd[r * w + j];
  }
  const Shape delta_shape = ds;
  return Variable::from_op(
      op, std::move(out), {x, delta},
      [n, w, rows, offset, delta_shape](const Tensor& g, const std::vector<bool>& needs) {
        std::vector<Tensor> grads(2);
        if (needs[1]) {
          grads[1] = Tensor::empty(delta_shape);
          const float* pg = g.data();
          float* p = grads[1].data();
          for (std::int64_t r = 0; r < rows; ++r) {
            std::memcpy(p + r * w, pg + r * n + offset, static_cast<std::size_t>(w) * sizeof(float));
          }
        }
        if (needs[0]) grads[0] = g;
        return grads;
      });
}

namespace {

struct PackedGeometry {
  std::int64_t b, t, c, heads, d;
};

/// rope(q), rope(k) of every row of qkv into (B, T, 2C): [rope(q) | rope(k)].
Tensor rotated_qk(const Tensor& qkv, const PackedGeometry& g, float base) {
  Tensor rot = Tensor::empty({g.b, g.t, 2 * g.c});  // (B, T, 2C)
  cpu::rope_packed(qkv.data(), 3 * g.c, rot.data(), 2 * g.c, g.b, g.t, 2 * g.c, g.d, base, false);
  return rot;
}

}  // namespace

Variable rope_attention_packed(const Variable& qkv, std::int64_t heads, float rope_base) {
  const char* op = "rope_attention_packed";
  check_defined(op, "qkv", qkv);
  const Shape& s = qkv.shape();
  if (s.size() != 3 || heads <= 0 || s[2] % (3 * heads) != 0 || (s[2] / (3 * heads)) % 2 != 0 || s[2] == 0) {
    throw ShapeError(tag(op) + "qkv " + shape_string(s) + " with " + std::to_string(heads) +
                     " heads: expected (B, T, 3·heads·D) with D even and positive");
  }
  if (qkv.backend() != Backend::Cpu) {
    throw BackendError(tag(op) + "no " + std::string(backend_name(qkv.backend())) + " kernel in this build");
  }
  const PackedGeometry g{s[0], s[1], s[2] / 3, heads, s[2] / 3 / heads};
  const float scale = 1.0F / std::sqrt(static_cast<float>(g.d));
  const cpu::FlashTiles tiles = cpu::flash_default_tiles(g.d);
  const Tensor x = qkv.value();
  Tensor out = Tensor::empty({g.b, g.t, g.c});  // (B, T, C), heads merged
  Tensor lse = Tensor::empty({g.b, heads, g.t});  // (B, H, T)
  {
    const Tensor rot = rotated_qk(x, g, rope_base);  // (B, T, 2C), freed after the kernel
    const std::int64_t tc2 = g.t * 2 * g.c;
    cpu::flash_attention_forward(g.b, heads, g.t, g.d, {rot.data(), tc2, g.d, 2 * g.c},
                                 {rot.data() + g.c, tc2, g.d, 2 * g.c},
                                 {x.data() + 2 * g.c, g.t * 3 * g.c, g.d, 3 * g.c},
                                 {out.data(), g.t * g.c, g.d, g.c}, lse.data(), scale, tiles);
  }
  const Tensor ov = out;
  return Variable::from_op(
      op, std::move(out), {qkv},
      [x, ov, lse, g, scale, tiles, rope_base](const Tensor& grad, const std::vector<bool>&) {
        const Tensor rot = rotated_qk(x, g, rope_base);  // recomputed: (B, T, 2C)
        Tensor d = Tensor::empty(x.shape());               // (B, T, 3C): [dq | dk | dv]
        const std::int64_t tc = g.t * g.c, tc2 = 2 * tc, tc3 = 3 * tc;
        float* pd = d.data();
        cpu::flash_attention_backward(
            g.b, g.heads, g.t, g.d, {rot.data(), tc2, g.d, 2 * g.c}, {rot.data() + g.c, tc2, g.d, 2 * g.c},
            {x.data() + 2 * g.c, tc3, g.d, 3 * g.c}, {ov.data(), tc, g.d, g.c}, {grad.data(), tc, g.d, g.c},
            lse.data(), {pd, tc3, g.d, 3 * g.c}, {pd + g.c, tc3, g.d, 3 * g.c}, {pd + 2 * g.c, tc3, g.d, 3 * g.c},
            scale, tiles);
        // d rope(x) → d x: the inverse rotation, in place on the q and k columns.
        cpu::rope_packed(pd, 3 * g.c, pd, 3 * g.c, g.b, g.t, 2 * g.c, g.d, rope_base, true);
        return std::vector<Tensor>{std::move(d)};
      },
      {x, ov, lse});
}

Variable swiglu_packed(const Variable& gate_up) {
  const char* op = "swiglu_packed";
  check_defined(op, "gate_up", gate_up);
  if (gate_up.value().dim() < 1 || gate_up.shape().back() % 2 != 0) {
    throw ShapeError(tag(op) + "gate_up " + shape_string(gate_up.shape()) + ": last dimension must be even (2F)");
  }
  const Tensor x = gate_up.value();
  return Variable::from_op(
      op, cpu::swiglu_packed_forward(x), {gate_up},
      [x](const Tensor& g, const std::vector<bool>&) {
        return std::vector<Tensor>{cpu::swiglu_packed_backward(x, g)};
      },
      {x});
}

}  // namespace riftco_transformer::fused
