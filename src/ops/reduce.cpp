// sum / mean over all elements. The forward sums serially in float64 (the
// backend's sum_all), so the result does not depend on the thread count.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

namespace {

Variable reduce_all(const char* op, const Variable& x, bool average) {
  check_defined(op, "input", x);
  const std::int64_t n = x.value().numel();
  if (average && n == 0) throw ShapeError(tag(op) + "mean of an empty tensor " + shape_string(x.shape()));
  const float factor = average ? 1.0F / static_cast<float>(n) : 1.0F;
  const Tensor xv = x.value();
  const double total = backend::kernels_for(op, xv).sum_all(xv);
  Tensor out = Tensor::full({}, static_cast<float>(average ? total / static_cast<double>(n) : total), xv.backend());
  const Shape shape = x.shape();
  return Variable::from_op(op, std::move(out), {x}, [shape, factor](const Tensor& g, const std::vector<bool>&) {
    // The upstream scalar is read on the host; the gradient is made on g's backend.
    return std::vector<Tensor>{Tensor::full(shape, g.item() * factor, g.backend())};
  });
}

}  // namespace

Variable sum(const Variable& x) { return reduce_all("sum", x, false); }
Variable mean(const Variable& x) { return reduce_all("mean", x, true); }

}  // namespace riftco_transformer
