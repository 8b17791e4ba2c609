// rms_norm: fused kernel forward/backward; keeps x and one rstd per row.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

Variable rms_norm(const Variable& x, const Variable& weight, float eps) {
  const char* op = "rms_norm";
  check_pair(op, "input", x, "weight", weight);
  if (x.value().dim() < 1 || weight.value().dim() != 1 || weight.shape()[0] != x.shape().back()) {
    throw ShapeError(tag(op) + "input " + shape_string(x.shape()) + " and weight " + shape_string(weight.shape()) +
                     ": weight must be 1-D with the input's last dimension");
  }
  if (!(eps > 0.0F)) throw ValueError(tag(op) + "eps must be positive, got " + float_text(eps));
  const Tensor xv = x.value();
  const Tensor wv = weight.value();
  Tensor rstd;
  Tensor out = backend::kernels_for(op, xv, wv).rms_norm_forward(xv, wv, eps, rstd);
  return Variable::from_op(op, std::move(out), {x, weight},
                           [op, xv, wv, rstd](const Tensor& g, const std::vector<bool>& needs) {
                             std::vector<Tensor> grads(2);
                             backend::kernels_for(op, xv, g).rms_norm_backward(xv, wv, rstd, g, grads[0], grads[1],
                                                                               needs[0], needs[1]);
                             return grads;
                           },
                           {xv, wv, rstd});
}

}  // namespace riftco_transformer
