// Bucketed gradient all-reduce under `mpirun -np 2` (and 3): the
// non-blocking all-reduce equals the blocking one bit for bit; the
// GradientBucketer commits exactly the gradients of backward() followed by a
// plain all_reduce_average of each gradient, with ordinary and checkpointed
// blocks; and its buckets start inside backward (the overlap).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "../cpp/block_stack.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/random.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;

namespace {

Communicator& comm() { return Communicator::world(); }

std::vector<float> rank_values(std::size_t n, std::uint64_t seed) {
  Random random(seed * 1000 + static_cast<std::uint64_t>(comm().rank()));
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = random.normal() * (i % 3 == 0 ? 1e4F : (i % 3 == 1 ? 1.0F : 1e-3F));
  return v;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// rt_test::BlockStack on the CPU, the input this rank's own.
struct Stack : rt_test::BlockStack {
  Stack(int layers, std::int64_t width)
      : BlockStack(layers, width, 100 + static_cast<std::uint64_t>(comm().rank()), Backend::Cpu) {}
};

}  // namespace

TEST(MpiBuckets, NonBlockingAllReduceEqualsTheBlockingOne) {
  ASSERT_EQ(comm().kind(), "mpi");
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001},
                              (std::size_t{1} << 24) + 5}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> blocking = rank_values(n, n + 3);
    std::vector<float> overlapped = blocking;
    comm().all_reduce_sum(blocking);
    auto request = comm().start_all_reduce_sum(overlapped);
    request->wait();
    EXPECT_TRUE(request->test());
    EXPECT_TRUE(same_bits(overlapped, blocking));
  }
}

TEST(MpiBuckets, SeveralRequestsInFlightCompleteInAnyWaitOrder) {
  std::vector<std::vector<float>> buffers;
  std::vector<std::vector<float>> expected;
  for (std::size_t k = 0; k < 4; ++k) {
    buffers.push_back(rank_values(500 + 77 * k, 40 + k));
    expected.push_back(buffers.back());
    comm().all_reduce_sum(expected.back());
  }
  std::vector<std::unique_ptr<CollectiveRequest>> requests;
  for (auto& b : buffers) requests.push_back(comm().start_all_reduce_sum(b));
  for (std::size_t k = requests.size(); k-- > 0;) requests[k]->wait();
  for (std::size_t k = 0; k < buffers.size(); ++k) EXPECT_TRUE(same_bits(buffers[k], expected[k])) << k;
}

TEST(MpiBuckets, BucketedGradientsAreThePlainAllReduceBitForBit) {
  for (const bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed ? "checkpointed blocks" : "ordinary blocks");
    Stack stack(6, 48);
    // Plain: backward, then each gradient all-reduced (average) after it.
    stack.loss(checkpointed).backward();
    std::vector<std::vector<float>> plain;
    for (const Variable& p : stack.params) {
      plain.emplace_back(p.grad().values().begin(), p.grad().values().end());
      comm().all_reduce_average(plain.back());
    }
    // Bucketed: ~2 parameters a bucket (48x48 floats = 9 KiB).
    GradientBucketer bucketer(comm(), stack.params, BucketOptions{12.0 / 1024.0, true});
    ASSERT_GE(bucketer.bucket_count(), 4U);
    bucketer.backward(stack.loss(checkpointed));
    for (std::size_t k = 0; k < stack.params.size(); ++k) {
      EXPECT_TRUE(same_bits(stack.params[k].grad().values(), plain[k])) << stack.params[k].name();
    }
    // Identical on every rank.
    for (const Variable& p : stack.params) {
      std::vector<float> all(static_cast<std::size_t>(p.value().numel() * comm().world_size()));
      comm().all_gather(p.grad().values(), all);
      for (int r = 1; r < comm().world_size(); ++r) {
        EXPECT_TRUE(same_bits(std::span<const float>(all).subspan(static_cast<std::size_t>(r * p.value().numel()),
                                                                  static_cast<std::size_t>(p.value().numel())),
                              p.grad().values()));
      }
    }
    // The overlap: buckets started inside backward, the first one while most
    // parameters were still waiting for their gradients.
    const auto& report = bucketer.last_pass();
    EXPECT_EQ(report.started.size(), bucketer.bucket_count());
    EXPECT_EQ(report.started_during_backward, bucketer.bucket_count());
    EXPECT_LE(report.final_parameters_at_start.front(), 4U);  // of 12: the last two blocks' parameters
    if (comm().rank() == 0) {
      std::printf("[buckets] %s: %zu buckets, all started inside backward, %zu completed before it ended\n",
                  checkpointed ? "checkpointed" : "ordinary", bucketer.bucket_count(),
                  report.completed_during_backward);
    }
  }
}

TEST(MpiBuckets, SumsWithoutAveragingAndRepeatPassesGiveTheSameBits) {
  Stack stack(3, 16);
  GradientBucketer bucketer(comm(), stack.params, BucketOptions{1.0 / 1024.0, false});
  bucketer.backward(stack.loss(false));
  std::vector<Tensor> first;
  for (const Variable& p : stack.params) first.push_back(p.grad().clone());
  stack.loss(false).backward();
  for (std::size_t k = 0; k < stack.params.size(); ++k) {
    std::vector<float> sum(stack.params[k].grad().values().begin(), stack.params[k].grad().values().end());
    comm().all_reduce_sum(sum);
    EXPECT_TRUE(same_bits(first[k].values(), sum));
  }
  bucketer.backward(stack.loss(false));
  for (std::size_t k = 0; k < stack.params.size(); ++k) {
    EXPECT_TRUE(same_bits(first[k].values(), stack.params[k].grad().values()));
  }
}

TEST(MpiBuckets, AccumulationWithARankThatRunsNoPassIsTheAccumulatorPlusPlainAllReduce) {
  // Two micro-batches; on the last one rank 1 has no rows (reduce() only),
  // the others run the bucketed backward over their accumulated sums.
  Stack stack(4, 24);
  std::vector<Tensor> base;
  stack.loss(false).backward();
  for (const Variable& p : stack.params) base.push_back(p.grad().clone());  // micro-batch 1 with weight 1
  std::vector<std::vector<float>> expected;
  const bool runs_pass = comm().rank() != 1;
  stack.x = Variable(stack.x.value().clone(), false, "x2");
  stack.x.mutable_value().data()[0] += 1.0F;  // micro-batch 2 differs
  if (runs_pass) stack.loss(false).backward();
  for (std::size_t k = 0; k < stack.params.size(); ++k) {
    std::vector<float> sum(base[k].values().begin(), base[k].values().end());
    if (runs_pass) {
      const Tensor& g = stack.params[k].grad();
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += 0.5F * g.values()[i];
    }
    comm().all_reduce_average(sum);
    expected.push_back(sum);
  }
  GradientBucketer bucketer(comm(), stack.params, BucketOptions{3.0 / 1024.0, true});
  ASSERT_GE(bucketer.bucket_count(), 3U);
  std::vector<Tensor> reduced;
  if (runs_pass) {
    bucketer.backward(stack.loss(false), base, 0.5F);
    for (const Variable& p : stack.params) reduced.push_back(p.grad());
  } else {
    reduced = bucketer.reduce(base);
  }
  for (std::size_t k = 0; k < stack.params.size(); ++k) {
    EXPECT_TRUE(same_bits(reduced[k].values(), expected[k])) << stack.params[k].name();
  }
}

TEST(MpiBuckets, AParameterOneRankReachesIsAveragedAndOneNoRankReachesIsLeftAlone) {
  // As synchronize_gradients: a gradient on some rank is averaged with the
  // others' zeros; a parameter no rank reached gets none (an optimizer skips
  // it, as in one process), where it used to get zeros that Adam stepped.
  Variable w(Tensor::full({3}, 1.0F), true, "w");
  Variable only_rank_1(Tensor::full({2}, 2.0F), true, "only_rank_1");
  Variable unused(Tensor::full({4}, 3.0F), true, "unused");
  GradientBucketer bucketer(comm(), {w, only_rank_1, unused});
  Variable loss = sum(scale(w, 1.0F + static_cast<float>(comm().rank())));
  if (comm().rank() == 1) loss = add(loss, sum(scale(only_rank_1, 4.0F)));
  bucketer.backward(loss);
  const float world = static_cast<float>(comm().world_size());
  float expected_w = 0.0F;
  for (int r = 0; r < comm().world_size(); ++r) expected_w += 1.0F + static_cast<float>(r);
  for (const float v : w.grad().values()) EXPECT_EQ(v, expected_w / world);
  ASSERT_TRUE(only_rank_1.grad().defined()) << "rank " << comm().rank();
  for (const float v : only_rank_1.grad().values()) EXPECT_EQ(v, 4.0F / world);
  EXPECT_FALSE(unused.grad().defined()) << "rank " << comm().rank();
  const std::vector<Tensor> reduced = bucketer.reduce(std::vector<Tensor>(3));  // no base anywhere
  for (const Tensor& g : reduced) EXPECT_FALSE(g.defined());
}

TEST(MpiBuckets, TransformerUnderEveryPolicyGivesThePlainAllReduceBits) {
  // The model's own checkpointing (block, segments, sub-blocks): its
  // parameters are final after their block's replay, and the reduced
  // gradients are those of the plain all-reduce.
  TransformerDimensions d;
  d.vocab_size = 64;
  d.context_length = 16;
  d.model_width = 32;
  d.heads = 4;
  d.layers = 4;
  d.feed_forward_width = 48;
  Random init(11);
  DecoderOnlyTransformer model(d, init);
  std::vector<Variable> params;
  for (const NamedParameter& p : model.parameters()) params.push_back(p.variable);
  Random data(200 + static_cast<std::uint64_t>(comm().rank()));
  std::vector<std::int32_t> tokens(2 * 16);
  std::vector<std::int32_t> targets(2 * 16);
  for (auto& t : tokens) t = static_cast<std::int32_t>(data.below(64));
  for (auto& t : targets) t = static_cast<std::int32_t>(data.below(64));
  GradientBucketer bucketer(comm(), params, BucketOptions{16.0 / 1024.0, true});
  ASSERT_GE(bucketer.bucket_count(), 4U);
  std::vector<std::vector<float>> reference;
  for (const ActivationCheckpointingKind kind : activation_checkpointing_kinds()) {
    SCOPED_TRACE(activation_checkpointing_name(kind));
    model.set_activation_checkpointing_kind(kind);
    model.loss(tokens, targets, 2).backward();
    std::vector<std::vector<float>> plain;
    for (const Variable& p : params) {
      plain.emplace_back(p.grad().values().begin(), p.grad().values().end());
      comm().all_reduce_average(plain.back());
    }
    bucketer.backward(model.loss(tokens, targets, 2));
    for (std::size_t k = 0; k < params.size(); ++k) {
      EXPECT_TRUE(same_bits(params[k].grad().values(), plain[k])) << model.parameters()[k].name;
      if (!reference.empty()) {  // checkpointing changes no bit (no parameter shared between blocks)
        EXPECT_TRUE(same_bits(params[k].grad().values(), reference[k])) << model.parameters()[k].name;
      }
    }
    if (reference.empty()) reference = plain;
    EXPECT_EQ(bucketer.last_pass().started_during_backward, bucketer.bucket_count());
  }
}
