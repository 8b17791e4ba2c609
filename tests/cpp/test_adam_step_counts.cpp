// Each parameter is bias-corrected by the updates it has had (PyTorch's
// per-parameter state['step']), not by the optimizer's step count: a
// parameter without a gradient at some steps (an unused branch, an inactive
// adapter) follows torch.optim.Adam's trajectory. The same for the fused
// step, ShardedAdam, the optimizer's state and the training checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "../../src/train/training_checkpoint.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/zero_adam.hpp"
#include "scratch.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 6;
bool reaches_b(int step) { return step == 0 || step == 3 || step == 4; }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

AdamOptions options() {
  AdamOptions o;
  o.learning_rate = 2e-2F;
  o.weight_decay = 0.1F;
  return o;
}

/// sum(a ∘ a · 1.5), plus sum(b ∘ a) at the steps that reach b: b's gradient is a.
Variable loss_at(int step, const Variable& a, const Variable& b) {
  Variable loss = sum(scale(mul(a, a), 1.5F));
  if (reaches_b(step)) loss = add(loss, sum(mul(b, a)));
  return loss;
}

struct Pair {
  Variable a{Tensor::from_data({3}, {0.5F, -1.25F, 2.0F}), true, "a"};
  Variable b{Tensor::from_data({3}, {1.0F, 0.25F, -0.75F}), true, "b"};
};

/// PyTorch's AdamW in double precision, each parameter with its own step.
struct Reference {
  std::vector<double> theta, m, v;
  int steps = 0;
  void update(const std::vector<double>& g, const AdamOptions& o) {
    ++steps;
    const double b1 = o.beta1, b2 = o.beta2;
    for (std::size_t k = 0; k < theta.size(); ++k) {
      theta[k] *= 1.0 - static_cast<double>(o.learning_rate) * o.weight_decay;
      m[k] = b1 * m[k] + (1.0 - b1) * g[k];
      v[k] = b2 * v[k] + (1.0 - b2) * g[k] * g[k];
      const double mh = m[k] / (1.0 - std::pow(b1, steps));
      const double vh = v[k] / (1.0 - std::pow(b2, steps));
      theta[k] -= o.learning_rate * mh / (std::sqrt(vh) + o.epsilon);
    }
  }
};

/// `steps` plain steps of `adam` on the pair (b reached at steps 0, 3, 4).
void train(Adam& adam, Pair& p, int steps) {
  for (int step = 0; step < steps; ++step) {
    adam.zero_grad();
    loss_at(step, p.a, p.b).backward();
    adam.step();
  }
}

Reference reference_of(const Variable& p) {
  const std::vector<float> f = p.value().to_vector();
  const std::vector<double> d(f.begin(), f.end());
  return {d, std::vector<double>(d.size(), 0.0), std::vector<double>(d.size(), 0.0)};
}

}  // namespace

/// The reference run: b corrected by its own updates (PyTorch) or, with
/// `optimizer_count`, by the optimizer's step count (riftco before).
std::pair<Reference, Reference> reference_run(bool optimizer_count) {
  Pair p;
  Reference ra = reference_of(p.a), rb = reference_of(p.b);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<double> ga, gb;
    for (std::size_t k = 0; k < 3; ++k) {
      ga.push_back(3.0 * ra.theta[k] + (reaches_b(step) ? rb.theta[k] : 0.0));
      gb.push_back(ra.theta[k]);
    }
    ra.update(ga, options());
    if (optimizer_count) rb.steps = step;  // update() adds this step
    if (reaches_b(step)) rb.update(gb, options());
  }
  return {ra, rb};
}

TEST(AdamStepCounts, ASkippedParameterIsBiasCorrectedByItsOwnUpdatesAsPyTorch) {
  Pair p;
  Adam adam({p.a, p.b}, options());
  train(adam, p, kSteps);
  EXPECT_EQ(adam.step_count(), kSteps);
  EXPECT_EQ(adam.parameter_step_count(0), kSteps);
  EXPECT_EQ(adam.parameter_step_count(1), 3);
  EXPECT_THROW((void)adam.parameter_step_count(2), ValueError);
  const auto [ra, rb] = reference_run(false);
  const auto [wa, wb] = reference_run(true);
  const std::vector<float> a = p.a.value().to_vector(), b = p.b.value().to_vector();
  double apart = 0.0;
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(a[k], ra.theta[k], 2e-6) << k;
    EXPECT_NEAR(b[k], rb.theta[k], 2e-6) << k;
    apart = std::max(apart, std::abs(rb.theta[k] - wb.theta[k]));
  }
  EXPECT_GT(apart, 1e-3);  // the optimizer-wide count would be far outside the tolerance
}

TEST(AdamStepCounts, TheFusedStepAndShardedAdamMatchStepBitForBit) {
  Pair plain, fused, sharded;
  Adam a1({plain.a, plain.b}, options());
  Adam a2({fused.a, fused.b}, options());
  const auto comm = make_single_process_communicator();
  ShardedAdam a3(*comm, std::vector<Variable>{sharded.a, sharded.b}, options());
  for (int step = 0; step < kSteps; ++step) {
    a1.zero_grad();
    loss_at(step, plain.a, plain.b).backward();
    a1.step();
    a2.backward_and_step(loss_at(step, fused.a, fused.b));
    a3.zero_grad();
    loss_at(step, sharded.a, sharded.b).backward();
    a3.step();
  }
  for (const Pair* other : {&fused, &sharded}) {
    EXPECT_TRUE(same_bits(other->a.value().to_vector(), plain.a.value().to_vector()));
    EXPECT_TRUE(same_bits(other->b.value().to_vector(), plain.b.value().to_vector()));
  }
  EXPECT_EQ(a2.parameter_step_count(1), 3);
  EXPECT_EQ(a3.parameter_step_count(1), 3);
  EXPECT_EQ(a3.state().parameter_steps, (std::vector<std::int64_t>{kSteps, 3}));
}

TEST(AdamStepCounts, StateCarriesTheCountsAndRefusesImpossibleOnesChangingNothing) {
  Pair p;
  Adam adam({p.a, p.b}, options());
  train(adam, p, 3);
  Adam::State s = adam.state();
  EXPECT_EQ(s.steps, 3);
  EXPECT_EQ(s.parameter_steps, (std::vector<std::int64_t>{3, 1}));

  // Restored into a fresh Adam, the next step is the same bits.
  Pair q;
  q.a.set_value(p.a.value().clone());
  q.b.set_value(p.b.value().clone());
  Adam restored({q.a, q.b}, options());
  restored.set_state(s);
  EXPECT_EQ(restored.parameter_step_count(1), 1);
  for (auto [adam_, pair] : {std::pair{&adam, &p}, std::pair{&restored, &q}}) {
    adam_->zero_grad();
    loss_at(3, pair->a, pair->b).backward();
    adam_->step();
  }
  EXPECT_TRUE(same_bits(p.b.value().to_vector(), q.b.value().to_vector()));

  // An empty list: every parameter at the step count (states from before).
  Adam::State old = s;
  old.parameter_steps.clear();
  restored.set_state(old);
  EXPECT_EQ(restored.parameter_step_count(0), 3);
  EXPECT_EQ(restored.parameter_step_count(1), 3);

  // Impossible counts: a ValueError naming the cause, nothing changed.
  restored.set_state(s);
  for (const std::vector<std::int64_t>& bad :
       {std::vector<std::int64_t>{3, 4}, std::vector<std::int64_t>{-1, 0}, std::vector<std::int64_t>{3}}) {
    Adam::State hostile = s;
    hostile.parameter_steps = bad;
    try {
      restored.set_state(hostile);
      ADD_FAILURE() << "accepted";
    } catch (const ValueError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("step count") != std::string::npos) << what;
    }
    EXPECT_EQ(restored.parameter_step_count(0), 3);
    EXPECT_EQ(restored.parameter_step_count(1), 1);
  }
}

TEST(AdamStepCounts, TheTrainingCheckpointKeepsThemAndRefusesHostileOnes) {
  const fs::path dir = rt_test::fresh_dir("adam_counts", "checkpoint");
  const fs::path path = dir / "training_checkpoint.safetensors";
  Pair p;
  Adam adam({p.a, p.b}, options());
  train(adam, p, 3);
  const std::vector<NamedParameter> trainable{{"a", p.a}, {"b", p.b}};
  const nlohmann::json config = {{"steps", 10}, {"gradient_accumulation_steps", 1}};
  stage::TrainingState state;
  state.step = 3;
  state.world_size_history = stage::extend_world_size_history(nlohmann::json::array(), 1, 1, 3);
  stage::save_training_checkpoint(path, trainable, adam.state(), state, config);
  EXPECT_EQ(read_safetensors(path).metadata.at("adam_parameter_steps"), R"({"b":1})");

  Adam::State loaded;
  stage::TrainingState into;
  stage::load_training_checkpoint(path, trainable, [&](const Adam::State& s) { loaded = s; }, into, config);
  EXPECT_EQ(loaded.steps, 3);
  EXPECT_EQ(loaded.parameter_steps, (std::vector<std::int64_t>{3, 1}));

  // Every parameter at every step: no key (files as before), all at adam_steps.
  Adam::State full = adam.state();
  full.parameter_steps = {3, 3};
  stage::save_training_checkpoint(dir / "full.safetensors", trainable, full, state, config);
  EXPECT_EQ(read_safetensors(dir / "full.safetensors").metadata.count("adam_parameter_steps"), 0U);

  for (const char* hostile : {R"({"b":4})", R"({"c":1})", R"({"b":-1})", R"({"b":1.5})", R"([1])", "{"}) {
    TensorFile f = read_safetensors(path);
    f.metadata["adam_parameter_steps"] = hostile;
    f.metadata["checksum"] = stage::checkpoint_checksum(f.metadata, f.tensors);
    write_safetensors(dir / "bad.safetensors", f.tensors, f.metadata);
    bool called = false;
    try {
      stage::load_training_checkpoint(dir / "bad.safetensors", trainable, [&](const Adam::State&) { called = true; },
                                      into, config);
      ADD_FAILURE() << hostile << " accepted";
    } catch (const ModelStateError& e) {
      EXPECT_NE(std::string(e.what()).find("adam_parameter_steps"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(called) << hostile;
  }
  // A count of 0 beside moments a step made: the optimizer refuses the state,
  // a ModelStateError naming the file, and nothing changes.
  {
    TensorFile f = read_safetensors(path);
    f.metadata["adam_parameter_steps"] = R"({"a":0})";
    f.metadata["checksum"] = stage::checkpoint_checksum(f.metadata, f.tensors);
    write_safetensors(dir / "bad.safetensors", f.tensors, f.metadata);
    Adam fresh({p.a, p.b}, options());
    const std::vector<float> before = p.a.value().to_vector();
    try {
      stage::load_training_checkpoint(dir / "bad.safetensors", trainable, fresh, into, config);
      ADD_FAILURE() << "accepted";
    } catch (const ModelStateError& e) {
      EXPECT_NE(std::string(e.what()).find("step count is 0"), std::string::npos) << e.what();
    }
    EXPECT_EQ(fresh.step_count(), 0);
    EXPECT_TRUE(same_bits(p.a.value().to_vector(), before));
  }
  // Saving refuses counts a resume would refuse (instead of writing the file).
  for (const std::vector<std::int64_t>& bad : {std::vector<std::int64_t>{7, 1}, std::vector<std::int64_t>{-5, 3},
                                                std::vector<std::int64_t>{1}, std::vector<std::int64_t>{3, 0}}) {
    Adam::State hostile = adam.state();
    hostile.parameter_steps = bad;
    EXPECT_THROW(stage::save_training_checkpoint(dir / "refused.safetensors", trainable, hostile, state, config),
                 ValueError);
    EXPECT_FALSE(fs::exists(dir / "refused.safetensors"));
  }
}

TEST(AdamStepCounts, ACountOfZeroNeedsZeroMoments) {
  Pair p;
  Adam adam({p.a, p.b}, options());
  loss_at(0, p.a, p.b).backward();
  adam.step();
  Adam::State s = adam.state();
  s.parameter_steps = {1, 0};  // b was updated: its moments are not zero
  EXPECT_THROW(adam.set_state(s), ValueError);
  EXPECT_EQ(adam.parameter_step_count(1), 1);
  Adam::State old = adam.state();
  old.steps = 0;  // no per-parameter counts: all at 0, with moments a step made
  old.parameter_steps.clear();
  EXPECT_THROW(adam.set_state(old), ValueError);
  s.parameter_steps = {1, 1};
  adam.set_state(s);  // consistent: accepted
}

// An unnamed parameter (Python's Variables are unnamed by default) with a NaN
// gradient was reported as "(it overflowed)": the culprit's empty name read
// as "none found".
TEST(AdamStepCounts, ANonFiniteGradientOfAnUnnamedParameterIsNamedByIndex) {
  Variable named(Tensor::from_data({2}, {1, 2}), true, "named");
  Variable unnamed(Tensor::from_data({2}, {1, 2}), true);
  Adam adam({named, unnamed});
  const std::vector<Tensor> gradients{Tensor::from_data({2}, {1, 1}),
                                      Tensor::from_data({2}, {1, std::numeric_limits<float>::quiet_NaN()})};
  try {
    adam.step(gradients);
    ADD_FAILURE() << "accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("(parameter 1 has a non-finite gradient)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(adam.step_count(), 0);
}
