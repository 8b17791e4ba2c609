#include "riftco_transformer/gradient_accumulator.hpp"

#include <cmath>
#include <string>

#include "../backend/kernels.hpp"
#include "adam_coefficients.hpp"

namespace riftco_transformer {

GradientAccumulator::GradientAccumulator(std::vector<Variable> parameters)
    : params_(std::move(parameters)), sums_(params_.size()), added_serial_(params_.size(), 0) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].defined()) throw ValueError("[GradientAccumulator] parameter " + std::to_string(i) + " is undefined");
  }
}

void GradientAccumulator::add(float weight) {
  if (!std::isfinite(weight)) {
    throw ValueError("[GradientAccumulator] weight must be finite, got " + float_text(weight));
  }
  // One handle per gradient, checked and then added: a backward committing
  // in another thread meanwhile can neither free nor change what is added.
  std::vector<std::uint64_t> serials;
  const std::vector<Tensor> grads = detail::fresh_gradients(params_, added_serial_, serials);  // added already: none
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    const Tensor& sum = sums_[i];
    if (sum.defined() && sum.backend() != g.backend()) {
      throw BackendError("[GradientAccumulator] the gradient of '" + params_[i].name() + "' is on " +
                         backend_name(g.backend()) + ", but earlier ones were on " + backend_name(sum.backend()));
    }
    if (sum.defined() ? g.shape() != sum.shape() : g.shape() != params_[i].value().shape()) {
      throw ShapeError("[GradientAccumulator] the gradient of '" + params_[i].name() + "' is " +
                       shape_string(g.shape()) + ", but " + (sum.defined() ? "earlier ones were " : "the value is ") +
                       shape_string(sum.defined() ? sum.shape() : params_[i].value().shape()));
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    // Elementwise on g's backend: the bits do not depend on the thread count.
    const backend::Kernels& kernels = backend::kernels(g.backend(), "GradientAccumulator");
    if (!sums_[i].defined()) {
      sums_[i] = kernels.scale(g, weight);  // weight · g
    } else {
      kernels.axpy_inplace(sums_[i], weight, g);  // sum += weight · g
    }
    added_serial_[i] = serials[i];
  }
  ++count_;
}

void GradientAccumulator::clear() {
  for (Tensor& t : sums_) t = Tensor();
  count_ = 0;
}

}  // namespace riftco_transformer
