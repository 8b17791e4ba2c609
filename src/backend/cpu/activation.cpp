#include <cmath>

#include "kernels.hpp"

namespace riftco_transformer::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654F;
constexpr float kGeluCoeff = 0.044715F;

inline float sigmoid(float x) { return 1.0F / (1.0F + std::exp(-x)); }

inline float forward_one(Activation act, float x) {
  if (act == Activation::Silu) return x * sigmoid(x);
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5F * x * (1.0F + std::tanh(u));
}

inline float derivative(Activation act, float x) {
  if (act == Activation::Silu) {
    const float s = sigmoid(x);
    return s * (1.0F + x * (1.0F - s));
  }
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  const float t = std::tanh(u);
  const float du = kSqrt2OverPi * (1.0F + 3.0F * kGeluCoeff * x * x);
  return 0.5F * (1.0F + t) + 0.5F * x * (1.0F - t * t) * du;
}

}  // namespace

Tensor activation_forward(Activation act, const Tensor& x) {
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data();
  float* po = out.data();
  const std::int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (std::int64_t i = 0; i < n; ++i) po[i] = forward_one(act, px[i]);
  return out;
}

Tensor activation_backward(Activation act, const Tensor& x, const Tensor& g) {
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data();
  const float* pg = g.data();
  float* po = out.data();
  const std::int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (std::int64_t i = 0; i < n; ++i) po[i] = pg[i] * derivative(act, px[i]);
  return out;
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up) {
  Tensor out = Tensor::empty(gate.shape());
  const float* pa = gate.data();
  const float* pb = up.data();
  float* po = out.data();
  const std::int64_t n = gate.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (std::int64_t i = 0; i < n; ++i) po[i] = pa[i] * sigmoid(pa[i]) * pb[i];
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
  const std::int64_t n = gate.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(pa[i]);
    da[i] = pg[i] * pb[i] * s * (1.0F + pa[i] * (1.0F - s));
    db[i] = pg[i] * pa[i] * s;
  }
}

}  // namespace riftco_transformer::cpu
