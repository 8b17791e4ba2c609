// Causal attention over (B, H, T, D): materialized (composed from ops, so the
// graph retains the T×T scores and probabilities) or flash (one node whose
// backward recomputes them tile by tile; see docs/attention.md).
#include "riftco_transformer/attention.hpp"

#include <cmath>

#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

const char* attention_kind_name(FullSequenceAttentionKind kind) {
  switch (kind) {
    case FullSequenceAttentionKind::Materialized:
      return "materialized";
    case FullSequenceAttentionKind::Flash:
      return "flash";
  }
  return "unknown";
}

FullSequenceAttentionKind parse_attention_kind(const std::string& name, const char* op) {
  if (name == "materialized") return FullSequenceAttentionKind::Materialized;
  if (name == "flash") return FullSequenceAttentionKind::Flash;
  throw ValueError(tag(op) + "unknown attention kind \"" + name + "\": expected \"materialized\" or \"flash\"");
}

namespace {

Variable materialized_attention(const Variable& q, const Variable& k, const Variable& v, float s) {
  const Variable scores = scale(matmul(q, k, false, true), s);  // (B, H, T, T)
  const Variable probs = softmax(causal_mask(scores));           // (B, H, T, T)
  return matmul(probs, v);                                       // (B, H, T, D)
}

Variable flash_attention(const Variable& q, const Variable& k, const Variable& v, float s) {
  const char* op = "flash_attention";
  const backend::Kernels& kernels = backend::kernels_for(op, q.value(), k.value(), v.value());
  const backend::FlashTiles tiles = kernels.flash_default_tiles(q.shape()[3]);
  Tensor lse;  // (B, H, T)
  Tensor out = kernels.flash_attention_forward(q.value(), k.value(), v.value(), s, tiles, lse);  // (B, H, T, D)
  const Tensor qv = q.value();
  const Tensor kv = k.value();
  const Tensor vv = v.value();
  const Tensor ov = out;
  return Variable::from_op(
      op, std::move(out), {q, k, v},
      [op, qv, kv, vv, ov, lse, s, tiles](const Tensor& g, const std::vector<bool>& needs) {
        std::vector<Tensor> grads(3);
        backend::kernels_for(op, qv, g).flash_attention_backward(qv, kv, vv, ov, lse, g, s, tiles, grads[0], grads[1],
                                                                 grads[2]);
        for (std::size_t i = 0; i < 3; ++i) {
          if (!needs[i]) grads[i] = Tensor();
        }
        return grads;
      },
      {qv, kv, vv, ov, lse});
}

}  // namespace

Variable causal_attention(const Variable& q, const Variable& k, const Variable& v, FullSequenceAttentionKind kind) {
  const char* op = "causal_attention";
  check_pair(op, "q", q, "k", k);
  check_pair(op, "q", q, "v", v);
  const auto shapes = [&] {
    return "q " + shape_string(q.shape()) + ", k " + shape_string(k.shape()) + ", v " + shape_string(v.shape());
  };
  if (q.shape().size() != 4 || k.shape().size() != 4 || v.shape().size() != 4) {
    throw ShapeError(tag(op) + shapes() + ": expected 4-D (B, H, T, D) tensors");
  }
  if (k.shape() != q.shape() || v.shape() != q.shape()) {
    throw ShapeError(tag(op) + shapes() + ": q, k and v must have the same shape");
  }
  const std::int64_t head_width = q.shape()[3];
  if (head_width <= 0) throw ShapeError(tag(op) + shapes() + ": head width D must be positive");
  const float s = 1.0F / std::sqrt(static_cast<float>(head_width));
  switch (kind) {
    case FullSequenceAttentionKind::Materialized:
      return materialized_attention(q, k, v, s);
    case FullSequenceAttentionKind::Flash:
      return flash_attention(q, k, v, s);
  }
  throw ValueError(tag(op) + "unknown attention kind " + std::to_string(static_cast<int>(kind)) +
                   ": expected materialized (0) or flash (1)");
}

}  // namespace riftco_transformer
