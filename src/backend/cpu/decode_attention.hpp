#pragma once
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cpu {

/// One query position against a K/V cache: q (H, D); caches (G, capacity, D)
/// of which the first `length` rows are valid, G dividing H (query head h
/// reads cache head h / (H / G): grouped-query attention). Returns (H, D).
Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values, std::int64_t length);

/// Writes rows (G, 1, D) (or (G, D)) into row `position` of each head of a
/// cache (G, capacity, D).
void cache_write(Tensor& cache, const Tensor& rows, std::int64_t position);

}  // namespace riftco_transformer::cpu
