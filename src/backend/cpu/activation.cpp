#include <algorithm>
#include <cmath>

#include "kernels.hpp"
#include "parallel.hpp"
#include "vec_math.hpp"

namespace riftco_transformer::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654F;
constexpr float kGeluCoeff = 0.044715F;

// Sigmoid goes through vec::exp_approx (branch-free), so the SiLU/SwiGLU
// loops below vectorize (AVX2 clone picked at load time; same bits as the
// baseline clone).
using vec::sigmoid_approx;

inline float gelu_forward(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5F * x * (1.0F + std::tanh(u));
}

inline float gelu_derivative(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  const float t = std::tanh(u);
  const float du = kSqrt2OverPi * (1.0F + 3.0F * kGeluCoeff * x * x);
  return 0.5F * (1.0F + t) + 0.5F * x * (1.0F - t * t) * du;
}

/// Elements per OpenMP chunk: large enough to amortize the fork.
constexpr std::int64_t kParallelElements = kMinStreamPerThread;

__attribute__((target_clones("avx512f", "avx2", "default"))) void silu_span(const float* x, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] * sigmoid_approx(x[i]);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void silu_backward_span(const float* x, const float* g, float* out,
                                                                           std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = sigmoid_approx(x[i]);
    out[i] = g[i] * (s * (1.0F + x[i] * (1.0F - s)));
  }
}

/// out = silu(gate) · up over n elements.
__attribute__((target_clones("avx512f", "avx2", "default"))) void swiglu_span(const float* gate, const float* up, float* out,
                                                                    std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid_approx(gate[i]) * up[i];
}

/// d_gate = g · up · silu'(gate), d_up = g · silu(gate) for one element.
inline void swiglu_gradient(float a, float u, float g, float& d_gate, float& d_up) {
  const float s = sigmoid_approx(a);
  d_gate = g * u * s * (1.0F + a * (1.0F - s));
  d_up = g * a * s;
}

/// swiglu_gradient over n elements.
__attribute__((target_clones("avx512f", "avx2", "default"))) void swiglu_backward_span(const float* gate, const float* up,
                                                                             const float* g, float* d_gate,
                                                                             float* d_up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) swiglu_gradient(gate[i], up[i], g[i], d_gate[i], d_up[i]);
}

/// The same with g read from d_gate before it is overwritten (its own loop:
/// g and d_gate as two pointers to one buffer would send the vectorizer's
/// alias check to the scalar fallback).
__attribute__((target_clones("avx512f", "avx2", "default"))) void swiglu_backward_inplace_span(const float* gate,
                                                                                     const float* up,
                                                                                     float* g_then_d_gate,
                                                                                     float* d_up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = g_then_d_gate[i];
    swiglu_gradient(gate[i], up[i], g, g_then_d_gate[i], d_up[i]);
  }
}

/// The same with d_gate and d_up written over gate and up (each element is
/// read before it is overwritten).
__attribute__((target_clones("avx512f", "avx2", "default"))) void swiglu_backward_over_span(float* gate_then_d_gate,
                                                                                  float* up_then_d_up,
                                                                                  const float* g, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = gate_then_d_gate[i];
    const float b = up_then_d_up[i];
    swiglu_gradient(a, b, g[i], gate_then_d_gate[i], up_then_d_up[i]);
  }
}

}  // namespace

Tensor activation_forward(Activation act, const Tensor& x) {
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data();
  float* po = out.data();
  const std::int64_t n = x.numel();
  if (act == Activation::Silu) {
    parallel_spans(n, [&](std::int64_t b, std::int64_t e) { silu_span(px + b, po + b, e - b); });
    return out;
  }
#pragma omp parallel for schedule(static) if (n > kParallelElements)
  for (std::int64_t i = 0; i < n; ++i) po[i] = gelu_forward(px[i]);
  return out;
}

Tensor activation_backward(Activation act, const Tensor& x, const Tensor& g) {
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data();
  const float* pg = g.data();
  float* po = out.data();
  const std::int64_t n = x.numel();
  if (act == Activation::Silu) {
    parallel_spans(n, [&](std::int64_t b, std::int64_t e) { silu_backward_span(px + b, pg + b, po + b, e - b); });
    return out;
  }
#pragma omp parallel for schedule(static) if (n > kParallelElements)
  for (std::int64_t i = 0; i < n; ++i) po[i] = pg[i] * gelu_derivative(px[i]);
  return out;
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up) {
  Tensor out = Tensor::empty(gate.shape());
  const float* pa = gate.data();
  const float* pb = up.data();
  float* po = out.data();
  parallel_spans(gate.numel(), [&](std::int64_t b, std::int64_t e) { swiglu_span(pa + b, pb + b, po + b, e - b); });
  return out;
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& g, Tensor& d_gate, Tensor& d_up) {
  d_gate = Tensor::empty(gate.shape());
  d_up = Tensor::empty(up.shape());
  const float* pa = gate.data();
  const float* pb = up.data();
  const float* pg = g.data();
  float* da = d_gate.data();
  float* db = d_up.data();
  parallel_spans(gate.numel(), [&](std::int64_t b, std::int64_t e) {
    swiglu_backward_span(pa + b, pb + b, pg + b, da + b, db + b, e - b);
  });
}

Tensor swiglu_packed_forward(const Tensor& gate_up) {
  const std::int64_t f2 = gate_up.size(-1);
  const std::int64_t f = f2 / 2;
  const std::int64_t rows = f2 == 0 ? 0 : gate_up.numel() / f2;
  Shape shape = gate_up.shape();
  shape.back() = f;
  Tensor out = Tensor::empty(shape);
  const float* pi = gate_up.data();
  float* po = out.data();
#pragma omp parallel for schedule(dynamic, 16) if (rows * f > kParallelElements)
  for (std::int64_t r = 0; r < rows; ++r) swiglu_span(pi + r * f2, pi + r * f2 + f, po + r * f, f);
  return out;
}

Tensor swiglu_packed_backward(const Tensor& gate_up, const Tensor& g) {
  const std::int64_t f2 = gate_up.size(-1);
  const std::int64_t f = f2 / 2;
  const std::int64_t rows = f2 == 0 ? 0 : gate_up.numel() / f2;
  Tensor d = Tensor::empty(gate_up.shape());
  const float* pi = gate_up.data();
  const float* pg = g.data();
  float* pd = d.data();
#pragma omp parallel for schedule(dynamic, 16) if (rows * f > kParallelElements)
  for (std::int64_t r = 0; r < rows; ++r) {
    swiglu_backward_span(pi + r * f2, pi + r * f2 + f, pg + r * f, pd + r * f2, pd + r * f2 + f, f);
  }
  return d;
}

void swiglu_packed_backward_inplace(const Tensor& gate_up, Tensor& d) {
  const std::int64_t f2 = gate_up.size(-1);
  const std::int64_t f = f2 / 2;
  const std::int64_t rows = f2 == 0 ? 0 : gate_up.numel() / f2;
  const float* pi = gate_up.data();
  float* pd = d.data();
#pragma omp parallel for schedule(dynamic, 16) if (rows * f > kParallelElements)
  for (std::int64_t r = 0; r < rows; ++r) {
    swiglu_backward_inplace_span(pi + r * f2, pi + r * f2 + f, pd + r * f2, pd + r * f2 + f, f);
  }
}

void swiglu_packed_backward_over(Tensor& gate_up, const Tensor& g) {
  const std::int64_t f2 = gate_up.size(-1);
  const std::int64_t f = f2 / 2;
  const std::int64_t rows = f2 == 0 ? 0 : gate_up.numel() / f2;
  const float* pg = g.data();
  float* pd = gate_up.data();
#pragma omp parallel for schedule(dynamic, 16) if (rows * f > kParallelElements)
  for (std::int64_t r = 0; r < rows; ++r) swiglu_backward_over_span(pd + r * f2, pd + r * f2 + f, pg + r * f, f);
}

}  // namespace riftco_transformer::cpu
