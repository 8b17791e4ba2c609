// BackwardHooks (the engine's per-leaf "gradient final" callback and the
// replaceable commit) and the GradientBucketer on the single-process
// communicator. The multi-rank checks are in tests/mpi/test_buckets.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "log_probe.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/ops.hpp"

using namespace riftco_transformer;
using rt_test::probe;
using rt_test::randn;

namespace {

/// Records every gradient_final call; finish() returns `replacements`.
struct Recorder : BackwardHooks {
  std::vector<std::string>* log = nullptr;
  std::vector<Tensor> gradients;
  std::vector<std::int64_t> replays_at_final;
  std::vector<std::pair<Variable, Tensor>> replacements;
  bool fail_in_finish = false;
  int begun = 0;
  int nodes = 0;
  void begin_pass() override { ++begun; }
  void node_done() override { ++nodes; }
  void gradient_final(const Variable& leaf, const Tensor& gradient) override {
    log->push_back("final " + leaf.name());
    gradients.push_back(gradient.defined() ? gradient.clone() : Tensor());
    replays_at_final.push_back(checkpoint_replay_count());
  }
  std::vector<std::pair<Variable, Tensor>> finish() override {
    if (fail_in_finish) throw CommunicationError("[test] the all-reduce failed");
    return replacements;
  }
};

struct Chain {
  std::vector<Variable> w;
  Variable x{randn({3, 4}, 11), false, "x"};
  explicit Chain(int layers) {
    for (int k = 0; k < layers; ++k) w.emplace_back(randn({4, 4}, 20 + static_cast<std::uint64_t>(k)), true,
                                                    "w" + std::to_string(k));
  }
  /// x -> [linear(w_k), silu, probe "p_k"] for each k -> sum.
  Variable loss(std::vector<std::string>& log, bool checkpointed = false, const bool* fail_at_p0 = nullptr) const {
    Variable h = x;
    for (std::size_t k = 0; k < w.size(); ++k) {
      const Variable wk = w[k];
      if (checkpointed) {
        const std::vector<Variable> deps{wk};
        h = checkpoint(h, deps, [wk](const Variable& v) { return silu(matmul(v, wk)); });
      } else {
        h = silu(matmul(h, wk));
      }
      h = probe(h, "p" + std::to_string(k), log, k == 0 ? fail_at_p0 : nullptr);
    }
    return sum(h);
  }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() &&
         std::memcmp(a.values().data(), b.values().data(), static_cast<std::size_t>(a.nbytes())) == 0;
}

std::vector<Tensor> grads_of(const std::vector<Variable>& params) {
  std::vector<Tensor> out;
  for (const Variable& p : params) out.push_back(p.grad().clone());
  return out;
}

}  // namespace

TEST(BackwardHooks, EachLeafIsFinalRightAfterItsLastConsumerRan) {
  Chain chain(4);
  std::vector<std::string> log;
  Recorder hooks;
  hooks.log = &log;
  chain.loss(log).backward(hooks);
  // The probe after layer k runs before layer k's matmul; w_k is final as
  // soon as that matmul ran, before anything of the layers below.
  const std::vector<std::string> expected{"p3", "final w3", "p2", "final w2", "p1", "final w1", "p0", "final w0"};
  EXPECT_EQ(log, expected);
  EXPECT_EQ(hooks.begun, 1);
  EXPECT_EQ(hooks.nodes, 4 * 3 + 1);  // matmul, silu, probe per layer, and the sum
  // The reported gradients are the committed ones.
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(same_bits(hooks.gradients[static_cast<std::size_t>(3 - k)], chain.w[static_cast<std::size_t>(k)].grad()));
  }
}

TEST(BackwardHooks, ASharedLeafIsFinalOnlyAfterItsLastUse) {
  Variable w(randn({4, 4}, 3), true, "w");
  Variable x(randn({2, 4}, 4), false, "x");
  std::vector<std::string> log;
  const Variable inner = probe(matmul(x, w), "inner", log);
  const Variable loss = sum(probe(matmul(inner, w), "outer", log));
  Recorder hooks;
  hooks.log = &log;
  loss.backward(hooks);
  EXPECT_EQ(log, (std::vector<std::string>{"outer", "inner", "final w"}));
  loss.backward();
  EXPECT_TRUE(same_bits(hooks.gradients[0], w.grad()));  // both uses summed before it was final
}

TEST(BackwardHooks, CheckpointedBlockLeavesAreFinalAfterTheirReplay) {
  Chain chain(3);
  std::vector<std::string> log;
  Recorder hooks;
  hooks.log = &log;
  const Variable loss = chain.loss(log, /*checkpointed=*/true);
  reset_checkpoint_replay_count();
  loss.backward(hooks);
  EXPECT_EQ(log, (std::vector<std::string>{"p2", "final w2", "p1", "final w1", "p0", "final w0"}));
  // w_k is final right after its own block's replay, before the next one's.
  EXPECT_EQ(hooks.replays_at_final, (std::vector<std::int64_t>{1, 2, 3}));
  // The same gradients as the ordinary graph.
  std::vector<std::string> plain_log;
  chain.loss(plain_log).backward();
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(same_bits(hooks.gradients[static_cast<std::size_t>(2 - k)], chain.w[static_cast<std::size_t>(k)].grad()));
  }
}

TEST(BackwardHooks, FinishReplacesTheCommittedGradientsEvenOfLeavesThePassMissed) {
  Chain chain(2);
  Variable unused(randn({5}, 9), true, "unused");
  std::vector<std::string> log;
  Recorder hooks;
  hooks.log = &log;
  const Tensor replaced = Tensor::full({4, 4}, 7.0F);
  hooks.replacements = {{chain.w[0], replaced}, {unused, Tensor::full({5}, 2.0F)}};
  chain.loss(log).backward(hooks);
  EXPECT_EQ(chain.w[0].grad().to_vector(), replaced.to_vector());
  EXPECT_NE(chain.w[0].grad().storage_id(), replaced.storage_id());  // never the hook's own buffer
  EXPECT_TRUE(same_bits(chain.w[1].grad(), hooks.gradients[0]));     // not replaced: the pass's own
  EXPECT_EQ(unused.grad().to_vector(), std::vector<float>(5, 2.0F));
}

TEST(BackwardHooks, AFailureAnywhereLeavesEveryPublicGradientAsItWas) {
  Chain chain(3);
  std::vector<std::string> log;
  chain.loss(log).backward();
  const std::vector<Tensor> before = grads_of(chain.w);
  auto unchanged = [&] {
    for (std::size_t k = 0; k < chain.w.size(); ++k) EXPECT_TRUE(same_bits(chain.w[k].grad(), before[k]));
  };
  chain.w[0].mutable_value().data()[0] += 1.0F;  // the next passes' gradients differ

  // A node failing after some leaves were final.
  bool fail = true;
  Recorder hooks;
  hooks.log = &log;
  EXPECT_THROW(chain.loss(log, false, &fail).backward(hooks), std::runtime_error);
  EXPECT_EQ(hooks.gradients.size(), 2U);  // w2 and w1 were final already
  unchanged();
  // The hook failing in finish (a failed collective).
  fail = false;
  Recorder failing;
  failing.log = &log;
  failing.fail_in_finish = true;
  EXPECT_THROW(chain.loss(log, false, &fail).backward(failing), CommunicationError);
  unchanged();
  // A replacement of the wrong shape.
  Recorder wrong;
  wrong.log = &log;
  wrong.replacements = {{chain.w[1], Tensor::zeros({3})}};
  EXPECT_THROW(chain.loss(log).backward(wrong), ShapeError);
  unchanged();
}

TEST(GradientBucketer, BucketsFillInReverseRegistrationOrder) {
  const auto comm = make_single_process_communicator();
  // 4x4 floats = 64 B each; a 150 B bucket holds two.
  Chain chain(5);
  GradientBucketer bucketer(*comm, chain.w, BucketOptions{150.0 / (1024 * 1024), true});
  ASSERT_EQ(bucketer.bucket_count(), 3U);
  EXPECT_EQ(bucketer.bucket_parameters(0), (std::vector<std::size_t>{4, 3}));
  EXPECT_EQ(bucketer.bucket_parameters(1), (std::vector<std::size_t>{2, 1}));
  EXPECT_EQ(bucketer.bucket_parameters(2), (std::vector<std::size_t>{0}));
  EXPECT_EQ(bucketer.bucket_elements(0), 32);
  EXPECT_THROW(bucketer.bucket_parameters(3), ValueError);
  // The default 25 MiB: one bucket.
  EXPECT_EQ(GradientBucketer(*comm, chain.w).bucket_count(), 1U);
}

TEST(GradientBucketer, BadArgumentsAreValueErrors) {
  const auto comm = make_single_process_communicator();
  Chain chain(2);
  EXPECT_THROW(GradientBucketer(*comm, chain.w, BucketOptions{0.0, true}), ValueError);
  EXPECT_THROW(GradientBucketer(*comm, {chain.w[0], chain.w[0]}), ValueError);
  EXPECT_THROW(GradientBucketer(*comm, {chain.x}), ValueError);  // does not require grad
  // Finite but past int64 as elements (clamped, not converted out of range):
  // one bucket holds everything; a tiny size gives each parameter its own.
  EXPECT_EQ(GradientBucketer(*comm, chain.w, BucketOptions{1e300, true}).bucket_count(), 1U);
  EXPECT_EQ(GradientBucketer(*comm, chain.w, BucketOptions{1e-300, true}).bucket_count(), 2U);
}

TEST(GradientBucketer, StartsBucketsDuringBackwardAndCommitsThePlainGradients) {
  const auto comm = make_single_process_communicator();
  Chain chain(5);
  std::vector<std::string> log;
  chain.loss(log, true).backward();
  const std::vector<Tensor> plain = grads_of(chain.w);
  GradientBucketer bucketer(*comm, chain.w, BucketOptions{150.0 / (1024 * 1024), true});
  bucketer.backward(chain.loss(log, true));
  for (std::size_t k = 0; k < chain.w.size(); ++k) EXPECT_TRUE(same_bits(chain.w[k].grad(), plain[k])) << k;
  const auto& report = bucketer.last_pass();
  EXPECT_EQ(report.started, (std::vector<std::size_t>{0, 1, 2}));
  // Bucket 0 (w4, w3) started when only its two parameters were final.
  EXPECT_EQ(report.final_parameters_at_start, (std::vector<std::size_t>{2, 4, 5}));
  EXPECT_EQ(report.started_during_backward, 3U);
}

TEST(GradientBucketer, AFailedPassCommitsNothingAndTheNextPassWorks) {
  const auto comm = make_single_process_communicator();
  Chain chain(4);
  std::vector<std::string> log;
  GradientBucketer bucketer(*comm, chain.w, BucketOptions{70.0 / (1024 * 1024), true});
  bucketer.backward(chain.loss(log));
  const std::vector<Tensor> before = grads_of(chain.w);
  chain.w[0].mutable_value().data()[0] += 1.0F;
  bool fail = true;
  EXPECT_THROW(bucketer.backward(chain.loss(log, false, &fail)), std::runtime_error);
  EXPECT_GE(bucketer.last_pass().started.size(), 2U);  // buckets had started
  for (std::size_t k = 0; k < chain.w.size(); ++k) EXPECT_TRUE(same_bits(chain.w[k].grad(), before[k]));
  fail = false;
  bucketer.backward(chain.loss(log));
  EXPECT_FALSE(same_bits(chain.w[0].grad(), before[0]));
  EXPECT_EQ(bucketer.last_pass().started.size(), 4U);
}

// A parameter no rank's pass reached (and no base held) is left as backward()
// leaves a leaf it did not reach, as in one process and as
// synchronize_gradients: no gradient, or its earlier one (whose serial an
// optimizer already stepped with). It used to get zeros, which Adam stepped:
// decay and moments moved for an unused branch.
TEST(GradientBucketer, AParameterNoRankReachedIsLeftAsBackwardLeavesIt) {
  const auto comm = make_single_process_communicator();
  Chain chain(2);
  Variable unused(randn({3}, 5), true, "unused");
  std::vector<Variable> params = chain.w;
  params.push_back(unused);
  GradientBucketer bucketer(*comm, params);
  std::vector<std::string> log;
  bucketer.backward(chain.loss(log));
  EXPECT_FALSE(unused.grad().defined());
  sum(mul(unused, unused)).backward();  // an earlier pass that reached it
  const std::uint64_t serial = unused.grad_serial();
  const Tensor earlier = unused.grad();
  bucketer.backward(chain.loss(log));
  EXPECT_EQ(unused.grad_serial(), serial);
  EXPECT_EQ(unused.grad().storage_id(), earlier.storage_id());
  // Adam over the bucketer's gradients: the unused parameter stays put, as
  // after plain backward() and step().
  Adam adam(params);
  adam.step();  // steps the earlier gradient once (it is fresh to this Adam)
  const std::vector<float> after_first = unused.value().to_vector();
  bucketer.backward(chain.loss(log));
  adam.step();
  EXPECT_EQ(unused.value().to_vector(), after_first);
  EXPECT_EQ(adam.parameter_step_count(params.size() - 1), 1);
}

TEST(GradientBucketer, AccumulationReducesTheAccumulatorsSumsBitForBit) {
  const auto comm = make_single_process_communicator();
  Chain chain(3);
  Variable unused(randn({3}, 5), true, "unused");
  std::vector<Variable> params = chain.w;
  params.push_back(unused);
  std::vector<std::string> log;
  // Reference: two micro-batches through a GradientAccumulator.
  GradientAccumulator reference(params);
  chain.loss(log).backward();
  reference.add(0.25F);
  std::vector<Tensor> base_copy;  // after micro-batch 1; cloned: add() below writes into the accumulator's buffers
  for (const Tensor& t : reference.gradients()) base_copy.push_back(t.defined() ? t.clone() : Tensor());
  chain.w[1].mutable_value().data()[3] += 0.5F;  // micro-batch 2 differs
  chain.loss(log).backward();
  reference.add(0.75F);
  // Bucketed: the last micro-batch reduces base + 0.75 g.
  GradientBucketer bucketer(*comm, params, BucketOptions{70.0 / (1024 * 1024), true});
  bucketer.backward(chain.loss(log), base_copy, 0.75F);
  for (std::size_t k = 0; k < chain.w.size(); ++k) {
    EXPECT_TRUE(same_bits(chain.w[k].grad(), reference.gradients()[k])) << k;
  }
  EXPECT_FALSE(unused.grad().defined());  // in neither: as the accumulator, no gradient
  EXPECT_FALSE(reference.gradients()[3].defined());
  // A rank with no pass: the base alone, nothing committed.
  const Tensor committed = chain.w[0].grad();
  const std::vector<Tensor> reduced = bucketer.reduce(base_copy);
  ASSERT_EQ(reduced.size(), params.size());
  for (std::size_t k = 0; k < chain.w.size(); ++k) EXPECT_TRUE(same_bits(reduced[k], base_copy[k]));
  EXPECT_FALSE(reduced[3].defined());  // no base held one
  EXPECT_EQ(chain.w[0].grad().storage_id(), committed.storage_id());
  // Wrong bases are ShapeErrors before anything runs.
  EXPECT_THROW(bucketer.reduce(std::vector<Tensor>(2)), ShapeError);
  std::vector<Tensor> wrong(params.size());
  wrong[0] = Tensor::zeros({2, 2});
  EXPECT_THROW(bucketer.backward(chain.loss(log), wrong, 1.0F), ShapeError);
  EXPECT_EQ(chain.w[0].grad().storage_id(), committed.storage_id());
}

TEST(BackwardHooks, AReplacementForAConstantOrTwiceForOneLeafIsRefusedAndCommitsNothing) {
  Chain chain(2);
  std::vector<std::string> log;
  chain.loss(log).backward();
  const std::vector<Tensor> before = grads_of(chain.w);
  // chain.x is a leaf that does not require grad: it never gets a gradient.
  Recorder constant;
  constant.log = &log;
  constant.replacements = {{chain.x, Tensor::full({3, 4}, 1.0F)}};
  try {
    chain.loss(log).backward(constant);
    ADD_FAILURE() << "a gradient for a leaf that does not require grad was committed";
  } catch (const BackwardError& e) {
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not require grad"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(chain.x.grad().defined());
  // Two gradients for one leaf: which one the hook meant is unknown.
  Recorder twice;
  twice.log = &log;
  twice.replacements = {{chain.w[0], Tensor::full({4, 4}, 1.0F)}, {chain.w[0], Tensor::full({4, 4}, 2.0F)}};
  try {
    chain.loss(log).backward(twice);
    ADD_FAILURE() << "two gradients for one leaf were accepted";
  } catch (const BackwardError& e) {
    EXPECT_NE(std::string(e.what()).find("two gradients"), std::string::npos) << e.what();
  }
  for (std::size_t k = 0; k < chain.w.size(); ++k) EXPECT_TRUE(same_bits(chain.w[k].grad(), before[k]));
}

TEST(BackwardHooks, AConsumedGradientIsFreedInThePassAndClearedAtTheCommit) {
  // The hook consumes w1 (final first): the engine drops it from the pass at
  // once (its buffer is freed while w0's backward still runs) and the commit
  // clears w1's earlier gradient; w0 commits as ever.
  struct Consumer : Recorder {
    const Node* taken = nullptr;
    std::weak_ptr<const Storage> storage;  // the consumed gradient's buffer
    bool freed_before_w0 = false;
    void gradient_final(const Variable& leaf, const Tensor& gradient) override {
      Recorder::gradient_final(leaf, gradient);
      if (leaf.name() == "w0") freed_before_w0 = storage.expired();
      if (leaf.name() == "w1") storage = gradient.weak_storage();
    }
    bool consumes(const Variable& leaf) const override { return leaf.node() == taken; }
  };
  Chain chain(2);
  std::vector<std::string> log;
  chain.loss(log).backward();  // earlier gradients the commit must clear or replace
  Consumer hooks;
  hooks.log = &log;
  hooks.taken = chain.w[1].node();
  chain.loss(log).backward(hooks);
  EXPECT_TRUE(hooks.freed_before_w0);
  EXPECT_FALSE(chain.w[1].grad().defined());
  EXPECT_TRUE(same_bits(chain.w[0].grad(), hooks.gradients[1]));
  // A replacement for a consumed gradient is refused and commits nothing.
  chain.loss(log).backward();
  const std::vector<Tensor> before = grads_of(chain.w);
  hooks.replacements = {{chain.w[1], Tensor::full({4, 4}, 1.0F)}};
  try {
    chain.loss(log).backward(hooks);
    ADD_FAILURE() << "a replacement for a consumed gradient was accepted";
  } catch (const BackwardError& e) {
    EXPECT_NE(std::string(e.what()).find("consumed"), std::string::npos) << e.what();
  }
  for (std::size_t k = 0; k < chain.w.size(); ++k) EXPECT_TRUE(same_bits(chain.w[k].grad(), before[k]));
}
