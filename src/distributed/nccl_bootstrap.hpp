#pragma once
// Internal: what the NCCL communicator needs before NCCL starts, over any
// Communicator (the MPI one under mpirun), so all of it builds and is tested
// without CUDA or NCCL: the ncclUniqueId's bytes broadcast as floats, each
// rank's place among the ranks of its host, the device each rank takes, and
// the wait limit. nccl_bootstrap.cpp; the NCCL communicator itself is
// nccl_communicator.cpp (RIFTCO_NCCL builds only).
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/distributed.hpp"

namespace riftco_transformer::distributed_detail {

/// Each byte as a float (0 .. 255, exact), so bytes travel through the
/// float collectives.
std::vector<float> bytes_as_floats(std::span<const unsigned char> bytes);
/// The inverse: a CommunicationError naming `op` when a value is not a whole
/// number in [0, 255] or the sizes differ.
void floats_as_bytes(std::span<const float> values, std::span<unsigned char> bytes, const char* op);
/// Every rank's `bytes` become rank `root`'s (one broadcast over `comm`;
/// every rank passes the same size). The ncclUniqueId's exchange.
void broadcast_bytes(Communicator& comm, std::span<unsigned char> bytes, int root);

/// Bytes of a host name compared by local_placement (longer names are cut).
constexpr std::size_t kHostNameBytes = 256;

/// This rank's place among the ranks that run on its host.
struct LocalPlacement {
  int local_rank = 0;  ///< ranks before this one (in rank order) on the same host
  int local_size = 1;  ///< ranks on this host
  std::string host;    ///< this rank's host name
};
/// Collective (one all_gather_words over `comm`): ranks whose `host` names
/// are equal share a host.
LocalPlacement local_placement(Communicator& comm, std::string_view host);
/// gethostname(), or "localhost" when it fails.
std::string this_host_name();

/// The CUDA device of a rank: its local rank. A BackendError naming the
/// rank, the host, its ranks and its devices when the host has more ranks
/// than devices (NCCL needs a device per rank).
int device_for_rank(const LocalPlacement& placement, int device_count, int rank, int world);
/// Collective (one all_reduce over `comm`): device_for_rank on every rank,
/// and when any rank has none, a BackendError on every rank (the ranks
/// without a device say why; the others how many ranks have none), so no
/// rank goes on to wait in NCCL's initialization for the others.
int agree_on_device(Communicator& comm, const LocalPlacement& placement, int device_count);

/// RIFTCO_NCCL_WAIT_TIMEOUT (seconds, default 600, validated like
/// RIFTCO_MPI_WAIT_TIMEOUT): how long any wait on an NCCL collective may take.
double nccl_wait_limit();

/// The NCCL communicator over Communicator::world(), created on the first
/// call and never destroyed (nccl_communicator.cpp; RIFTCO_NCCL builds only).
Communicator& nccl_world();

}  // namespace riftco_transformer::distributed_detail
