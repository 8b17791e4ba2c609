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
  m.def("scale", [](const Variable& a, RealArg<float> factor) { return rt::scale(a, factor.value); }, "a"_a,
        "factor"_a);
  m.def("silu", &rt::silu, "x"_a);
  m.def("gelu", &rt::gelu, "x"_a);
  m.def("swiglu", &rt::swiglu, "gate"_a, "up"_a);
  m.def("sum", &rt::sum, "x"_a);
  m.def("mean", &rt::mean, "x"_a);
  // Integer and float arguments refuse a bool, as PyTorch's dims do
  // ("argument 'dim0' must be int, not bool"); see IntArg in common.hpp.
  const auto ints = [](const std::vector<IntArg<std::int64_t>>& values, const char* what) {
    std::vector<std::int64_t> out;
    for (const IntArg<std::int64_t>& v : values) out.push_back(v.get(what));
    return out;
  };
  m.def("reshape", [ints](const Variable& x, const std::vector<IntArg<std::int64_t>>& shape) {
    return rt::reshape(x, ints(shape, "[reshape] a dimension of shape"));
  }, "x"_a, "shape"_a);
  m.def("transpose", [](const Variable& x, const IntArg<std::int64_t>& dim0, const IntArg<std::int64_t>& dim1) {
    return rt::transpose(x, dim0.get("[transpose] dim0"), dim1.get("[transpose] dim1"));
  }, "x"_a, "dim0"_a, "dim1"_a);
  m.def("permute", [ints](const Variable& x, const std::vector<IntArg<std::int64_t>>& dims) {
    return rt::permute(x, ints(dims, "[permute] a dim"));
  }, "x"_a, "dims"_a);
  m.def("repeat_heads", [](const Variable& x, const IntArg<std::int64_t>& groups) {
    return rt::repeat_heads(x, groups.get("[repeat_heads] groups"));
  }, "x"_a, "groups"_a,
        "(B, G, T, D) → (B, G·groups, T, D), head h reading head h // groups (grouped-query attention).");
  m.def("rms_norm", [](const Variable& x, const Variable& weight, RealArg<float> eps) {
    return rt::rms_norm(x, weight, eps.value);
  }, "x"_a, "weight"_a, "eps"_a = 1.0e-5F);
  m.def("softmax", &rt::softmax, "x"_a);
  m.def("causal_mask", [](const Variable& scores, const IntArg<std::int64_t>& offset) {
    return rt::causal_mask(scores, offset.get("[causal_mask] offset"));
  }, "scores"_a, "offset"_a = 0);
  m.def("rope", [](const Variable& x, const IntArg<std::int64_t>& position_offset, RealArg<float> base) {
    return rt::rope(x, position_offset.get("[rope] position_offset"), base.value);
  }, "x"_a, "position_offset"_a = 0, "base"_a = 10000.0F);
  m.def("embedding",
        [](const Variable& weight, nb::handle ids) {
          const TokenArray t = tokens_from_python(ids, "embedding");
          return rt::embedding(weight, t.ids, t.shape);
        },
        "weight"_a, "ids"_a, "weight (V, C), ids (B, T) → (B, T, C).");
  m.def("cross_entropy",
        [](const Variable& logits, nb::handle targets, const IntArg<std::int32_t>& ignore_index) {
          const std::int32_t ignore = ignore_index.get("[cross_entropy] ignore_index");
          const TokenArray t = tokens_from_python(targets, "cross_entropy");
          return rt::cross_entropy(logits, t.ids, ignore);
        },
        "logits"_a, "targets"_a, "ignore_index"_a = -100, "Mean cross-entropy over rows; ignore_index rows skipped.");
  m.def("causal_attention",
        [](const Variable& q, const Variable& k, const Variable& v, nb::str kind) {
          return rt::causal_attention(q, k, v, rt::parse_attention_kind(choice_of(kind, "[causal_attention] attention")));
        },
        "q"_a, "k"_a, "v"_a, "attention"_a = "materialized", "Causal attention over (B, H, T, D).");
}

}  // namespace riftco_python
