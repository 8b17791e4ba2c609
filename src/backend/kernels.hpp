#pragma once
// The backend interface: one table of kernels with the same signatures on
// every backend (ggml's backend tables, MLX's eval_cpu / eval_gpu pairs).
// Ops, autograd, Adam and decode call `kernels_for(op, operands...)` (or
// `kernels(backend)`) and never name cpu:: or cuda:: themselves.
//
// Every Tensor argument is a tensor of the table's backend, and every Tensor
// a kernel returns is allocated there. Raw pointers (gemm, rope_packed, the
// strided flash views, Adam) are addresses on that backend: take them with
// Tensor::device_data(). Host-side arguments are the ones typed as such:
// token ids and targets (std::span<const std::int32_t>), shapes, scalars,
// and the scalar results (cross-entropy loss, sum_all, sum_of_squares,
// all_finite), which every backend returns to the host.
//
// The CPU table (backend/cpu/cpu_kernels.cpp) forwards to the cpu::
// functions in backend/cpu/*.hpp; a CUDA build registers its table through
// cuda_kernels() (backend/cuda_stub.cpp returns null when it is not built).
// Kernels are deterministic for a fixed backend, shape and thread count.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernel_types.hpp"
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::backend {

class Kernels {
 public:
  Kernels() = default;
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;
  virtual ~Kernels() = default;

  /// The backend whose tensors these kernels read and write.
  virtual Backend backend() const = 0;

  // ---- BLAS ---------------------------------------------------------------
  /// C(M,N) = alpha · op(A) op(B) + beta · C, row-major.
  virtual void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                    std::int64_t ldc) const = 0;
  /// Chains of products; each chain runs in order over one C, chains write
  /// disjoint C (the bits of one gemm per product in chain order).
  virtual void gemm_group(std::span<const std::span<const GemmProblem>> chains) const = 0;
  /// Batched op(a) op(b); b is 2-D (shared) or has a's batch dims.
  virtual Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) const = 0;

  // ---- elementwise --------------------------------------------------------
  virtual Tensor add(const Tensor& a, const Tensor& b) const = 0;            // same shape
  virtual void add_inplace(Tensor& a, const Tensor& b) const = 0;            // a += b
  virtual void axpy_inplace(Tensor& y, float alpha, const Tensor& x) const = 0;  // y += alpha · x
  virtual Tensor scale(const Tensor& a, float s) const = 0;
  /// Numpy broadcasting into `out_shape`.
  virtual Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape) const = 0;
  /// Sums a broadcast gradient down to `shape`.
  virtual Tensor reduce_to_shape(const Tensor& grad, const Shape& shape) const = 0;
  /// Σ of every element in double, returned to the host.
  virtual double sum_all(const Tensor& x) const = 0;

  // ---- layout -------------------------------------------------------------
  /// out dim d is in dim perm[d].
  virtual Tensor permute(const Tensor& in, std::span<const std::int64_t> perm) const = 0;
  /// x (..., N) + delta (..., W) on columns [offset, offset + W).
  virtual Tensor add_columns(const Tensor& x, const Tensor& delta, std::int64_t offset) const = 0;
  /// Columns [offset, offset + width) of x (..., N).
  virtual Tensor take_columns(const Tensor& x, std::int64_t offset, std::int64_t width) const = 0;
  /// (B, G, T, D) → (B, G·groups, T, D) and its backward (sum over copies
  /// in copy order).
  virtual Tensor repeat_heads(const Tensor& x, std::int64_t groups) const = 0;
  virtual Tensor repeat_heads_backward(const Tensor& g, std::int64_t groups) const = 0;

  // ---- activations --------------------------------------------------------
  virtual Tensor activation_forward(Activation act, const Tensor& x) const = 0;
  /// dx = g · act'(x).
  virtual Tensor activation_backward(Activation act, const Tensor& x, const Tensor& g) const = 0;
  /// silu(gate) · up and its backward.
  virtual Tensor swiglu_forward(const Tensor& gate, const Tensor& up) const = 0;
  virtual void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& g, Tensor& d_gate,
                               Tensor& d_up) const = 0;
  /// gate_up (..., 2F) = [gate | up] → (..., F), and d gate_up given g.
  virtual Tensor swiglu_packed_forward(const Tensor& gate_up) const = 0;
  virtual Tensor swiglu_packed_backward(const Tensor& gate_up, const Tensor& g) const = 0;
  /// The same gradient written over its own input: d (..., 2F) holds g in
  /// columns [0, F) of each row on entry (columns [F, 2F) are not read) and
  /// d gate_up on return, with swiglu_packed_backward's bits. No (..., F)
  /// buffer: a caller can produce g straight into d (a GEMM with ldc 2F).
  virtual void swiglu_packed_backward_inplace(const Tensor& gate_up, Tensor& d) const = 0;
  /// The same gradient written over gate_up itself (a buffer its owner
  /// handed over, take_if_unique), reading g (..., F) whole; the same bits.
  virtual void swiglu_packed_backward_over(Tensor& gate_up, const Tensor& g) const = 0;

  // ---- normalization ------------------------------------------------------
  /// y = x · rstd · w per row; rstd (rows) returned for the backward.
  virtual Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd) const = 0;
  virtual void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx,
                                 Tensor& dw, bool need_dx, bool need_dw) const = 0;

  // ---- softmax / mask -----------------------------------------------------
  virtual Tensor softmax_forward(const Tensor& x) const = 0;  // last axis
  virtual Tensor softmax_backward(const Tensor& y, const Tensor& g) const = 0;
  /// Entries j > i + offset of each (Tq, Tk) matrix set to `fill`.
  virtual Tensor causal_fill(const Tensor& x, std::int64_t offset, float fill) const = 0;

  // ---- dropout ------------------------------------------------------------
  /// The dropout mask of `shape`: 0 or keep_scale (1/(1-p)) per element, a
  /// pure function of (seed, element index) through Philox4x32-10
  /// (backend/philox.hpp), so every backend gives the same bits and the
  /// device makes its mask without a host copy.
  virtual Tensor dropout_mask(const Shape& shape, std::uint64_t seed, float p, float keep_scale) const = 0;

  // ---- rotary embedding ---------------------------------------------------
  virtual Tensor rope_apply(const Tensor& x, std::int64_t offset, float base, bool inverse) const = 0;
  /// Strided rows of `width` floats (src may equal dst).
  virtual void rope_packed(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride,
                           std::int64_t batch, std::int64_t t, std::int64_t width, std::int64_t d, float base,
                           bool inverse) const = 0;

  // ---- embedding ----------------------------------------------------------
  virtual Tensor embedding_forward(const Tensor& weight, std::span<const std::int32_t> ids,
                                   const Shape& out_shape) const = 0;
  /// dW[ids[i]] += g[i] in id order. The result is on this backend.
  virtual Tensor embedding_backward(const Shape& weight_shape, std::span<const std::int32_t> ids,
                                    const Tensor& g) const = 0;

  // ---- cross-entropy ------------------------------------------------------
  /// Mean loss over counted rows (returned to the host); probs (N, V) kept.
  virtual float cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets,
                                      std::int32_t ignore, Tensor& probs, std::int64_t& count) const = 0;
  virtual Tensor cross_entropy_backward(const Tensor& probs, std::span<const std::int32_t> targets,
                                        std::int32_t ignore, std::int64_t count, float g) const = 0;

  // ---- optimizer ----------------------------------------------------------
  /// Σ x² over spans of this backend's memory, in double, thread-count
  /// independent.
  virtual double sum_of_squares(std::span<const std::span<const float>> spans) const = 0;
  /// The terms of sum_of_squares, returned to the host: each span cut from
  /// its start into kNormChunk chunks, one double per chunk, in order
  /// (sum_of_squares adds exactly these, in this order).
  virtual std::vector<double> sum_of_squares_partials(std::span<const std::span<const float>> spans) const = 0;
  virtual void adam_update(std::span<const AdamUpdate> params, const AdamCoefficients& c) const = 0;
  /// No NaN or ±inf among `values` (this backend's memory).
  virtual bool all_finite(std::span<const float> values) const = 0;

  // ---- flat buffers (data parallelism: gradient buckets, ZeRO-1 shards) ----
  /// dst[i] = src[i], i < n (this backend's memory; the ranges must not overlap).
  virtual void copy_values(const float* src, float* dst, std::int64_t n) const = 0;
  /// dst[i] = value, i < n.
  virtual void fill_values(float* dst, std::int64_t n, float value) const = 0;
  /// dst[i] = src[i] / divisor, an IEEE division per element (the
  /// communicators' all_reduce_average arithmetic; src may equal dst).
  virtual void divide_values(const float* src, float* dst, std::int64_t n, float divisor) const = 0;

  // ---- attention ----------------------------------------------------------
  virtual FlashTiles flash_default_tiles(std::int64_t head_width) const = 0;
  /// Strided views: writes out and lse (B, H, T).
  virtual void flash_attention_forward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q,
                                       HeadView k, HeadView v, MutableHeadView out, float* lse, float scale,
                                       FlashTiles tiles) const = 0;
  /// Writes (not adds) every element of dq, dk, dv.
  virtual void flash_attention_backward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q,
                                        HeadView k, HeadView v, HeadView out, HeadView d_out, const float* lse,
                                        MutableHeadView dq, MutableHeadView dk, MutableHeadView dv, float scale,
                                        FlashTiles tiles) const = 0;
  /// Contiguous (B, H, T, D) forms: allocate out / lse, dq / dk / dv.
  virtual Tensor flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                         FlashTiles tiles, Tensor& lse) const = 0;
  virtual void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                        const Tensor& lse, const Tensor& d_out, float scale, FlashTiles tiles,
                                        Tensor& dq, Tensor& dk, Tensor& dv) const = 0;

  // ---- decode -------------------------------------------------------------
  /// q (H, D) against caches (G, capacity, D), first `length` rows valid.
  virtual Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values,
                                  std::int64_t length) const = 0;
  /// rows (G, 1, D) into row `position` of each head of cache (G, capacity, D).
  virtual void cache_write(Tensor& cache, const Tensor& rows, std::int64_t position) const = 0;
};

/// The CPU table (always built).
const Kernels& cpu_kernels();
/// The CUDA table when this build has the CUDA backend, else null
/// (backend/cuda_stub.cpp).
const Kernels* cuda_kernels();

/// The table for `backend`; BackendError "[op] the cuda backend is not built
/// in this package" when it is missing.
const Kernels& kernels(Backend backend, const char* op = "kernels");

/// Throws BackendError "[op] operand i (shape) is on X but operand j (shape)
/// is on Y" (kernels_for's error; takes plain values so a CPU-only build can
/// test it).
[[noreturn]] void throw_mixed_backends(const char* op, std::size_t i, Backend a, const Shape& a_shape, std::size_t j,
                                       Backend b, const Shape& b_shape);

/// The table of the operands' common backend; BackendError naming the op,
/// both operands' shapes and both backends when they differ. Undefined
/// tensors (an absent optional operand) are skipped; at least `first` must
/// be defined.
template <class... Rest>
const Kernels& kernels_for(const char* op, const Tensor& first, const Rest&... rest) {
  const Backend b = first.backend();
  [[maybe_unused]] std::size_t i = 0;  // unused when there is one operand
  (
      [&](const Tensor& t) {
        ++i;
        if (t.defined() && t.backend() != b) throw_mixed_backends(op, 0, b, first.shape(), i, t.backend(), t.shape());
      }(rest),
      ...);
  return kernels(b, op);
}

}  // namespace riftco_transformer::backend
