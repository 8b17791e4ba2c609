// synchronize_gradients: one all-reduce of the flattened gradients after
// backward, for callers that do not reduce during backward. The pipelines
// use GradientBucketer (gradient_buckets.hpp: buckets started inside
// backward), which gives the same bits. The flat buffer lives on the
// parameters' backend and is packed by its kernels (a CUDA model's never
// crosses the host: only the per-parameter flags go in and come back, one
// copy each way).
#include <string>
#include <utility>
#include <vector>

#include "../backend/kernels.hpp"
#include "../tensor/device_runtime.hpp"
#include "model_backend.hpp"
#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {

void synchronize_gradients(Communicator& comm, std::span<const Variable> parameters, std::vector<Tensor>& gradients) {
  if (gradients.size() != parameters.size()) {
    throw ShapeError("[synchronize_gradients] " + std::to_string(gradients.size()) + " gradients for " +
                     std::to_string(parameters.size()) + " parameters");
  }
  const Backend backend = distributed_detail::model_backend(comm, parameters, "synchronize_gradients");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& g = gradients[i];
    const Shape& shape = parameters[i].shape();
    const std::string name =
        parameters[i].name().empty() ? "parameter " + std::to_string(i) : "'" + parameters[i].name() + "'";
    if (g.defined() && g.backend() != backend) {
      throw BackendError("[synchronize_gradients] the gradient of " + name + " is on " + backend_name(g.backend()) +
                         ", the parameters on " + backend_name(backend));
    }
    if (g.defined() && g.shape() != shape) {
      throw ShapeError("[synchronize_gradients] the gradient of " + name + " is " + shape_string(g.shape()) +
                       ", the parameter is " + shape_string(shape));
    }
    total += parameters[i].value().numel();
  }
  // The gradients, then one flag per parameter: 1 where this rank has a
  // gradient. The flags are made on the host and copied in at once.
  const auto count = static_cast<std::int64_t>(parameters.size());
  const auto flag_bytes = static_cast<std::size_t>(count) * sizeof(float);
  const backend::Kernels& kernels = backend::kernels(backend, "synchronize_gradients");
  Tensor flat = Tensor::zeros({total + count}, backend);
  float* out = flat.device_data();
  std::vector<float> present(static_cast<std::size_t>(count), 0.0F);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const std::int64_t n = parameters[i].value().numel();
    if (gradients[i].defined()) {
      kernels.copy_values(std::as_const(gradients[i]).device_data(), out + offset, n);  // read: no version bump
      present[i] = 1.0F;
    }
    offset += n;
  }
  detail::copy_bytes(out + total, backend, present.data(), Backend::Cpu, flag_bytes, "synchronize_gradients");
  comm.all_reduce_average(flat);
  // The averaged flags back on the host (the gradients stay where they are).
  const float* in = std::as_const(flat).device_data();
  detail::copy_bytes(present.data(), Backend::Cpu, in + total, backend, flag_bytes, "synchronize_gradients");
  offset = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const std::int64_t n = parameters[i].value().numel();
    if (present[i] > 0.0F) {
      Tensor g = Tensor::empty(parameters[i].shape(), backend);
      kernels.copy_values(in + offset, g.device_data(), n);
      gradients[i] = std::move(g);
    }
    offset += n;
  }
}

}  // namespace riftco_transformer
