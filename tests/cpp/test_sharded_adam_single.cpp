// ShardedAdam (ZeRO-1) on the single-process communicator: one shard holds
// everything, and every step is plain Adam's, bit for bit. The multi-rank
// checks are in tests/mpi/test_zero.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model_fixtures.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/zero_adam.hpp"

using namespace riftco_transformer;
using rt_test::randn;

namespace {

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<Variable> params_from(std::uint64_t seed) {
  // One parameter over the norm's 32768-element chunk.
  return {Variable(randn({40000}, seed), true, "big"), Variable(randn({3, 5}, seed + 1), true, "small"),
          Variable(randn({9}, seed + 2), true, "norm")};
}

AdamOptions clipped() {
  AdamOptions o;
  o.learning_rate = 3e-3F;
  o.weight_decay = 0.05F;
  o.max_grad_norm = 0.5F;
  return o;
}

}  // namespace

TEST(ShardedAdamSingle, IsPlainAdamBitForBit) {
  const auto comm = make_single_process_communicator();
  const auto a = params_from(1);
  const auto b = params_from(1);
  ShardedAdam zero(*comm, a, clipped());
  Adam plain(b, clipped());
  EXPECT_EQ(zero.shard_begin(), 0);
  EXPECT_EQ(zero.shard_end(), 40000 + 15 + 9);
  EXPECT_EQ(zero.state_bytes(), 2 * 4 * (40000 + 15 + 9));
  for (std::uint64_t step = 0; step < 4; ++step) {
    const std::vector<Tensor> g{randn({40000}, 10 + step), randn({3, 5}, 20 + step), Tensor()};
    const float zn = zero.step(g);
    const float pn = plain.step(g);
    EXPECT_EQ(std::memcmp(&zn, &pn, sizeof(float)), 0);
    for (std::size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same_bits(a[k].value().values(), b[k].value().values()));
  }
  const Adam::State zs = zero.state();
  const Adam::State ps = plain.state();
  EXPECT_EQ(zs.steps, 4);
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(same_bits(zs.first_moment[k].values(), ps.first_moment[k].values()));
    EXPECT_TRUE(same_bits(zs.second_moment[k].values(), ps.second_moment[k].values()));
  }
  EXPECT_EQ(zs.first_moment[2].to_vector(), std::vector<float>(9, 0.0F));  // never had a gradient
}

TEST(ShardedAdamSingle, BadArgumentsAreTypedAndChangeNothing) {
  const auto comm = make_single_process_communicator();
  const auto p = params_from(2);
  EXPECT_THROW(ShardedAdam(*comm, {p[0], p[0]}), ValueError);
  EXPECT_THROW(ShardedAdam(*comm, {Variable(randn({2}, 1), false, "frozen")}), ValueError);
  EXPECT_THROW(ShardedAdam(*comm, std::vector<ParameterGroup>{{"g", {p[0]}, -1.0F}}, AdamOptions{}), ValueError);
  ShardedAdam zero(*comm, p, clipped());
  const std::vector<float> before(p[0].value().values().begin(), p[0].value().values().end());
  EXPECT_THROW(zero.step(std::vector<Tensor>{randn({40000}, 1)}), ValueError);  // one gradient for three
  EXPECT_THROW(zero.step(std::vector<Tensor>{randn({40000}, 1), randn({5, 3}, 2), Tensor()}), ShapeError);
  std::vector<Tensor> bad{randn({40000}, 1), Tensor(), Tensor()};
  bad[0].data()[5] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(zero.step(bad), ValueError);
  EXPECT_EQ(zero.step_count(), 0);
  EXPECT_TRUE(same_bits(p[0].value().values(), before));
  Adam::State wrong = zero.state();
  wrong.second_moment.pop_back();
  EXPECT_THROW(zero.set_state(wrong), ValueError);
}

TEST(ShardedAdamSingle, StepsWithAnAccumulatorOfItsOwnParametersOnly) {
  const auto comm = make_single_process_communicator();
  const auto a = params_from(3);
  const auto b = params_from(3);
  ShardedAdam zero(*comm, a, clipped());
  Adam plain(b, clipped());
  GradientAccumulator acc_a(a);
  GradientAccumulator acc_b(b);
  for (const auto* params : {&a, &b}) {
    for (const Variable& p : *params) sum(mul(p, p)).backward();
  }
  acc_a.add(0.5F);
  acc_b.add(0.5F);
  const float zn = zero.step(acc_a);
  const float pn = plain.step(acc_b);
  EXPECT_EQ(std::memcmp(&zn, &pn, sizeof(float)), 0);
  for (std::size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same_bits(a[k].value().values(), b[k].value().values()));
  EXPECT_THROW(zero.step(acc_b), ValueError);  // another optimizer's parameters
  EXPECT_EQ(zero.step_count(), 1);
}
