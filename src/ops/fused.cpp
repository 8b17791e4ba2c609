// Fused ops for the transformer block (see fused.hpp for each composite
// reference). Forward kernel and backward closure side by side, as in the
// other op files.
#include "fused.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "../backend/kernels.hpp"
#include "op_util.hpp"

namespace riftco_transformer::fused {
using namespace ops_detail;

namespace {

/// x W_iᵀ for every weight into consecutive columns of out (rows, Σ out_i),
/// all products in one parallel region.
void packed_forward(const backend::Kernels& kern, const float* x, std::int64_t rows, std::int64_t k,
                    const std::vector<Tensor>& w, const std::vector<std::int64_t>& widths, std::int64_t total,
                    float* out, const float* addend = nullptr) {
  std::vector<backend::GemmProblem> problems;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    problems.push_back({false, true, rows, widths[i], k, 1.0F, x, k, w[i].device_data(), k, 0.0F, out + offset, total,
                        addend == nullptr ? nullptr : addend + offset, total});
    offset += widths[i];
  }
  std::vector<std::span<const backend::GemmProblem>> chains;
  for (const backend::GemmProblem& p : problems) chains.emplace_back(&p, 1);
  kern.gemm_group(chains);
}

/// Backward of packed_forward given g (rows, Σ out_i): dx = Σ_i g_i W_i in
/// part order (when dx is non-null; one chain; rows dx_ld apart, k by
/// default) and dW_i = g_iᵀ x for each needed i, all in one parallel region.
void packed_backward(const backend::Kernels& kern, const float* g, const float* x, std::int64_t rows, std::int64_t k,
                     const std::vector<Tensor>& w, const std::vector<std::int64_t>& widths, std::int64_t total,
                     float* dx, std::vector<Tensor>& dw, const std::vector<bool>& need_dw, std::int64_t dx_ld = 0) {
  if (dx_ld == 0) dx_ld = k;
  std::vector<backend::GemmProblem> dx_chain;
  std::vector<backend::GemmProblem> dw_problems;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (dx != nullptr) {
      dx_chain.push_back({false, false, rows, k, widths[i], 1.0F, g + offset, total, w[i].device_data(), k,
                          i == 0 ? 0.0F : 1.0F, dx, dx_ld});
    }
    if (need_dw[i]) {
      dw[i] = Tensor::empty(w[i].shape(), w[i].backend());
      dw_problems.push_back(
          {true, false, widths[i], k, rows, 1.0F, g + offset, total, x, k, 0.0F, dw[i].device_data(), k});
    }
    offset += widths[i];
  }
  std::vector<std::span<const backend::GemmProblem>> chains;
  if (!dx_chain.empty()) chains.emplace_back(dx_chain);
  for (const backend::GemmProblem& p : dw_problems) chains.emplace_back(&p, 1);
  kern.gemm_group(chains);
}

/// Validates weights (out_i, k) against an input's last dim k.
std::vector<std::int64_t> packed_widths(const char* op, const Variable& x, const std::vector<Variable>& weights,
                                        std::int64_t& total) {
  if (weights.empty()) throw ValueError(tag(op) + "needs at least one weight");
  if (x.value().dim() < 1) throw ShapeError(tag(op) + "input " + shape_string(x.shape()) + " needs a last axis");
  const std::int64_t k = x.shape().back();
  std::vector<std::int64_t> widths;
  total = 0;
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
  return widths;
}

/// Rows of a (..., last) tensor: the product of its leading dimensions, also
/// when the last one is 0 (a product over an empty K is zeros, not nothing).
std::int64_t leading_rows(const Shape& shape) {
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return rows;
}

/// The value of a node whose value is not computed (value_needed false): all
/// NaN on the CPU, so a reader that should not exist sees it at once; zeros
/// on a device (one memset: a NaN fill would be a host-to-device copy of the
/// whole tensor, about what the skipped GEMM costs there).
Tensor unread_value(const Shape& shape, Backend backend) {
  if (backend != Backend::Cpu) return Tensor::zeros(shape, backend);
  return Tensor::full(shape, std::numeric_limits<float>::quiet_NaN(), backend);
}

}  // namespace

Variable norm_linear_packed(const Variable& h, const Variable& norm_weight, float eps,
                            const std::vector<Variable>& weights) {
  const char* op = "norm_linear_packed";
  check_pair(op, "input", h, "norm weight", norm_weight);
  if (h.value().dim() < 1 || norm_weight.value().dim() != 1 || norm_weight.shape()[0] != h.shape().back()) {
    throw ShapeError(tag(op) + "input " + shape_string(h.shape()) + " and norm weight " +
                     shape_string(norm_weight.shape()) + ": weight must be 1-D with the input's last dimension");
  }
  if (!(eps > 0.0F)) throw ValueError(tag(op) + "eps must be positive, got " + float_text(eps));
  std::int64_t total = 0;
  const std::vector<std::int64_t> widths = packed_widths(op, h, weights, total);
  const Tensor hv = h.value();
  const Tensor nw = norm_weight.value();
  const std::int64_t k = hv.size(-1);
  const std::int64_t rows = leading_rows(hv.shape());
  Shape out_shape = hv.shape();
  out_shape.back() = total;
  const backend::Kernels& kern = backend::kernels_for(op, hv, nw);  // weights: checked by packed_widths
  Tensor out = Tensor::empty(out_shape, hv.backend());  // (..., Σ out_i)
  Tensor rstd;                                          // (rows)
  std::vector<Tensor> wv;
  for (const Variable& w : weights) wv.push_back(w.value());
  {
    const Tensor x = kern.rms_norm_forward(hv, nw, eps, rstd);  // (..., K), not kept
    packed_forward(kern, x.device_data(), rows, k, wv, widths, total, out.device_data());
  }
  std::vector<Variable> parents{h, norm_weight};
  parents.insert(parents.end(), weights.begin(), weights.end());
  std::vector<Tensor> saved = wv;
  saved.push_back(hv);
  saved.push_back(nw);
  saved.push_back(rstd);
  return Variable::from_op(
      op, std::move(out), std::move(parents),
      [op, hv, nw, rstd, wv, widths, total, rows, k, eps](const Tensor& g, const std::vector<bool>& needs) {
        const backend::Kernels& kern = backend::kernels_for(op, hv, g);
        std::vector<Tensor> grads(wv.size() + 2);
        const bool need_dx = needs[0] || needs[1];
        Tensor dx;
        if (need_dx) dx = Tensor::empty(hv.shape(), hv.backend());
        std::vector<Tensor> dw(wv.size());
        {
          Tensor unused;
          const Tensor x = kern.rms_norm_forward(hv, nw, eps, unused);  // recomputed, bit-identical
          packed_backward(kern, g.device_data(), x.device_data(), rows, k, wv, widths, total,
                          need_dx ? dx.device_data() : nullptr, dw, std::vector<bool>(needs.begin() + 2, needs.end()));
        }  // x goes before the norm's gradient exists (a block's backward peak)
        for (std::size_t i = 0; i < wv.size(); ++i) grads[i + 2] = std::move(dw[i]);
        if (need_dx) kern.rms_norm_backward(hv, nw, rstd, dx, grads[0], grads[1], needs[0], needs[1]);
        return grads;
      },
      std::move(saved));
}

Variable linear_residual(const Variable& residual, const Variable& x, const Variable& weight, bool value_needed) {
  const char* op = "linear_residual";
  check_pair(op, "residual", residual, "input", x);
  std::int64_t total = 0;
  const std::vector<std::int64_t> widths = packed_widths(op, x, {weight}, total);
  Shape out_shape = x.shape();
  out_shape.back() = total;
  if (residual.shape() != out_shape) {
    throw ShapeError(tag(op) + "residual " + shape_string(residual.shape()) + " and input " +
                     shape_string(x.shape()) + " with weight " + shape_string(weight.shape()) +
                     ": the residual must have the projection's shape " + shape_string(out_shape));
  }
  const Tensor xv = x.value();
  const std::vector<Tensor> wv{weight.value()};
  const std::int64_t k = xv.size(-1);
  const std::int64_t rows = leading_rows(xv.shape());
  const backend::Kernels& kern = backend::kernels_for(op, xv, residual.value());
  Tensor out;
  if (!value_needed) {
    out = unread_value(out_shape, xv.backend());
  } else {
    // residual + x Wᵀ with add(residual, linear(x, W))'s bits, each block of
    // the product added to the residual by the GEMM's own task (the
    // projection is never a whole tensor).
    const Tensor rv = residual.value();
    out = Tensor::empty(out_shape, xv.backend());
    packed_forward(kern, xv.device_data(), rows, k, wv, widths, total, out.device_data(), rv.device_data());
  }
  return Variable::from_op(
      op, std::move(out), {residual, x, weight},
      [op, xv, wv, widths, total, rows, k](const Tensor& g, const std::vector<bool>& needs) {
        const backend::Kernels& kern = backend::kernels_for(op, xv, g);
        std::vector<Tensor> grads(3);
        if (needs[0]) grads[0] = g;
        if (needs[1]) grads[1] = Tensor::empty(xv.shape(), xv.backend());
        std::vector<Tensor> dw(1);
        packed_backward(kern, g.device_data(), xv.device_data(), rows, k, wv, widths, total,
                        needs[1] ? grads[1].device_data() : nullptr, dw, {static_cast<bool>(needs[2])});
        grads[2] = std::move(dw[0]);
        return grads;
      },
      {xv, wv[0]});
}

Variable swiglu_linear_residual(const Variable& residual, const Variable& gate_up, const Variable& weight,
                                bool value_needed) {
  const char* op = "swiglu_linear_residual";
  check_pair(op, "residual", residual, "gate_up", gate_up);
  check_pair(op, "gate_up", gate_up, "weight", weight);
  const Shape& gs = gate_up.shape();
  const Shape& ws = weight.shape();
  if (gs.empty() || gs.back() % 2 != 0 || ws.size() != 2 || ws[1] * 2 != gs.back() ||
      residual.shape() != [&] {
        Shape s = gs;
        s.back() = ws[0];
        return s;
      }()) {
    throw ShapeError(tag(op) + "residual " + shape_string(residual.shape()) + ", gate_up " + shape_string(gs) +
                     " and weight " + shape_string(ws) + ": expected (..., C), (..., 2F) and (C, F)");
  }
  const Tensor gu = gate_up.value();
  const std::vector<Tensor> wv{weight.value()};
  const std::vector<std::int64_t> widths{ws[0]};
  const std::int64_t total = ws[0];
  const std::int64_t k = ws[1];
  const std::int64_t rows = leading_rows(gu.shape());
  const backend::Kernels& kern = backend::kernels_for(op, gu, residual.value());
  Tensor out;
  if (!value_needed) {
    out = unread_value(residual.shape(), gu.backend());
  } else {
    const Tensor m = kern.swiglu_packed_forward(gu);  // (..., F), not kept
    const Tensor rv = residual.value();
    out = Tensor::empty(residual.shape(), gu.backend());  // residual + m Wᵀ, added block by block as above
    packed_forward(kern, m.device_data(), rows, k, wv, widths, total, out.device_data(), rv.device_data());
  }
  return Variable::from_op(
      op, std::move(out), {residual, gate_up, weight},
      [op, gu = Tensor(gu), wv, widths, total, rows, k](const Tensor& g, const std::vector<bool>& needs) mutable {
        const backend::Kernels& kern = backend::kernels_for(op, gu, g);
        std::vector<Tensor> grads(3);
        if (needs[0]) grads[0] = g;
        std::vector<Tensor> dw(1);
        Tensor m;  // (..., F)
        if (needs[2]) {  // dW = gᵀ m: one GEMM over every row, as before
          m = kern.swiglu_packed_forward(gu);  // recomputed (same bits)
          packed_backward(kern, g.device_data(), m.device_data(), rows, k, wv, widths, total, nullptr, dw, {true});
          grads[2] = std::move(dw[0]);
        }
        if (!needs[1]) return grads;
        // Released graph, gate/up read by nothing else: its gradient is
        // written over it, dm = g W into m's buffer (or a new (..., F) one),
        // then the SwiGLU backward in place over gate/up: gate/up + (..., F)
        // at most, never two (..., 2F) buffers.
        if (Tensor over = take_if_unique(gu); over.defined()) {
          Shape fs = over.shape();
          fs.back() = k;
          Tensor dm = m.defined() ? std::move(m) : Tensor::empty(fs, over.backend());
          packed_backward(kern, g.device_data(), nullptr, rows, k, wv, widths, total, dm.device_data(), dw, {false});
          kern.swiglu_packed_backward_over(over, dm);
          grads[1] = std::move(over);
          return grads;
        }
        m = Tensor();  // gone before d gate_up exists
        // dm = g W goes straight into columns [0, F) of each row of
        // d gate_up (row stride 2F), which the SwiGLU backward then
        // overwrites in place: no (..., F) buffer is ever allocated.
        grads[1] = Tensor::empty(gu.shape(), gu.backend());
        packed_backward(kern, g.device_data(), nullptr, rows, k, wv, widths, total, grads[1].device_data(), dw,
                        {false}, 2 * k);
        kern.swiglu_packed_backward_inplace(gu, grads[1]);
        return grads;
      },
      {gu, wv[0]});
}

Variable linear_packed(const Variable& x, const std::vector<Variable>& weights) {
  const char* op = "linear_packed";
  check_defined(op, "input", x);
  std::int64_t total = 0;
  const std::vector<std::int64_t> widths = packed_widths(op, x, weights, total);
  const Tensor xv = x.value();
  const std::int64_t k = xv.size(-1);
  const std::int64_t rows = leading_rows(xv.shape());
  Shape out_shape = x.shape();
  out_shape.back() = total;
  const backend::Kernels& kern = backend::kernels_for(op, xv);  // weights: checked by packed_widths
  Tensor out = Tensor::empty(out_shape, xv.backend());  // (..., Σ out_i): [x W_0ᵀ | x W_1ᵀ | ...]
  std::vector<Tensor> wv;
  for (const Variable& w : weights) wv.push_back(w.value());
  packed_forward(kern, xv.device_data(), rows, k, wv, widths, total, out.device_data());
  std::vector<Variable> parents{x};
  parents.insert(parents.end(), weights.begin(), weights.end());
  std::vector<Tensor> saved = wv;
  saved.push_back(xv);
  return Variable::from_op(
      op, std::move(out), std::move(parents),
      [op, xv, wv, widths, total, rows, k](const Tensor& g, const std::vector<bool>& needs) {
        const backend::Kernels& kern = backend::kernels_for(op, xv, g);
        std::vector<Tensor> grads(wv.size() + 1);
        if (needs[0]) grads[0] = Tensor::empty(xv.shape(), xv.backend());
        std::vector<Tensor> dw(wv.size());
        packed_backward(kern, g.device_data(), xv.device_data(), rows, k, wv, widths, total,
                        needs[0] ? grads[0].device_data() : nullptr, dw,
                        std::vector<bool>(needs.begin() + 1, needs.end()));
        for (std::size_t i = 0; i < wv.size(); ++i) grads[i + 1] = std::move(dw[i]);
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
  const std::int64_t w = ds.back();
  Tensor out = backend::kernels_for(op, x.value(), delta.value()).add_columns(x.value(), delta.value(), offset);
  return Variable::from_op(
      op, std::move(out), {x, delta},
      [op, w, offset](const Tensor& g, const std::vector<bool>& needs) {
        std::vector<Tensor> grads(2);
        if (needs[1]) grads[1] = backend::kernels_for(op, g).take_columns(g, offset, w);  // (..., w)
        if (needs[0]) grads[0] = g;
        return grads;
      });
}

namespace {

struct PackedGeometry {
  std::int64_t b, t, c, heads, d;
};

/// rope(q), rope(k) of every row of qkv into (B, T, 2C): [rope(q) | rope(k)].
Tensor rotated_qk(const backend::Kernels& kern, const Tensor& qkv, const PackedGeometry& g, float base) {
  Tensor rot = Tensor::empty({g.b, g.t, 2 * g.c}, qkv.backend());  // (B, T, 2C)
  kern.rope_packed(qkv.device_data(), 3 * g.c, rot.device_data(), 2 * g.c, g.b, g.t, 2 * g.c, g.d, base, false);
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
  const PackedGeometry g{s[0], s[1], s[2] / 3, heads, s[2] / 3 / heads};
  const float scale = 1.0F / std::sqrt(static_cast<float>(g.d));
  const Tensor x = qkv.value();
  const backend::Kernels& kern = backend::kernels_for(op, x);
  const backend::FlashTiles tiles = kern.flash_default_tiles(g.d);
  Tensor out = Tensor::empty({g.b, g.t, g.c}, x.backend());    // (B, T, C), heads merged
  Tensor lse = Tensor::empty({g.b, heads, g.t}, x.backend());  // (B, H, T)
  {
    const Tensor rot = rotated_qk(kern, x, g, rope_base);  // (B, T, 2C), freed after the kernel
    const std::int64_t tc2 = g.t * 2 * g.c;
    kern.flash_attention_forward(g.b, heads, g.t, g.d, {rot.device_data(), tc2, g.d, 2 * g.c},
                                 {rot.device_data() + g.c, tc2, g.d, 2 * g.c},
                                 {x.device_data() + 2 * g.c, g.t * 3 * g.c, g.d, 3 * g.c},
                                 {out.device_data(), g.t * g.c, g.d, g.c}, lse.device_data(), scale, tiles);
  }
  const Tensor ov = out;
  return Variable::from_op(
      op, std::move(out), {qkv},
      [op, x, ov, lse, g, scale, tiles, rope_base](const Tensor& grad, const std::vector<bool>&) {
        const backend::Kernels& kern = backend::kernels_for(op, x, grad);
        const Tensor rot = rotated_qk(kern, x, g, rope_base);  // recomputed: (B, T, 2C)
        Tensor d = Tensor::empty(x.shape(), x.backend());        // (B, T, 3C): [dq | dk | dv]
        const std::int64_t tc = g.t * g.c, tc2 = 2 * tc, tc3 = 3 * tc;
        float* pd = d.device_data();
        const float* pr = rot.device_data();
        kern.flash_attention_backward(g.b, g.heads, g.t, g.d, {pr, tc2, g.d, 2 * g.c}, {pr + g.c, tc2, g.d, 2 * g.c},
                                      {x.device_data() + 2 * g.c, tc3, g.d, 3 * g.c}, {ov.device_data(), tc, g.d, g.c},
                                      {grad.device_data(), tc, g.d, g.c}, lse.device_data(), {pd, tc3, g.d, 3 * g.c},
                                      {pd + g.c, tc3, g.d, 3 * g.c}, {pd + 2 * g.c, tc3, g.d, 3 * g.c}, scale, tiles);
        // d rope(x) → d x: the inverse rotation, in place on the q and k columns.
        kern.rope_packed(pd, 3 * g.c, pd, 3 * g.c, g.b, g.t, 2 * g.c, g.d, rope_base, true);
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
      op, backend::kernels_for(op, x).swiglu_packed_forward(x), {gate_up},
      [op, x](const Tensor& g, const std::vector<bool>&) {
        return std::vector<Tensor>{backend::kernels_for(op, x, g).swiglu_packed_backward(x, g)};
      },
      {x});
}

}  // namespace riftco_transformer::fused
