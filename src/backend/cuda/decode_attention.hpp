#pragma once
// Decode attention against a K/V cache on the device: backend/cpu/decode_attention.hpp's signature.
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cuda {

/// q (H, D); caches (G, capacity, D), the first `length` rows valid; returns (H, D).
Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values, std::int64_t length);

/// rows (G, 1, D) into row `position` of each head of cache (G, capacity, D).
void cache_write(Tensor& cache, const Tensor& rows, std::int64_t position);

}  // namespace riftco_transformer::cuda
