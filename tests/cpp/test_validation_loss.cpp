// Post-training examples whose response the sequence length cuts off
// entirely (the prompt fills it) hold no target. They were drawn like the
// others: a validation batch of them counted as a loss of 0 in the mean of
// the batches (pulling the reported validation loss down), and a training
// step of them logged loss 0 and stepped Adam on zero gradients. Now they are
// never drawn, and the validation loss is the mean over every real target.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <fstream>
#include <string>

#include "riftco_transformer/data.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "scratch.hpp"
#include "tiny_pretraining.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

/// 20 examples; every tenth (k = 9, 19) is the validation split's. Example 9
/// is a copy of example 19 or, with `cut_off`, a prompt longer than a
/// 16-token sequence (no target). The training examples are the same.
fs::path write_chat(const fs::path& dir, bool cut_off) {
  const fs::path path = dir / (cut_off ? "cut_off.jsonl" : "copies.jsonl");
  std::ofstream out(path);
  for (int k = 0; k < 20; ++k) {
    std::string prompt = "Q" + std::to_string(k) + "?";
    std::string response = "A" + std::to_string(k) + ".";
    if (k == 9) {
      prompt = cut_off ? "a prompt far longer than the sixteen tokens of a sequence" : "Q19?";
      response = "A19.";
    }
    out << R"({"prompt": ")" << prompt << R"(", "response": ")" << response << "\"}\n";
  }
  return path;
}

}  // namespace

TEST(ValidationLoss, BatchesWithoutTargetsDoNotCountAsALossOfZero) {
  const fs::path dir = rt_test::fresh_dir("validation_loss", "cut_off");
  PretrainingConfig base = rt_test::tiny_pretraining(dir);
  base.output_dir = dir / "base";
  base.steps = 1;
  ASSERT_TRUE(run_pretraining(base).completed);
  PostTrainingConfig c = rt_test::tiny_chat_post_training(base.output_dir / "model.safetensors", 2);
  c.sequence_length = 16;
  c.eval_batches = 6;
  c.checkpoint_interval = 0;
  // Every target of the validation batches is one of example 19's, in both
  // runs (same training, so the same model): the same mean loss.
  c.data = write_chat(dir, false);
  c.output_dir = dir / "copies";
  const RunResult copies = run_post_training(c);
  c.data = write_chat(dir, true);
  c.output_dir = dir / "cut_off";
  const RunResult cut_off = run_post_training(c);
  ASSERT_TRUE(copies.completed && cut_off.completed);
  EXPECT_EQ(copies.final_train_loss, cut_off.final_train_loss);
  EXPECT_GT(copies.final_validation_loss, 0.5F);
  EXPECT_NEAR(cut_off.final_validation_loss, copies.final_validation_loss, 1e-5F * copies.final_validation_loss);
}

TEST(ValidationLoss, ExamplesWithoutATargetWithinTheSequenceAreNeverDrawn) {
  std::string jsonl;
  for (int k = 0; k < 30; ++k) {
    const std::string prompt = k % 3 == 0 ? "Q" + std::to_string(k) + "?" : std::string(40, 'p');
    jsonl += R"({"prompt": ")" + prompt + R"(", "response": "A."})" + "\n";
  }
  const ChatDataset data = ChatDataset::parse(jsonl, "cut_off");
  for (const Split split : {Split::Train, Split::Validation}) {
    Random random(3);
    for (int i = 0; i < 50; ++i) {
      const TokenBatch b = data.sample_batch(random, 4, 16, split);
      for (std::int64_t row = 0; row < b.batch; ++row) {
        const auto first = b.targets.begin() + row * b.seq_len;
        EXPECT_TRUE(std::any_of(first, first + b.seq_len, [](std::int32_t t) { return t != kIgnoreTarget; }))
            << "batch " << i << " row " << row;
      }
    }
  }
  // Long enough for every prompt: every example is drawn again.
  Random random(3);
  std::set<std::int32_t> firsts;
  for (int i = 0; i < 200; ++i) firsts.insert(data.sample_batch(random, 1, 64).tokens[0]);
  EXPECT_EQ(firsts.count(static_cast<std::int32_t>('p')), 1U);
  Random none(4);
  const ChatDataset all_long = ChatDataset::parse(R"({"prompt": ")" + std::string(40, 'p') + R"(", "response": "A."})", "long");
  EXPECT_THROW(all_long.sample_batch(none, 1, 16), DataError);
}
