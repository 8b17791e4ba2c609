#pragma once
// Decode attention against a K/V cache on the device: backend/cpu/decode_attention.hpp's signature.
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cuda {

/// q (H, D); caches (G, capacity, D), the first `length` rows valid; returns (H, D).
Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values, std::int64_t length);

}  // namespace riftco_transformer::cuda
