#pragma once
// Shared argument checks and index draws for the dataset samplers.
#include <cstdint>
#include <string>

#include "riftco_transformer/data.hpp"

namespace riftco_transformer::data_detail {

inline const char* split_name(Split split) { return split == Split::Train ? "train" : "validation"; }

inline void check_batch_shape(const char* op, std::int64_t batch, std::int64_t seq_len) {
  if (batch < 1 || seq_len < 1) {
    throw ValueError(std::string("[") + op + "] batch " + std::to_string(batch) + " and seq_len " +
                     std::to_string(seq_len) + " must both be at least 1");
  }
}

/// Uniform in [0, bound), bound >= 1; one random.below() when bound fits in
/// 32 bits (every realistic corpus), rejection on 64 bits otherwise.
inline std::uint64_t draw_index(Random& random, std::uint64_t bound) {
  if (bound <= 0xFFFFFFFFULL) return random.below(static_cast<std::uint32_t>(bound));
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  for (;;) {
    const std::uint64_t hi = random.next_u32();
    const std::uint64_t v = (hi << 32) | random.next_u32();
    if (v < limit) return v % bound;
  }
}

}  // namespace riftco_transformer::data_detail
