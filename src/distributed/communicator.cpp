// Communicator: the tensor overloads (host spans, or the device hooks), the
// average, world() and world_for().
#include <string>
#include <utility>

#include "collective_checks.hpp"
#include "mpi_world.hpp"
#include "nccl_bootstrap.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {
namespace {

// The tensor overloads take defined tensors, both operands on one backend.
void require_defined(const Tensor& tensor, const char* op) {
  if (!tensor.defined()) {
    throw BackendError(std::string("[") + op + "] collectives take defined tensors; got an undefined tensor");
  }
}

bool on_host(const Tensor& tensor, const char* op) {
  require_defined(tensor, op);
  return tensor.backend() == Backend::Cpu;
}

bool on_host(const Tensor& input, const Tensor& output, const char* op) {
  require_defined(input, op);
  require_defined(output, op);
  if (input.backend() != output.backend()) {
    throw BackendError(std::string("[") + op + "] input " + shape_string(input.shape()) + " is on " +
                       backend_name(input.backend()) + " but output " + shape_string(output.shape()) + " is on " +
                       backend_name(output.backend()));
  }
  return input.backend() == Backend::Cpu;
}

std::span<float> host_span(Tensor& tensor) { return {tensor.data(), static_cast<std::size_t>(tensor.numel())}; }

std::size_t elements(const Tensor& tensor) { return static_cast<std::size_t>(tensor.numel()); }

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

void Communicator::all_reduce_sum(Tensor& tensor) {
  if (on_host(tensor, "all_reduce_sum")) return all_reduce_sum(host_span(tensor));
  device_all_reduce(tensor, false);
}
void Communicator::all_reduce_average(Tensor& tensor) {
  if (on_host(tensor, "all_reduce_average")) return all_reduce_average(host_span(tensor));
  device_all_reduce(tensor, true);
}
std::unique_ptr<CollectiveRequest> Communicator::start_all_reduce_sum(Tensor& tensor) {
  if (on_host(tensor, "all_reduce_sum")) return start_all_reduce_sum(host_span(tensor));
  return device_start_all_reduce_sum(tensor);
}
void Communicator::reduce_scatter_sum(const Tensor& input, Tensor& output) {
  if (on_host(input, output, "reduce_scatter_sum")) return reduce_scatter_sum(input.values(), host_span(output));
  distributed_detail::check_reduce_scatter(elements(input), elements(output), world_size());
  device_reduce_scatter_sum(input, output);
}
void Communicator::all_gather(const Tensor& input, Tensor& output) {
  if (on_host(input, output, "all_gather")) return all_gather(input.values(), host_span(output));
  distributed_detail::check_all_gather(elements(input), elements(output), world_size());
  device_all_gather(input, output);
}
void Communicator::broadcast(Tensor& tensor, int root) {
  if (on_host(tensor, "broadcast")) return broadcast(host_span(tensor), root);
  distributed_detail::check_root(root, world_size());
  device_broadcast(tensor, root);
}

// Device tensors on a communicator without device collectives: at world
// size 1 each collective is a copy on the device; otherwise refused.
namespace {
[[noreturn]] void refuse_device(const Communicator& comm, const Tensor& tensor, const char* op) {
  throw BackendError(std::string("[") + op + "] the " + std::string(comm.kind()) + " communicator (rank " +
                     std::to_string(comm.rank()) + " of " + std::to_string(comm.world_size()) +
                     ") moves host buffers only; this tensor " + shape_string(tensor.shape()) + " is on " +
                     backend_name(tensor.backend()) +
                     ": device tensors need the nccl communicator (Communicator::world_for, a build with "
                     "RIFTCO_NCCL); they are not copied through the host");
}
}  // namespace

void Communicator::device_all_reduce(Tensor& tensor, bool average) {
  if (world_size() != 1) refuse_device(*this, tensor, average ? "all_reduce_average" : "all_reduce_sum");
  tensor.bump_version("all_reduce_sum");  // the sum over one rank is the tensor itself
}
std::unique_ptr<CollectiveRequest> Communicator::device_start_all_reduce_sum(Tensor& tensor) {
  device_all_reduce(tensor, false);
  return std::make_unique<CompletedRequest>();
}
void Communicator::device_reduce_scatter_sum(const Tensor& input, Tensor& output) {
  if (world_size() != 1) refuse_device(*this, input, "reduce_scatter_sum");
  output.copy_from(input.reshape(output.shape()));
}
void Communicator::device_all_gather(const Tensor& input, Tensor& output) {
  if (world_size() != 1) refuse_device(*this, input, "all_gather");
  output.copy_from(input.reshape(output.shape()));
}
void Communicator::device_broadcast(Tensor& tensor, int root) {
  if (world_size() != 1) refuse_device(*this, tensor, "broadcast");
  static_cast<void>(root);
  tensor.bump_version("broadcast");
}

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

bool nccl_built() {
#ifdef RIFTCO_NCCL
  return true;
#else
  return false;
#endif
}

std::string_view communicator_kind_for(Backend model_backend, bool launched_by_mpi, bool mpi_is_built,
                                       bool nccl_is_built) {
  if (!launched_by_mpi || !mpi_is_built) return "single-process";  // one process: world() is the single-process one
  if (model_backend == Backend::Cpu) return "mpi";
  if (nccl_is_built) return "nccl";
  throw BackendError(std::string("[communicator] a ") + backend_name(model_backend) +
                     " model under an MPI launcher needs the nccl communicator, and this build has none "
                     "(configure with -DRIFTCO_CUDA=ON -DRIFTCO_NCCL=ON where nccl.h and libnccl are "
                     "installed); its gradients are not copied through the host instead");
}

Communicator& Communicator::world_for(Backend backend) {
  bool launched = false;
#ifdef RIFTCO_MPI
  launched = distributed_detail::launched_by_mpi();
#endif
  const std::string_view kind = communicator_kind_for(backend, launched, mpi_built(), nccl_built());
#ifdef RIFTCO_NCCL
  if (kind == "nccl") return distributed_detail::nccl_world();
#endif
  static_cast<void>(kind);
  return world();
}

}  // namespace riftco_transformer
