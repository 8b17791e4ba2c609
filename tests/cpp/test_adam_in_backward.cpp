// Adam::backward_and_step (the optimizer step fused into the backward pass,
// issue 16's S3 memory target): bit-identical to backward() + step() on every
// checkpointing policy, both attentions, LoRA, weight-decay groups and both
// GraphAfterBackward modes; leaves outside the Adam keep their gradients;
// unreached parameters as step() treats them; the failure contract (nothing
// changes before the first update, PartialStepError after it); and the
// allocator's peak counters (not timings) pin the memory it saves.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::randn;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {

struct Case {
  ActivationCheckpointingKind policy = ActivationCheckpointingKind::Disabled;
  FullSequenceAttentionKind attention = FullSequenceAttentionKind::Flash;
  std::optional<ActivationCheckpointingPlan> plan;
  bool lora = false;
  bool groups = false;         // default_parameter_groups: norms without decay
  bool leave_out_norms = false;  // the norm weights train outside the Adam
  GraphAfterBackward graph = GraphAfterBackward::Release;
  std::string what() const {
    return std::string(activation_checkpointing_name(policy)) + (plan ? " " + describe_plan(*plan) : "") +
           (attention == FullSequenceAttentionKind::Flash ? " flash" : " materialized") + (lora ? " lora" : "") +
           (groups ? " groups" : "") + (leave_out_norms ? " norms-outside" : "") +
           (graph == GraphAfterBackward::Keep ? " keep" : " release");
  }
};

struct Run {
  std::vector<Tensor> values;       // every model parameter after the steps
  std::vector<Tensor> outside;      // gradients of the leaves outside the Adam after the last step
  Adam::State state;
  std::vector<float> norms;
};

bool is_norm(const std::string& name) { return name.find("norm") != std::string::npos; }

Run train(const Case& s, bool fused) {
  Random random(31);
  DecoderOnlyTransformer model(tiny_dims(3), random, 1e-5F, s.attention, s.policy);
  if (s.plan) model.set_activation_checkpointing_plan(*s.plan);
  std::vector<NamedParameter> trained = model.parameters();
  if (s.lora) {
    Random lora_random(5);
    LoraConfig config;
    config.rank = 2;
    config.targets = {LoraTarget::Query, LoraTarget::Value, LoraTarget::Down};
    model.add_lora(config, lora_random);
    model.set_base_trainable(false);
    trained = model.lora_parameters();
    for (NamedParameter& p : trained) {  // B starts at zero: give the adapters a non-trivial start
      p.variable.set_value(randn(p.variable.shape(), 17 + p.name.size()));
    }
  }
  std::vector<Variable> outside;
  if (s.leave_out_norms) {
    std::erase_if(trained, [&](const NamedParameter& p) {
      if (is_norm(p.name)) outside.push_back(p.variable);
      return is_norm(p.name);
    });
  }
  AdamOptions options;
  options.learning_rate = 1e-2F;
  options.weight_decay = 0.05F;
  std::vector<Variable> list;
  for (const NamedParameter& p : trained) list.push_back(p.variable);
  Adam adam = s.groups ? Adam(default_parameter_groups(trained, 0.1F, false), options) : Adam(list, options);
  Run r;
  for (int step = 0; step < 3; ++step) {
    const auto b = random_batch(2, 12, 32, 100 + step);
    Variable loss = model.loss(b.tokens, b.targets, 2);
    if (fused) {
      r.norms.push_back(adam.backward_and_step(loss, s.graph));
      for (const Variable& p : adam.parameters()) EXPECT_FALSE(p.grad().defined()) << s.what() << " " << p.name();
    } else {
      loss.backward(s.graph);
      r.norms.push_back(adam.step());
    }
  }
  for (const NamedParameter& p : model.parameters()) r.values.push_back(p.variable.value().clone());
  if (s.lora) {
    for (const NamedParameter& p : model.lora_parameters()) r.values.push_back(p.variable.value().clone());
  }
  for (const Variable& v : outside) r.outside.push_back(v.grad().clone());
  r.state = adam.state();
  return r;
}

void expect_same(const Case& s) {
  const Run reference = train(s, false);
  const Run fused = train(s, true);
  const std::string what = s.what();
  ASSERT_EQ(reference.values.size(), fused.values.size()) << what;
  for (std::size_t i = 0; i < reference.values.size(); ++i) {
    EXPECT_TRUE(bit_equal(reference.values[i], fused.values[i])) << what << " parameter " << i;
  }
  EXPECT_EQ(reference.state.steps, 3) << what;
  EXPECT_EQ(fused.state.steps, 3) << what;
  ASSERT_EQ(reference.state.first_moment.size(), fused.state.first_moment.size()) << what;
  for (std::size_t i = 0; i < reference.state.first_moment.size(); ++i) {
    EXPECT_TRUE(bit_equal(reference.state.first_moment[i], fused.state.first_moment[i])) << what << " m " << i;
    EXPECT_TRUE(bit_equal(reference.state.second_moment[i], fused.state.second_moment[i])) << what << " v " << i;
  }
  ASSERT_EQ(reference.norms.size(), fused.norms.size());
  for (std::size_t i = 0; i < reference.norms.size(); ++i) {
    EXPECT_EQ(reference.norms[i], fused.norms[i]) << what << " norm of step " << i;  // bit-equal, not near
    EXPECT_GT(fused.norms[i], 0.0F) << what;
  }
  ASSERT_EQ(reference.outside.size(), fused.outside.size()) << what;
  for (std::size_t i = 0; i < reference.outside.size(); ++i) {
    ASSERT_TRUE(fused.outside[i].defined()) << what << " outside leaf " << i;
    EXPECT_TRUE(bit_equal(reference.outside[i], fused.outside[i])) << what << " outside leaf " << i;
  }
}

/// An op whose backward throws, or returns NaN, on demand.
Variable faulty_identity(const Variable& x, const bool* should_throw, const bool* poison) {
  return Variable::from_op("faulty_identity", x.value().clone(), {x},
                           [should_throw, poison](const Tensor& g, const std::vector<bool>&) {
                             if (*should_throw) throw std::runtime_error("closure failed on purpose");
                             if (!*poison) return std::vector<Tensor>{g};
                             Tensor bad = g.clone();
                             bad.data()[0] = std::numeric_limits<float>::quiet_NaN();
                             return std::vector<Tensor>{bad};
                           });
}

/// loss = sum(faulty(faulty(x · late) · first)) with its switches: `first`
/// becomes final (and is stepped) before `late`.
struct Chain {
  bool throw_late = false, poison_late = false, throw_first = false, poison_first = false;
  Variable x{randn({3, 4}, 1), false, "x"};
  Variable late{randn({3, 4}, 2), true, "late"};
  Variable first{randn({3, 4}, 3), true, "first"};
  Variable other{randn({3, 4}, 4), true, "other"};  // a leaf outside the Adam
  Variable loss() {
    Variable h = faulty_identity(mul(mul(x, late), other), &throw_late, &poison_late);
    return sum(faulty_identity(mul(h, first), &throw_first, &poison_first));
  }
};

struct Snapshot {
  std::vector<Tensor> values, grads;
  Adam::State state;
};
Snapshot snapshot(const std::vector<Variable>& leaves, const Adam& adam) {
  Snapshot s;
  for (const Variable& v : leaves) {
    s.values.push_back(v.value().clone());
    s.grads.push_back(v.grad().defined() ? v.grad().clone() : Tensor());
  }
  s.state = adam.state();
  return s;
}
void expect_unchanged(const Snapshot& before, const Snapshot& after) {
  for (std::size_t i = 0; i < before.values.size(); ++i) {
    EXPECT_TRUE(bit_equal(before.values[i], after.values[i])) << "value " << i;
    ASSERT_EQ(before.grads[i].defined(), after.grads[i].defined()) << "grad " << i;
    if (before.grads[i].defined()) EXPECT_TRUE(bit_equal(before.grads[i], after.grads[i])) << "grad " << i;
  }
  EXPECT_EQ(before.state.steps, after.state.steps);
  for (std::size_t i = 0; i < before.state.first_moment.size(); ++i) {
    EXPECT_TRUE(bit_equal(before.state.first_moment[i], after.state.first_moment[i])) << "m " << i;
    EXPECT_TRUE(bit_equal(before.state.second_moment[i], after.state.second_moment[i])) << "v " << i;
  }
}

}  // namespace

TEST(AdamInBackward, BitIdenticalToBackwardThenStepOnEveryPolicyAndAttention) {
  for (const ActivationCheckpointingKind policy : activation_checkpointing_kinds()) {
    for (const FullSequenceAttentionKind attention :
         {FullSequenceAttentionKind::Flash, FullSequenceAttentionKind::Materialized}) {
      Case s;
      s.policy = policy;
      s.attention = attention;
      expect_same(s);
    }
  }
  Case planned;
  planned.plan = ActivationCheckpointingPlan{{1, BlockRecompute::Mlp}, {2, BlockRecompute::Whole}};
  expect_same(planned);
}

TEST(AdamInBackward, BitIdenticalWithLoraGroupsKeepAndLeavesOutsideTheAdam) {
  for (const ActivationCheckpointingKind policy :
       {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock}) {
    Case lora;
    lora.policy = policy;
    lora.lora = true;
    expect_same(lora);
    Case groups;
    groups.policy = policy;
    groups.groups = true;
    expect_same(groups);
    Case keep;
    keep.policy = policy;
    keep.graph = GraphAfterBackward::Keep;
    expect_same(keep);
    Case outside;
    outside.policy = policy;
    outside.leave_out_norms = true;
    expect_same(outside);
  }
}

TEST(AdamInBackward, UnreachedAndUncontributedParametersAsBackwardThenStep) {
  // a: reached; b: never reached, no gradient (skipped); c: never reached,
  // holding a gradient from an earlier pass (step() uses it); d: reached,
  // but its consumer gives it no gradient (the commit's zeros: moments move).
  auto run = [](bool fused) {
    Variable a(randn({5}, 1), true, "a"), b(randn({5}, 2), true, "b"), c(randn({5}, 3), true, "c"),
        d(randn({5}, 4), true, "d");
    sum(mul(c, c)).backward();
    Adam adam({a, b, c, d}, AdamOptions{1e-2F, 0.9F, 0.999F, 1e-8F, 0.1F, 0.0F});
    const std::vector<Tensor> earlier{randn({5}, 5), Tensor(), randn({5}, 6), randn({5}, 7)};
    adam.step(earlier);  // moments that a zero gradient visibly moves (b's stay zero)
    const Adam::State moments_before = adam.state();
    Variable blocked = Variable::from_op("no_gradient_for_d", add(a, d).value(), {a, d},
                                         [](const Tensor& g, const std::vector<bool>&) {
                                           return std::vector<Tensor>{g, Tensor()};
                                         });
    Variable loss = sum(mul(blocked, blocked));
    float norm = 0;
    if (fused) {
      norm = adam.backward_and_step(loss);
      for (const Variable& p : {a, b, c, d}) EXPECT_FALSE(p.grad().defined()) << p.name();
    } else {
      loss.backward(GraphAfterBackward::Release);
      EXPECT_FALSE(b.grad().defined());
      norm = adam.step();
    }
    return std::make_tuple(norm, snapshot({a, b, c, d}, adam), moments_before);
  };
  const auto [reference_norm, reference, before] = run(false);
  const auto [fused_norm, fused, unused] = run(true);
  EXPECT_EQ(reference_norm, fused_norm);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(bit_equal(reference.values[i], fused.values[i])) << i;
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(bit_equal(reference.state.first_moment[i], fused.state.first_moment[i])) << i;
    EXPECT_TRUE(bit_equal(reference.state.second_moment[i], fused.state.second_moment[i])) << i;
  }
  EXPECT_TRUE(bit_equal(fused.state.first_moment[1], Tensor::zeros({5}))) << "b was skipped";
  EXPECT_FALSE(bit_equal(fused.state.first_moment[3], before.first_moment[3])) << "d's zeros moved nothing";
  EXPECT_FALSE(bit_equal(fused.state.first_moment[2], before.first_moment[2])) << "c's earlier gradient unused";
  EXPECT_EQ(fused.state.steps, 2);
}

TEST(AdamInBackward, ANonFiniteLateGradientIsAPartialStepErrorNamingTheCount) {
  Chain chain;
  chain.poison_late = true;
  Adam adam({chain.late, chain.first});
  const Tensor late_before = chain.late.value().clone();
  const Tensor first_before = chain.first.value().clone();
  try {
    adam.backward_and_step(chain.loss());
    FAIL() << "no PartialStepError";
  } catch (const PartialStepError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("[Adam::backward_and_step]"), std::string::npos) << message;
    EXPECT_NE(message.find("1 of 2"), std::string::npos) << message;
    EXPECT_NE(message.find("'late'"), std::string::npos) << message;
  }
  EXPECT_EQ(adam.step_count(), 1);  // the step stays advanced: `first` moved with it
  EXPECT_FALSE(bit_equal(first_before, chain.first.value()));
  EXPECT_TRUE(bit_equal(late_before, chain.late.value()));
  EXPECT_TRUE(bit_equal(adam.state().first_moment[0], Tensor::zeros({3, 4})));
}

// Another model's loss reaches none of the Adam's parameters: refused before
// the pass runs (a ValueError naming the count and the first parameter), so
// the loss's graph, the other model's gradients and the Adam are untouched.
TEST(AdamInBackward, ALossReachingNoneOfItsParametersIsRefusedBeforeThePass) {
  Variable w(randn({3, 3}, 41), true, "w");
  Variable other(randn({3, 3}, 42), true, "other");
  const Variable x(randn({2, 3}, 43), false, "x");
  Adam adam({w});
  const Variable before = Variable(w.value().clone());
  const Variable loss = sum(matmul(x, other));
  try {
    adam.backward_and_step(loss);
    FAIL() << "a loss of another parameter was stepped";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("reaches none of this Adam's 1 parameters (the first is 'w')"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(adam.step_count(), 0);
  EXPECT_FALSE(other.grad().defined());
  EXPECT_EQ(w.value().to_vector(), before.value().to_vector());
  loss.backward(GraphAfterBackward::Release);  // the graph is intact
  EXPECT_TRUE(other.grad().defined());
}

TEST(AdamInBackward, AFailureBeforeTheFirstUpdateChangesNothingAndKeepsItsType) {
  Chain chain;
  chain.loss().backward();  // gradients from an earlier pass, which a failure must not touch
  Adam adam({chain.late, chain.first});
  adam.step();  // moments and steps that must survive
  const std::vector<Variable> leaves{chain.late, chain.first, chain.other};
  {
    const Snapshot before = snapshot(leaves, adam);
    chain.poison_first = true;  // the first-final parameter's gradient
    EXPECT_THROW(adam.backward_and_step(chain.loss()), ValueError);
    chain.poison_first = false;
    expect_unchanged(before, snapshot(leaves, adam));
  }
  {
    const Snapshot before = snapshot(leaves, adam);
    chain.throw_first = true;  // a closure throws before any parameter is final
    EXPECT_THROW(adam.backward_and_step(chain.loss()), std::runtime_error);
    chain.throw_first = false;
    expect_unchanged(before, snapshot(leaves, adam));
  }
  {
    Variable stale = chain.loss();
    chain.x.mutable_value().data()[0] += 1.0F;  // an input changed after the graph was built
    const Snapshot before = snapshot(leaves, adam);
    EXPECT_THROW(adam.backward_and_step(stale), StaleGraphError);
    expect_unchanged(before, snapshot(leaves, adam));
  }
  {
    const Snapshot before = snapshot(leaves, adam);
    Variable not_scalar = mul(chain.x, chain.first);
    EXPECT_THROW(adam.backward_and_step(not_scalar), BackwardError);
    expect_unchanged(before, snapshot(leaves, adam));
  }
  {
    chain.throw_late = true;  // a closure throws after `first` was stepped
    try {
      adam.backward_and_step(chain.loss());
      FAIL() << "no PartialStepError";
    } catch (const PartialStepError& e) {
      EXPECT_NE(std::string(e.what()).find("1 of 2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("closure failed on purpose"), std::string::npos) << e.what();
    }
    EXPECT_EQ(adam.step_count(), 2);
  }
}

TEST(AdamInBackward, ANonFiniteLossOnAModelChangesNothing) {
  Random random(31);
  DecoderOnlyTransformer model(tiny_dims(2), random, 1e-5F, FullSequenceAttentionKind::Flash,
                               ActivationCheckpointingKind::TransformerBlock);
  std::vector<Variable> params;
  for (const NamedParameter& p : model.parameters()) params.push_back(p.variable);
  Adam adam(params);
  const auto b = random_batch(2, 12, 32, 9);
  adam.backward_and_step(model.loss(b.tokens, b.targets, 2));
  const Snapshot before = snapshot(params, adam);
  const Variable loss = model.loss(b.tokens, b.targets, 2);
  const Variable nan(Tensor::full(loss.shape(), std::numeric_limits<float>::quiet_NaN()), false, "nan");
  EXPECT_THROW(adam.backward_and_step(mul(loss, nan)), ValueError);  // every gradient NaN: the first-final's refused
  expect_unchanged(before, snapshot(params, adam));
}

TEST(AdamInBackward, MaxGradNormIsRefusedBeforeAnythingRuns) {
  Chain chain;
  AdamOptions options;
  options.max_grad_norm = 1.0F;
  Adam adam({chain.late, chain.first}, options);
  const std::vector<Variable> leaves{chain.late, chain.first, chain.other};
  const Snapshot before = snapshot(leaves, adam);
  Variable loss = chain.loss();
  try {
    adam.backward_and_step(loss);
    FAIL() << "no ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("max_grad_norm"), std::string::npos) << e.what();
  }
  expect_unchanged(before, snapshot(leaves, adam));
  loss.backward(GraphAfterBackward::Release);  // the graph was not touched
  EXPECT_TRUE(chain.first.grad().defined());
}

TEST(AdamInBackward, PeakMemoryDropsByMostOfTheGradients) {
  // Eight 256×256 weights and a one-row input: the gradients (2 MiB) dwarf
  // the activations, as in issue 16's S3. backward()+step() holds every
  // gradient at the commit; the fused step holds one or two at a time.
  constexpr std::int64_t width = 256;
  constexpr int layers = 8;
  std::vector<Variable> weights;
  for (int l = 0; l < layers; ++l) {
    weights.emplace_back(randn({width, width}, 40 + l), true, "w" + std::to_string(l));
  }
  const Variable x(randn({1, width}, 7), false, "x");
  auto forward = [&] {
    Variable h = x;
    for (const Variable& w : weights) h = scale(linear(h, w), 1.0F / 16.0F);  // keeps values near 1
    return sum(h);
  };
  Adam adam(weights);
  const std::int64_t gradient_bytes = layers * width * width * static_cast<std::int64_t>(sizeof(float));
  auto peak_of = [&](bool fused) {
    Variable loss = forward();
    const std::int64_t before = memory_stats().live_bytes;
    reset_peak_memory();
    if (fused) {
      adam.backward_and_step(loss);
    } else {
      loss.backward(GraphAfterBackward::Release);
      adam.step();
    }
    const std::int64_t peak = memory_stats().peak_bytes - before;
    adam.zero_grad();
    return peak;
  };
  const std::int64_t reference = peak_of(false);
  const std::int64_t fused = peak_of(true);
  RecordProperty("reference_peak", std::to_string(reference));
  RecordProperty("fused_peak", std::to_string(fused));
  // The reference holds every gradient at the commit (the graph's last
  // activations, a few KiB, are gone by then: `before` counted them).
  EXPECT_GE(reference, gradient_bytes * 9 / 10) << "reference " << reference;
  EXPECT_LE(fused, reference - gradient_bytes * 3 / 4) << "reference " << reference << " fused " << fused;
}

TEST(AdamInBackward, ACheckpointedModelsPeakDropsByMostOfItsGradients) {
  // Width 64, 4 layers, 8 tokens: the gradients (~0.5 MiB) dwarf the
  // activations. Under 'block' each block's parameters are final right after
  // its replay, so the fused step never holds more than a block's gradients.
  for (const ActivationCheckpointingKind policy :
       {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock}) {
    TransformerDimensions d = tiny_dims(4);
    d.model_width = 64;
    d.heads = 4;
    d.feed_forward_width = 160;
    auto peak_of = [&](bool fused) {
      Random random(3);
      DecoderOnlyTransformer model(d, random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
      std::vector<Variable> params;
      for (const NamedParameter& p : model.parameters()) params.push_back(p.variable);
      Adam adam(params);
      const auto b = random_batch(1, 8, 32, 4);
      Variable loss = model.loss(b.tokens, b.targets, 1);
      const std::int64_t before = memory_stats().live_bytes;
      reset_peak_memory();
      if (fused) {
        adam.backward_and_step(loss);
      } else {
        loss.backward(GraphAfterBackward::Release);
        adam.step();
      }
      return std::make_pair(memory_stats().peak_bytes - before, model.parameter_count() * std::int64_t{4});
    };
    const auto [reference, gradient_bytes] = peak_of(false);
    const auto [fused, unused] = peak_of(true);
    const std::string what = activation_checkpointing_name(policy);
    RecordProperty(what + "_reference_peak", std::to_string(reference));
    RecordProperty(what + "_fused_peak", std::to_string(fused));
    // Measured: disabled 681 KB -> 82 KB, block 768 KB -> 199 KB (gradients 772 KB).
    EXPECT_GE(reference, gradient_bytes * 3 / 4) << what;  // the commit holds them all (activations gone)
    EXPECT_LE(fused, reference - gradient_bytes * 3 / 5) << what << " reference " << reference << " fused " << fused;
  }
}

TEST(AdamInBackward, AParameterThatNoLongerFitsItsMomentsIsRefusedBeforeAnythingRuns) {
  // `late` would only be reached after `first` was stepped: the check runs
  // before the pass, so step()'s ShapeError comes with nothing changed.
  Chain chain;
  chain.late.set_value(randn({2, 2}, 8));
  Adam adam({chain.late, chain.first});
  chain.late.set_value(randn({3, 4}, 9));  // after the Adam made its moments
  const std::vector<Variable> leaves{chain.late, chain.first, chain.other};
  const Snapshot before = snapshot(leaves, adam);
  try {
    adam.backward_and_step(chain.loss());
    FAIL() << "no ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("'late'"), std::string::npos) << e.what();
  }
  expect_unchanged(before, snapshot(leaves, adam));
}

TEST(AdamInBackward, ANormThatOverflowsWithFiniteGradientsIsAPartialStepError) {
  // Each gradient is 3e38 (finite; its square fits a double), but the global
  // norm √(2 · 9e76) is above FLT_MAX: step() refuses it with nothing
  // changed, the fused step finds out only after both updates.
  Variable x(Tensor::full({1}, 3.0e38F), false, "x");
  Variable w0(Tensor::full({1}, 1.0F), true, "w0");
  Variable w1(Tensor::full({1}, 1.0F), true, "w1");
  auto loss = [&] { return add(sum(mul(x, w0)), sum(mul(x, w1))); };
  Adam reference({w0, w1});
  loss().backward();
  EXPECT_THROW(reference.step(), ValueError);
  Adam adam({w0, w1});
  try {
    adam.backward_and_step(loss());
    FAIL() << "no PartialStepError";
  } catch (const PartialStepError& e) {
    EXPECT_NE(std::string(e.what()).find("2 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("overflowed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(adam.step_count(), 1);
}

// A dependency a checkpoint reads only without gradient, also used with
// gradient outside it: the checkpoint still counts as its reader, so the
// fused step updates it only after the checkpoint ran (it updated it first
// and the pass then found its own input stale: a half-applied step).
TEST(AdamInBackward, ALeafACheckpointReadsWithoutGradientIsUpdatedAfterIt) {
  const auto run = [](bool fused) {
    Random r(5);
    Variable x(Tensor::normal({2, 3}, r), true, "x");
    Variable w(Tensor::normal({3, 3}, r), true, "w");
    Variable t(Tensor::normal({3, 3}, r), true, "t");
    Adam adam({w, t});
    const std::function<Variable(const Variable&)> block = [&](const Variable& h) {
      Variable td;
      {
        NoGradGuard no_grad;
        td = scale(t, 1.0F);
      }
      return matmul(matmul(h, w), td);
    };
    Variable loss = sum(matmul(checkpoint(x, std::vector<Variable>{w, t}, block), t));
    if (fused) {
      adam.backward_and_step(loss);
    } else {
      loss.backward();
      adam.step();
    }
    return std::pair{w.value().clone(), t.value().clone()};
  };
  const auto [w1, t1] = run(false);
  const auto [w2, t2] = run(true);
  EXPECT_TRUE(bit_equal(w1, w2));
  EXPECT_TRUE(bit_equal(t1, t2));
}
