// ShardedAdam (ZeRO-1) on the single-process communicator: one shard holds
// everything, and every step is plain Adam's, bit for bit. The multi-rank
// checks are in tests/mpi/test_zero.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
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

namespace {

// Rank 0 of a pretend 2-rank world whose collectives succeed (sums are the
// identity, a reduce-scatter keeps block 0, a gather gives every rank's
// block this rank's values, as if rank 1 held the same) except
// all-gather number `fail_at` (counted from 1), which fails as a broken
// link would. A step gathers twice: the norm's partials, then the parameters.
class GatherFailsCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string_view kind() const override { return "test"; }
  void all_reduce_sum(std::span<float>) override {}
  void reduce_scatter_sum(std::span<const float> input, std::span<float> output) override {
    std::copy(input.begin(), input.begin() + static_cast<std::ptrdiff_t>(output.size()), output.begin());
  }
  void all_gather(std::span<const float> input, std::span<float> output) override {
    if (++gathers == fail_at) throw CommunicationError("[all_gather] the link to rank 1 is down (test)");
    for (std::size_t at = 0; !input.empty() && at + input.size() <= output.size(); at += input.size()) {
      std::copy(input.begin(), input.end(), output.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }
  void broadcast(std::span<float>, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(std::string_view, int) override { std::abort(); }
  int gathers = 0;
  int fail_at = 0;
};

}  // namespace

TEST(ShardedAdamSingle, AFailedParameterGatherRefusesLaterStepsAndStateUntilARestore) {
  GatherFailsCommunicator comm;
  std::vector<Variable> p = params_from(21);
  ShardedAdam zero(comm, p, clipped());
  const Adam::State saved = zero.state();
  std::vector<Tensor> grads;
  for (const Variable& v : p) grads.push_back(randn(v.shape(), 99));
  // A failure before the shard is updated (the norm's gather) changes nothing.
  comm.gathers = 0;
  comm.fail_at = 1;
  EXPECT_THROW(zero.step(grads), CommunicationError);
  EXPECT_TRUE(zero.failed_step().empty());
  EXPECT_EQ(zero.step_count(), 0);
  // A failure of the parameter gather: this rank's shard moved, the others' did not.
  comm.gathers = 0;
  comm.fail_at = 2;
  EXPECT_THROW(zero.step(grads), CommunicationError);
  ASSERT_FALSE(zero.failed_step().empty());
  EXPECT_NE(zero.failed_step().find("step 1"), std::string::npos) << zero.failed_step();
  // The ranks' parameters differ now: no further step, no state to save.
  comm.fail_at = 0;
  try {
    zero.step(grads);
    FAIL() << "a step after a failed parameter gather was accepted";
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("step 1's parameter all-gather failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("link to rank 1 is down"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)zero.state(), CommunicationError);
  // Restoring a saved state is the way back.
  zero.set_state(saved);
  EXPECT_TRUE(zero.failed_step().empty());
  EXPECT_NO_THROW(zero.step(grads));
  EXPECT_EQ(zero.step_count(), 1);
}

// A step with no gradient at all (every parameter's undefined) changes
// nothing, the step count included, on both Adams: the next real step is a
// first step's, bit for bit (PyTorch's step() with every .grad None).
TEST(ShardedAdamSingle, AStepWithoutAnyGradientChangesNothingOnEitherAdam) {
  const auto comm = make_single_process_communicator();
  const auto a = params_from(3);
  const auto b = params_from(3);
  const auto fresh = params_from(3);
  ShardedAdam zero(*comm, a, clipped());
  Adam plain(b, clipped());
  Adam reference(fresh, clipped());
  const std::vector<Tensor> none(3);
  EXPECT_EQ(zero.step(none), 0.0F);
  EXPECT_EQ(plain.step(none), 0.0F);
  EXPECT_EQ(plain.step(), 0.0F);  // the parameters' own (undefined) gradients
  EXPECT_EQ(zero.state().steps, 0);
  EXPECT_EQ(plain.step_count(), 0);
  const std::vector<Tensor> g{randn({40000}, 30), randn({3, 5}, 31), randn({9}, 32)};
  zero.step(g);
  plain.step(g);
  reference.step(g);
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(same_bits(a[k].value().values(), fresh[k].value().values())) << k;
    EXPECT_TRUE(same_bits(b[k].value().values(), fresh[k].value().values())) << k;
  }
}

// A restored state no step could have made is refused by both Adams, each
// check with its own message, and nothing changes: a step count the next
// step would overflow (it wrapped to INT64_MIN), a first moment not finite,
// a second moment NaN or negative (NaN weights followed). A second moment of
// +inf is what a finite gradient whose square overflows leaves: accepted.
TEST(ShardedAdamSingle, HostileStatesAreRefusedByBothAdamsNamingTheCheck) {
  const auto comm = make_single_process_communicator();
  const auto a = params_from(4);
  const auto b = params_from(4);
  ShardedAdam zero(*comm, a, clipped());
  Adam plain(b, clipped());
  const std::vector<Tensor> g{randn({40000}, 40), randn({3, 5}, 41), randn({9}, 42)};
  zero.step(g);
  plain.step(g);
  const Adam::State good = plain.state();
  const auto refused = [&](const Adam::State& s) -> std::string {
    std::string both;
    for (const bool sharded : {false, true}) {
      try {
        sharded ? zero.set_state(s) : plain.set_state(s);
        both += "(accepted)";
      } catch (const Error& e) {
        both += e.what();
      }
      both += " | ";
    }
    return both;
  };
  const auto edited = [&](const std::function<void(Adam::State&)>& edit) {
    Adam::State s = good;
    s.first_moment = {good.first_moment[0].clone(), good.first_moment[1].clone(), good.first_moment[2].clone()};
    s.second_moment = {good.second_moment[0].clone(), good.second_moment[1].clone(), good.second_moment[2].clone()};
    edit(s);
    return s;
  };
  const std::vector<std::pair<std::function<void(Adam::State&)>, std::string>> cases{
      {[](Adam::State& s) { s.steps = std::numeric_limits<std::int64_t>::max(); }, "step count 9223372036854775807"},
      {[](Adam::State& s) { s.steps = -1; }, "step count -1"},
      {[](Adam::State& s) { s.first_moment[1].data()[2] = std::numeric_limits<float>::infinity(); },
       "'small': its first moment holds inf at element 2"},
      {[](Adam::State& s) { s.second_moment[0].data()[7] = -1.0F; }, "'big': its second moment holds -1"},
      {[](Adam::State& s) { s.second_moment[2].data()[0] = std::nanf(""); }, "its second moment holds nan"},
      {[](Adam::State& s) { s.second_moment[1] = randn({5, 3}, 1); }, "its second moment has shape (5, 3)"},
  };
  for (const auto& [edit, message] : cases) {
    const std::string both = refused(edited(edit));
    EXPECT_EQ(both.find("(accepted)"), std::string::npos) << both;
    EXPECT_NE(both.find(message), std::string::npos) << both;
  }
  EXPECT_EQ(plain.step_count(), 1);
  EXPECT_EQ(zero.step_count(), 1);
  EXPECT_NO_THROW(plain.set_state(edited([](Adam::State& s) {
    s.second_moment[0].data()[0] = std::numeric_limits<float>::infinity();
  })));
}
