// Adam parameter groups, GradientAccumulator, and gradient accumulation in
// the stage pipelines (K micro-batches against one K-times-larger batch).
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scratch.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return rt_test::fresh_dir("accumulation", name); }
using rt_test::read_file;

/// max |a - b| / max |b| over all elements (a relative error of the whole tensor).
double relative_difference(const Tensor& a, const Tensor& b) {
  double diff = 0.0;
  double scale = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a.values()[i]) - b.values()[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b.values()[i])));
  }
  return scale == 0.0 ? diff : diff / scale;
}

PretrainingConfig tiny_pretraining(const fs::path& dir) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
  std::ofstream(dir / "corpus.txt") << text;
  PretrainingConfig c;
  c.dimensions = {256, 32, 16, 2, 2, 32};
  c.data = dir / "corpus.txt";
  c.steps = 4;
  c.batch = 2;
  c.sequence_length = 16;
  c.warmup_steps = 1;
  c.eval_interval = 0;
  c.eval_batches = 1;
  c.checkpoint_interval = 2;
  c.output_dir = dir / "run";
  return c;
}

struct Trace {
  std::vector<float> losses;
  std::vector<float> grad_norms;
};

ProgressCallback record(Trace& t) {
  return [&t](const StepReport& s) {
    t.losses.push_back(s.loss);
    t.grad_norms.push_back(s.grad_norm);
    return true;
  };
}

void expect_close_traces(const Trace& a, const Trace& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  // Step 1 starts from the same weights: the loss and the gradient norm agree
  // to float rounding; later steps follow the same path closely.
  EXPECT_NEAR(a.losses[0], b.losses[0], 1e-5 * std::fabs(b.losses[0]));
  EXPECT_NEAR(a.grad_norms[0], b.grad_norms[0], 1e-5 * std::fabs(b.grad_norms[0]));
  for (std::size_t i = 1; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-3 * std::fabs(b.losses[i]));
}

}  // namespace

TEST(ParameterGroups, NormWeightsAreNotDecayedAndMembershipComesFromNames) {
  Random init(3);
  DecoderOnlyTransformer model(rt_test::tiny_dims(), init);
  const std::vector<NamedParameter> params = model.parameters();
  const std::vector<ParameterGroup> groups = default_parameter_groups(params, 0.5F, true);
  ASSERT_EQ(groups.size(), 2U);
  EXPECT_EQ(groups[0].name, "decay");
  EXPECT_EQ(groups[1].name, "no_decay");
  EXPECT_EQ(groups[1].parameters.size(), 2U * 2U + 1U);  // two norms per block + the final norm
  for (const Variable& v : groups[1].parameters) EXPECT_NE(v.name().find("norm"), std::string::npos) << v.name();
  for (const Variable& v : groups[0].parameters) EXPECT_EQ(v.name().find("norm"), std::string::npos) << v.name();
  const std::vector<ParameterGroup> no_embeddings = default_parameter_groups(params, 0.5F, false);
  EXPECT_EQ(no_embeddings[1].parameters.size(), 2U * 2U + 1U + 2U);

  // Zero gradients: only decay moves a weight, and only in the decay group.
  AdamOptions o;
  o.learning_rate = 0.1F;
  o.weight_decay = 0.5F;
  Adam adam(groups, o);
  EXPECT_EQ(adam.groups().size(), 2U);
  EXPECT_FLOAT_EQ(adam.weight_decay_of(adam.groups()[1].begin), 0.0F);
  std::vector<Tensor> before;
  std::vector<Tensor> zeros;
  for (const Variable& p : adam.parameters()) {
    before.push_back(p.value().clone());
    zeros.push_back(Tensor::zeros(p.shape()));
  }
  adam.step(zeros);
  for (std::size_t i = 0; i < before.size(); ++i) {
    const Variable& p = adam.parameters()[i];
    const bool decayed = i < adam.groups()[0].end;
    for (std::int64_t j = 0; j < p.value().numel(); ++j) {
      const float expected = decayed ? before[i].values()[j] * (1.0F - 0.1F * 0.5F) : before[i].values()[j];
      ASSERT_EQ(p.value().values()[j], expected) << p.name();
    }
  }
}

TEST(ParameterGroups, BadGroupsAreRefusedByName) {
  Variable a(Tensor::ones({2}), true, "a");
  Variable b(Tensor::ones({2}), true, "b");
  try {
    Adam adam(std::vector<ParameterGroup>{{"first", {a, b}, {}}, {"second", {a}, 0.0F}}, AdamOptions{});
    FAIL() << "a parameter in two groups was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'a' appears twice (again in group 'second')"), std::string::npos) << e.what();
  }
  try {
    Adam adam(std::vector<ParameterGroup>{{"odd", {a}, -1.0F}}, AdamOptions{});
    FAIL() << "a negative decay was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("group 'odd': weight_decay"), std::string::npos) << e.what();
  }
  Adam adam({a, b}, AdamOptions{});
  EXPECT_THROW(adam.step(std::vector<Tensor>{Tensor::ones({2})}), ValueError);  // one gradient for two
  EXPECT_THROW(adam.step(std::vector<Tensor>{Tensor::ones({3}), Tensor()}), ShapeError);
  EXPECT_EQ(adam.step_count(), 0);
}

TEST(ParameterGroups, AParameterListedTwiceInOneListIsRefused) {
  // Was accepted: the parameter was then updated twice per step.
  Variable a(Tensor::ones({2}), true, "a");
  Variable b(Tensor::ones({2}), true, "b");
  try {
    Adam adam({a, b, a}, AdamOptions{});
    FAIL() << "a parameter listed twice was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 2 'a' appears twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Adam(std::vector<ParameterGroup>{{"one", {b, b}, {}}}, AdamOptions{}), ValueError);
}

TEST(ParameterGroups, StepWithAnAccumulatorOfOtherParametersIsRefused) {
  // Same count and shapes, other order: the sums would have trained the
  // wrong weights silently.
  Variable a(Tensor::ones({2}), true, "a");
  Variable b(Tensor::ones({2}), true, "b");
  Adam adam({a, b}, AdamOptions{});
  for (const auto& params : {std::vector<Variable>{b, a}, std::vector<Variable>{a}}) {
    GradientAccumulator acc(params);
    sum(add(a, scale(b, 2.0F))).backward();
    acc.add();
    try {
      adam.step(acc);
      FAIL() << "an accumulator of other parameters was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("GradientAccumulator"), std::string::npos) << e.what();
    }
    EXPECT_EQ(adam.step_count(), 0);
    EXPECT_EQ(a.value().values()[0], 1.0F);
    EXPECT_EQ(b.value().values()[0], 1.0F);
  }
  GradientAccumulator own(adam.parameters());
  sum(add(a, b)).backward();
  own.add();
  adam.step(own);
  EXPECT_EQ(adam.step_count(), 1);
}

TEST(ParameterGroups, ExplicitGradientsStepLikeCommittedOnes) {
  auto run = [](bool explicit_gradients) {
    Random init(5);
    DecoderOnlyTransformer model(rt_test::tiny_dims(), init);
    AdamOptions o;
    o.weight_decay = 0.1F;
    o.max_grad_norm = 0.5F;
    Adam adam(default_parameter_groups(model.parameters(), 0.1F, true), o);
    const rt_test::Batch b = rt_test::random_batch(2, 8, 32, 9);
    for (int step = 0; step < 2; ++step) {
      model.loss(b.tokens, b.targets, b.batch).backward();
      if (explicit_gradients) {
        std::vector<Tensor> grads;
        for (const Variable& p : adam.parameters()) grads.push_back(p.grad().clone());
        adam.zero_grad();
        adam.step(grads);
      } else {
        adam.step();
      }
    }
    std::vector<float> all;
    for (const NamedParameter& p : model.parameters()) {
      const auto v = p.variable.value().values();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  EXPECT_EQ(run(true), run(false));
}

TEST(GradientAccumulation, WeightedMicroBatchesEqualOneLargeBatchWithMaskedTargets) {
  Random init(7);
  DecoderOnlyTransformer model(rt_test::tiny_dims(), init);
  rt_test::Batch big = rt_test::random_batch(4, 8, 32, 11);
  // Different numbers of real targets per row, as post-training gives.
  for (std::size_t i = 0; i < big.targets.size(); ++i) {
    if ((i % 8) < (i / 8) * 2 || i % 5 == 0) big.targets[i] = kIgnoreTarget;
  }
  model.loss(big.tokens, big.targets, 4).backward();
  std::vector<Tensor> reference;
  std::vector<Variable> params;
  for (const NamedParameter& p : model.parameters()) {
    reference.push_back(p.variable.grad().clone());
    params.push_back(p.variable);
  }
  GradientAccumulator acc(params);
  const std::int64_t half = 2 * 8;
  auto count = [&](std::int64_t from) {
    return std::count_if(big.targets.begin() + from, big.targets.begin() + from + half,
                         [](std::int32_t t) { return t != kIgnoreTarget; });
  };
  const double total = static_cast<double>(count(0) + count(half));
  ASSERT_NE(count(0), count(half));
  for (const std::int64_t from : {std::int64_t{0}, half}) {
    const std::span<const std::int32_t> tokens(big.tokens.data() + from, half);
    const std::span<const std::int32_t> targets(big.targets.data() + from, half);
    model.loss(tokens, targets, 2).backward();
    acc.add(static_cast<float>(count(from) / total));
  }
  EXPECT_EQ(acc.count(), 2);
  for (std::size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(acc.gradients()[i].defined());
    EXPECT_LT(relative_difference(acc.gradients()[i], reference[i]), 1e-5) << params[i].name();
  }
  EXPECT_THROW(acc.add(std::nanf("")), ValueError);
  acc.clear();
  EXPECT_EQ(acc.count(), 0);
  EXPECT_FALSE(acc.gradients()[0].defined());
}

TEST(GradientAccumulation, PretrainingMatchesTheLargerBatchAndIsDeterministic) {
  const fs::path dir = fresh_dir("pretrain");
  PretrainingConfig big = tiny_pretraining(dir);
  big.batch = 4;
  big.output_dir = dir / "big";
  Trace big_trace;
  ASSERT_TRUE(run_pretraining(big, record(big_trace)).completed);

  PretrainingConfig micro = tiny_pretraining(dir);
  micro.gradient_accumulation_steps = 2;
  micro.output_dir = dir / "micro";
  Trace micro_trace;
  ASSERT_TRUE(run_pretraining(micro, record(micro_trace)).completed);
  expect_close_traces(micro_trace, big_trace);
  {
    const auto a = load_model(dir / "big" / "model.safetensors");
    const auto b = load_model(dir / "micro" / "model.safetensors");
    double worst = 0.0;
    for (std::size_t i = 0; i < a->parameters().size(); ++i) {
      worst = std::max(worst, relative_difference(b->parameters()[i].variable.value(), a->parameters()[i].variable.value()));
    }
    std::printf("pretraining: largest relative weight difference after 4 steps %.3g\n", worst);
    // Adam divides by sqrt(v): where a gradient element is near zero, rounding
    // in the sum moves its update by up to lr. Measured 2e-5 after 4 steps;
    // the gradients themselves agree to 1e-5 (WeightedMicroBatches... above).
    EXPECT_LT(worst, 1e-4);
  }

  const nlohmann::json meta = nlohmann::json::parse(read_file(micro.output_dir / "metadata.json"));
  EXPECT_EQ(meta["config"]["gradient_accumulation_steps"], 2);
  EXPECT_EQ(meta["config"]["batch"], 2);
  EXPECT_EQ(meta["facts"]["effective_batch"], 4);
  EXPECT_EQ(meta["config"]["decay_embeddings"], true);
  const nlohmann::json& groups = meta["facts"]["parameter_groups"];
  ASSERT_EQ(groups.size(), 2U);
  EXPECT_EQ(groups[1]["name"], "no_decay");
  EXPECT_EQ(groups[1]["parameter_names"].size(), 5U);
  EXPECT_EQ(groups[1]["parameter_names"][0], "blocks.0.attention_norm.weight");

  // Twice: bit for bit. With block checkpointing: the same bits again.
  micro.output_dir = dir / "micro_again";
  micro.activation_checkpointing = ActivationCheckpointingKind::TransformerBlock;
  ASSERT_TRUE(run_pretraining(micro).completed);
  EXPECT_EQ(read_file(dir / "micro" / "model.safetensors"), read_file(dir / "micro_again" / "model.safetensors"));

  // Interrupted after step 3 (checkpoint at step 2) and resumed: the same bits.
  micro.output_dir = dir / "micro_resumed";
  run_pretraining(micro, [](const StepReport& s) { return s.step < 3; });
  micro.resume = true;
  PretrainingConfig other_k = micro;
  other_k.gradient_accumulation_steps = 4;
  try {
    run_pretraining(other_k);
    FAIL() << "resume with another K was accepted";
  } catch (const ModelStateError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps"), std::string::npos) << e.what();
  }
  EXPECT_EQ(run_pretraining(micro).resumed_from_step, 2);
  EXPECT_EQ(read_file(dir / "micro" / "model.safetensors"), read_file(dir / "micro_resumed" / "model.safetensors"));

  PretrainingConfig bad = tiny_pretraining(dir);
  bad.gradient_accumulation_steps = 0;
  EXPECT_THROW(run_pretraining(bad), ValueError);
}

TEST(GradientAccumulation, PostTrainingWithMaskedTargetsMatchesTheLargerBatch) {
  const fs::path dir = fresh_dir("post");
  PretrainingConfig base = tiny_pretraining(dir);
  base.dimensions.context_length = 96;
  base.steps = 1;
  base.output_dir = dir / "base";
  ASSERT_TRUE(run_pretraining(base).completed);

  for (const FineTuningMethod method : {FineTuningMethod::Full, FineTuningMethod::Lora}) {
    PostTrainingConfig c;
    c.base_model = base.output_dir / "model.safetensors";
    c.data = fs::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl";
    c.fine_tuning_method = method;
    c.lora.rank = 2;
    c.steps = 3;
    c.batch = 6;
    c.sequence_length = 96;
    c.eval_interval = 0;
    c.eval_batches = 1;
    c.weight_decay = 0.1F;
    c.output_dir = dir / "big";
    Trace big_trace;
    ASSERT_TRUE(run_post_training(c, record(big_trace)).completed);
    c.batch = 2;
    c.gradient_accumulation_steps = 3;
    c.output_dir = dir / "micro";
    Trace micro_trace;
    ASSERT_TRUE(run_post_training(c, record(micro_trace)).completed);
    expect_close_traces(micro_trace, big_trace);
    // The trained weights after three steps: the same up to float rounding.
    const char* file = method == FineTuningMethod::Full ? "model.safetensors" : "adapter.safetensors";
    std::vector<std::unique_ptr<DecoderOnlyTransformer>> trained;
    for (const char* run : {"big", "micro"}) {
      trained.push_back(load_model(c.base_model));
      if (method == FineTuningMethod::Full) {
        load_model_state(*trained.back(), dir / run / file);
      } else {
        load_adapter_state(*trained.back(), dir / run / file);
      }
    }
    const auto a = method == FineTuningMethod::Full ? trained[0]->parameters() : trained[0]->lora_parameters();
    const auto b = method == FineTuningMethod::Full ? trained[1]->parameters() : trained[1]->lora_parameters();
    ASSERT_EQ(a.size(), b.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, relative_difference(b[i].variable.value(), a[i].variable.value()));
    }
    std::printf("post-training %s: largest relative weight difference %.3g\n", file, worst);
    EXPECT_LT(worst, 1e-5);
  }
}

// Each commit's gradient is summed once: a parameter the last pass did not
// reach still holds an earlier pass's gradient, which add() used to sum
// again unless zero_grad() ran between adds (PyTorch's .grad += counts each
// pass once). A clear() does not make an added gradient new again.
TEST(GradientAccumulation, AGradientAddedOnceIsNotAddedAgainByALaterAdd) {
  Variable a(Tensor::from_data({2}, {1.0F, 2.0F}), true, "a");
  Variable b(Tensor::from_data({2}, {3.0F, -1.0F}), true, "b");
  GradientAccumulator acc({a, b});
  add(sum(mul(a, a)), sum(mul(b, b))).backward();  // pass 1 reaches a and b: 2a, 2b
  acc.add(0.5F);
  sum(mul(a, a)).backward();  // pass 2 reaches a only; b keeps pass 1's gradient
  acc.add(0.5F);
  EXPECT_EQ(acc.count(), 2);
  EXPECT_EQ(acc.gradients()[0].to_vector(), (std::vector<float>{2.0F, 4.0F}));   // 0.5·2a + 0.5·2a
  EXPECT_EQ(acc.gradients()[1].to_vector(), (std::vector<float>{3.0F, -1.0F}));  // 0.5·2b once, not twice
  acc.add(1.0F);  // no pass since: nothing new
  EXPECT_EQ(acc.gradients()[0].to_vector(), (std::vector<float>{2.0F, 4.0F}));
  acc.clear();
  acc.add(1.0F);  // still the same commits: nothing new to sum after the clear either
  EXPECT_FALSE(acc.gradients()[0].defined());
  EXPECT_FALSE(acc.gradients()[1].defined());
  sum(mul(b, b)).backward();  // a new commit of b: summed
  acc.add(1.0F);
  EXPECT_FALSE(acc.gradients()[0].defined());
  EXPECT_EQ(acc.gradients()[1].to_vector(), (std::vector<float>{6.0F, -2.0F}));
}
