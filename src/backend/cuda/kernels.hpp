#pragma once
// CUDA kernels over Tensors (no autograd): the same functions, signatures and
// math as backend/cpu/kernels.hpp, in namespace cuda. Every Tensor argument
// and result is a cuda tensor and every raw pointer a device pointer; spans
// of ids and targets are host memory (copied to the device here). A Tensor
// argument on another backend is a BackendError naming the kernel.
//
// All work runs on the legacy default stream (ordered with every copy and
// with the caching allocator's reuse of freed blocks). Reductions use fixed
// trees and fixed loop orders (no atomics), so a kernel gives the same bits
// every run on the same device. Matrix products go through cuBLAS with TF32
// off unless RIFTCO_CUDA_TF32=1 (docs/cuda.md).
#include <cstdint>
#include <span>

#include "../cpu/kernels.hpp"  // the argument types shared by every backend
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cuda {

using cpu::Activation;
using cpu::AdamCoefficients;
using cpu::AdamUpdate;
using cpu::BinaryOp;
using cpu::GemmProblem;

// ---- BLAS (cuBLAS) ------------------------------------------------------------
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);
void gemm_group(std::span<const std::span<const GemmProblem>> chains);
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
/// Whether cuBLAS may use TF32 tensor cores (RIFTCO_CUDA_TF32=1; off by default).
bool tf32_enabled();

// ---- elementwise ----------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
void add_inplace(Tensor& a, const Tensor& b);
void axpy_inplace(Tensor& y, float alpha, const Tensor& x);
Tensor scale(const Tensor& a, float s);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape);
Tensor reduce_to_shape(const Tensor& grad, const Shape& shape);
/// Σ of every element in double (fixed chunks, fixed trees, chunk sums added in order on the host).
double sum_all(const Tensor& x);

// ---- layout ---------------------------------------------------------------------
Tensor permute(const Tensor& in, std::span<const std::int64_t> perm);
Tensor add_columns(const Tensor& x, const Tensor& delta, std::int64_t offset);
Tensor take_columns(const Tensor& x, std::int64_t offset, std::int64_t width);
Tensor repeat_heads(const Tensor& x, std::int64_t groups);
Tensor repeat_heads_backward(const Tensor& g, std::int64_t groups);

// ---- activations ----------------------------------------------------------------
Tensor activation_forward(Activation act, const Tensor& x);
Tensor activation_backward(Activation act, const Tensor& x, const Tensor& g);
Tensor swiglu_forward(const Tensor& gate, const Tensor& up);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& g, Tensor& d_gate, Tensor& d_up);
Tensor swiglu_packed_forward(const Tensor& gate_up);
Tensor swiglu_packed_backward(const Tensor& gate_up, const Tensor& g);
void swiglu_packed_backward_inplace(const Tensor& gate_up, Tensor& d);
/// d gate_up written over gate_up, g (..., F) read whole.
void swiglu_packed_backward_over(Tensor& gate_up, const Tensor& g);

// ---- normalization --------------------------------------------------------------
Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd);
void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx, Tensor& dw,
                       bool need_dx, bool need_dw);

// ---- softmax / mask -------------------------------------------------------------
Tensor softmax_forward(const Tensor& x);
Tensor softmax_backward(const Tensor& y, const Tensor& g);
Tensor causal_fill(const Tensor& x, std::int64_t offset, float fill);

// ---- dropout --------------------------------------------------------------------
/// The same Philox mask as the CPU's (backend/philox.hpp), made on the device.
Tensor dropout_mask(const Shape& shape, std::uint64_t seed, float p, float keep_scale);

// ---- rotary embedding -----------------------------------------------------------
Tensor rope_apply(const Tensor& x, std::int64_t offset, float base, bool inverse);
void rope_packed(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride, std::int64_t batch,
                 std::int64_t t, std::int64_t width, std::int64_t d, float base, bool inverse);

// ---- embedding ------------------------------------------------------------------
Tensor embedding_forward(const Tensor& weight, std::span<const std::int32_t> ids, const Shape& out_shape);
Tensor embedding_backward(const Shape& weight_shape, std::span<const std::int32_t> ids, const Tensor& g);

// ---- cross-entropy --------------------------------------------------------------
float cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets, std::int32_t ignore,
                            Tensor& probs, std::int64_t& count);
Tensor cross_entropy_backward(const Tensor& probs, std::span<const std::int32_t> targets, std::int32_t ignore,
                              std::int64_t count, float g);

// ---- optimizer ------------------------------------------------------------------
/// Spans of device floats; fixed chunks, each summed in double by a fixed
/// tree, the chunk sums added in order on the host.
double sum_of_squares(std::span<const std::span<const float>> spans);
/// Its terms: one double per chunk, in order (copied to the host).
std::vector<double> sum_of_squares_partials(std::span<const std::span<const float>> spans);
/// The AdamUpdate pointers are device pointers.
void adam_update(std::span<const AdamUpdate> params, const AdamCoefficients& c);
/// No NaN or ±inf among `values` (device floats).
bool all_finite(std::span<const float> values);

// ---- flat buffers (device pointers, the legacy default stream) --------------------
void copy_values(const float* src, float* dst, std::int64_t n);
void fill_values(float* dst, std::int64_t n, float value);
/// dst[i] = src[i] / divisor: an IEEE-rounded division (nvcc's default -prec-div=true).
void divide_values(const float* src, float* dst, std::int64_t n, float divisor);

}  // namespace riftco_transformer::cuda
