#pragma once
// Fused ops the transformer block uses on its hot path (private to the
// library: src/model includes this header). Each has a composite reference
// it is tested against (tests/cpp/test_fused_ops.cpp):
//
//   linear_packed(x, {W0, W1, ...})   ≡ [linear(x, W0) | linear(x, W1) | ...]
//                                        side by side in one (..., Σ out_i)
//                                        tensor (no weight copies)
//   norm_linear_packed(h, n, eps, Ws)  ≡ linear_packed(rms_norm(h, n, eps), Ws),
//                                        the normalized input recomputed in
//                                        the backward instead of kept
//   linear_residual(r, x, W)           ≡ add(r, linear(x, W)); the projection
//                                        itself is not kept
//   swiglu_linear_residual(r, gu, W)   ≡ add(r, linear(swiglu_packed(gu), W));
//                                        swiglu(gu) recomputed in the backward
//   add_columns(x, d, offset)          ≡ x with d added to columns
//                                        [offset, offset + d.cols)
//   rope_attention_packed(qkv, H)      ≡ split q, k, v (B, T, C) out of qkv,
//                                        split heads, rope(q), rope(k), flash
//                                        causal_attention, merge heads →
//                                        (B, T, C), with no permute copies
//   swiglu_packed(gu)                  ≡ swiglu(gu[..., :F], gu[..., F:])
//
// linear_residual and swiglu_linear_residual take `value_needed`: false
// builds the same node (same parents, same backward, same gradient bits)
// without computing its value, which is then all NaN (zeros on a device,
// where a NaN fill would be a host-to-device copy). Only a checkpoint
// replay's final op uses it: the replay's output value is never read.
#include <cstdint>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer::fused {

/// x (..., K) and weights W_i (out_i, K) → (..., Σ out_i) holding x W_iᵀ in
/// consecutive column ranges. One GEMM per weight writes its columns in
/// place; the backward accumulates dx over the weights in order and writes
/// each dW_i = g_iᵀ x directly.
Variable linear_packed(const Variable& x, const std::vector<Variable>& weights);

/// linear_packed(rms_norm(h, norm_weight, eps), weights) with the same bits,
/// keeping only h (a graph value anyway) and one rstd per row: the
/// normalized input is recomputed in the backward.
Variable norm_linear_packed(const Variable& h, const Variable& norm_weight, float eps,
                            const std::vector<Variable>& weights);

/// residual + x Wᵀ (W: (N, K), residual (..., N)) with the bits of
/// add(residual, linear(x, W)); the projection is never a tensor of its own:
/// each GEMM block adds the residual to its part of the output while it is
/// in cache (GemmProblem::addend). value_needed false: the GEMM and the add are skipped and the value
/// is not computed (see the top of this file).
Variable linear_residual(const Variable& residual, const Variable& x, const Variable& weight,
                         bool value_needed = true);

/// residual + swiglu_packed(gate_up) Wᵀ (gate_up (..., 2F), W (C, F)) with
/// the bits of add(residual, linear(swiglu_packed(gate_up), W)); keeps
/// gate_up only and recomputes the SwiGLU output in the backward.
/// value_needed false: SwiGLU, the GEMM and the add are skipped and the value
/// is not computed (see the top of this file).
Variable swiglu_linear_residual(const Variable& residual, const Variable& gate_up, const Variable& weight,
                                bool value_needed = true);

/// x (..., N) plus delta (..., n) on columns [offset, offset + n); the other
/// dims must match.
Variable add_columns(const Variable& x, const Variable& delta, std::int64_t offset);

/// qkv (B, T, 3C): each row is [q (C) | k (C) | v (C)], C = heads · D with
/// D even. Returns causal softmax(rope(q) rope(k)ᵀ / √D) v per head, heads
/// merged back: (B, T, C). Flash kernel: keeps the output and one
/// log-sum-exp per (b, h, t); the backward recomputes rope(q), rope(k) and
/// the probabilities tile by tile.
Variable rope_attention_packed(const Variable& qkv, std::int64_t heads, float rope_base = 10000.0F);

/// gate_up (..., 2F) → silu(gate_up[..., :F]) * gate_up[..., F:] (..., F).
Variable swiglu_packed(const Variable& gate_up);

}  // namespace riftco_transformer::fused
