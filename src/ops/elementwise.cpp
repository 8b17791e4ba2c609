// add / sub / mul with numpy broadcasting, scale. Backward reduces the
// broadcast gradient back to each input's shape.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

namespace {

Variable binary_op(const char* op, backend::BinaryOp kind, const Variable& a, const Variable& b) {
  check_pair(op, "lhs", a, "rhs", b);
  const Shape out_shape = broadcast_shape(op, a.shape(), b.shape());
  Tensor out = backend::kernels_for(op, a.value(), b.value()).binary(kind, a.value(), b.value(), out_shape);
  const Shape as = a.shape();
  const Shape bs = b.shape();
  std::vector<Tensor> saved;
  Tensor av;
  Tensor bv;
  if (kind == backend::BinaryOp::Mul) {  // only mul's backward needs the values
    av = a.value();
    bv = b.value();
    saved = {av, bv};
  }
  return Variable::from_op(
      op, std::move(out), {a, b},
      [op, kind, as, bs, av, bv, out_shape](const Tensor& g, const std::vector<bool>& needs) {
        std::vector<Tensor> grads(2);
        const backend::Kernels& k = backend::kernels_for(op, g, av, bv);  // av, bv: defined for mul only
        switch (kind) {
          case backend::BinaryOp::Add:
            if (needs[0]) grads[0] = k.reduce_to_shape(g, as);
            if (needs[1]) grads[1] = k.reduce_to_shape(g, bs);
            break;
          case backend::BinaryOp::Sub:
            if (needs[0]) grads[0] = k.reduce_to_shape(g, as);
            if (needs[1]) grads[1] = k.scale(k.reduce_to_shape(g, bs), -1.0F);
            break;
          case backend::BinaryOp::Mul:
            if (needs[0]) grads[0] = k.reduce_to_shape(k.binary(backend::BinaryOp::Mul, g, bv, out_shape), as);
            if (needs[1]) grads[1] = k.reduce_to_shape(k.binary(backend::BinaryOp::Mul, g, av, out_shape), bs);
            break;
        }
        return grads;
      },
      std::move(saved));
}

}  // namespace

Variable add(const Variable& a, const Variable& b) { return binary_op("add", backend::BinaryOp::Add, a, b); }
Variable sub(const Variable& a, const Variable& b) { return binary_op("sub", backend::BinaryOp::Sub, a, b); }
Variable mul(const Variable& a, const Variable& b) { return binary_op("mul", backend::BinaryOp::Mul, a, b); }

Variable scale(const Variable& a, float factor) {
  check_defined("scale", "input", a);
  return Variable::from_op("scale", backend::kernels_for("scale", a.value()).scale(a.value(), factor), {a},
                           [factor](const Tensor& g, const std::vector<bool>&) {
                             return std::vector<Tensor>{backend::kernels_for("scale", g).scale(g, factor)};
                           });
}

}  // namespace riftco_transformer
