// add / sub / mul with numpy broadcasting, scale. Backward reduces the
// broadcast gradient back to each input's shape.
#include "../backend/cpu/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

namespace {

Variable binary_op(const char* op, cpu::BinaryOp kind, const Variable& a, const Variable& b) {
  check_pair(op, "lhs", a, "rhs", b);
  const Shape out_shape = broadcast_shape(op, a.shape(), b.shape());
  Tensor out = cpu::binary(kind, a.value(), b.value(), out_shape);
  const Shape as = a.shape();
  const Shape bs = b.shape();
  std::vector<Tensor> saved;
  Tensor av;
  Tensor bv;
  if (kind == cpu::BinaryOp::Mul) {  // only mul's backward needs the values
    av = a.value();
    bv = b.value();
    saved = {av, bv};
  }
  return Variable::from_op(
      op, std::move(out), {a, b},
      [kind, as, bs, av, bv, out_shape](const Tensor& g, const std::vector<bool>& needs) {
        std::vector<Tensor> grads(2);
        switch (kind) {
          case cpu::BinaryOp::Add:
            if (needs[0]) grads[0] = cpu::reduce_to_shape(g, as);
            if (needs[1]) grads[1] = cpu::reduce_to_shape(g, bs);
            break;
          case cpu::BinaryOp::Sub:
            if (needs[0]) grads[0] = cpu::reduce_to_shape(g, as);
            if (needs[1]) grads[1] = cpu::scale(cpu::reduce_to_shape(g, bs), -1.0F);
            break;
          case cpu::BinaryOp::Mul:
            if (needs[0]) grads[0] = cpu::reduce_to_shape(cpu::binary(cpu::BinaryOp::Mul, g, bv, out_shape), as);
            if (needs[1]) grads[1] = cpu::reduce_to_shape(cpu::binary(cpu::BinaryOp::Mul, g, av, out_shape), bs);
            break;
        }
        return grads;
      },
      std::move(saved));
}

}  // namespace

Variable add(const Variable& a, const Variable& b) { return binary_op("add", cpu::BinaryOp::Add, a, b); }
Variable sub(const Variable& a, const Variable& b) { return binary_op("sub", cpu::BinaryOp::Sub, a, b); }
Variable mul(const Variable& a, const Variable& b) { return binary_op("mul", cpu::BinaryOp::Mul, a, b); }

Variable scale(const Variable& a, float factor) {
  check_defined("scale", "input", a);
  return Variable::from_op("scale", cpu::scale(a.value(), factor), {a},
                           [factor](const Tensor& g, const std::vector<bool>&) {
                             return std::vector<Tensor>{cpu::scale(g, factor)};
                           });
}

}  // namespace riftco_transformer
