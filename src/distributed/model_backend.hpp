#pragma once
// The backend a data-parallel path (GradientBucketer, ShardedAdam,
// synchronize_gradients) packs and reduces on: the parameters' own, checked
// against the communicator before anything changes (docs/distributed.md,
// "Data parallelism on CUDA tensors").
#include <span>
#include <string>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/variable.hpp"

namespace riftco_transformer::distributed_detail {

/// The backend every parameter lives on; flat buffers are made there and
/// filled with that backend's kernels. BackendErrors naming `op`, both
/// sides and the rank:
///  - parameters on two backends (naming the first pair that differs);
///  - a CPU model on a device communicator (accepts(Backend::Cuda): the nccl
///    one): its gradients go over Communicator::world();
///  - a CUDA model on a communicator that moves host buffers only (mpi) at
///    world size > 1: device gradients need the nccl communicator and are
///    never copied through the host. At world size 1 every communicator takes
///    device tensors (each collective is a copy on the device).
/// No parameters: the communicator's device backend (CUDA for the nccl one),
/// else the CPU.
Backend model_backend(const Communicator& comm, std::span<const Variable> parameters, const char* op);

/// A tensor that does not fit the layout (a gradient, an accumulated sum, a
/// moment, a parameter since resized or moved): a ShapeError when its size
/// or shape differs, else (the backend differs) a BackendError, with
/// `message` naming both sides.
[[noreturn]] void throw_mismatch(bool shape_differs, const std::string& message);

}  // namespace riftco_transformer::distributed_detail
