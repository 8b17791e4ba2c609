// Differentiable ops (ops.hpp, attention.hpp) for custom blocks and losses.
#include "common.hpp"
#include "riftco_transformer/attention.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_python {

void init_ops(nb::module_& m) {
  using rt::Variable;
  m.def("matmul", &rt::matmul, "a"_a, "b"_a, "transpose_a"_a = false, "transpose_b"_a = false,
        "a (..., M, K) @ b (..., K, N); b may be 2-D or share a's batch dims.");
  m.def("linear", &rt::linear, "x"_a, "weight"_a, "x (..., in) @ weight.T, weight (out, in).");
  m.def("add", &rt::add, "a"_a, "b"_a);
  m.def("sub", &rt::sub, "a"_a, "b"_a);
  m.def("mul", &rt::mul, "a"_a, "b"_a);
  m.def("scale", &rt::scale, "a"_a, "factor"_a);
  m.def("silu", &rt::silu, "x"_a);
  m.def("gelu", &rt::gelu, "x"_a);
  m.def("swiglu", &rt::swiglu, "gate"_a, "up"_a);
  m.def("sum", &rt::sum, "x"_a);
  m.def("mean", &rt::mean, "x"_a);
  m.def("reshape", [](const Variable& x, const rt::Shape& shape) { return rt::reshape(x, shape); }, "x"_a, "shape"_a);
  m.def("transpose", &rt::transpose, "x"_a, "dim0"_a, "dim1"_a);
  m.def("permute", &rt::permute, "x"_a, "dims"_a);
  m.def("repeat_heads", &rt::repeat_heads, "x"_a, "groups"_a,
        "(B, G, T, D) → (B, G·groups, T, D), head h reading head h // groups (grouped-query attention).");
  m.def("rms_norm", &rt::rms_norm, "x"_a, "weight"_a, "eps"_a = 1.0e-5F);
  m.def("softmax", &rt::softmax, "x"_a);
  m.def("causal_mask", &rt::causal_mask, "scores"_a, "offset"_a = 0);
  m.def("rope", &rt::rope, "x"_a, "position_offset"_a = 0, "base"_a = 10000.0F);
  m.def("embedding",
        [](const Variable& weight, nb::handle ids) {
          const TokenArray t = tokens_from_python(ids, "embedding");
          return rt::embedding(weight, t.ids, t.shape);
        },
        "weight"_a, "ids"_a, "weight (V, C), ids (B, T) → (B, T, C).");
  m.def("cross_entropy",
        [](const Variable& logits, nb::handle targets, std::int32_t ignore_index) {
          const TokenArray t = tokens_from_python(targets, "cross_entropy");
          return rt::cross_entropy(logits, t.ids, ignore_index);
        },
        "logits"_a, "targets"_a, "ignore_index"_a = -100, "Mean cross-entropy over rows; ignore_index rows skipped.");
  m.def("causal_attention",
        [](const Variable& q, const Variable& k, const Variable& v, nb::str kind) {
          return rt::causal_attention(q, k, v, rt::parse_attention_kind(choice_of(kind, "[causal_attention] attention")));
        },
        "q"_a, "k"_a, "v"_a, "attention"_a = "materialized", "Causal attention over (B, H, T, D).");
}

}  // namespace riftco_python
