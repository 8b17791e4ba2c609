#pragma once
// Internal: the MPI communicator (mpi_communicator.cpp, built with MPI only).
#include "riftco_transformer/distributed.hpp"

namespace riftco_transformer::distributed_detail {

/// Whether an MPI launcher started this process (its environment variables).
bool launched_by_mpi();
/// The MPI_COMM_WORLD communicator; initializes MPI on first use.
Communicator& mpi_world();

}  // namespace riftco_transformer::distributed_detail
