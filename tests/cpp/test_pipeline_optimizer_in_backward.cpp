// The pipelines' optimizer_in_backward (Adam::backward_and_step in the stage
// loop): the same weights to the bit as the plain step, recorded in
// metadata.json, changeable on resume, and its three refusals (clipping,
// gradient accumulation, more than one rank) made before anything is read or
// written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "scratch.hpp"
#include "tiny_pretraining.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

PretrainingConfig tiny(const fs::path& dir) {
  PretrainingConfig c = rt_test::tiny_pretraining_checkpointed(dir);
  c.max_grad_norm = 0.0F;  // the fused step cannot clip
  return c;
}

/// A base model for post-training on the chat data (context 96): `steps`
/// steps into dir/base.
PretrainingConfig chat_base(const fs::path& dir, std::int64_t steps) {
  PretrainingConfig base = tiny(dir);
  base.dimensions.context_length = 96;
  base.steps = steps;
  base.output_dir = dir / "base";
  return base;
}

nlohmann::json metadata(const fs::path& run) {
  return nlohmann::json::parse(rt_test::read_file(run / "metadata.json"));
}

/// Every metrics row without its timings (losses, learning rates, norms).
std::string numbers(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::string out;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    for (const char* key : {"tokens_per_second", "elapsed_seconds", "peak_bytes", "activation_peak_bytes"}) {
      row.erase(key);
    }
    out += row.dump() + "\n";
  }
  return out;
}

std::string refusal(const std::function<void()>& run) {
  try {
    run();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no ValueError)";
}

/// Rank 0 of a pretend two-rank job: the refusal comes before any collective.
class TwoRanks final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string_view kind() const override { return "test"; }
  void all_reduce_sum(std::span<float>) override { ADD_FAILURE() << "a collective ran"; }
  void reduce_scatter_sum(std::span<const float>, std::span<float>) override { ADD_FAILURE() << "a collective ran"; }
  void all_gather(std::span<const float>, std::span<float>) override { ADD_FAILURE() << "a collective ran"; }
  void broadcast(std::span<float>, int) override { ADD_FAILURE() << "a collective ran"; }
  void barrier() override { ADD_FAILURE() << "a collective ran"; }
  [[noreturn]] void abort(std::string_view, int) override { std::abort(); }
};

}  // namespace

TEST(PipelineOptimizerInBackward, PretrainingGivesTheSameBitsAndRecordsIt) {
  const fs::path dir = rt_test::fresh_dir("fused_step", "pretrain");
  PretrainingConfig c = tiny(dir);
  EXPECT_FALSE(c.optimizer_in_backward);
  c.output_dir = dir / "plain";
  ASSERT_TRUE(run_pretraining(c).completed);
  c.optimizer_in_backward = true;
  c.output_dir = dir / "fused";
  ASSERT_TRUE(run_pretraining(c).completed);
  EXPECT_EQ(rt_test::read_file(dir / "plain" / "model.safetensors"),
            rt_test::read_file(dir / "fused" / "model.safetensors"));
  EXPECT_EQ(numbers(dir / "plain"), numbers(dir / "fused"));
  EXPECT_EQ(metadata(dir / "plain")["config"]["optimizer_in_backward"], false);
  EXPECT_EQ(metadata(dir / "fused")["config"]["optimizer_in_backward"], true);
}

// Execution policy: a run checkpointed with the option resumes without it
// (and the other way round) to the bits of a straight run.
TEST(PipelineOptimizerInBackward, AResumeMayTurnItOnOrOff) {
  const fs::path dir = rt_test::fresh_dir("fused_step", "resume");
  PretrainingConfig c = tiny(dir);
  c.output_dir = dir / "straight";
  ASSERT_TRUE(run_pretraining(c).completed);
  for (const bool first : {true, false}) {
    c.output_dir = dir / (first ? "on_then_off" : "off_then_on");
    c.resume = false;
    c.optimizer_in_backward = first;
    ASSERT_FALSE(run_pretraining(c, [](const StepReport& s) { return s.step < 4; }).completed);
    c.resume = true;
    c.optimizer_in_backward = !first;
    EXPECT_EQ(run_pretraining(c).resumed_from_step, 3);
    EXPECT_EQ(rt_test::read_file(dir / "straight" / "model.safetensors"),
              rt_test::read_file(c.output_dir / "model.safetensors"))
        << c.output_dir;
  }
}

TEST(PipelineOptimizerInBackward, LoraAndFullPostTrainingGiveTheSameBits) {
  const fs::path dir = rt_test::fresh_dir("fused_step", "post");
  const PretrainingConfig base = chat_base(dir, 2);
  ASSERT_TRUE(run_pretraining(base).completed);
  PostTrainingConfig c = rt_test::tiny_chat_post_training(base.output_dir / "model.safetensors", 3);
  c.activation_checkpointing = ActivationCheckpointingKind::TransformerBlock;
  c.max_grad_norm = 0.0F;
  for (const FineTuningMethod method : {FineTuningMethod::Lora, FineTuningMethod::Full}) {
    c.fine_tuning_method = method;
    const std::string name = fine_tuning_method_name(method);
    c.optimizer_in_backward = false;
    c.output_dir = dir / (name + "_plain");
    const RunResult plain = run_post_training(c);
    c.optimizer_in_backward = true;
    c.output_dir = dir / (name + "_fused");
    const RunResult fused = run_post_training(c);
    ASSERT_TRUE(plain.completed && fused.completed) << name;
    EXPECT_EQ(rt_test::read_file(plain.weights), rt_test::read_file(fused.weights)) << name;
    EXPECT_EQ(numbers(plain.output_dir), numbers(fused.output_dir)) << name;
    EXPECT_EQ(metadata(fused.output_dir)["config"]["optimizer_in_backward"], true) << name;
  }
}

// Each refusal names the field and the fix, and leaves an existing run's
// directory as it was; post-training refuses before the base model or the
// data is read (both are missing here).
TEST(PipelineOptimizerInBackward, TheThreeRefusalsComeBeforeAnythingIsReadOrWritten) {
  const fs::path dir = rt_test::fresh_dir("fused_step", "refusals");
  PretrainingConfig c = tiny(dir);
  c.steps = 2;
  c.output_dir = dir / "run";
  ASSERT_TRUE(run_pretraining(c).completed);
  std::vector<std::pair<fs::path, std::string>> before;
  for (const fs::directory_entry& e : fs::directory_iterator(c.output_dir)) {
    before.emplace_back(e.path(), rt_test::read_file(e.path()));
  }
  c.optimizer_in_backward = true;
  PostTrainingConfig post;
  post.base_model = dir / "missing.safetensors";
  post.data = dir / "missing.jsonl";
  post.output_dir = c.output_dir;
  post.optimizer_in_backward = true;

  PretrainingConfig clipped = c;
  clipped.max_grad_norm = PretrainingConfig{}.max_grad_norm;  // the default, 1.0
  std::string why = refusal([&] { run_pretraining(clipped); });
  EXPECT_NE(why.find("[PretrainingConfig] optimizer_in_backward"), std::string::npos) << why;
  EXPECT_NE(why.find("set max_grad_norm to 0"), std::string::npos) << why;
  EXPECT_NE(why.find("the pipelines default to 1.0"), std::string::npos) << why;
  EXPECT_THROW(clipped.validate(), ValueError);
  post.max_grad_norm = 0.5F;
  why = refusal([&] { run_post_training(post); });
  EXPECT_NE(why.find("[post_training] optimizer_in_backward"), std::string::npos) << why;
  EXPECT_NE(why.find("max_grad_norm 0 (got 0.5"), std::string::npos) << why;

  PretrainingConfig accumulated = c;
  accumulated.gradient_accumulation_steps = 2;
  why = refusal([&] { run_pretraining(accumulated); });
  EXPECT_NE(why.find("gradient_accumulation_steps 1 (got 2)"), std::string::npos) << why;
  EXPECT_NE(why.find("set gradient_accumulation_steps to 1"), std::string::npos) << why;
  post.max_grad_norm = 0.0F;
  post.gradient_accumulation_steps = 4;
  why = refusal([&] { run_post_training(post); });
  EXPECT_NE(why.find("gradient_accumulation_steps 1 (got 4)"), std::string::npos) << why;

  TwoRanks two;
  why = refusal([&] { run_pretraining(c, two); });
  EXPECT_NE(why.find("[pretraining] optimizer_in_backward"), std::string::npos) << why;
  EXPECT_NE(why.find("this job has 2 ranks"), std::string::npos) << why;
  EXPECT_NE(why.find("run without mpirun"), std::string::npos) << why;
  post.gradient_accumulation_steps = 1;
  why = refusal([&] { run_post_training(post, two); });
  EXPECT_NE(why.find("this job has 2 ranks"), std::string::npos) << why;

  std::size_t files = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(c.output_dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, before.size());
  for (const auto& [path, bytes] : before) EXPECT_EQ(rt_test::read_file(path), bytes) << path;
  // Off, none of the three conditions matters.
  c.optimizer_in_backward = false;
  accumulated.optimizer_in_backward = false;
  EXPECT_NO_THROW(accumulated.validate());
  clipped.optimizer_in_backward = false;
  EXPECT_NO_THROW(clipped.validate());
}

// A base model whose last block's down-projection gradient overflows while
// the loss and the gradients reached before it (LM head, final norm) stay
// finite: the final norm's weight 1e25 makes the residual gradient ~1e23,
// the up-projection's row 0 of 1e20 makes the SwiGLU output's column 0
// ~1e19 (the down-projection's column 0, 1e-30, keeps the forward sane).
// Fused: the head and the norm are updated, then the step fails part-way.
TEST(PipelineOptimizerInBackward, AGradientOverflowAfterTheFirstUpdateIsAPartialStepErrorWithNoModel) {
  const fs::path dir = rt_test::fresh_dir("fused_step", "partial");
  const PretrainingConfig base = chat_base(dir, 1);
  ASSERT_TRUE(run_pretraining(base).completed);
  auto model = load_model(base.output_dir / "model.safetensors");
  const std::int64_t c = base.dimensions.model_width;
  const std::int64_t f = base.dimensions.feed_forward_width;
  const std::string last = "blocks." + std::to_string(base.dimensions.layers - 1) + ".mlp.";
  model->parameter("final_norm.weight").set_value(Tensor::full({c}, 1e25F));
  Tensor up = model->parameter(last + "up.weight").value().clone();
  for (std::int64_t j = 0; j < c; ++j) up.data()[j] = 1e20F;
  model->parameter(last + "up.weight").set_value(up);
  Tensor down = model->parameter(last + "down.weight").value().clone();
  for (std::int64_t i = 0; i < c; ++i) down.data()[i * f] = 1e-30F;
  model->parameter(last + "down.weight").set_value(down);
  save_model_state(*model, dir / "overflowing.safetensors");

  PostTrainingConfig p = rt_test::tiny_chat_post_training(dir / "overflowing.safetensors", 2);
  p.fine_tuning_method = FineTuningMethod::Full;
  p.max_grad_norm = 0.0F;
  p.output_dir = dir / "plain";
  try {  // the plain step sees every gradient first: nothing changes
    run_post_training(p);
    ADD_FAILURE() << "the overflowing gradient was not refused";
  } catch (const PartialStepError& e) {
    ADD_FAILURE() << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stopped before updating the weights"), std::string::npos) << e.what();
  }
  p.optimizer_in_backward = true;
  p.output_dir = dir / "fused";
  try {
    run_post_training(p);
    ADD_FAILURE() << "the overflowing gradient was not refused";
  } catch (const PartialStepError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[post_training] step 1: [Adam::backward_and_step] failed after updating"),
              std::string::npos) << what;
    EXPECT_NE(what.find(last + "down.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("the weights were partly updated"), std::string::npos) << what;
    EXPECT_NE(what.find("no final model is written"), std::string::npos) << what;
    EXPECT_NE(what.find("the last training checkpoint, if any, is kept"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(p.output_dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(p.output_dir / "metadata.json"));
}
