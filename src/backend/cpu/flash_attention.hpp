#pragma once
// FlashAttention-2 style causal attention on the CPU (no autograd).
//
// Tensor entry points take contiguous (B, H, T, D) q, k, v, out, dq, dk, dv
// and lse (B, H, T). The strided entry points take any layout whose rows of
// one head are D contiguous floats (e.g. heads packed side by side in a
// (B, T, 3C) projection output), so callers need no permute copies. Only
// per-thread scratch proportional to T·D is allocated (never a T×T matrix).
// Parallel over (b, h) pairs handed out dynamically to OpenMP threads; every output
// element is produced by one thread in a fixed order, so results are
// bit-identical for any thread count.
#include <cstdint>

#include "../kernel_types.hpp"
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cpu {

/// Rows of queries and keys processed per tile (tests force many tiles on
/// small T) and the strided (B, H, T, D) views: backend/kernel_types.hpp.
using backend::FlashTiles;
using backend::HeadView;
using backend::MutableHeadView;

/// The pair kernels' instruction set: 16-lane AVX-512F + FMA, 8-lane AVX2 +
/// FMA, or the baseline (8-lane vectors as SSE pairs, every fused
/// multiply-add a libm fmaf call: slow, for CPUs without FMA). All give the
/// same bits (explicit fused multiply-adds in the same order everywhere).
enum class FlashBuild : std::uint8_t { Auto, Baseline, Avx2, Avx512 };

/// Whether this CPU runs `build` (Auto and Baseline: always).
bool flash_build_supported(FlashBuild build);

/// Auto (the default) runs the widest supported build; tests force one
/// (ValueError for a build this CPU lacks, or an unknown value).
void flash_force_build(FlashBuild build);

/// 64 query rows and 64 key rows; while query_rows·key_rows·D exceeds 2^18
/// the key rows, then the query rows, are halved (down to 16), which keeps a
/// tile's scores and operands in L1/L2: 64×64 up to D = 64, 64×32 at
/// D = 128, 64×16 at D = 256.
FlashTiles flash_default_tiles(std::int64_t head_width);

/// out = softmax(causal(q kᵀ · scale)) v; writes lse (B, H, T), contiguous,
/// = the log-sum-exp of each query row's scaled, masked scores.
void flash_attention_forward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                             HeadView v, MutableHeadView out, float* lse, float scale, FlashTiles tiles);

/// Gradients of the forward above given d_out, recomputing scores and
/// probabilities tile by tile from q, k, lse. Writes (not adds) every
/// element of dq, dk and dv.
void flash_attention_backward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                              HeadView v, HeadView out, HeadView d_out, const float* lse, MutableHeadView dq,
                              MutableHeadView dk, MutableHeadView dv, float scale, FlashTiles tiles);

/// Tensor form over contiguous (B, H, T, D): returns out, allocates lse.
Tensor flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale, FlashTiles tiles,
                               Tensor& lse);

/// Tensor form: dq, dk, dv are allocated here.
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& d_out, float scale, FlashTiles tiles, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace riftco_transformer::cpu
