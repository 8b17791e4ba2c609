#pragma once
// FlashAttention-2 style causal attention on the CPU (no autograd).
//
// q, k, v, out, dq, dk, dv are contiguous (B, H, T, D); lse is (B, H, T).
// Only tile-sized scratch is allocated (never a T×T matrix). Parallel over
// independent work items with static OpenMP partitioning; every output
// element is produced by one thread in a fixed order, so results are
// bit-identical for a fixed thread count (in fact for any thread count).
#include <cstdint>

#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cpu {

/// Rows of queries and keys processed per tile. Exposed so tests can force
/// many tiles on small T.
struct FlashTiles {
  std::int64_t query_rows = 64;
  std::int64_t key_rows = 64;
};

/// 64 query rows and 64 key rows; while query_rows·key_rows·D exceeds 2^18
/// the key rows, then the query rows, are halved (down to 16), so every tile
/// GEMM stays at or below OpenBLAS's threading threshold (M·N·K <= 65536·4)
/// and runs on the calling OpenMP thread: 64×64 up to D = 64, 64×32 at
/// D = 128, 64×16 at D = 256.
FlashTiles flash_default_tiles(std::int64_t head_width);

/// out = softmax(causal(q kᵀ · scale)) v; writes lse (B, H, T) = the
/// log-sum-exp of each query row's scaled, masked scores.
Tensor flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale, FlashTiles tiles,
                               Tensor& lse);

/// Gradients of the forward above given d_out, recomputing scores and
/// probabilities tile by tile from q, k, lse. dq, dk, dv are allocated here.
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& d_out, float scale, FlashTiles tiles, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace riftco_transformer::cpu
