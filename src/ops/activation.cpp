// silu, gelu (tanh approximation), swiglu = silu(gate) * up.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

namespace {

Variable unary_activation(const char* op, backend::Activation act, const Variable& x) {
  check_defined(op, "input", x);
  const Tensor xv = x.value();
  return Variable::from_op(
      op, backend::kernels_for(op, xv).activation_forward(act, xv), {x},
      [op, act, xv](const Tensor& g, const std::vector<bool>&) {
        return std::vector<Tensor>{backend::kernels_for(op, xv, g).activation_backward(act, xv, g)};
      },
      {xv});
}

}  // namespace

Variable silu(const Variable& x) { return unary_activation("silu", backend::Activation::Silu, x); }
Variable gelu(const Variable& x) { return unary_activation("gelu", backend::Activation::Gelu, x); }

Variable swiglu(const Variable& gate, const Variable& up) {
  const char* op = "swiglu";
  check_pair(op, "gate", gate, "up", up);
  if (gate.shape() != up.shape()) {
    throw ShapeError(tag(op) + "gate " + shape_string(gate.shape()) + " and up " + shape_string(up.shape()) +
                     ": shapes differ");
  }
  const Tensor a = gate.value();
  const Tensor b = up.value();
  return Variable::from_op(
      op, backend::kernels_for(op, a, b).swiglu_forward(a, b), {gate, up},
      [op, a, b](const Tensor& g, const std::vector<bool>&) {
        std::vector<Tensor> grads(2);
        backend::kernels_for(op, a, b, g).swiglu_backward(a, b, g, grads[0], grads[1]);
        return grads;
      },
      {a, b});
}

}  // namespace riftco_transformer
