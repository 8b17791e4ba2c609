// The counter-based dropout RNG: Philox4x32-10 against Random123's published
// known-answer vectors, the mask as a pure function of (key, element index),
// the dropout op drawing its key from the caller's generator, and checkpoint
// replay reproducing the masks bit for bit (and only from the right stream
// position).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "../../src/backend/kernels.hpp"
#include "../../src/backend/philox.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/ops.hpp"

using namespace riftco_transformer;
using backend::PhiloxCounter;
using backend::PhiloxKey;
using rt_test::randn;

namespace {

Tensor mask(const Shape& shape, std::uint64_t key, float p) {
  return backend::cpu_kernels().dropout_mask(shape, key, p, 1.0F / (1.0F - p));
}

/// The key dropout() draws from `random` (two words, high first).
std::uint64_t next_key(Random& random) {
  const std::uint64_t high = random.next_u32();
  return (high << 32U) | random.next_u32();
}

}  // namespace

// Random123 1.14, examples/kat_vectors, the three "philox4x32 10" lines
// (counter[4] key[2] → output[4]).
TEST(Philox, KnownAnswerVectorsOfRandom123) {
  struct Vector {
    PhiloxCounter counter;
    PhiloxKey key;
    PhiloxCounter expected;
  };
  const Vector vectors[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Vector& v : vectors) {
    const PhiloxCounter got = backend::philox4x32_10(v.counter, v.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.word[i], v.expected.word[i]) << "word " << i;
  }
}

TEST(DropoutMask, IsAPureFunctionOfKeyAndIndex) {
  const float p = 0.3F;
  const float scale = 1.0F / (1.0F - p);
  const Tensor big = mask({100003}, 42, p);
  // Element i does not depend on the shape: every prefix length (1, 2, 3
  // elements in the last group of four) is the big mask's prefix.
  for (const std::int64_t n : {1, 2, 3, 4, 5, 1001}) {
    const Tensor small = mask({n}, 42, p);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(small.data()[i], big.data()[i]) << "n " << n << " i " << i;
  }
  // Element i is word i % 4 of Philox at counter (i / 4, 0) under the key.
  const PhiloxCounter bits = backend::philox4x32_10({{1, 0, 0, 0}}, {{42, 0}});
  for (int lane = 0; lane < 4; ++lane) {
    const bool dropped = static_cast<double>(bits.word[lane]) < static_cast<double>(p) * 4294967296.0;
    EXPECT_EQ(big.data()[4 + lane], dropped ? 0.0F : scale) << "lane " << lane;
  }
  std::int64_t kept = 0;
  for (const float v : big.values()) {
    ASSERT_TRUE(v == 0.0F || v == scale) << v;
    kept += v != 0.0F ? 1 : 0;
  }
  // 100003 Bernoulli(0.7) draws: 7 standard deviations is ±1015.
  EXPECT_NEAR(static_cast<double>(kept), 0.7 * 100003, 1015.0);
  // Another key gives another mask; the same key the same bits.
  EXPECT_FALSE(bit_equal(mask({100003}, 43, p), big));
  EXPECT_TRUE(bit_equal(mask({100003}, 42, p), big));
}

// The drop probability is p exactly: a word is dropped iff it is below
// p·2^32 (a whole number for p = 0.1F: 429496736). Key 6090200's element 2
// draws 429496800, in the 96 words [p·2^32, ceil(p·2^24)·2^8) that a 24-bit
// uniform compared with p dropped too (a bias of 2.2e-8 at p = 0.1).
TEST(DropoutMask, DropsExactlyTheWordsBelowPTimesTwoToThe32) {
  const float p = 0.1F;
  EXPECT_EQ(backend::dropout_threshold(p), 429496736U);
  EXPECT_EQ(backend::philox4x32_10({{0, 0, 0, 0}}, {{6090200, 0}}).word[2], 429496800U);
  EXPECT_EQ(mask({3}, 6090200, p).data()[2], 1.0F / (1.0F - p));  // kept
  EXPECT_EQ(backend::dropout_threshold(0.5F), 2147483648U);
  EXPECT_EQ(backend::dropout_threshold(std::nextafter(1.0F, 0.0F)), 4294967296U - 256U);
  EXPECT_EQ(backend::dropout_threshold(1e-30F), 1U);  // the least drop probability above 0: 2^-32
  EXPECT_EQ(backend::dropout_threshold(0.0F), 0U);
}

TEST(DropoutMask, DoesNotDependOnTheThreadCount) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Tensor one = mask({3, 70001}, 7, 0.1F);
  omp_set_num_threads(3);
  const Tensor three = mask({3, 70001}, 7, 0.1F);
  omp_set_num_threads(threads);
  EXPECT_TRUE(bit_equal(one, three));
}

TEST(DropoutOp, DrawsOneKeyFromTheCallersGeneratorAndAppliesItsMask) {
  const Tensor x = randn({5, 9}, 3);
  Random random(77);
  Random copy(77);
  const Variable y = dropout(Variable(x), 0.25F, random);
  const Tensor m = mask(x.shape(), next_key(copy), 0.25F);
  EXPECT_EQ(random.state(), copy.state());  // exactly two words drawn
  for (std::int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y.value().data()[i], x.data()[i] * m.data()[i]) << i;
  // p = 0 is the identity and draws nothing.
  const Random::State before = random.state();
  EXPECT_TRUE(bit_equal(dropout(Variable(x), 0.0F, random).value(), x));
  EXPECT_EQ(random.state(), before);
}

// A replay rewinds the generator to the position the forward drew from: both
// masks come back bit for bit, and the live stream is put back afterwards.
// A replay that started one key later (the wrong stream offset) would give
// the second mask first: the check that the replay's position is the
// recorded one, not any position of the same generator.
TEST(DropoutReplay, RecordedStreamPositionReproducesEveryMask) {
  const Tensor x = randn({6, 11}, 5);
  Random random(2024);
  std::vector<RandomStreamStart> starts;
  Tensor first;
  Tensor second;
  {
    RandomStreamRecorder recorder;
    first = dropout(Variable(x), 0.5F, random).value();
    second = dropout(Variable(x), 0.5F, random).value();
    starts = recorder.take();
  }
  ASSERT_EQ(starts.size(), 1U);
  ASSERT_FALSE(bit_equal(first, second));
  const Random::State live = random.state();
  {
    RandomStreamReplay replay(starts);
    EXPECT_TRUE(bit_equal(dropout(Variable(x), 0.5F, random).value(), first));
    EXPECT_TRUE(bit_equal(dropout(Variable(x), 0.5F, random).value(), second));
  }
  EXPECT_EQ(random.state(), live);
  // The wrong offset: a start recorded one key later replays the wrong masks.
  Random shifted(2024);
  (void)next_key(shifted);
  std::vector<RandomStreamStart> wrong = starts;
  wrong.front().state = shifted.state();
  {
    RandomStreamReplay replay(wrong);
    const Tensor replayed = dropout(Variable(x), 0.5F, random).value();
    EXPECT_FALSE(bit_equal(replayed, first));
    EXPECT_TRUE(bit_equal(replayed, second));
  }
}

// Through checkpoint(): two dropouts inside one checkpointed callable give
// the ordinary graph's output and gradients bit for bit.
TEST(DropoutReplay, CheckpointedTwoDropoutsEqualTheOrdinaryGraph) {
  const Tensor x0 = randn({4, 8}, 9);
  const Tensor w0 = randn({8, 8}, 10);
  const auto run = [&](bool checkpointed) {
    Variable x(x0, true, "x");
    Variable w(w0, true, "w");
    Random random(31);
    const auto f = [&](const Variable& h) {
      return dropout(silu(matmul(dropout(h, 0.4F, random), w)), 0.2F, random);
    };
    const std::vector<Variable> deps{w};
    const Variable out = checkpointed ? checkpoint(x, deps, f) : f(x);
    sum(out).backward();
    return std::vector<Tensor>{out.value().clone(), x.grad().clone(), w.grad().clone()};
  };
  const std::vector<Tensor> ordinary = run(false);
  const std::vector<Tensor> replayed = run(true);
  for (std::size_t i = 0; i < ordinary.size(); ++i) EXPECT_TRUE(bit_equal(ordinary[i], replayed[i])) << i;
}

// Edges: a zero-element input (no draw of the mask beyond the key; the
// backward runs), p next below 1 (keep probability 2^-24, finite scale
// 2^24), and dropouts at two checkpoint levels plus after the outer one:
// the nested replays rewind to the recorded positions, bit for bit.
TEST(DropoutEdges, ZeroElements) {
  Random random(1);
  Random copy(1);
  const Variable x(Tensor::zeros({0, 5}), true, "x");
  const Variable y = dropout(x, 0.5F, random);
  EXPECT_EQ(y.value().shape(), (Shape{0, 5}));
  (void)next_key(copy);
  EXPECT_EQ(random.state(), copy.state());  // the key is drawn as for any size: the stream stays in step
  sum(y).backward();
  EXPECT_EQ(x.grad().shape(), (Shape{0, 5}));
}

TEST(DropoutEdges, PNextBelowOne) {
  const float p = std::nextafter(1.0F, 0.0F);
  const Tensor m = mask({1 << 20}, 3, p);
  std::int64_t kept = 0;
  for (const float v : m.values()) {
    ASSERT_TRUE(v == 0.0F || v == 16777216.0F) << v;
    kept += v != 0.0F ? 1 : 0;
  }
  EXPECT_LE(kept, 8);  // 2^20 draws at 2^-24 (256 words in 2^32): 1/16 expected
  Random random(5);
  const Tensor x = randn({64, 64}, 2);
  const Variable y = dropout(Variable(x), p, random);
  for (const float v : y.value().values()) EXPECT_TRUE(std::isfinite(v));
}

TEST(DropoutEdges, NestedCheckpoints) {
  const Tensor x0 = randn({4, 8}, 9);
  const Tensor w0 = randn({8, 8}, 10);
  const auto run = [&](int mode, GraphAfterBackward graph) {
    Variable x(x0, true, "x");
    Variable w(w0, true, "w");
    Random random(31);
    const std::vector<Variable> deps{w};
    const auto inner = [&](const Variable& h) { return dropout(silu(matmul(h, w)), 0.3F, random); };
    const auto outer = [&](const Variable& h) {
      const Variable a = dropout(h, 0.4F, random);
      const Variable b = mode == 2 ? checkpoint(a, deps, inner) : inner(a);
      return dropout(matmul(b, w), 0.2F, random);
    };
    const Variable out = mode >= 1 ? checkpoint(x, deps, outer) : outer(x);
    const Variable after = dropout(out, 0.1F, random);
    sum(after).backward(graph);
    return std::vector<Tensor>{after.value().clone(), x.grad().clone(), w.grad().clone()};
  };
  const std::vector<Tensor> ordinary = run(0, GraphAfterBackward::Keep);
  for (const GraphAfterBackward graph : {GraphAfterBackward::Keep, GraphAfterBackward::Release}) {
    for (int mode : {1, 2}) {
      const std::vector<Tensor> replayed = run(mode, graph);
      for (std::size_t i = 0; i < ordinary.size(); ++i) {
        EXPECT_TRUE(bit_equal(ordinary[i], replayed[i])) << "mode " << mode << " tensor " << i;
      }
    }
  }
}

TEST(DropoutStream, ARefusedLossLeavesTheDropoutGeneratorWhereItWas) {
  // The model's loss checks its targets before the forward draws dropout
  // masks: a refused call (a target outside the vocabulary) used to move the
  // stream on, so the next good loss differed from a run without the error
  // (4.135418 vs 4.138085 in the attack) and a resumed run from its original.
  const TransformerDimensions d = rt_test::tiny_dims();
  const rt_test::Batch b = rt_test::random_batch(2, 8, d.vocab_size, 3);
  Random init(5);
  DecoderOnlyTransformer model(d, init);
  model.set_dropout(0.2F, 11);
  model.set_training(true);
  const Random::State before = model.dropout_random().state();
  std::vector<std::int32_t> bad = b.targets;
  bad[5] = static_cast<std::int32_t>(d.vocab_size);  // one past the last id
  EXPECT_THROW(model.loss(b.tokens, bad, 2), ValueError);
  std::vector<std::int32_t> short_targets(b.targets.begin(), b.targets.end() - 1);
  EXPECT_THROW(model.loss(b.tokens, short_targets, 2), ShapeError);
  EXPECT_TRUE(model.dropout_random().state() == before);
  const float after_errors = model.loss(b.tokens, b.targets, 2).value().item();
  Random init2(5);
  DecoderOnlyTransformer fresh(d, init2);
  fresh.set_dropout(0.2F, 11);
  fresh.set_training(true);
  EXPECT_EQ(after_errors, fresh.loss(b.tokens, b.targets, 2).value().item());
  // ignore_index is still a valid target.
  bad[5] = -100;
  EXPECT_NO_THROW(model.loss(b.tokens, bad, 2));
}
