#pragma once
// 64-bit words through the float collectives: checksums, counts and random
// generator states that the ranks compare or save. Private to the layers
// above (distributed, train).
#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/distributed.hpp"

namespace riftco_transformer::distributed_detail {

/// Every rank's `words`, in rank order (world_size × words.size(); one
/// all-gather). Each word travels as four 16-bit pieces, each exact as a
/// float. Every rank passes the same number of words.
std::vector<std::uint64_t> all_gather_words(Communicator& comm, std::span<const std::uint64_t> words);

}  // namespace riftco_transformer::distributed_detail
