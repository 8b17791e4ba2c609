#pragma once
// Finite-difference gradient checker used by every op test.
//
// L(x) = Σ f(x) ⊙ w with a fixed random projection w, evaluated with float64
// accumulation. Analytic gradients come from backward(seed = w). Numeric
// gradients are central differences with step eps = 1e-2 (float32 forward
// noise makes smaller steps worse). An element passes when
//   |analytic - numeric| <= atol + rtol * |numeric|,   atol = 2e-3, rtol = 2e-2
// unless a test states otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace rt_test {

using riftco_transformer::Random;
using riftco_transformer::Tensor;
using riftco_transformer::Variable;

struct GradCheckOptions {
  double eps = 1e-2;
  double atol = 2e-3;
  double rtol = 2e-2;
};

inline double projected(const Tensor& out, const Tensor& w) {
  double acc = 0.0;
  for (std::int64_t i = 0; i < out.numel(); ++i) acc += static_cast<double>(out.data()[i]) * w.data()[i];
  return acc;
}

/// Returns the number of mismatching elements (0 = pass); reports the first few.
inline int gradcheck(const std::function<Variable(const std::vector<Variable>&)>& f, std::vector<Tensor> inputs,
                     GradCheckOptions opt = {}, std::uint64_t seed = 1234) {
  std::vector<Variable> vars;
  for (std::size_t i = 0; i < inputs.size(); ++i) vars.emplace_back(inputs[i].clone(), true, "x" + std::to_string(i));
  Variable out = f(vars);
  Random random(seed);
  const Tensor w = Tensor::normal(out.shape(), random);
  out.backward(w);
  int failures = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor analytic = vars[i].grad();
    for (std::int64_t e = 0; e < inputs[i].numel(); ++e) {
      auto eval = [&](double delta) {
        std::vector<Variable> probe;
        for (std::size_t j = 0; j < inputs.size(); ++j) {
          Tensor t = inputs[j].clone();
          if (j == i) t.data()[e] = static_cast<float>(t.data()[e] + delta);
          probe.emplace_back(t, false);
        }
        return projected(f(probe).value(), w);
      };
      const double numeric = (eval(opt.eps) - eval(-opt.eps)) / (2.0 * opt.eps);
      const double a = analytic.data()[e];
      if (!(std::fabs(a - numeric) <= opt.atol + opt.rtol * std::fabs(numeric))) {
        if (failures < 5) {
          ADD_FAILURE() << "input " << i << " element " << e << ": analytic " << a << " numeric " << numeric;
        }
        ++failures;
      }
    }
  }
  return failures;
}

}  // namespace rt_test
