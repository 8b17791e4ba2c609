#pragma once
// CPU kernels over Tensors (no autograd). Loops use OpenMP with static
// partitioning and no cross-thread reductions whose order depends on timing,
// so results are bit-identical for a fixed thread count.
#include <cstdint>
#include <span>
#include <vector>

#include "../kernel_types.hpp"
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cpu {

// ---- BLAS -----------------------------------------------------------------
/// C(M,N) = alpha * op(A) op(B) + beta * C, row-major; op transposes when set.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

/// The kernel set OpenBLAS runs ("Haswell", "Cooperlake", ...: its own
/// choice, or OPENBLAS_CORETYPE's), for benchmark reports.
const char* blas_core_name();

/// One product for gemm_group, with gemm's arguments (backend/kernel_types.hpp).
using backend::GemmProblem;
/// Several independent products in one parallel region. Each chain is a
/// list of products over the same C (same M, N, c, ldc; e.g. Σ_i A_i B_i with
/// beta 0 then 1) that run in order; different chains write disjoint C.
/// Every chain is cut into blocks exactly as gemm() cuts it alone, so the
/// bits equal one gemm() call per product in chain order; blocks of all
/// chains are handed out to threads together (one barrier, better balance).
void gemm_group(std::span<const std::span<const GemmProblem>> chains);

/// Batched matmul: a (batch.., M, K) [or (.., K, M) when trans_a], b either
/// 2-D (K, N) [(N, K)] shared by every batch or with the same batch dims.
/// Shapes are validated by the op front-end.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

// ---- elementwise ----------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);  // same shape
void add_inplace(Tensor& a, const Tensor& b);  // a += b, same shape
void axpy_inplace(Tensor& y, float alpha, const Tensor& x);  // y += alpha * x
Tensor scale(const Tensor& a, float s);

using backend::BinaryOp;  // Add, Sub, Mul
/// Numpy broadcasting; `out_shape` is the broadcast shape.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape);
/// Sums `grad` (broadcast shape) down to `shape` (the input's shape).
Tensor reduce_to_shape(const Tensor& grad, const Shape& shape);
/// Σ of every element, serially in double (the same bits for any thread
/// count).
double sum_all(const Tensor& x);

// ---- layout ---------------------------------------------------------------
/// out[i_perm...] = in[i...]: out dim d is in dim perm[d].
Tensor permute(const Tensor& in, std::span<const std::int64_t> perm);
/// x (..., N) with delta (..., W) added to columns [offset, offset + W) of
/// every row (a new buffer; x is not written).
Tensor add_columns(const Tensor& x, const Tensor& delta, std::int64_t offset);
/// Columns [offset, offset + width) of every row of x (..., N): (..., width).
Tensor take_columns(const Tensor& x, std::int64_t offset, std::int64_t width);
/// x (B, G, T, D) → (B, G·groups, T, D): head g copied to heads
/// g·groups … g·groups + groups − 1 (grouped-query attention).
Tensor repeat_heads(const Tensor& x, std::int64_t groups);
/// The backward: g (B, G·groups, T, D) summed over each head's copies, in
/// copy order (deterministic) → (B, G, T, D).
Tensor repeat_heads_backward(const Tensor& g, std::int64_t groups);

// ---- activations (elementwise) -------------------------------------------
using backend::Activation;  // Silu, Gelu
Tensor activation_forward(Activation act, const Tensor& x);
/// dx = g * act'(x).
Tensor activation_backward(Activation act, const Tensor& x, const Tensor& g);
/// out = silu(gate) * up.
Tensor swiglu_forward(const Tensor& gate, const Tensor& up);
/// d_gate, d_up given g.
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& g, Tensor& d_gate, Tensor& d_up);
/// gate_up (..., 2F) holds gate in its first F columns and up in the last F:
/// returns silu(gate) * up (..., F), the same per-element formula as above.
Tensor swiglu_packed_forward(const Tensor& gate_up);
/// d gate_up (..., 2F) given g (..., F).
Tensor swiglu_packed_backward(const Tensor& gate_up, const Tensor& g);
/// The same, in place: d (..., 2F) holds g in columns [0, F) of each row on
/// entry and d gate_up on return (same bits).
void swiglu_packed_backward_inplace(const Tensor& gate_up, Tensor& d);
/// d gate_up written over gate_up, g (..., F) read whole.
void swiglu_packed_backward_over(Tensor& gate_up, const Tensor& g);

// ---- normalization --------------------------------------------------------
/// y = x * rstd * w per row of length C; rstd (rows) is returned for backward.
Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd);
/// dx and dw (dw summed over rows in row order per column).
void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx, Tensor& dw,
                       bool need_dx, bool need_dw);

// ---- softmax / mask -------------------------------------------------------
Tensor softmax_forward(const Tensor& x);  // last axis
/// dx = y * (g - sum(g * y)) per row.
Tensor softmax_backward(const Tensor& y, const Tensor& g);
/// Copy with entries j > i + offset of each (Tq, Tk) matrix set to `fill`.
Tensor causal_fill(const Tensor& x, std::int64_t offset, float fill);

// ---- dropout --------------------------------------------------------------
/// backend/philox.hpp's mask of `shape` (dropout.cpp).
Tensor dropout_mask(const Shape& shape, std::uint64_t seed, float p, float keep_scale);

// ---- rotary embedding -----------------------------------------------------
/// x (..., T, D): rotate pairs (2i, 2i+1) by angle (offset + t) * theta_i.
/// inverse = true rotates by the negative angle (the backward).
Tensor rope_apply(const Tensor& x, std::int64_t offset, float base, bool inverse);
/// Rows (b, t) of `width` floats (width/D heads of D side by side) at
/// src + (b·T + t)·src_stride, rotated like rope_apply at offset 0 into
/// dst + (b·T + t)·dst_stride. src == dst (in place) is allowed.
void rope_packed(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride, std::int64_t batch,
                 std::int64_t t, std::int64_t width, std::int64_t d, float base, bool inverse);

// ---- embedding ------------------------------------------------------------
Tensor embedding_forward(const Tensor& weight, std::span<const std::int32_t> ids, const Shape& out_shape);
/// dW[ids[i]] += g[i], in row order (deterministic).
Tensor embedding_backward(const Shape& weight_shape, std::span<const std::int32_t> ids, const Tensor& g);

// ---- cross-entropy --------------------------------------------------------
/// logits (N, V): returns the mean loss over rows whose target != ignore and
/// writes softmax probabilities (N, V) to `probs` for the backward; `count`
/// receives the number of counted rows.
float cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets, std::int32_t ignore,
                            Tensor& probs, std::int64_t& count);
/// d logits = (probs - onehot) * g / count on counted rows, 0 elsewhere.
Tensor cross_entropy_backward(const Tensor& probs, std::span<const std::int32_t> targets, std::int32_t ignore,
                              std::int64_t count, float g);

// ---- optimizer ------------------------------------------------------------
/// Σ x² over every span, accumulated in double. The spans are cut into fixed
/// chunks whose partial sums are added in order, so the result does not
/// depend on the thread count.
double sum_of_squares(std::span<const std::span<const float>> spans);
/// sum_of_squares's terms: one double per chunk, in order.
std::vector<double> sum_of_squares_partials(std::span<const std::span<const float>> spans);

/// One Adam(W) update over a parameter and the step's coefficients
/// (formula: backend/kernel_types.hpp).
using backend::AdamCoefficients;
using backend::AdamUpdate;
/// Applies the update to every parameter in one parallel pass (elementwise:
/// the bits do not depend on the thread count).
void adam_update(std::span<const AdamUpdate> params, const AdamCoefficients& c);

/// True when no value is NaN or ±inf (names the culprit when the gradient
/// norm is not finite).
bool all_finite(std::span<const float> values);

// ---- flat buffers -----------------------------------------------------------
/// dst[i] = src[i] (no overlap).
void copy_values(const float* src, float* dst, std::int64_t n);
/// dst[i] = value.
void fill_values(float* dst, std::int64_t n, float value);
/// dst[i] = src[i] / divisor (IEEE division; src may equal dst).
void divide_values(const float* src, float* dst, std::int64_t n, float divisor);

}  // namespace riftco_transformer::cpu
