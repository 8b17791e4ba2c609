// A checkpointed block's parameters are final to the outer pass's hooks
// inside the block's replay backward, each as soon as the replay has it
// final, not after the whole replay (NestedPassHooks, docs/autograd.md
// "Leaves final inside a nested pass"): on every policy that wraps blocks,
// each leaf exactly once; a weight also used outside the checkpoint (tied)
// once, with the summed gradient; a checkpoint inside a checkpoint's replay;
// and what it saves with Adam::backward_and_step, from the allocator's peak.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "log_probe.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::probe;
using rt_test::randn;

namespace {

/// Counts every report with what had happened by then; never allocates a
/// tensor itself (the allocator's counters are the clock) and consumes
/// nothing unless asked (`log` gets "final <name>" when given).
struct Counting : BackwardHooks {
  struct Report {
    std::string name;
    std::int64_t replays = 0;      // checkpoint replays begun by then
    std::int64_t allocations = 0;  // tensor allocations by then
    Tensor gradient;               // the handle, no copy
  };
  std::vector<Report> reports;
  std::vector<std::string>* log = nullptr;
  bool consume = false;
  void gradient_final(const Variable& leaf, const Tensor& gradient) override {
    reports.push_back({leaf.name(), checkpoint_replay_count(), memory_stats().allocation_count, gradient});
    if (log != nullptr) log->push_back("final " + leaf.name());
  }
  bool consumes(const Variable&) const override { return consume; }
  std::vector<std::pair<Variable, Tensor>> finish() override { return {}; }
  int times(const std::string& name) const {
    int n = 0;
    for (const Report& r : reports) n += r.name == name ? 1 : 0;
    return n;
  }
  const Tensor& gradient_of(const std::string& name) const {
    for (const Report& r : reports) {
      if (r.name == name) return r.gradient;
    }
    static const Tensor none;
    return none;
  }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() &&
         std::memcmp(a.values().data(), b.values().data(), static_cast<std::size_t>(a.nbytes())) == 0;
}

/// The parameters a policy puts inside checkpoints.
bool checkpointed(ActivationCheckpointingKind policy, const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return false;
  if (policy == ActivationCheckpointingKind::AttentionSubBlock) return name.find("attention") != std::string::npos;
  if (policy == ActivationCheckpointingKind::MlpSubBlock) return name.find("mlp") != std::string::npos;
  return true;
}

}  // namespace

TEST(CheckpointHooks, ABlocksParametersAreReportedDuringItsReplayBackwardOnEveryPolicy) {
  for (const ActivationCheckpointingKind policy : activation_checkpointing_kinds()) {
    if (policy == ActivationCheckpointingKind::Disabled) continue;
    const std::string what = activation_checkpointing_name(policy);
    Random random(11);
    DecoderOnlyTransformer model(rt_test::tiny_dims(3), random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
    const auto b = rt_test::random_batch(2, 8, 32, 5);
    Counting hooks;
    model.loss(b.tokens, b.targets, 2).backward(hooks);
    std::vector<Tensor> hooked;
    for (const NamedParameter& p : model.parameters()) {
      EXPECT_EQ(hooks.times(p.name), 1) << what << " " << p.name;  // each leaf exactly once
      EXPECT_TRUE(same_bits(hooks.gradient_of(p.name), p.variable.grad())) << what << " " << p.name;
      hooked.push_back(p.variable.grad().clone());
    }
    // Inside one checkpoint (one replay) its parameters are reported as the
    // replay's backward makes each final: the replay's backward allocates
    // between the first and the last report. After the replay they would
    // come in one burst, nothing allocated in between.
    std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> span;  // replay -> first, last allocation count
    for (const Counting::Report& r : hooks.reports) {
      if (!checkpointed(policy, r.name)) continue;
      auto [it, fresh] = span.try_emplace(r.replays, r.allocations, r.allocations);
      it->second.second = r.allocations;
    }
    EXPECT_GE(span.size(), 1U) << what;
    for (const auto& [replay, allocations] : span) {
      EXPECT_GT(allocations.second, allocations.first) << what << ": replay " << replay << "'s parameters in one burst";
    }
    // The committed gradients are those of backward() without hooks.
    model.loss(b.tokens, b.targets, 2).backward();
    const std::vector<NamedParameter> params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(same_bits(hooked[i], params[i].variable.grad())) << what << " " << params[i].name;
    }
  }
}

TEST(CheckpointHooks, ALeafIsReportedBeforeTheReplaysOwnInputIsDifferentiated) {
  for (const bool consume : {false, true}) {
    const Variable x(randn({3, 4}, 1), true, "x");
    const Variable w(randn({4, 4}, 2), true, "w");
    std::vector<std::string> log;
    const std::vector<Variable> deps{w};
    const Variable out = checkpoint(x, deps, [&](const Variable& v) {
      return silu(matmul(probe(v, "replay input", log), w));  // its backward runs last in the replay
    });
    Counting hooks;
    hooks.log = &log;
    hooks.consume = consume;
    sum(out).backward(hooks);
    EXPECT_EQ(log, (std::vector<std::string>{"final w", "replay input", "final x"})) << consume;
    EXPECT_EQ(w.grad().defined(), !consume);  // a consumed one is cleared at the commit
  }
}

TEST(CheckpointHooks, AWeightAlsoUsedOutsideIsReportedOnceWithTheSummedGradient) {
  // Outside use differentiated before the checkpoint (its consumer comes
  // after it in the forward) and after it (before it in the forward).
  for (const bool outside_first : {true, false}) {
    const Variable x(randn({3, 4}, 3), true, "x");
    const Variable w(randn({4, 4}, 4), true, "w");
    auto loss = [&](std::vector<std::string>& log) {
      const std::vector<Variable> deps{w};
      const Variable in = outside_first ? x : matmul(x, w);
      const Variable h = checkpoint(in, deps, [&](const Variable& v) {
        return silu(matmul(probe(v, "replay input", log), w));
      });
      return sum(outside_first ? matmul(h, w) : h);
    };
    std::vector<std::string> log;
    Counting hooks;
    hooks.log = &log;
    loss(log).backward(hooks);
    EXPECT_EQ(hooks.times("w"), 1) << outside_first;
    // Final only once both uses reached it: after the replay's backward.
    EXPECT_EQ(log[0], "replay input") << outside_first;
    const Tensor reported = hooks.gradient_of("w");
    std::vector<std::string> plain_log;
    loss(plain_log).backward();
    EXPECT_TRUE(same_bits(reported, w.grad())) << outside_first;
    // Consumed (an optimizer step in the pass): the same update as backward() + step().
    auto weights_after = [&](bool fused) {
      const Variable w0(randn({4, 4}, 4), true, "w");
      const Variable x0(randn({3, 4}, 3), false, "x");
      const std::vector<Variable> deps{w0};
      const Variable in = outside_first ? x0 : matmul(x0, w0);
      const Variable h = checkpoint(in, deps, [&](const Variable& v) { return silu(matmul(v, w0)); });
      const Variable l = sum(outside_first ? matmul(h, w0) : h);
      Adam adam({w0});
      if (fused) {
        adam.backward_and_step(l);
      } else {
        l.backward(GraphAfterBackward::Release);
        adam.step();
      }
      return w0.value().clone();
    };
    EXPECT_TRUE(same_bits(weights_after(true), weights_after(false))) << outside_first;
  }
}

TEST(CheckpointHooks, ACheckpointInsideACheckpointsReplayReportsUpLevelByLevel) {
  for (const bool consume : {false, true}) {
    const Variable x(randn({3, 4}, 5), true, "x");
    const Variable w_outer(randn({4, 4}, 6), true, "w_outer");
    const Variable w_inner(randn({4, 4}, 7), true, "w_inner");
    std::vector<std::string> log;
    auto loss = [&] {
      const std::vector<Variable> outer_deps{w_outer, w_inner};
      const Variable out = checkpoint(x, outer_deps, [&](const Variable& v) {
        const Variable a = matmul(probe(v, "outer input", log), w_outer);
        const std::vector<Variable> inner_deps{w_inner};
        return checkpoint(a, inner_deps, [&](const Variable& u) {
          return silu(matmul(probe(u, "inner input", log), w_inner));
        });
      });
      return sum(out);
    };
    Counting hooks;
    hooks.log = &log;
    hooks.consume = consume;
    loss().backward(hooks);
    EXPECT_EQ(log, (std::vector<std::string>{"final w_inner", "inner input", "final w_outer", "outer input",
                                             "final x"}))
        << consume;
    if (consume) continue;
    const Tensor inner = hooks.gradient_of("w_inner").clone();
    const Tensor outer = hooks.gradient_of("w_outer").clone();
    loss().backward();
    EXPECT_TRUE(same_bits(inner, w_inner.grad()));
    EXPECT_TRUE(same_bits(outer, w_outer.grad()));
  }
}

/// node_done() (a GradientBucketer polls its all-reduces there) also runs
/// for the nodes of a replay's nested pass, nested replays included, not
/// only once the checkpoint node is done: a replay is a block's whole
/// backward, long enough for collectives to stall without it.
TEST(CheckpointHooks, NodeDoneRunsForEachNodeOfAReplaysBackward) {
  struct Progress : Counting {
    void node_done() override { log->push_back("node_done"); }
  };
  const Variable x(randn({3, 4}, 15), true, "x");
  const Variable w_outer(randn({4, 4}, 16), true, "w_outer");
  const Variable w_inner(randn({4, 4}, 17), true, "w_inner");
  std::vector<std::string> log;
  const std::vector<Variable> outer_deps{w_outer, w_inner};
  const Variable out = checkpoint(x, outer_deps, [&](const Variable& v) {
    const Variable a = probe(matmul(probe(v, "outer input", log), w_outer), "outer product", log);
    const std::vector<Variable> inner_deps{w_inner};
    return checkpoint(a, inner_deps, [&](const Variable& u) {
      return silu(matmul(probe(u, "inner input", log), w_inner));
    });
  });
  Progress hooks;
  hooks.log = &log;
  sum(out).backward(hooks);
  const auto at = [&](const std::string& what) {
    return static_cast<std::size_t>(std::find(log.begin(), log.end(), what) - log.begin());
  };
  const auto progress_between = [&](std::size_t from, std::size_t to) {
    return std::count(log.begin() + static_cast<std::ptrdiff_t>(from), log.begin() + static_cast<std::ptrdiff_t>(to),
                      std::string("node_done"));
  };
  ASSERT_LT(at("inner input"), at("outer product"));
  ASSERT_LT(at("outer product"), at("outer input"));
  ASSERT_LT(at("outer input"), log.size());
  // The outer pass's sum node, then inside the inner replay (silu, matmul,
  // its input's probe) and inside the outer one (the inner checkpoint node,
  // the probes, the matmul): before, only the outer pass's two nodes.
  EXPECT_GE(progress_between(0, at("inner input")), 2) << ::testing::PrintToString(log);
  EXPECT_GE(progress_between(at("inner input"), at("outer product")), 1) << ::testing::PrintToString(log);
  EXPECT_GE(progress_between(at("outer product"), at("outer input")), 1) << ::testing::PrintToString(log);
  EXPECT_EQ(hooks.times("w_inner"), 1);
  EXPECT_EQ(hooks.times("w_outer"), 1);
}

TEST(CheckpointHooks, TheFusedStepUnderBlockHoldsNoWholeBlocksGradients) {
  // Width 64, 4 layers, 8 tokens: the gradients dwarf the activations.
  // With each block's parameters stepped as its replay makes them final,
  // 'block' with the step in the backward peaks barely above 'disabled'
  // (the replay's activations); holding a whole block's gradients until its
  // replay ended put it most of a block's gradient bytes above (measured:
  // 117 KB over, the block's gradients 189 KB; now 23 KB over).
  TransformerDimensions d = rt_test::tiny_dims(4);
  d.model_width = 64;
  d.heads = 4;
  d.feed_forward_width = 160;
  std::int64_t block_gradient_bytes = 0;
  auto fused_peak = [&](ActivationCheckpointingKind policy) {
    Random random(3);
    DecoderOnlyTransformer model(d, random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
    std::vector<Variable> params;
    block_gradient_bytes = 0;
    for (const NamedParameter& p : model.parameters()) {
      params.push_back(p.variable);
      if (p.name.rfind("blocks.0.", 0) == 0) block_gradient_bytes += p.variable.value().nbytes();
    }
    Adam adam(params);
    const auto b = rt_test::random_batch(1, 8, 32, 4);
    Variable loss = model.loss(b.tokens, b.targets, 1);
    const std::int64_t before = memory_stats().live_bytes;
    reset_peak_memory();
    adam.backward_and_step(loss);
    return memory_stats().peak_bytes - before;
  };
  const std::int64_t disabled = fused_peak(ActivationCheckpointingKind::Disabled);
  const std::int64_t block = fused_peak(ActivationCheckpointingKind::TransformerBlock);
  RecordProperty("disabled_fused_peak", std::to_string(disabled));
  RecordProperty("block_fused_peak", std::to_string(block));
  EXPECT_LE(block, disabled + block_gradient_bytes / 4)
      << "disabled " << disabled << " block " << block << " one block's gradients " << block_gradient_bytes;
}
