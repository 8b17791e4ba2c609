// The CUDA backend's kernel table: every entry forwards to the cuda::
// function of the same name and signature (backend/cuda/*.hpp). Calls are
// fully qualified: the argument types are shared with cpu::, so an
// unqualified call would be ambiguous under argument-dependent lookup.
#include "../cpu/flash_attention.hpp"  // cpu::flash_default_tiles
#include "../kernels.hpp"
#include "decode_attention.hpp"
#include "flash_attention.hpp"
#include "kernels.hpp"

namespace riftco_transformer::backend {
namespace {

class CudaKernels final : public Kernels {
 public:
  Backend backend() const override { return Backend::Cuda; }

  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
            std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) const override {
    cuda::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void gemm_group(std::span<const std::span<const GemmProblem>> chains) const override { cuda::gemm_group(chains); }
  Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) const override { return cuda::matmul(a, b, ta, tb); }

  Tensor add(const Tensor& a, const Tensor& b) const override { return cuda::add(a, b); }
  void add_inplace(Tensor& a, const Tensor& b) const override { cuda::add_inplace(a, b); }
  void axpy_inplace(Tensor& y, float alpha, const Tensor& x) const override { cuda::axpy_inplace(y, alpha, x); }
  Tensor scale(const Tensor& a, float s) const override { return cuda::scale(a, s); }
  Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape) const override {
    return cuda::binary(op, a, b, out_shape);
  }
  Tensor reduce_to_shape(const Tensor& grad, const Shape& shape) const override {
    return cuda::reduce_to_shape(grad, shape);
  }
  double sum_all(const Tensor& x) const override { return cuda::sum_all(x); }

  Tensor permute(const Tensor& in, std::span<const std::int64_t> perm) const override {
    return cuda::permute(in, perm);
  }
  Tensor add_columns(const Tensor& x, const Tensor& delta, std::int64_t offset) const override {
    return cuda::add_columns(x, delta, offset);
  }
  Tensor take_columns(const Tensor& x, std::int64_t offset, std::int64_t width) const override {
    return cuda::take_columns(x, offset, width);
  }
  Tensor repeat_heads(const Tensor& x, std::int64_t groups) const override { return cuda::repeat_heads(x, groups); }
  Tensor repeat_heads_backward(const Tensor& g, std::int64_t groups) const override {
    return cuda::repeat_heads_backward(g, groups);
  }

  Tensor activation_forward(Activation act, const Tensor& x) const override { return cuda::activation_forward(act, x); }
  Tensor activation_backward(Activation act, const Tensor& x, const Tensor& g) const override {
    return cuda::activation_backward(act, x, g);
  }
  Tensor swiglu_forward(const Tensor& gate, const Tensor& up) const override { return cuda::swiglu_forward(gate, up); }
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& g, Tensor& d_gate,
                       Tensor& d_up) const override {
    cuda::swiglu_backward(gate, up, g, d_gate, d_up);
  }
  Tensor swiglu_packed_forward(const Tensor& gate_up) const override { return cuda::swiglu_packed_forward(gate_up); }
  Tensor swiglu_packed_backward(const Tensor& gate_up, const Tensor& g) const override {
    return cuda::swiglu_packed_backward(gate_up, g);
  }
  void swiglu_packed_backward_inplace(const Tensor& gate_up, Tensor& d) const override {
    cuda::swiglu_packed_backward_inplace(gate_up, d);
  }
  void swiglu_packed_backward_over(Tensor& gate_up, const Tensor& g) const override {
    cuda::swiglu_packed_backward_over(gate_up, g);
  }

  Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd) const override {
    return cuda::rms_norm_forward(x, w, eps, rstd);
  }
  void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx, Tensor& dw,
                         bool need_dx, bool need_dw) const override {
    cuda::rms_norm_backward(x, w, rstd, g, dx, dw, need_dx, need_dw);
  }

  Tensor softmax_forward(const Tensor& x) const override { return cuda::softmax_forward(x); }
  Tensor softmax_backward(const Tensor& y, const Tensor& g) const override { return cuda::softmax_backward(y, g); }
  Tensor causal_fill(const Tensor& x, std::int64_t offset, float fill) const override {
    return cuda::causal_fill(x, offset, fill);
  }

  Tensor dropout_mask(const Shape& shape, std::uint64_t seed, float p, float keep_scale) const override {
    return cuda::dropout_mask(shape, seed, p, keep_scale);
  }

  Tensor rope_apply(const Tensor& x, std::int64_t offset, float base, bool inverse) const override {
    return cuda::rope_apply(x, offset, base, inverse);
  }
  void rope_packed(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride, std::int64_t batch,
                   std::int64_t t, std::int64_t width, std::int64_t d, float base, bool inverse) const override {
    cuda::rope_packed(src, src_stride, dst, dst_stride, batch, t, width, d, base, inverse);
  }

  Tensor embedding_forward(const Tensor& weight, std::span<const std::int32_t> ids,
                           const Shape& out_shape) const override {
    return cuda::embedding_forward(weight, ids, out_shape);
  }
  Tensor embedding_backward(const Shape& weight_shape, std::span<const std::int32_t> ids,
                            const Tensor& g) const override {
    return cuda::embedding_backward(weight_shape, ids, g);
  }

  float cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets, std::int32_t ignore,
                              Tensor& probs, std::int64_t& count) const override {
    return cuda::cross_entropy_forward(logits, targets, ignore, probs, count);
  }
  Tensor cross_entropy_backward(const Tensor& probs, std::span<const std::int32_t> targets, std::int32_t ignore,
                                std::int64_t count, float g) const override {
    return cuda::cross_entropy_backward(probs, targets, ignore, count, g);
  }

  double sum_of_squares(std::span<const std::span<const float>> spans) const override {
    return cuda::sum_of_squares(spans);
  }
  void adam_update(std::span<const AdamUpdate> params, const AdamCoefficients& c) const override {
    cuda::adam_update(params, c);
  }
  bool all_finite(std::span<const float> values) const override { return cuda::all_finite(values); }
  std::vector<double> sum_of_squares_partials(std::span<const std::span<const float>> spans) const override {
    return cuda::sum_of_squares_partials(spans);
  }
  void copy_values(const float* src, float* dst, std::int64_t n) const override { cuda::copy_values(src, dst, n); }
  void fill_values(float* dst, std::int64_t n, float value) const override { cuda::fill_values(dst, n, value); }
  void divide_values(const float* src, float* dst, std::int64_t n, float divisor) const override {
    cuda::divide_values(src, dst, n, divisor);
  }

  FlashTiles flash_default_tiles(std::int64_t head_width) const override {
    return cpu::flash_default_tiles(head_width);  // ignored by the cuda kernels (tiles follow from D)
  }
  void flash_attention_forward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                               HeadView v, MutableHeadView out, float* lse, float scale,
                               FlashTiles tiles) const override {
    cuda::flash_attention_forward(B, H, T, D, q, k, v, out, lse, scale, tiles);
  }
  void flash_attention_backward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                                HeadView v, HeadView out, HeadView d_out, const float* lse, MutableHeadView dq,
                                MutableHeadView dk, MutableHeadView dv, float scale, FlashTiles tiles) const override {
    cuda::flash_attention_backward(B, H, T, D, q, k, v, out, d_out, lse, dq, dk, dv, scale, tiles);
  }
  Tensor flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale, FlashTiles tiles,
                                 Tensor& lse) const override {
    return cuda::flash_attention_forward(q, k, v, scale, tiles, lse);
  }
  void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                const Tensor& lse, const Tensor& d_out, float scale, FlashTiles tiles, Tensor& dq,
                                Tensor& dk, Tensor& dv) const override {
    cuda::flash_attention_backward(q, k, v, out, lse, d_out, scale, tiles, dq, dk, dv);
  }

  Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values,
                          std::int64_t length) const override {
    return cuda::cached_attention(q, keys, values, length);
  }
  void cache_write(Tensor& cache, const Tensor& rows, std::int64_t position) const override {
    cuda::cache_write(cache, rows, position);
  }
};

}  // namespace

const Kernels* cuda_kernels() {
  static const CudaKernels table;
  return &table;
}

}  // namespace riftco_transformer::backend
