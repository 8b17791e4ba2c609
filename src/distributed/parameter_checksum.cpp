// parameter_checksum / check_parameters_identical: the cheap test that data
// parallelism kept every rank's parameters bit-identical.
#include <cstdio>
#include <string>
#include <vector>

#include "../tensor/hash.hpp"
#include "gather_words.hpp"
#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {
namespace {

std::string hex(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

std::uint64_t parameter_checksum(std::span<const Variable> parameters) {
  detail::Hash64 hash;
  for (const Variable& p : parameters) {
    const Tensor& value = p.value();
    // The shape (rank and sizes), then the value bytes.
    hash.update({}, value.backend() == Backend::Cpu ? value : value.to(Backend::Cpu));
  }
  return hash.digest();
}

void check_parameters_identical(Communicator& comm, std::span<const Variable> parameters, std::int64_t step,
                                std::string_view op) {
  const std::uint64_t mine = parameter_checksum(parameters);
  const std::vector<std::uint64_t> sums = distributed_detail::all_gather_words(comm, {&mine, 1});
  std::string differ;
  for (std::size_t r = 1; r < sums.size(); ++r) {
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
