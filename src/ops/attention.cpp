// Interim: materialized attention only; the tiled flash kernel lands from the attention branch
// (until then Flash runs the materialized path).
#include <cmath>
#include "op_util.hpp"
#include "riftco_transformer/attention.hpp"
#include "riftco_transformer/ops.hpp"
namespace riftco_transformer {
const char* attention_kind_name(FullSequenceAttentionKind kind) { return kind == FullSequenceAttentionKind::Flash ? "flash" : "materialized"; }
FullSequenceAttentionKind parse_attention_kind(const std::string& name, const char* op) {
  if (name == "flash") return FullSequenceAttentionKind::Flash;
  if (name == "materialized") return FullSequenceAttentionKind::Materialized;
  throw ValueError(std::string("[") + op + "] bad");
}
Variable causal_attention(const Variable& q, const Variable& k, const Variable& v, FullSequenceAttentionKind) {
  const float s = 1.0F / std::sqrt(static_cast<float>(q.shape().back()));
  return matmul(softmax(causal_mask(scale(matmul(q, k, false, true), s))), v);
}
}
