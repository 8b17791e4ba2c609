// The NCCL communicator's bootstrap over any Communicator (nccl_bootstrap.hpp),
// and make_nccl_communicator's refusal in a build without NCCL.
#include "nccl_bootstrap.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "collective_checks.hpp"
#include "gather_words.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer::distributed_detail {

std::vector<float> bytes_as_floats(std::span<const unsigned char> bytes) {
  return std::vector<float>(bytes.begin(), bytes.end());
}

void floats_as_bytes(std::span<const float> values, std::span<unsigned char> bytes, const char* op) {
  if (values.size() != bytes.size()) {
    throw CommunicationError(std::string("[") + op + "] " + std::to_string(values.size()) + " values for " +
                             std::to_string(bytes.size()) + " bytes");
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (!(v >= 0.0F && v <= 255.0F) || std::floor(v) != v) {
      throw CommunicationError(std::string("[") + op + "] value " + std::to_string(i) + " is " + std::to_string(v) +
                               ", not a byte: the exchange was corrupted");
    }
    bytes[i] = static_cast<unsigned char>(v);
  }
}

void broadcast_bytes(Communicator& comm, std::span<unsigned char> bytes, int root) {
  std::vector<float> values = bytes_as_floats(bytes);
  comm.broadcast(std::span<float>(values), root);
  floats_as_bytes(values, bytes, "broadcast_bytes");
}

LocalPlacement local_placement(Communicator& comm, std::string_view host) {
  constexpr std::size_t kWords = kHostNameBytes / sizeof(std::uint64_t);
  std::vector<std::uint64_t> mine(kWords, 0);
  std::memcpy(mine.data(), host.data(), std::min(host.size(), kHostNameBytes));
  const std::vector<std::uint64_t> all = all_gather_words(comm, mine);
  LocalPlacement placement;
  placement.host = std::string(host);
  placement.local_size = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm.world_size()); ++r) {
    if (!std::equal(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(r * kWords))) continue;
    if (static_cast<int>(r) < comm.rank()) ++placement.local_rank;
    ++placement.local_size;
  }
  return placement;
}

std::string this_host_name() {
  char name[kHostNameBytes + 1] = {};
  if (gethostname(name, kHostNameBytes) != 0) return "localhost";
  return name;
}

int device_for_rank(const LocalPlacement& placement, int device_count, int rank, int world) {
  if (placement.local_size > device_count) {
    throw BackendError("[nccl] rank " + std::to_string(rank) + " of " + std::to_string(world) + ": host '" +
                       placement.host + "' runs " + std::to_string(placement.local_size) + " ranks but has " +
                       std::to_string(device_count) +
                       " CUDA device(s) visible; the nccl communicator needs one device per rank (start at most " +
                       std::to_string(device_count) + " ranks per host, e.g. mpirun -np " +
                       std::to_string(device_count) + ")");
  }
  return placement.local_rank;
}

int agree_on_device(Communicator& comm, const LocalPlacement& placement, int device_count) {
  int device = -1;
  std::string why;
  try {
    device = device_for_rank(placement, device_count, comm.rank(), comm.world_size());
  } catch (const BackendError& e) {
    why = e.what();
  }
  float failed = device < 0 ? 1.0F : 0.0F;
  comm.all_reduce_sum(std::span<float>(&failed, 1));
  if (!why.empty()) throw BackendError(why);
  if (failed > 0.0F) {
    throw BackendError("[nccl] rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.world_size()) +
                       ": " + std::to_string(static_cast<int>(failed)) +
                       " rank(s) have no CUDA device of their own (their message is on their standard error); "
                       "every rank stops");
  }
  return device;
}

double nccl_wait_limit() { return seconds_from_environment("RIFTCO_NCCL_WAIT_TIMEOUT", 600.0); }

}  // namespace riftco_transformer::distributed_detail

namespace riftco_transformer {

#ifndef RIFTCO_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host) {
  throw BackendError("[nccl] rank " + std::to_string(host.rank()) + " of " + std::to_string(host.world_size()) +
                     ": the nccl communicator is not built in this package (configure with -DRIFTCO_CUDA=ON "
                     "-DRIFTCO_NCCL=ON where nccl.h and libnccl are installed)");
}
#endif

}  // namespace riftco_transformer
