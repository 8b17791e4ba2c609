#include "riftco_transformer/gradient_accumulator.hpp"

#include <cmath>
#include <string>
#include <utility>  // std::as_const

namespace riftco_transformer {

GradientAccumulator::GradientAccumulator(std::vector<Variable> parameters)
    : params_(std::move(parameters)), sums_(params_.size()) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].defined()) throw ValueError("[GradientAccumulator] parameter " + std::to_string(i) + " is undefined");
  }
}

void GradientAccumulator::add(float weight) {
  if (!std::isfinite(weight)) {
    throw ValueError("[GradientAccumulator] weight must be finite, got " + std::to_string(weight));
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = params_[i].grad();
    if (!g.defined()) continue;
    if (g.backend() != Backend::Cpu) {
      throw ShapeError("[GradientAccumulator] the gradient of '" + params_[i].name() + "' is on " +
                       backend_name(g.backend()) + "; accumulation runs on cpu");
    }
    const Tensor& sum = sums_[i];
    if (sum.defined() ? g.shape() != sum.shape() : g.shape() != params_[i].value().shape()) {
      throw ShapeError("[GradientAccumulator] the gradient of '" + params_[i].name() + "' is " +
                       shape_string(g.shape()) + ", but " + (sum.defined() ? "earlier ones were " : "the value is ") +
                       shape_string(sum.defined() ? sum.shape() : params_[i].value().shape()));
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = params_[i].grad();
    if (!g.defined()) continue;
    const float* src = std::as_const(g).data();
    const std::int64_t n = g.numel();
    if (!sums_[i].defined()) {
      sums_[i] = Tensor::zeros(g.shape(), Backend::Cpu);
      float* dst = sums_[i].data();
      // Elementwise: the bits do not depend on the thread count.
#pragma omp parallel for schedule(static) if (n > 65536)
      for (std::int64_t j = 0; j < n; ++j) dst[j] = weight * src[j];
    } else {
      float* dst = sums_[i].data();
#pragma omp parallel for schedule(static) if (n > 65536)
      for (std::int64_t j = 0; j < n; ++j) dst[j] += weight * src[j];
    }
  }
  ++count_;
}

void GradientAccumulator::clear() {
  for (Tensor& t : sums_) t = Tensor();
  count_ = 0;
}

}  // namespace riftco_transformer
