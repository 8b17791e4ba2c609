// synchronize_gradients: one all-reduce of the flattened gradients after
// backward, for callers that do not reduce during backward. The pipelines
// use GradientBucketer (gradient_buckets.hpp: buckets started inside
// backward), which gives the same bits.
#include <algorithm>
#include <string>

#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {

void synchronize_gradients(Communicator& comm, std::span<const Variable> parameters, std::vector<Tensor>& gradients) {
  if (gradients.size() != parameters.size()) {
    throw ShapeError("[synchronize_gradients] " + std::to_string(gradients.size()) + " gradients for " +
                     std::to_string(parameters.size()) + " parameters");
  }
  std::size_t total = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& g = gradients[i];
    const Shape& shape = parameters[i].shape();
    const std::string name =
        parameters[i].name().empty() ? "parameter " + std::to_string(i) : "'" + parameters[i].name() + "'";
    if (g.defined() && g.backend() != Backend::Cpu) {
      throw BackendError("[synchronize_gradients] the gradient of " + name + " is not a CPU tensor");
    }
    if (g.defined() && g.shape() != shape) {
      throw ShapeError("[synchronize_gradients] the gradient of " + name + " is " + shape_string(g.shape()) +
                       ", the parameter is " + shape_string(shape));
    }
    total += static_cast<std::size_t>(parameters[i].value().numel());
  }
  // The gradients, then one flag per parameter: 1 where this rank has a gradient.
  std::vector<float> flat(total + parameters.size(), 0.0F);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const auto n = static_cast<std::size_t>(parameters[i].value().numel());
    if (gradients[i].defined()) {
      std::ranges::copy(gradients[i].values(), flat.begin() + static_cast<std::ptrdiff_t>(offset));
      flat[total + i] = 1.0F;
    }
    offset += n;
  }
  comm.all_reduce_average(std::span<float>(flat));
  offset = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const auto n = static_cast<std::size_t>(parameters[i].value().numel());
    if (flat[total + i] > 0.0F) {
      gradients[i] = Tensor::from_data(parameters[i].shape(), std::span<const float>(flat).subspan(offset, n));
    }
    offset += n;
  }
}

}  // namespace riftco_transformer
