// Communicator: the tensor overloads, the average, and world().
#include <string>
#include <utility>

#include "mpi_world.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {
namespace {

std::span<float> host_span(Tensor& tensor, const char* op) {
  if (!tensor.defined() || tensor.backend() != Backend::Cpu) {
    throw BackendError(std::string("[") + op + "] collectives take defined CPU tensors; got " +
                       (tensor.defined() ? "a tensor on another backend" : "an undefined tensor") +
                       " of shape " + shape_string(tensor.shape()));
  }
  return {tensor.data(), static_cast<std::size_t>(tensor.numel())};
}

std::span<const float> host_span(const Tensor& tensor, const char* op) {
  if (!tensor.defined() || tensor.backend() != Backend::Cpu) {
    throw BackendError(std::string("[") + op + "] collectives take defined CPU tensors; got " +
                       (tensor.defined() ? "a tensor on another backend" : "an undefined tensor") +
                       " of shape " + shape_string(tensor.shape()));
  }
  return tensor.values();
}

}  // namespace

void Communicator::all_reduce_average(std::span<float> values) {
  all_reduce_sum(values);
  const auto n = static_cast<float>(world_size());
  if (n == 1.0F) return;
  for (float& v : values) v /= n;
}

namespace {
class CompletedRequest final : public CollectiveRequest {
 public:
  bool test() override { return true; }
  void wait() override {}
};
}  // namespace

std::unique_ptr<CollectiveRequest> Communicator::start_all_reduce_sum(std::span<float> values) {
  all_reduce_sum(values);
  return std::make_unique<CompletedRequest>();
}

void Communicator::all_reduce_sum(Tensor& tensor) { all_reduce_sum(host_span(tensor, "all_reduce_sum")); }
void Communicator::all_reduce_average(Tensor& tensor) {
  all_reduce_average(host_span(tensor, "all_reduce_average"));
}
void Communicator::reduce_scatter_sum(const Tensor& input, Tensor& output) {
  reduce_scatter_sum(host_span(input, "reduce_scatter_sum"), host_span(output, "reduce_scatter_sum"));
}
void Communicator::all_gather(const Tensor& input, Tensor& output) {
  all_gather(host_span(input, "all_gather"), host_span(output, "all_gather"));
}
void Communicator::broadcast(Tensor& tensor, int root) { broadcast(host_span(tensor, "broadcast"), root); }

Communicator& Communicator::world() {
#ifdef RIFTCO_MPI
  if (distributed_detail::launched_by_mpi()) return distributed_detail::mpi_world();
#endif
  static const std::unique_ptr<Communicator> single = make_single_process_communicator();
  return *single;
}

bool mpi_built() {
#ifdef RIFTCO_MPI
  return true;
#else
  return false;
#endif
}

}  // namespace riftco_transformer
