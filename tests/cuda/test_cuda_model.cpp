// Whole models on the CUDA backend: logits, loss and every parameter
// gradient against the same model on the CPU (flash and materialized
// attention, grouped-query attention, LoRA); every checkpointing policy bit
// for bit against the ordinary graph on CUDA; an Adam step; decode with the
// K/V cache on the device; the CUDA allocator's accounting; stale graphs
// after model.to(); an activation memory budget met on CUDA, with and
// without activation offload; activation offload (same bits, the boundary
// activations in pinned host memory); and dropout masks made on the device
// with the CPU's bits.
// Every test skips, saying why, when no CUDA device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "cuda_skip.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../cpp/model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/memory_plan.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::random_batch;

namespace {

Tensor host(const Tensor& t) { return t.to(Backend::Cpu); }

/// |actual − expected| <= rtol·|expected| + atol·max|expected| everywhere.
void expect_close(const Tensor& expected, const Tensor& actual, const std::string& what, double rtol = 1e-3,
                  double atol = 1e-4) {
  const Tensor e = host(expected);
  const Tensor a = host(actual);
  ASSERT_EQ(e.shape(), a.shape()) << what;
  double scale = 0.0;
  for (const float x : e.values()) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  std::int64_t bad = 0;
  std::int64_t first = -1;
  double worst = 0.0;
  for (std::int64_t i = 0; i < e.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(e.values()[i]) - a.values()[i]);
    worst = std::max(worst, d);
    if (!(d <= rtol * std::fabs(static_cast<double>(e.values()[i])) + atol * scale)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " " << shape_string(e.shape()) << ": " << bad << " elements off; first at " << first
                    << "; max |diff| " << worst << " (max |expected| " << scale << ")";
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = host(a);
  const Tensor y = host(b);
  return x.shape() == y.shape() &&
         std::memcmp(x.values().data(), y.values().data(), static_cast<std::size_t>(x.numel()) * sizeof(float)) == 0;
}

struct Config {
  const char* name;
  FullSequenceAttentionKind attention;
  std::int64_t kv_heads;  // 0: multi-head
  bool lora;
};

TransformerDimensions dims_for(const Config& c, std::int64_t layers = 2) {
  TransformerDimensions d;
  d.vocab_size = 48;
  d.context_length = 24;
  d.model_width = 32;
  d.heads = 4;
  d.key_value_heads = c.kv_heads;
  d.layers = layers;
  d.feed_forward_width = 40;
  return d;
}

/// The same seeded model (and adapters) on `backend`.
std::unique_ptr<DecoderOnlyTransformer> make_model(const Config& c, Backend backend, std::int64_t layers = 2,
                                                   ActivationCheckpointingKind policy =
                                                       ActivationCheckpointingKind::Disabled) {
  Random random(31);
  auto model = std::make_unique<DecoderOnlyTransformer>(dims_for(c, layers), random, 1e-5F, c.attention, policy);
  if (c.lora) {
    LoraConfig lora;
    lora.rank = 4;
    lora.targets = {LoraTarget::Query, LoraTarget::Value, LoraTarget::Down};
    model->add_lora(lora, random);
    // B starts at zero; give it values so the adapters change the logits and A gets gradients.
    for (NamedParameter& p : model->lora_parameters()) {
      if (p.name.ends_with("lora_b")) p.variable.set_value(rt_test::randn(p.variable.shape(), 33).clone());
    }
  }
  model->to(backend);
  return model;
}

std::vector<Variable> trainable(const DecoderOnlyTransformer& model) {
  std::vector<Variable> out;
  for (const NamedParameter& p : model.parameters()) out.push_back(p.variable);
  for (const NamedParameter& p : model.lora_parameters()) out.push_back(p.variable);
  return out;
}

struct Step {
  Tensor logits;
  Tensor loss;
  std::vector<Tensor> grads;
  std::vector<Tensor> after_adam;
};

/// logits, loss, every gradient, then one Adam step's parameters (all copied to the host).
Step run_step(DecoderOnlyTransformer& model, const rt_test::Batch& b) {
  Step s;
  s.logits = host(model.forward(b.tokens, b.batch).value());
  Variable loss = model.loss(b.tokens, b.targets, b.batch);
  s.loss = host(loss.value());
  loss.backward();
  std::vector<Variable> params = trainable(model);
  for (const Variable& p : params) s.grads.push_back(host(p.grad()));
  Adam adam(params);
  adam.step();
  for (const Variable& p : params) s.after_adam.push_back(host(p.value()));
  return s;
}

class CudaModelParity : public ::testing::TestWithParam<Config> {};

TEST_P(CudaModelParity, LogitsLossGradientsAndAdamMatchCpu) {
  SKIP_WITHOUT_CUDA();
  const Config& c = GetParam();
  const auto b = random_batch(2, 20, 48, 34);
  auto cpu_model = make_model(c, Backend::Cpu);
  auto gpu_model = make_model(c, Backend::Cuda);
  ASSERT_EQ(gpu_model->backend(), Backend::Cuda);
  const Step e = run_step(*cpu_model, b);
  const Step a = run_step(*gpu_model, b);
  expect_close(e.logits, a.logits, "logits");
  expect_close(e.loss, a.loss, "loss", 1e-5, 0.0);
  const std::vector<NamedParameter> names = [&] {
    std::vector<NamedParameter> n = cpu_model->parameters();
    for (NamedParameter& p : cpu_model->lora_parameters()) n.push_back(std::move(p));
    return n;
  }();
  ASSERT_EQ(e.grads.size(), a.grads.size());
  for (std::size_t i = 0; i < e.grads.size(); ++i) {
    expect_close(e.grads[i], a.grads[i], "gradient of " + names[i].name);
    expect_close(e.after_adam[i], a.after_adam[i], "Adam step of " + names[i].name);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModelParity,
                         ::testing::Values(Config{"flash", FullSequenceAttentionKind::Flash, 0, false},
                                           Config{"materialized", FullSequenceAttentionKind::Materialized, 0, false},
                                           Config{"flash_gqa", FullSequenceAttentionKind::Flash, 2, false},
                                           Config{"materialized_gqa", FullSequenceAttentionKind::Materialized, 2,
                                                  false},
                                           Config{"flash_lora", FullSequenceAttentionKind::Flash, 0, true},
                                           Config{"materialized_gqa_lora", FullSequenceAttentionKind::Materialized,
                                                  2, true}),
                         [](const ::testing::TestParamInfo<Config>& info) { return std::string(info.param.name); });

// ---- checkpointing on CUDA: every policy equals the ordinary graph bit for bit ----

class CudaPolicyParity : public ::testing::TestWithParam<FullSequenceAttentionKind> {};

TEST_P(CudaPolicyParity, EveryPolicyEqualsDisabledBitForBit) {
  SKIP_WITHOUT_CUDA();
  const Config c{"policy", GetParam(), 2, true};
  const auto b = random_batch(2, 20, 48, 35);
  const auto run = [&](ActivationCheckpointingKind kind, const ActivationCheckpointingPlan* plan, float dropout) {
    // A plan is set on a built model (set_activation_checkpointing_plan makes the kind Planned).
    auto model = make_model(c, Backend::Cuda, 4, plan != nullptr ? ActivationCheckpointingKind::Disabled : kind);
    if (plan != nullptr) model->set_activation_checkpointing_plan(*plan);
    EXPECT_EQ(model->activation_checkpointing_kind(), kind);
    if (dropout > 0.0F) model->set_dropout(dropout, 7);
    return run_step(*model, b);
  };
  const ActivationCheckpointingPlan mixed{{2, BlockRecompute::Whole},
                                          {1, BlockRecompute::Attention},
                                          {1, BlockRecompute::Mlp}};
  for (const float dropout : {0.0F, 0.2F}) {
    const Step base = run(ActivationCheckpointingKind::Disabled, nullptr, dropout);
    const std::vector<std::pair<std::string, Step>> others = {
        {"block", run(ActivationCheckpointingKind::TransformerBlock, nullptr, dropout)},
        {"segments", run(ActivationCheckpointingKind::BlockSegments, nullptr, dropout)},
        {"attention", run(ActivationCheckpointingKind::AttentionSubBlock, nullptr, dropout)},
        {"mlp", run(ActivationCheckpointingKind::MlpSubBlock, nullptr, dropout)},
        {"mixed plan", run(ActivationCheckpointingKind::Planned, &mixed, dropout)},
    };
    for (const auto& [name, s] : others) {
      const std::string what = name + " (dropout " + std::to_string(dropout) + ")";
      EXPECT_TRUE(same_bits(base.logits, s.logits)) << what << " logits";
      EXPECT_TRUE(same_bits(base.loss, s.loss)) << what << " loss";
      ASSERT_EQ(base.grads.size(), s.grads.size());
      for (std::size_t i = 0; i < base.grads.size(); ++i) {
        EXPECT_TRUE(same_bits(base.grads[i], s.grads[i])) << what << " gradient " << i;
        EXPECT_TRUE(same_bits(base.after_adam[i], s.after_adam[i])) << what << " Adam step " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, CudaPolicyParity,
                         ::testing::Values(FullSequenceAttentionKind::Flash, FullSequenceAttentionKind::Materialized),
                         [](const ::testing::TestParamInfo<FullSequenceAttentionKind>& info) {
                           return std::string(info.param == FullSequenceAttentionKind::Flash ? "flash" : "materialized");
                         });

// ---- activation offload: parked boundary activations, same bits -------------------

TEST(CudaActivationOffload, GradientsEqualOffloadOffBitForBit) {
  SKIP_WITHOUT_CUDA();
  const Config c{"offload", FullSequenceAttentionKind::Flash, 2, true};
  const auto b = random_batch(2, 20, 48, 38);
  const auto run = [&](ActivationCheckpointingKind kind, const ActivationCheckpointingPlan* plan, bool offload,
                       float dropout) {
    auto model = make_model(c, Backend::Cuda, 4, plan != nullptr ? ActivationCheckpointingKind::Disabled : kind);
    if (plan != nullptr) model->set_activation_checkpointing_plan(*plan);
    model->set_activation_offload(offload);
    EXPECT_EQ(model->activation_offload(), offload);
    if (dropout > 0.0F) model->set_dropout(dropout, 7);
    return run_step(*model, b);
  };
  const ActivationCheckpointingPlan mixed{{2, BlockRecompute::Whole},
                                          {1, BlockRecompute::Attention},
                                          {1, BlockRecompute::Mlp}};
  for (const float dropout : {0.0F, 0.2F}) {
    const Step base = run(ActivationCheckpointingKind::Disabled, nullptr, false, dropout);
    const std::vector<std::pair<std::string, Step>> others = {
        {"disabled+offload", run(ActivationCheckpointingKind::Disabled, nullptr, true, dropout)},
        {"block+offload", run(ActivationCheckpointingKind::TransformerBlock, nullptr, true, dropout)},
        {"segments+offload", run(ActivationCheckpointingKind::BlockSegments, nullptr, true, dropout)},
        {"attention+offload", run(ActivationCheckpointingKind::AttentionSubBlock, nullptr, true, dropout)},
        {"mixed plan+offload", run(ActivationCheckpointingKind::Planned, &mixed, true, dropout)},
    };
    for (const auto& [name, s] : others) {
      const std::string what = name + " (dropout " + std::to_string(dropout) + ")";
      EXPECT_TRUE(same_bits(base.logits, s.logits)) << what << " logits";
      EXPECT_TRUE(same_bits(base.loss, s.loss)) << what << " loss";
      ASSERT_EQ(base.grads.size(), s.grads.size());
      for (std::size_t i = 0; i < base.grads.size(); ++i) {
        EXPECT_TRUE(same_bits(base.grads[i], s.grads[i])) << what << " gradient " << i;
        EXPECT_TRUE(same_bits(base.after_adam[i], s.after_adam[i])) << what << " Adam step " << i;
      }
    }
  }
}

TEST(CudaActivationOffload, BoundaryActivationsMoveToPinnedHostMemoryAndBack) {
  SKIP_WITHOUT_CUDA();
  const Config c{"offload memory", FullSequenceAttentionKind::Flash, 0, false};
  const auto b = random_batch(2, 20, 48, 39);
  const std::int64_t layers = 4;
  const std::int64_t boundary = 2 * 20 * 32 * static_cast<std::int64_t>(sizeof(float));  // one (B, T, C) input
  // Device and host live bytes once the loss exists (before backward), and after the step and graph release.
  // The device peak of the step (forward and backward) above the live bytes before it.
  const auto measure = [&](bool offload, std::int64_t& device_live, std::int64_t& host_live, std::int64_t& peak) {
    auto model = make_model(c, Backend::Cuda, layers, ActivationCheckpointingKind::TransformerBlock);
    model->set_activation_offload(offload);
    const std::int64_t device_before = memory_stats(Backend::Cuda).live_bytes;
    const std::int64_t host_before = memory_stats(Backend::Cpu).live_bytes;
    reset_peak_memory(Backend::Cuda);
    {
      Variable loss = model->loss(b.tokens, b.targets, b.batch);
      device_live = memory_stats(Backend::Cuda).live_bytes - device_before;
      host_live = memory_stats(Backend::Cpu).live_bytes - host_before;
      loss.backward();
      peak = memory_stats(Backend::Cuda).peak_bytes - device_before;
      for (Variable& p : trainable(*model)) p.clear_grad();
    }  // graph released
    EXPECT_EQ(memory_stats(Backend::Cuda).live_bytes, device_before) << "offload " << offload;
    EXPECT_EQ(memory_stats(Backend::Cpu).live_bytes, host_before) << "offload " << offload;
  };
  std::int64_t device_off = 0;
  std::int64_t host_off = 0;
  std::int64_t device_on = 0;
  std::int64_t host_on = 0;
  std::int64_t peak_off = 0;
  std::int64_t peak_on = 0;
  measure(false, device_off, host_off, peak_off);
  measure(true, device_on, host_on, peak_on);
  // The backward brings each input back one group ahead and lets it go after its replay: a lower device peak.
  EXPECT_LT(peak_on, peak_off);
  // Every group's input (the embedding output and three block outputs) left the device for pinned host memory.
  EXPECT_EQ(device_off - device_on, layers * boundary);
  EXPECT_EQ(host_on - host_off, layers * boundary);
  // The pinned blocks stay cached for the next step until released with the CPU cache.
  EXPECT_GE(release_cached_memory(Backend::Cpu), layers * boundary);
}

// ---- decode with the K/V cache on the device -------------------------------------

TEST(CudaDecode, DecodeTokenMatchesForwardAndTheCpu) {
  SKIP_WITHOUT_CUDA();
  const Config c{"decode", FullSequenceAttentionKind::Flash, 2, true};
  auto cpu_model = make_model(c, Backend::Cpu);
  auto gpu_model = make_model(c, Backend::Cuda);
  const auto b = random_batch(1, 16, 48, 36);
  const Tensor forward_logits = host(gpu_model->forward(b.tokens, 1).value());  // (1, T, V)
  DecodeSession gpu_session(*gpu_model);
  DecodeSession cpu_session(*cpu_model);
  const std::int64_t v = 48;
  for (std::size_t t = 0; t < b.tokens.size(); ++t) {
    const Tensor g = gpu_session.decode_token(b.tokens[t]);
    ASSERT_EQ(g.backend(), Backend::Cuda);
    const Tensor row = Tensor::from_data({v}, forward_logits.values().subspan(t * static_cast<std::size_t>(v), v));
    expect_close(row, g.reshape({v}), "decode vs forward at position " + std::to_string(t));
    expect_close(cpu_session.decode_token(b.tokens[t]).reshape({v}), g.reshape({v}),
                 "cuda vs cpu decode at position " + std::to_string(t));
  }
  GenerationOptions greedy;
  greedy.max_new_tokens = 6;
  greedy.temperature = 0.0F;
  const std::vector<std::int32_t> prompt{1, 2, 3};
  EXPECT_EQ(generate(*cpu_model, prompt, greedy).tokens, generate(*gpu_model, prompt, greedy).tokens);
}

// ---- allocator accounting ------------------------------------------------------

TEST(CudaModelMemory, LiveReturnsAfterAStepAndPeakExceedsLive) {
  SKIP_WITHOUT_CUDA();
  const Config c{"memory", FullSequenceAttentionKind::Flash, 0, false};
  auto model = make_model(c, Backend::Cuda);
  Adam adam(trainable(*model));  // moments allocated here
  const auto b = random_batch(2, 20, 48, 37);
  const MemoryStats cpu_before = memory_stats(Backend::Cpu);
  for (int step = 0; step < 2; ++step) {
    const std::int64_t live = memory_stats(Backend::Cuda).live_bytes;
    reset_peak_memory(Backend::Cuda);
    {
      Variable loss = model->loss(b.tokens, b.targets, b.batch);
      loss.backward();
    }  // graph released
    adam.step();
    adam.zero_grad();
    const MemoryStats after = memory_stats(Backend::Cuda);
    EXPECT_EQ(after.live_bytes, live) << "step " << step;
    EXPECT_GT(after.peak_bytes, after.live_bytes) << "step " << step;
    EXPECT_GE(after.reserved_bytes, after.live_bytes);
  }
  // The activations live on the device: the host allocator grows by far less than the device peak.
  EXPECT_LT(memory_stats(Backend::Cpu).live_bytes - cpu_before.live_bytes, 1 << 16);
  // The freed activations stay cached until released (reserved counts size classes, live exact bytes).
  const std::int64_t reserved = memory_stats(Backend::Cuda).reserved_bytes;
  EXPECT_GT(release_cached_memory(Backend::Cuda), 0);
  EXPECT_LT(memory_stats(Backend::Cuda).reserved_bytes, reserved);
  EXPECT_GE(memory_stats(Backend::Cuda).reserved_bytes, memory_stats(Backend::Cuda).live_bytes);
}

// ---- transfers make earlier graphs stale -----------------------------------------

TEST(CudaModelTransfer, GraphsBuiltBeforeToAreStale) {
  SKIP_WITHOUT_CUDA();
  const Config c{"stale", FullSequenceAttentionKind::Flash, 0, true};
  auto model = make_model(c, Backend::Cuda);
  const auto b = random_batch(2, 12, 48, 38);
  Variable loss = model->loss(b.tokens, b.targets, b.batch);
  const std::uint64_t version = model->token_embedding().version();
  model->to(Backend::Cpu);
  EXPECT_EQ(model->backend(), Backend::Cpu);
  EXPECT_NE(model->token_embedding().version(), version);
  for (const Variable& p : trainable(*model)) EXPECT_EQ(p.backend(), Backend::Cpu) << p.name();
  EXPECT_THROW(loss.backward(), StaleGraphError);
  // Moving back and forth keeps the values bit for bit; the model trains on the CPU again.
  const Tensor before = host(model->blocks()[0].query.value());
  model->to(Backend::Cuda);
  model->to(Backend::Cpu);
  EXPECT_TRUE(same_bits(before, model->blocks()[0].query.value()));
  Variable fresh = model->loss(b.tokens, b.targets, b.batch);
  EXPECT_NO_THROW(fresh.backward());
}

TEST(CudaModelTransfer, MixedBackendParametersAreRejected) {
  SKIP_WITHOUT_CUDA();
  const Config c{"mixed", FullSequenceAttentionKind::Flash, 0, false};
  auto model = make_model(c, Backend::Cpu);
  Variable(model->blocks()[0].query).to(Backend::Cuda);  // one leaf alone
  const auto b = random_batch(1, 8, 48, 39);
  try {
    (void)model->loss(b.tokens, b.targets, b.batch);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.attention.query.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}

// ---- an activation memory budget met on CUDA ----------------------------------------

TEST(CudaMemoryPlan, MeasuredPeakMeetsTheBudget) {
  SKIP_WITHOUT_CUDA();
  const Config c{"budget", FullSequenceAttentionKind::Flash, 0, false};
  auto model = make_model(c, Backend::Cuda, 6);
  const std::int64_t batch = 2;
  const std::int64_t t = 24;
  const ActivationMemoryProfile profile = profile_activation_memory(*model, batch, t);
  const ActivationMemoryPlan cheapest = plan_activation_memory(profile, std::int64_t{1} << 40);
  const std::int64_t lo = cheapest.smallest_feasible_bytes;
  const std::int64_t hi = cheapest.disabled_peak_bytes;
  ASSERT_LT(lo, hi);
  const auto b = random_batch(batch, t, 48, 40);
  for (const std::int64_t budget : {lo, (lo + hi) / 2, hi}) {
    const ActivationMemoryPlan plan = plan_activation_memory(profile, budget);
    model->set_activation_checkpointing_plan(plan.plan);
    const std::int64_t measured = measure_activation_peak(*model, b.tokens, b.targets, batch);
    EXPECT_LE(measured, budget) << "budget " << budget << " plan " << describe_plan(plan.plan) << " predicted "
                                << plan.predicted_peak_bytes;
    for (Variable& p : trainable(*model)) p.clear_grad();
  }
}

// With offload on, the prediction leaves the offloaded inputs out of what
// groups keep on the device, counts the two inputs back during each replay,
// and predicts the pinned host bytes apart: never below the allocator's
// device peak, at most two block inputs plus 10% above it, and the host
// bytes exact.
TEST(CudaMemoryPlan, OffloadPredictionBoundsTheAllocatorPeak) {
  SKIP_WITHOUT_CUDA();
  const Config c{"budget offload", FullSequenceAttentionKind::Flash, 0, false};
  auto model = make_model(c, Backend::Cuda, 6);
  const std::int64_t batch = 2;
  const std::int64_t t = 24;
  model->set_activation_offload(true);
  const ActivationMemoryProfile profile = profile_activation_memory(*model, batch, t);
  ASSERT_TRUE(profile.activation_offload);
  ActivationMemoryProfile without = profile;
  without.activation_offload = false;
  const auto b = random_batch(batch, t, 48, 41);
  const ActivationCheckpointingPlan plans[] = {
      ActivationCheckpointingPlan(6, CheckpointGroup{1, BlockRecompute::Whole}),
      ActivationCheckpointingPlan(3, CheckpointGroup{2, BlockRecompute::Whole}),
      {{1, BlockRecompute::Attention}, {1, BlockRecompute::Whole}, {1, BlockRecompute::Mlp},
       {2, BlockRecompute::Whole}, {1, BlockRecompute::Nothing}},
      ActivationCheckpointingPlan(6, CheckpointGroup{1, BlockRecompute::Attention})};
  // Host bytes live once the loss exists and the device peak of the step, offload on or off.
  const auto step = [&](bool offload, std::int64_t& host_live, std::int64_t& device_peak) {
    model->set_activation_offload(offload);
    const std::int64_t host_before = memory_stats(Backend::Cpu).live_bytes;
    const std::int64_t device_before = memory_stats(Backend::Cuda).live_bytes;
    reset_peak_memory(Backend::Cuda);
    {
      Variable loss = model->loss(b.tokens, b.targets, b.batch);
      host_live = memory_stats(Backend::Cpu).live_bytes - host_before;
      loss.backward();
    }
    device_peak = memory_stats(Backend::Cuda).peak_bytes - device_before;
    for (Variable& p : trainable(*model)) p.clear_grad();
  };
  for (const ActivationCheckpointingPlan& plan : plans) {
    model->set_activation_checkpointing_plan(plan);
    std::int64_t host_off = 0;
    std::int64_t peak_off = 0;
    std::int64_t host_on = 0;
    std::int64_t measured = 0;
    step(false, host_off, peak_off);
    step(true, host_on, measured);
    const std::int64_t host_pinned = host_on - host_off;
    const std::int64_t predicted = predicted_activation_peak(profile, plan);
    const std::string what = describe_plan(plan) + ": predicted " + std::to_string(predicted) + ", measured " +
                             std::to_string(measured) + "; without offload predicted " +
                             std::to_string(predicted_activation_peak(without, plan)) + ", measured " +
                             std::to_string(peak_off);
    EXPECT_LE(measured, predicted) << what;
    EXPECT_LE(predicted - measured, 2 * profile.block_input_bytes + predicted / 10) << what;
    EXPECT_EQ(host_pinned, predicted_pinned_host_bytes(profile, plan)) << what;
  }
  // A budget: the plan chosen under offload meets it on the device.
  const ActivationMemoryPlan loose = plan_activation_memory(profile, std::int64_t{1} << 40);
  const std::int64_t budget = (loose.smallest_feasible_bytes + loose.disabled_peak_bytes) / 2;
  const ActivationMemoryPlan plan = plan_activation_memory(profile, budget);
  model->set_activation_checkpointing_plan(plan.plan);
  model->set_activation_offload(true);
  EXPECT_LE(measure_activation_peak(*model, b.tokens, b.targets, batch), budget) << describe_plan(plan.plan);
  for (Variable& p : trainable(*model)) p.clear_grad();
  release_cached_memory(Backend::Cpu);
}

// ---- dropout: the Philox mask made on the device --------------------------------

TEST(CudaDropout, MaskIsMadeOnTheDeviceWithTheCpuBits) {
  SKIP_WITHOUT_CUDA();
  const Tensor x = rt_test::randn({4, 1001}, 43);
  const Tensor xc = x.to(Backend::Cuda);
  Random on_device(5);
  Random on_host(5);
  const std::int64_t host_allocations = memory_stats(Backend::Cpu).allocation_count;
  const Variable yc = dropout(Variable(xc), 0.3F, on_device);
  EXPECT_EQ(memory_stats(Backend::Cpu).allocation_count, host_allocations);  // no host mask, no copy
  const Variable y = dropout(Variable(x), 0.3F, on_host);
  EXPECT_TRUE(same_bits(y.value(), yc.value()));
  EXPECT_EQ(on_device.state(), on_host.state());
}

}  // namespace
