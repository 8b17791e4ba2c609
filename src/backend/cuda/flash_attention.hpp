#pragma once
// FlashAttention-2 style causal attention on CUDA: the signatures of
// backend/cpu/flash_attention.hpp (views and lse are device memory). The
// forward runs one block per (b, h, query tile) with an online softmax and
// saves one log-sum-exp per row; the backward recomputes the scores tile by
// tile in two kernels (dK/dV per key tile, dQ per query tile), so no output
// element is accumulated by atomics. `tiles` is ignored: the GPU tile sizes
// follow from D (flash_attention.cu).
#include <cstdint>

#include "../cpu/flash_attention.hpp"  // FlashTiles, HeadView, MutableHeadView
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cuda {

using cpu::FlashTiles;
using cpu::HeadView;
using cpu::MutableHeadView;

void flash_attention_forward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                             HeadView v, MutableHeadView out, float* lse, float scale, FlashTiles tiles);

void flash_attention_backward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                              HeadView v, HeadView out, HeadView d_out, const float* lse, MutableHeadView dq,
                              MutableHeadView dk, MutableHeadView dv, float scale, FlashTiles tiles);

Tensor flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale, FlashTiles tiles,
                               Tensor& lse);

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& d_out, float scale, FlashTiles tiles, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace riftco_transformer::cuda
