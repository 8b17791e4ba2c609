// parameter_checksum / check_parameters_identical: the cheap test that data
// parallelism kept every rank's parameters bit-identical.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {
namespace {

constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr std::uint64_t kFnvPrime = 0x100000001b3ULL;

void mix(std::uint64_t& hash, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= kFnvPrime;
  }
}

std::string hex(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

std::uint64_t parameter_checksum(std::span<const Variable> parameters) {
  std::uint64_t hash = kFnvOffset;
  for (const Variable& p : parameters) {
    const Tensor& value = p.value();
    for (const std::int64_t d : value.shape()) mix(hash, &d, sizeof d);
    if (value.backend() != Backend::Cpu) {
      const Tensor host = value.to(Backend::Cpu);
      mix(hash, host.values().data(), host.values().size_bytes());
    } else {
      mix(hash, value.values().data(), value.values().size_bytes());
    }
  }
  return hash;
}

void check_parameters_identical(Communicator& comm, std::span<const Variable> parameters, std::int64_t step,
                                std::string_view op) {
  const std::uint64_t mine = parameter_checksum(parameters);
  // Four 16-bit pieces, each exact as a float: the communicator moves floats.
  float pieces[4];
  for (int i = 0; i < 4; ++i) pieces[i] = static_cast<float>((mine >> (16 * i)) & 0xFFFFU);
  const auto world = static_cast<std::size_t>(comm.world_size());
  std::vector<float> all(4 * world);
  comm.all_gather(std::span<const float>(pieces, 4), std::span<float>(all));
  std::vector<std::uint64_t> sums(world, 0);
  for (std::size_t r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < 4; ++i) sums[r] |= static_cast<std::uint64_t>(all[4 * r + i]) << (16 * i);
  }
  std::string differ;
  for (std::size_t r = 1; r < world; ++r) {
    if (sums[r] == sums[0]) continue;
    differ += (differ.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " differs from rank 0: " +
              hex(sums[r]) + " vs " + hex(sums[0]);
  }
  if (!differ.empty()) {
    throw CommunicationError("[" + std::string(op) + "] step " + std::to_string(step) +
                             ": parameters differ across ranks (" + differ +
                             "); data-parallel ranks must stay bit-identical");
  }
}

}  // namespace riftco_transformer
