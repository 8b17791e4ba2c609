// Stage pipelines end to end on tiny shapes: files, metadata, resume.
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "message_of.hpp"
#include "scratch.hpp"
#include "tiny_pretraining.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return rt_test::fresh_dir("pipeline", name); }
using rt_test::read_file;

/// The shared tiny run, 8 steps with evaluations and checkpoints along the way.
PretrainingConfig tiny_pretraining(const fs::path& dir) {
  PretrainingConfig c = rt_test::tiny_pretraining(dir);
  c.steps = 8;
  c.warmup_steps = 2;
  c.eval_interval = 4;
  c.eval_batches = 2;
  c.checkpoint_interval = 3;
  c.output_dir = dir / "run";
  return c;
}

}  // namespace

TEST(Pipelines, PretrainingWritesEveryFileAndRecordsThePolicy) {
  const fs::path dir = fresh_dir("pretrain");
  PretrainingConfig c = tiny_pretraining(dir);
  c.activation_checkpointing = ActivationCheckpointingKind::TransformerBlock;
  std::int64_t reports = 0;
  const RunResult r = run_pretraining(c, [&](const StepReport& s) {
    ++reports;
    EXPECT_EQ(s.total_steps, 8);
    EXPECT_GT(s.peak_bytes, 0);
    return true;
  });
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(reports, 8);
  EXPECT_EQ(r.weights, c.output_dir / "model.safetensors");
  for (const char* f : {"model.safetensors", "metadata.json", "metrics.jsonl", "loss_curve.svg"}) {
    EXPECT_TRUE(fs::exists(c.output_dir / f)) << f;
  }
  EXPECT_FALSE(fs::exists(c.output_dir / "training_checkpoint.safetensors"));  // removed when complete
  const nlohmann::json meta = nlohmann::json::parse(read_file(c.output_dir / "metadata.json"));
  EXPECT_EQ(meta["config"]["activation_checkpointing"], "block");
  EXPECT_EQ(meta["config"]["attention"], "flash");
  EXPECT_EQ(meta["stage"], "pretraining");
  EXPECT_GT(meta["results"]["peak_memory_bytes"].get<std::int64_t>(), 0);
  EXPECT_GT(meta["results"]["tokens_per_second"].get<double>(), 0.0);
  EXPECT_TRUE(meta["results"]["final_validation_loss"].is_number());
  std::ifstream metrics(c.output_dir / "metrics.jsonl");
  std::string line;
  int rows = 0;
  int validation_rows = 0;
  while (std::getline(metrics, line)) {
    ++rows;
    validation_rows += nlohmann::json::parse(line).contains("validation_loss");
  }
  EXPECT_EQ(rows, 8);
  EXPECT_EQ(validation_rows, 2);  // steps 4 and 8
  // The model file does not carry the policy.
  const TensorFile model = read_safetensors(c.output_dir / "model.safetensors");
  for (const auto& [k, v] : model.metadata) EXPECT_EQ(k.find("checkpoint"), std::string::npos) << k;
}

TEST(Pipelines, ResumeAfterInterruptionIsBitIdentical) {
  const fs::path dir = fresh_dir("resume");
  PretrainingConfig c = tiny_pretraining(dir);
  c.dropout = 0.1F;  // the dropout generator must be restored too
  c.output_dir = dir / "straight";
  const RunResult straight = run_pretraining(c);
  ASSERT_TRUE(straight.completed);

  c.output_dir = dir / "interrupted";
  const RunResult first = run_pretraining(c, [](const StepReport& s) { return s.step < 5; });
  EXPECT_FALSE(first.completed);
  EXPECT_TRUE(fs::exists(c.output_dir / "training_checkpoint.safetensors"));  // written at step 3
  EXPECT_FALSE(fs::exists(c.output_dir / "model.safetensors"));
  c.resume = true;
  const RunResult resumed = run_pretraining(c);
  EXPECT_TRUE(resumed.completed);
  EXPECT_EQ(resumed.resumed_from_step, 3);
  EXPECT_EQ(read_file(dir / "straight" / "model.safetensors"), read_file(dir / "interrupted" / "model.safetensors"));
  EXPECT_EQ(straight.final_train_loss, resumed.final_train_loss);
  EXPECT_EQ(straight.final_validation_loss, resumed.final_validation_loss);
  // A changed configuration cannot resume from that checkpoint.
  c.output_dir = dir / "changed";
  c.resume = false;
  run_pretraining(c, [](const StepReport& s) { return s.step < 4; });
  c.resume = true;
  c.learning_rate *= 2;
  EXPECT_THROW(run_pretraining(c), ModelStateError);
  // Another architecture is named by its field (the header's tensors, checked
  // first since the loaders read headers first, named only a missing tensor).
  c.learning_rate /= 2;
  c.dimensions.layers = 3;
  try {
    run_pretraining(c);
    ADD_FAILURE() << "resumed with another architecture";
  } catch (const ModelStateError& e) {
    EXPECT_NE(std::string(e.what()).find("first difference: 'dimensions'"), std::string::npos) << e.what();
  }
  // The attention kind too: flash and materialized agree only within
  // rounding, so a resumed run would not be the uninterrupted one's bits.
  c.dimensions.layers = 2;
  c.attention = c.attention == FullSequenceAttentionKind::Flash ? FullSequenceAttentionKind::Materialized
                                                                : FullSequenceAttentionKind::Flash;
  try {
    run_pretraining(c);
    ADD_FAILURE() << "resumed with the other attention kind";
  } catch (const ModelStateError& e) {
    EXPECT_NE(std::string(e.what()).find("first difference: 'attention'"), std::string::npos) << e.what();
  }
}

TEST(Pipelines, ResumeMayChangeThePolicyButNotTheData) {
  const fs::path dir = fresh_dir("resume_policy");
  PretrainingConfig c = tiny_pretraining(dir);
  c.output_dir = dir / "straight";
  ASSERT_TRUE(run_pretraining(c).completed);
  // Interrupted without checkpointing, resumed with block checkpointing (as
  // after running out of memory): the same bits, since the policy does not
  // change the numbers.
  c.output_dir = dir / "switched";
  run_pretraining(c, [](const StepReport& s) { return s.step < 4; });
  c.resume = true;
  c.activation_checkpointing = ActivationCheckpointingKind::TransformerBlock;
  const RunResult r = run_pretraining(c);
  EXPECT_EQ(r.resumed_from_step, 3);
  EXPECT_EQ(read_file(dir / "straight" / "model.safetensors"), read_file(dir / "switched" / "model.safetensors"));
  // Resuming a completed run is refused (nothing to resume), outputs intact.
  const std::string model = read_file(c.output_dir / "model.safetensors");
  EXPECT_THROW(run_pretraining(c), ValueError);
  EXPECT_EQ(read_file(c.output_dir / "model.safetensors"), model);
  // Changed data under the same path: refused.
  c.output_dir = dir / "data_changed";
  c.resume = false;
  run_pretraining(c, [](const StepReport& s) { return s.step < 4; });
  std::ofstream(c.data, std::ios::app) << "one more line of text\n";
  c.resume = true;
  try {
    run_pretraining(c);
    ADD_FAILURE() << "resumed on changed data";
  } catch (const ModelStateError& e) {
    EXPECT_NE(std::string(e.what()).find("data_fingerprint"), std::string::npos) << e.what();
  }
}

TEST(Pipelines, LoraPostTrainingOnTheShippedData) {
  const fs::path dir = fresh_dir("post");
  PretrainingConfig base = tiny_pretraining(dir);
  base.dimensions.context_length = 96;
  base.steps = 2;
  ASSERT_TRUE(run_pretraining(base).completed);

  PostTrainingConfig c = rt_test::tiny_chat_post_training(base.output_dir / "model.safetensors", 4);
  c.activation_checkpointing = ActivationCheckpointingKind::TransformerBlock;
  c.eval_interval = 2;
  c.output_dir = dir / "lora";
  const RunResult r = run_post_training(c);
  ASSERT_TRUE(r.completed);
  EXPECT_EQ(r.weights, c.output_dir / "adapter.safetensors");
  const nlohmann::json meta = nlohmann::json::parse(read_file(c.output_dir / "metadata.json"));
  EXPECT_EQ(meta["config"]["activation_checkpointing"], "block");
  EXPECT_EQ(meta["config"]["fine_tuning_method"], "lora");
  EXPECT_EQ(meta["config"]["lora"]["rank"], 2);
  EXPECT_LT(meta["facts"]["trainable_parameters"].get<std::int64_t>(),
            meta["facts"]["base_parameters"].get<std::int64_t>());
  // The adapters load onto the base model.
  auto model = load_model(c.base_model);
  load_adapter_state(*model, r.weights);
  EXPECT_TRUE(model->has_lora());

  // LoRA with block checkpointing and dropout, interrupted and resumed:
  // bit-identical adapters.
  c.dropout = 0.1F;
  c.checkpoint_interval = 2;
  c.output_dir = dir / "lora_straight";
  ASSERT_TRUE(run_post_training(c).completed);
  c.output_dir = dir / "lora_resumed";
  run_post_training(c, [](const StepReport& s) { return s.step < 3; });
  c.resume = true;
  EXPECT_EQ(run_post_training(c).resumed_from_step, 2);
  EXPECT_EQ(read_file(dir / "lora_straight" / "adapter.safetensors"),
            read_file(dir / "lora_resumed" / "adapter.safetensors"));
  c.resume = false;
  c.dropout = 0.0F;

  c.fine_tuning_method = FineTuningMethod::Full;
  c.output_dir = dir / "full";
  const RunResult full = run_post_training(c);
  EXPECT_EQ(full.weights, c.output_dir / "model.safetensors");
}

TEST(Pipelines, BadInputFailsBeforeTouchingExistingOutputs) {
  const fs::path dir = fresh_dir("bad");
  PretrainingConfig c = tiny_pretraining(dir);
  c.steps = 2;
  ASSERT_TRUE(run_pretraining(c).completed);
  const std::string metadata = read_file(c.output_dir / "metadata.json");
  const std::string model = read_file(c.output_dir / "model.safetensors");
  const std::string metrics = read_file(c.output_dir / "metrics.jsonl");

  PretrainingConfig missing = c;
  missing.data = dir / "no_such_file.txt";
  EXPECT_THROW(run_pretraining(missing), DataError);
  PretrainingConfig corrupt = c;
  std::ofstream(dir / "bad.txt", std::ios::binary) << std::string("ok \xff\xfe bad", 9);
  corrupt.data = dir / "bad.txt";
  EXPECT_THROW(run_pretraining(corrupt), DataError);
  PretrainingConfig tiny = c;
  std::ofstream(dir / "short.txt") << "too short";
  tiny.data = dir / "short.txt";
  EXPECT_THROW(run_pretraining(tiny), DataError);
  PretrainingConfig bad_steps = c;
  bad_steps.steps = 0;
  EXPECT_THROW(run_pretraining(bad_steps), ValueError);
  PretrainingConfig huge_batch = c;
  huge_batch.batch = std::int64_t{1} << 62;
  EXPECT_THROW(run_pretraining(huge_batch), ValueError);
  PretrainingConfig infinite = c;
  infinite.weight_decay = std::numeric_limits<float>::infinity();
  EXPECT_THROW(run_pretraining(infinite), ValueError);

  PostTrainingConfig post;
  post.base_model = c.output_dir / "model.safetensors";
  post.data = dir / "missing.jsonl";
  post.output_dir = c.output_dir;  // the base's own run directory
  EXPECT_THROW(run_post_training(post), ValueError);
  post.output_dir = dir / "post";
  EXPECT_THROW(run_post_training(post), DataError);
  post.data = fs::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl";
  post.base_model = dir / "bad.txt";
  EXPECT_THROW(run_post_training(post), ModelStateError);
  EXPECT_THROW(parse_fine_tuning_method("qlora"), ValueError);
  EXPECT_THROW(parse_activation_checkpointing("sometimes"), ValueError);
  EXPECT_THROW(parse_attention_kind("sparse"), ValueError);

  EXPECT_EQ(read_file(c.output_dir / "metadata.json"), metadata);
  EXPECT_EQ(read_file(c.output_dir / "model.safetensors"), model);
  EXPECT_EQ(read_file(c.output_dir / "metrics.jsonl"), metrics);
}

// Every file a run writes is checked with the writer's own check at setup:
// a directory or a symlink in the way of model.safetensors (or any other
// output) was found only after the last step, losing the run.
TEST(Pipelines, AnOutputThatCannotBeReplacedIsRefusedBeforeStepOne) {
  const fs::path dir = fresh_dir("targets");
  std::ofstream(dir / "elsewhere") << "x";
  int steps = 0;
  const auto count = [&steps](const StepReport&) { return ++steps > 0; };
  for (const char* name : {"model.safetensors", "metadata.json", "metrics.jsonl", "loss_curve.svg",
                           "training_checkpoint.safetensors"}) {
    for (const bool symlink : {false, true}) {
      PretrainingConfig c = tiny_pretraining(dir);
      c.output_dir = dir / (std::string("run_") + name + (symlink ? "_link" : "_dir"));
      fs::create_directories(c.output_dir);
      if (symlink) {
        fs::create_symlink(dir / "elsewhere", c.output_dir / name);
      } else {
        fs::create_directories(c.output_dir / name / "inside");
      }
      steps = 0;
      try {
        run_pretraining(c, count);
        ADD_FAILURE() << name << ": the run was not refused";
      } catch (const ModelStateError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find((c.output_dir / name).string()), std::string::npos) << message;
        EXPECT_NE(message.find("checked before training"), std::string::npos) << message;
      }
      EXPECT_EQ(steps, 0) << name;
      EXPECT_FALSE(fs::exists(c.output_dir / "metrics.partial.jsonl")) << name;
    }
  }
  EXPECT_EQ(read_file(dir / "elsewhere"), "x");
  // Post-training's own output: adapter.safetensors.
  PretrainingConfig base = tiny_pretraining(dir);
  base.dimensions.context_length = 96;
  base.steps = 2;
  base.output_dir = dir / "base";
  ASSERT_TRUE(run_pretraining(base).completed);
  PostTrainingConfig post = rt_test::tiny_chat_post_training(base.output_dir / "model.safetensors", 2);
  post.output_dir = dir / "lora";
  fs::create_directories(post.output_dir / "adapter.safetensors" / "inside");
  steps = 0;
  const std::string message = rt_test::message_of<ModelStateError>([&] { run_post_training(post, count); });
  EXPECT_NE(message.find("adapter.safetensors: the target is a directory"), std::string::npos) << message;
  EXPECT_EQ(steps, 0);
  fs::remove_all(dir);
}

TEST(Pipelines, LearningRateScheduleWarmsUpThenDecays) {
  StageSettings s;
  s.steps = 100;
  s.warmup_steps = 10;
  s.learning_rate = 1.0F;
  s.min_learning_rate_ratio = 0.1F;
  EXPECT_FLOAT_EQ(s.learning_rate_at(0), 0.1F);
  EXPECT_FLOAT_EQ(s.learning_rate_at(9), 1.0F);
  EXPECT_FLOAT_EQ(s.learning_rate_at(10), 1.0F);
  EXPECT_NEAR(s.learning_rate_at(99), 0.1F, 1e-6);
  EXPECT_GT(s.learning_rate_at(50), s.learning_rate_at(60));
  // The last step is at lr·ratio however short the decay: with one step
  // after the warmup it ran at the peak (the attack's 5 steps, 4 warmup:
  // 0.0025, 0.005, 0.0075, 0.01, 0.01 at lr 0.01, ratio 0.1).
  s.steps = 5;
  s.warmup_steps = 4;
  s.learning_rate = 0.01F;
  const float expected[] = {0.0025F, 0.005F, 0.0075F, 0.01F, 0.001F};
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(s.learning_rate_at(i), expected[i]) << i;
  for (const std::int64_t steps : {2, 3, 11, 12}) {  // no warmup, or a decay of 0..2 steps
    s.steps = steps;
    s.warmup_steps = steps > 10 ? 10 : 0;
    EXPECT_FLOAT_EQ(s.learning_rate_at(steps - 1), 0.001F) << steps;
    if (steps - s.warmup_steps > 1) EXPECT_FLOAT_EQ(s.learning_rate_at(s.warmup_steps), 0.01F) << steps;
  }
  s.steps = 1;  // one step, no warmup: it runs at lr (the rate reaches its peak somewhere)
  s.warmup_steps = 0;
  EXPECT_FLOAT_EQ(s.learning_rate_at(0), 0.01F);
  // A warmup longer than the run ends inside it (documented; Hugging Face's too).
  s.steps = 3;
  s.warmup_steps = 20;
  EXPECT_FLOAT_EQ(s.learning_rate_at(2), 0.0015F);
}

// A run's memory figures are its own thread's allocations: another thread
// training meanwhile leaves each step's activation peak as it is alone, and
// the run no longer resets the process's peak, which other threads read
// (a 64 MiB buffer freed before the run still shows in memory_stats after).
TEST(Pipelines, MemoryFiguresAreTheRunsOwnAndTheProcessPeakIsLeftAlone) {
  const fs::path dir = fresh_dir("memory_figures");
  { const Tensor big = Tensor::empty({std::int64_t{16} << 20}); }
  const std::int64_t process_peak = memory_stats().peak_bytes;
  ASSERT_GE(process_peak, std::int64_t{64} << 20);
  const auto activation_peaks = [&](const std::string& name) {
    PretrainingConfig c = tiny_pretraining(dir);
    c.steps = 3;
    c.output_dir = dir / name;
    std::vector<std::int64_t> peaks;
    run_pretraining(c, [&](const StepReport& s) {
      peaks.push_back(s.activation_peak_bytes);
      return true;
    });
    return peaks;
  };
  const std::vector<std::int64_t> alone = activation_peaks("alone");
  EXPECT_GE(memory_stats().peak_bytes, process_peak);
  std::atomic<bool> done{false};
  std::thread other([&] {
    while (!done.load()) {
      const Tensor t = Tensor::empty({std::int64_t{1} << 20});
    }
  });
  const std::vector<std::int64_t> busy = activation_peaks("busy");
  done.store(true);
  other.join();
  EXPECT_EQ(busy, alone);
  EXPECT_GT(alone.front(), 0);
}
