#pragma once
// Data parallelism over a Communicator (docs/distributed.md): the gradient
// average every rank applies before the optimizer step, and the check that
// every rank still holds the same parameters. The distributed layer: knows
// Variables and Tensors, not models or files.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

/// Averages gradients over the ranks of `comm`: afterwards gradients[i] is
/// (sum over ranks r, in rank order, of rank r's gradients[i]) / world_size,
/// the same bits on every rank. One gradient per parameter, in the same
/// order on every rank. An undefined gradient counts as zeros of its
/// parameter's shape (a rank whose rows had no real targets) and comes back
/// defined when any rank had one; undefined on every rank, it stays
/// undefined (Adam skips the parameter, as one process would). Outputs are
/// new tensors on the parameters' backend: the inputs' storage is not
/// written. Checks (before any communication) that there is one gradient
/// per parameter and that each defined one is of its parameter's shape on
/// the parameters' backend (ShapeError / BackendError naming the
/// parameter), and that `comm` reduces that backend (a BackendError naming
/// both: a CPU model on the nccl communicator, a CUDA model on the mpi one
/// at world size > 1). Every rank must call it with the same parameters; a
/// failing collective is a CommunicationError. One all-reduce over the
/// flattened gradients (and one flag per parameter) in a buffer on the
/// parameters' backend: a CUDA model's over NCCL, without a host copy.
void synchronize_gradients(Communicator& comm, std::span<const Variable> parameters, std::vector<Tensor>& gradients);

/// A 64-bit hash (the checkpoints' Hash64) of every parameter's shape and
/// value bytes, in order: equal on two ranks exactly when their parameters
/// are bit-identical (up to hash collisions).
std::uint64_t parameter_checksum(std::span<const Variable> parameters);

/// Compares parameter_checksum across the ranks (one all-gather of 4 floats
/// per rank). A mismatch is a CommunicationError on every rank, naming `op`,
/// `step`, the ranks whose parameters differ from rank 0's and the
/// checksums: "[pretraining] step 40: parameters differ across ranks (rank 1
/// differs from rank 0: 0123... vs 4567...)".
void check_parameters_identical(Communicator& comm, std::span<const Variable> parameters, std::int64_t step,
                                std::string_view op);

}  // namespace riftco_transformer
