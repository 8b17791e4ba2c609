// SiLU, GELU (tanh form) and SwiGLU, forward and backward: one thread per
// element, the CPU kernels' formulas (backend/cpu/activation.cpp) with the
// device's expf/tanhf in place of the CPU's exp polynomial.
#include "cuda_common.hpp"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654F;
constexpr float kGeluCoeff = 0.044715F;

#define GRID_STRIDE(i, n)                                                                       \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

__device__ inline float sigmoid(float x) { return 1.0F / (1.0F + expf(-x)); }

__device__ inline float gelu_forward(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5F * x * (1.0F + tanhf(u));
}

__device__ inline float gelu_derivative(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  const float t = tanhf(u);
  const float du = kSqrt2OverPi * (1.0F + 3.0F * kGeluCoeff * x * x);
  return 0.5F * (1.0F + t) + 0.5F * x * (1.0F - t * t) * du;
}

__global__ void activation_forward_kernel(Activation act, const float* x, float* out, std::int64_t n) {
  GRID_STRIDE(i, n) out[i] = act == Activation::Silu ? x[i] * sigmoid(x[i]) : gelu_forward(x[i]);
}

__global__ void activation_backward_kernel(Activation act, const float* x, const float* g, float* out,
                                           std::int64_t n) {
  GRID_STRIDE(i, n) {
    if (act == Activation::Silu) {
      const float s = sigmoid(x[i]);
      out[i] = g[i] * (s * (1.0F + x[i] * (1.0F - s)));
    } else {
      out[i] = g[i] * gelu_derivative(x[i]);
    }
  }
}

/// out = silu(gate)·up: element i of `rows` rows of f, gate/up at row·ld (+ offsets).
__global__ void swiglu_kernel(const float* gate, const float* up, std::int64_t in_ld, float* out, std::int64_t rows,
                              std::int64_t f) {
  GRID_STRIDE(i, rows * f) {
    const std::int64_t r = i / f;
    const std::int64_t j = i % f;
    const float a = gate[r * in_ld + j];
    out[i] = a * sigmoid(a) * up[r * in_ld + j];
  }
}

/// d_gate = g·up·silu'(gate), d_up = g·silu(gate); gate/up/d_gate/d_up at
/// row·in_ld, g at row·g_ld. g may be d_gate itself (g_ld = in_ld): each
/// thread reads its element of g before writing the same element.
__global__ void swiglu_backward_kernel(const float* gate, const float* up, std::int64_t in_ld, const float* g,
                                       std::int64_t g_ld, float* d_gate, float* d_up, std::int64_t rows,
                                       std::int64_t f) {
  GRID_STRIDE(i, rows * f) {
    const std::int64_t r = i / f;
    const std::int64_t j = i % f;
    const float a = gate[r * in_ld + j];
    const float s = sigmoid(a);
    const float gi = g[r * g_ld + j];
    d_gate[r * in_ld + j] = gi * up[r * in_ld + j] * s * (1.0F + a * (1.0F - s));
    d_up[r * in_ld + j] = gi * a * s;
  }
}

}  // namespace

Tensor activation_forward(Activation act, const Tensor& x) {
  detail::require_cuda(x, "activation_forward", "x");
  Tensor out = detail::empty(x.shape());
  const std::int64_t n = x.numel();
  if (n == 0) return out;
  activation_forward_kernel<<<detail::grid_for(n), detail::kThreads>>>(act, x.device_data(), out.device_data(), n);
  detail::check_launch("activation_forward", "activation_forward_kernel");
  return out;
}

Tensor activation_backward(Activation act, const Tensor& x, const Tensor& g) {
  detail::require_cuda(x, "activation_backward", "x");
  detail::require_cuda(g, "activation_backward", "g");
  Tensor out = detail::empty(x.shape());
  const std::int64_t n = x.numel();
  if (n == 0) return out;
  activation_backward_kernel<<<detail::grid_for(n), detail::kThreads>>>(act, x.device_data(), g.device_data(),
                                                                        out.device_data(), n);
  detail::check_launch("activation_backward", "activation_backward_kernel");
  return out;
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up) {
  detail::require_cuda(gate, "swiglu_forward", "gate");
  detail::require_cuda(up, "swiglu_forward", "up");
  Tensor out = detail::empty(gate.shape());
  const std::int64_t n = gate.numel();
  if (n == 0) return out;
  // n rows of one element: row stride 1.
  swiglu_kernel<<<detail::grid_for(n), detail::kThreads>>>(gate.device_data(), up.device_data(), 1, out.device_data(),
                                                           n, 1);
  detail::check_launch("swiglu_forward", "swiglu_kernel");
  return out;
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& g, Tensor& d_gate, Tensor& d_up) {
  detail::require_cuda(gate, "swiglu_backward", "gate");
  detail::require_cuda(up, "swiglu_backward", "up");
  detail::require_cuda(g, "swiglu_backward", "g");
  d_gate = detail::empty(gate.shape());
  d_up = detail::empty(up.shape());
  const std::int64_t n = gate.numel();
  if (n == 0) return;
  swiglu_backward_kernel<<<detail::grid_for(n), detail::kThreads>>>(
      gate.device_data(), up.device_data(), 1, g.device_data(), 1, d_gate.device_data(), d_up.device_data(), n, 1);
  detail::check_launch("swiglu_backward", "swiglu_backward_kernel");
}

Tensor swiglu_packed_forward(const Tensor& gate_up) {
  detail::require_cuda(gate_up, "swiglu_packed_forward", "gate_up");
  const std::int64_t f2 = gate_up.size(-1);
  const std::int64_t f = f2 / 2;
  const std::int64_t rows = f2 == 0 ? 0 : gate_up.numel() / f2;
  Shape shape = gate_up.shape();
  shape.back() = f;
  Tensor out = detail::empty(shape);
  if (rows * f == 0) return out;
  const float* pi = gate_up.device_data();
  swiglu_kernel<<<detail::grid_for(rows * f), detail::kThreads>>>(pi, pi + f, f2, out.device_data(), rows, f);
  detail::check_launch("swiglu_packed_forward", "swiglu_kernel");
  return out;
}

Tensor swiglu_packed_backward(const Tensor& gate_up, const Tensor& g) {
  detail::require_cuda(gate_up, "swiglu_packed_backward", "gate_up");
  detail::require_cuda(g, "swiglu_packed_backward", "g");
  const std::int64_t f2 = gate_up.size(-1);
  const std::int64_t f = f2 / 2;
  const std::int64_t rows = f2 == 0 ? 0 : gate_up.numel() / f2;
  Tensor d = detail::empty(gate_up.shape());
  if (rows * f == 0) return d;
  const float* pi = gate_up.device_data();
  float* pd = d.device_data();
  swiglu_backward_kernel<<<detail::grid_for(rows * f), detail::kThreads>>>(pi, pi + f, f2, g.device_data(), f, pd,
                                                                           pd + f, rows, f);
  detail::check_launch("swiglu_packed_backward", "swiglu_backward_kernel");
  return d;
}

void swiglu_packed_backward_inplace(const Tensor& gate_up, Tensor& d) {
  detail::require_cuda(gate_up, "swiglu_packed_backward_inplace", "gate_up");
  detail::require_cuda(d, "swiglu_packed_backward_inplace", "d");
  const std::int64_t f2 = gate_up.size(-1);
  const std::int64_t f = f2 / 2;
  const std::int64_t rows = f2 == 0 ? 0 : gate_up.numel() / f2;
  if (rows * f == 0) return;
  const float* pi = gate_up.device_data();
  float* pd = d.device_data();
  swiglu_backward_kernel<<<detail::grid_for(rows * f), detail::kThreads>>>(pi, pi + f, f2, pd, f2, pd, pd + f, rows,
                                                                           f);
  detail::check_launch("swiglu_packed_backward_inplace", "swiglu_backward_kernel");
}

void swiglu_packed_backward_over(Tensor& gate_up, const Tensor& g) {
  detail::require_cuda(gate_up, "swiglu_packed_backward_over", "gate_up");
  detail::require_cuda(g, "swiglu_packed_backward_over", "g");
  const std::int64_t f2 = gate_up.size(-1);
  const std::int64_t f = f2 / 2;
  const std::int64_t rows = f2 == 0 ? 0 : gate_up.numel() / f2;
  if (rows * f == 0) return;
  float* pd = gate_up.device_data();
  // Each thread reads its gate and up before it writes them.
  swiglu_backward_kernel<<<detail::grid_for(rows * f), detail::kThreads>>>(pd, pd + f, f2, g.device_data(), f, pd,
                                                                           pd + f, rows, f);
  detail::check_launch("swiglu_packed_backward_over", "swiglu_backward_kernel");
}

}  // namespace riftco_transformer::cuda
