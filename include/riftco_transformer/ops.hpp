#pragma once
// Differentiable functions over Variables. Each op validates and broadcasts
// in its front-end (errors start with "[op]" and carry the shapes), runs the
// forward kernel of its operands' backend (docs/backends.md) and records a
// backward closure beside it.
#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

// ---- linear algebra -------------------------------------------------------
/// a (..., M, K) @ b (..., K, N). b may be 2-D (shared by every batch) or have
/// exactly a's batch dims. transpose_a/b transpose the last two dims.
Variable matmul(const Variable& a, const Variable& b, bool transpose_a = false, bool transpose_b = false);
/// x (..., in) @ weightᵀ with weight (out, in) → (..., out); x may be 1-D
/// (in,) → (out,). ShapeError "[linear] x ... and weight ..." otherwise.
Variable linear(const Variable& x, const Variable& weight);

// ---- elementwise (numpy broadcasting) -------------------------------------
Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable scale(const Variable& a, float factor);
Variable silu(const Variable& x);
/// tanh approximation (GPT-2's).
Variable gelu(const Variable& x);
/// silu(gate) * up, same shapes.
Variable swiglu(const Variable& gate, const Variable& up);

// ---- reductions -----------------------------------------------------------
Variable sum(const Variable& x);   // all elements → scalar
Variable mean(const Variable& x);  // all elements → scalar

// ---- layout ---------------------------------------------------------------
Variable reshape(const Variable& x, const Shape& shape);
Variable transpose(const Variable& x, std::int64_t dim0, std::int64_t dim1);
Variable permute(const Variable& x, const std::vector<std::int64_t>& dims);
/// x (B, G, T, D) → (B, G·groups, T, D): head h of the result is head
/// h / groups of x (grouped-query attention shares each key/value head among
/// `groups` query heads). The backward sums the gradients of each group.
Variable repeat_heads(const Variable& x, std::int64_t groups);

// ---- transformer pieces ---------------------------------------------------
/// weight (V, C), ids with shape ids_shape → (ids_shape..., C). Backward
/// scatter-adds rows into the weight gradient.
Variable embedding(const Variable& weight, std::span<const std::int32_t> ids, const Shape& ids_shape);
/// x (..., C) * rsqrt(mean(x²) + eps) * weight (C).
Variable rms_norm(const Variable& x, const Variable& weight, float eps);
/// Softmax over the last axis. A row that is all -inf (every key masked)
/// gives zeros with a zero gradient, where PyTorch gives NaN: a fully masked
/// row contributes nothing instead of poisoning the result.
Variable softmax(const Variable& x);
/// scores (..., Tq, Tk): entries with key j > query i + offset become -inf
/// (offset = Tk - Tq when queries are the last Tq positions).
Variable causal_mask(const Variable& scores, std::int64_t offset = 0);
/// Rotary position embedding on x (..., T, D), D even, rotating pairs
/// (2i, 2i+1) by angle (position_offset + t) * base^(-2i/D). The positions
/// must lie in [0, 2^20), the model's context limit (ValueError otherwise).
Variable rope(const Variable& x, std::int64_t position_offset = 0, float base = 10000.0F);
/// Mean cross-entropy of logits (..., V) against targets (one per row);
/// rows whose target equals ignore_index are skipped. Fused log-softmax.
/// With no row left (every target ignored, or no rows) the loss is 0 with
/// zero gradients, where PyTorch's mean gives NaN: a batch without a real
/// target adds nothing (the pipelines weigh batches by their targets).
Variable cross_entropy(const Variable& logits, std::span<const std::int32_t> targets,
                       std::int32_t ignore_index = -100);
/// The target check cross_entropy makes (every target in [0, classes) or
/// ignore_index; ValueError naming `op`, the target and its row otherwise),
/// for callers that check before computing the logits (the model's loss,
/// which draws dropout masks in its forward).
void check_cross_entropy_targets(const char* op, std::span<const std::int32_t> targets, std::int64_t classes,
                                 std::int32_t ignore_index);

// ---- regularization -------------------------------------------------------
/// Inverted dropout: each element is zeroed with probability p (drawn from
/// `random` in element order) and the rest scaled by 1/(1-p). p = 0 returns x.
Variable dropout(const Variable& x, float p, Random& random);

}  // namespace riftco_transformer
