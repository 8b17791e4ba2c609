// The parallel Adam kernels behind Adam::step: the chunked gradient norm
// against a float64 reference, the fused update against a plain scalar loop
// (bit-identical), and both bit-identical for 1, 2 and 3 threads, over
// parameters that straddle chunk boundaries.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/tensor.hpp"
#include "riftco_transformer/variable.hpp"

using namespace riftco_transformer;

namespace {

const std::vector<std::int64_t> kSizes = {1, 7, 32768, 32769, 100003, 5};

struct AdamRun {
  float norm = 0.0F;
  std::vector<Tensor> values;
};

/// Two Adam steps (second one clipped) over parameters of kSizes.
AdamRun two_steps(int threads) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<Variable> params;
  std::vector<Tensor> grads;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    Random r(40 + i);
    params.emplace_back(Tensor::normal({kSizes[i]}, r), true, "p" + std::to_string(i));
    grads.push_back(Tensor::normal({kSizes[i]}, r));
  }
  AdamOptions o;
  o.learning_rate = 0.01F;
  o.weight_decay = 0.1F;
  o.max_grad_norm = 50.0F;
  Adam adam(params, o);
  AdamRun run;
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i = 0; i < params.size(); ++i) sum(mul(params[i], Variable(grads[i], false))).backward();
    run.norm = adam.step();
  }
  for (const Variable& p : params) run.values.push_back(p.value().clone());
  omp_set_num_threads(before);
  return run;
}

}  // namespace

TEST(AdamKernel, NormAndUpdateMatchAScalarReference) {
  // Reference: norm in double over every element in order; the update is the
  // same float formula in a plain loop (ISO C++: no FMA contraction), so the
  // parameters must match bit for bit.
  std::vector<std::vector<float>> theta;
  std::vector<std::vector<float>> g;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    Random r(40 + i);
    const Tensor p = Tensor::normal({kSizes[i]}, r);
    const Tensor gr = Tensor::normal({kSizes[i]}, r);
    theta.emplace_back(p.data(), p.data() + p.numel());
    g.emplace_back(gr.data(), gr.data() + gr.numel());
  }
  std::vector<std::vector<float>> m(theta.size());
  std::vector<std::vector<float>> v(theta.size());
  for (std::size_t i = 0; i < theta.size(); ++i) {
    m[i].assign(theta[i].size(), 0.0F);
    v[i].assign(theta[i].size(), 0.0F);
  }
  float norm = 0.0F;
  for (int step = 1; step <= 2; ++step) {
    double sq = 0.0;
    for (const auto& gi : g)
      for (float x : gi) sq += static_cast<double>(x) * x;
    norm = static_cast<float>(std::sqrt(sq));
    const float clip = norm > 50.0F ? 50.0F / (norm + 1e-6F) : 1.0F;
    const auto c1 = static_cast<float>(1.0 - std::pow(0.9, step));
    const auto c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(0.999F), step));
    const float decay = 1.0F - 0.01F * 0.1F;
    for (std::size_t i = 0; i < theta.size(); ++i) {
      for (std::size_t j = 0; j < theta[i].size(); ++j) {
        const float gj = g[i][j] * clip;
        m[i][j] = 0.9F * m[i][j] + (1.0F - 0.9F) * gj;
        v[i][j] = 0.999F * v[i][j] + (1.0F - 0.999F) * gj * gj;
        theta[i][j] = theta[i][j] * decay - 0.01F * (m[i][j] / c1) / (std::sqrt(v[i][j] / c2) + 1e-8F);
      }
    }
  }
  const AdamRun run = two_steps(2);
  EXPECT_GT(norm, 50.0F);  // the second step really clips
  EXPECT_NEAR(run.norm, norm, 1e-5 * norm);
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const Tensor want = Tensor::from_data({kSizes[i]}, theta[i]);
    // The kernel's norm sums in chunks, so the clip factor may differ in the
    // last bit from the reference's; allow that much.
    EXPECT_LT(max_abs_diff(run.values[i], want), 1e-6F) << "parameter " << i;
  }
}

TEST(AdamKernel, BitIdenticalForAnyThreadCount) {
  const AdamRun one = two_steps(1);
  for (const int t : {2, 3}) {
    const AdamRun other = two_steps(t);
    EXPECT_EQ(one.norm, other.norm) << t << " threads";
    for (std::size_t i = 0; i < one.values.size(); ++i) EXPECT_TRUE(bit_equal(one.values[i], other.values[i])) << i;
  }
}
