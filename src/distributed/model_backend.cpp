// model_backend: the parameters' backend against the communicator's.
#include "model_backend.hpp"

#include <string>

#include "riftco_transformer/errors.hpp"

namespace riftco_transformer::distributed_detail {
namespace {

std::string describe(std::span<const Variable> parameters, std::size_t i) {
  const Variable& p = parameters[i];
  return "parameter " + std::to_string(i) + (p.name().empty() ? std::string() : " '" + p.name() + "'") + " " +
         shape_string(p.shape());
}

std::string communicator_name(const Communicator& comm) {
  return "the " + std::string(comm.kind()) + " communicator (rank " + std::to_string(comm.rank()) + " of " +
         std::to_string(comm.world_size()) + ")";
}

}  // namespace

Backend model_backend(const Communicator& comm, std::span<const Variable> parameters, const char* op) {
  const bool device_communicator = comm.accepts(Backend::Cuda);
  if (parameters.empty()) return device_communicator ? Backend::Cuda : Backend::Cpu;
  const Backend backend = parameters[0].backend();
  for (std::size_t i = 1; i < parameters.size(); ++i) {
    if (parameters[i].backend() != backend) {
      throw BackendError(std::string("[") + op + "] " + describe(parameters, 0) + " is on " + backend_name(backend) +
                         " but " + describe(parameters, i) + " is on " + backend_name(parameters[i].backend()) +
                         ": data parallelism reduces one model on one backend");
    }
  }
  if (backend == Backend::Cpu && device_communicator) {
    throw BackendError(std::string("[") + op + "] the model is on cpu (" + describe(parameters, 0) + ") but " +
                       communicator_name(comm) +
                       " reduces cuda tensors: a cpu model's gradients go over Communicator::world() "
                       "(mpi or single-process), a cuda model's over Communicator::world_for(Backend::Cuda)");
  }
  if (backend != Backend::Cpu && !comm.accepts(backend) && comm.world_size() > 1) {
    throw BackendError(std::string("[") + op + "] the model is on " + backend_name(backend) + " (" +
                       describe(parameters, 0) + ") but " + communicator_name(comm) +
                       " moves host buffers only: device gradients need the nccl communicator "
                       "(Communicator::world_for(Backend::Cuda), a build with RIFTCO_NCCL); they are not copied "
                       "through the host");
  }
  return backend;
}

void throw_mismatch(bool shape_differs, const std::string& message) {
  if (shape_differs) throw ShapeError(message);
  throw BackendError(message);
}

}  // namespace riftco_transformer::distributed_detail
