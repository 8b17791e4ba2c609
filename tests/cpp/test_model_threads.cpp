// One model used from several threads (a Python program releasing the GIL):
// structural changes (LoRA adapters, freezing) wait for forwards and decode
// steps, and one decode session serves one call at a time. Before the
// structure lock, adding adapters while another thread generated read a
// vector being replaced (heap corruption within a few trials); two threads
// on one session wrote past the K/V cache.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "model_fixtures.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

LoraConfig adapters_on(const char* targets) {
  LoraConfig c;
  c.rank = 2;
  c.alpha = 4.0F;
  c.targets = parse_lora_targets(targets);
  return c;
}

}  // namespace

// Fresh adapters (B = 0) leave every output bit unchanged, so whatever the
// other thread does to the adapters, each forward and each generation here
// must give the reference bits (or, for a generation or a backward that a
// change overtook between two steps, StaleGraphError).
TEST(ModelThreads, AddingAndRemovingAdaptersWhileAnotherThreadRunsTheModelIsSafe) {
  Random random(5);
  DecoderOnlyTransformer model(tiny_dims(3), random, 1e-5F, FullSequenceAttentionKind::Flash,
                               ActivationCheckpointingKind::TransformerBlock);
  const auto b = random_batch(2, 8, 32, 6);
  const std::vector<float> reference = model.forward(b.tokens, 2).value().to_vector();
  GenerationOptions options;
  options.max_new_tokens = 6;
  options.seed = 3;
  const std::vector<std::int32_t> prompt{1, 2, 3};
  const std::vector<std::int32_t> tokens = generate(model, prompt, options).tokens;

  std::atomic<bool> done{false};
  std::atomic<int> changes{0};
  std::thread changer([&] {
    Random r(9);
    const char* targets[] = {"all", "query,value", "down", "gate,up,output"};
    for (int i = 0; !done.load(); ++i) {
      model.add_lora(adapters_on(targets[i % 4]), r);
      if (i % 3 == 0) model.set_lora_active(false);
      EXPECT_EQ(model.lora_config().rank, 2);
      model.set_base_trainable(true);  // the lock is taken; the graph's leaves still train
      model.remove_lora();
      changes.fetch_add(1);
    }
  });
  try {  // an unexpected throw must still reach join() below
    for (int i = 0; i < 60 || changes.load() < 20; ++i) {
      const bool logits_same = same_bits(model.forward(b.tokens, 2).value().to_vector(), reference);
      bool tokens_same = true;
      try {
        tokens_same = generate(model, prompt, options).tokens == tokens;
      } catch (const StaleGraphError&) {  // adapters changed between two of its tokens: its cache is stale
      }
      Variable loss = model.loss(b.tokens, b.targets, 2);
      try {
        loss.backward();  // a replay reads the adapters again: a change since is refused
      } catch (const StaleGraphError&) {            // before the pass
      } catch (const CheckpointContractError&) {  // during the pass (the replay's boundary changed)
      }
      EXPECT_TRUE(logits_same) << i;
      EXPECT_TRUE(tokens_same) << i;
      if (!logits_same || !tokens_same) break;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  done.store(true);
  changer.join();
}

TEST(ModelThreads, TwoThreadsDecodingOnOneSessionFillEachPositionOnce) {
  Random random(7);
  DecoderOnlyTransformer model(tiny_dims(2), random);
  const std::int32_t token = 4;
  std::vector<std::vector<float>> reference;  // the logits at each position, one thread
  {
    DecodeSession alone(model);
    for (std::int64_t p = 0; p < alone.capacity(); ++p) reference.push_back(alone.decode_token(token).to_vector());
  }
  for (int trial = 0; trial < 40; ++trial) {
    DecodeSession session(model);
    std::vector<std::vector<float>> got[2];
    auto decode = [&](int who) {
      for (;;) {
        try {
          got[who].push_back(session.decode_token(token).to_vector());
        } catch (const ValueError&) {  // the context is full
          return;
        }
      }
    };
    std::thread a(decode, 0);
    std::thread c(decode, 1);
    a.join();
    c.join();
    ASSERT_EQ(session.position(), session.capacity()) << trial;
    ASSERT_EQ(got[0].size() + got[1].size(), reference.size()) << trial;
    // Each thread's calls took increasing positions: its results are a
    // subsequence of the reference, and together they cover it once.
    std::vector<int> used(reference.size(), 0);
    for (const auto& mine : got) {
      std::size_t p = 0;
      for (const std::vector<float>& logits : mine) {
        while (p < reference.size() && !same_bits(logits, reference[p])) ++p;
        ASSERT_LT(p, reference.size()) << "logits of no position, trial " << trial;
        ++used[p++];
      }
    }
    for (std::size_t p = 0; p < used.size(); ++p) EXPECT_EQ(used[p], 1) << "position " << p << ", trial " << trial;
  }
}
