// Resume at another world size under `mpirun -np 2` (docs/distributed.md,
// "Resume"): every rank draws the whole global batch from one generator and a
// training checkpoint holds the full Adam state (ZeRO-1's gathered too), so
// without dropout a run stopped at N = 2 continues in one process, and one
// made by one process continues on two ranks with ZeRO-1: the parameters
// agree with the uninterrupted runs to float tolerance, the loss curve, the
// step counter and the learning-rate schedule continue, and metadata.json
// records the new world size and which steps ran at which N (LoRA
// post-training too). With dropout the
// ranks' streams are their own: the resume is refused, naming both sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "job_dir.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

using riftco_mpi_test::max_weight_difference;
using riftco_mpi_test::read_file;
using riftco_mpi_test::world;

fs::path job_dir() { return riftco_mpi_test::job_dir("riftco_resume_n_"); }

/// 6 steps, a checkpoint every 3, warmup then cosine decay (the schedule must continue).
PretrainingConfig tiny(const std::string& name) {
  PretrainingConfig c = riftco_mpi_test::tiny_run(job_dir(), name);
  c.steps = 6;
  c.eval_interval = 3;
  c.checkpoint_interval = 3;
  return c;
}

struct Trace {
  std::vector<std::int64_t> steps;
  std::vector<float> losses, learning_rates;
};
ProgressCallback record(Trace& t, std::int64_t stop_after = 0) {
  return [&t, stop_after](const StepReport& r) {
    t.steps.push_back(r.step);
    t.losses.push_back(r.loss);
    t.learning_rates.push_back(r.learning_rate);
    return stop_after == 0 || r.step < stop_after;
  };
}

/// Uninterrupted references: 2 ranks with ZeRO-1, and one process (rank 0 alone).
struct References {
  Trace two, one;
  fs::path two_weights, one_weights;
};
const References& references() {
  static const References refs = [] {
    References r;
    PretrainingConfig two = tiny("whole_two");
    two.zero_stage = 1;
    EXPECT_TRUE(run_pretraining(two, world(), record(r.two)).completed);
    r.two_weights = two.output_dir / "model.safetensors";
    PretrainingConfig one = tiny("whole_one");
    if (world().rank() == 0) {
      const auto single = make_single_process_communicator();
      EXPECT_TRUE(run_pretraining(one, *single, record(r.one)).completed);
    }
    world().barrier();
    r.one_weights = one.output_dir / "model.safetensors";
    return r;
  }();
  return refs;
}

/// The resumed steps 4..6 against an uninterrupted run's: the same step
/// numbers and learning rates, losses within float tolerance.
void expect_continues(const Trace& resumed, const Trace& whole, const char* what) {
  ASSERT_EQ(whole.steps.size(), 6U) << what;
  EXPECT_EQ(resumed.steps, (std::vector<std::int64_t>{4, 5, 6})) << what;
  EXPECT_EQ(resumed.learning_rates, std::vector<float>(whole.learning_rates.begin() + 3, whole.learning_rates.end()))
      << what;
  ASSERT_EQ(resumed.losses.size(), 3U) << what;
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(resumed.losses[i], whole.losses[i + 3], 1e-5F) << what << " " << i;
}

/// metadata.json's world size and history; metrics.jsonl holds steps 1..6,
/// the first three the interrupted job's losses.
void expect_files(const fs::path& dir, int world_size, const nlohmann::json& history, const Trace& first_part) {
  const nlohmann::json meta = nlohmann::json::parse(read_file(dir / "metadata.json"));
  EXPECT_EQ(meta["world_size"], world_size);
  EXPECT_EQ(meta["world_size_history"], history) << meta["world_size_history"].dump();
  EXPECT_EQ(meta["results"]["resumed_from_step"], 3);
  std::istringstream lines(read_file(dir / "metrics.jsonl"));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 6U);
  ASSERT_EQ(first_part.losses.size(), 3U);
  for (std::size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i]["step"], static_cast<int>(i + 1));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(rows[i]["loss"].get<float>(), first_part.losses[i]) << i;
}

nlohmann::json history(int first_world, int second_world) {
  return nlohmann::json::array({{{"world_size", first_world}, {"first_step", 1}, {"last_step", 3}},
                                {{"world_size", second_world}, {"first_step", 4}, {"last_step", 6}}});
}

}  // namespace

TEST(ResumeWorldSize, RunsOnTwoRanks) {
  ASSERT_EQ(world().world_size(), 2) << "run under mpirun -np 2";
}

TEST(ResumeWorldSize, TwoRanksWithZeroStoppedAtStep3ContinueInOneProcess) {
  const References& refs = references();
  PretrainingConfig c = tiny("two_then_one");
  c.zero_stage = 1;
  Trace first;
  ASSERT_FALSE(run_pretraining(c, world(), record(first, 3)).completed);
  ASSERT_TRUE(fs::exists(c.output_dir / "training_checkpoint.safetensors"));
  if (world().rank() == 0) {  // a plain process: one rank, ZeRO-1 asked for (plain Adam on one rank)
    c.resume = true;
    const auto single = make_single_process_communicator();
    Trace rest;
    const RunResult r = run_pretraining(c, *single, record(rest));
    ASSERT_TRUE(r.completed);
    EXPECT_EQ(r.resumed_from_step, 3);
    EXPECT_EQ(r.steps, 6);
    expect_continues(rest, refs.two, "2 -> 1 against 2 ranks");
    expect_continues(rest, refs.one, "2 -> 1 against 1 process");
    const float vs_two = max_weight_difference(c.output_dir / "model.safetensors", refs.two_weights);
    const float vs_one = max_weight_difference(c.output_dir / "model.safetensors", refs.one_weights);
    std::cout << "[2 ranks (ZeRO-1) -> 1 process at step 3] max |weight difference| vs uninterrupted 2 ranks "
              << vs_two << ", vs uninterrupted 1 process " << vs_one << std::endl;
    EXPECT_LE(vs_two, 1e-5F);
    EXPECT_LE(vs_one, 1e-5F);
    expect_files(c.output_dir, 1, history(2, 1), first);
    EXPECT_FALSE(fs::exists(c.output_dir / "training_checkpoint.safetensors")) << "the run completed";
  }
  world().barrier();
}

TEST(ResumeWorldSize, OneProcessStoppedAtStep3ContinuesOnTwoRanksWithZero) {
  const References& refs = references();
  PretrainingConfig c = tiny("one_then_two");
  Trace first;
  if (world().rank() == 0) {
    const auto single = make_single_process_communicator();
    EXPECT_FALSE(run_pretraining(c, *single, record(first, 3)).completed);
  }
  world().barrier();
  ASSERT_TRUE(fs::exists(c.output_dir / "training_checkpoint.safetensors"));
  c.resume = true;
  c.zero_stage = 1;
  Trace rest;
  const RunResult r = run_pretraining(c, world(), record(rest));
  ASSERT_TRUE(r.completed);
  EXPECT_EQ(r.resumed_from_step, 3);
  expect_continues(rest, refs.two, "1 -> 2 against 2 ranks");
  const float vs_two = max_weight_difference(c.output_dir / "model.safetensors", refs.two_weights);
  EXPECT_LE(vs_two, 1e-5F);
  if (world().rank() == 0) {
    expect_continues(rest, refs.one, "1 -> 2 against 1 process");
    const float vs_one = max_weight_difference(c.output_dir / "model.safetensors", refs.one_weights);
    std::cout << "[1 process -> 2 ranks (ZeRO-1) at step 3] max |weight difference| vs uninterrupted 1 process "
              << vs_one << ", vs uninterrupted 2 ranks " << vs_two << std::endl;
    EXPECT_LE(vs_one, 1e-5F);
    expect_files(c.output_dir, 2, history(1, 2), first);
    const nlohmann::json meta = nlohmann::json::parse(read_file(c.output_dir / "metadata.json"));
    EXPECT_EQ(meta["facts"]["zero_sharded"], true);
  }
  world().barrier();
}

TEST(ResumeWorldSize, LoraPostTrainingStoppedOnTwoRanksContinuesInOneProcess) {
  PretrainingConfig base = tiny("lora_base");
  base.steps = 2;
  ASSERT_TRUE(run_pretraining(base, world()).completed);
  PostTrainingConfig c;
  c.base_model = base.output_dir / "model.safetensors";
  c.data = fs::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl";
  c.steps = 6;
  c.batch = 4;
  c.gradient_accumulation_steps = 2;  // the ranks' shares of real targets differ per micro-batch
  c.sequence_length = 32;
  c.eval_interval = 3;
  c.eval_batches = 1;
  c.checkpoint_interval = 3;
  c.lora.rank = 2;
  c.zero_stage = 1;
  c.output_dir = job_dir() / "lora_whole";
  Trace whole;
  ASSERT_TRUE(run_post_training(c, world(), record(whole)).completed);
  c.output_dir = job_dir() / "lora_two_then_one";
  Trace first;
  ASSERT_FALSE(run_post_training(c, world(), record(first, 3)).completed);
  if (world().rank() == 0) {
    c.resume = true;
    const auto single = make_single_process_communicator();
    Trace rest;
    const RunResult r = run_post_training(c, *single, record(rest));
    ASSERT_TRUE(r.completed);
    EXPECT_EQ(r.resumed_from_step, 3);
    EXPECT_EQ(rest.steps, (std::vector<std::int64_t>{4, 5, 6}));
    EXPECT_EQ(rest.learning_rates, std::vector<float>(whole.learning_rates.begin() + 3, whole.learning_rates.end()));
    for (std::size_t i = 0; i < rest.losses.size(); ++i) EXPECT_NEAR(rest.losses[i], whole.losses[i + 3], 1e-4F);
    const float d =
        max_weight_difference(c.output_dir / "adapter.safetensors", job_dir() / "lora_whole" / "adapter.safetensors");
    std::cout << "[LoRA, 2 ranks (ZeRO-1) -> 1 process at step 3] max |adapter difference| vs uninterrupted 2 ranks "
              << d << std::endl;
    EXPECT_LE(d, 1e-4F);
  }
  world().barrier();
}

TEST(ResumeWorldSize, WithDropoutAnotherWorldSizeIsRefusedNamingBoth) {
  // 2 ranks -> 1 process.
  PretrainingConfig c = tiny("dropout_two");
  c.dropout = 0.1F;
  c.zero_stage = 1;
  ASSERT_FALSE(run_pretraining(c, world(), [](const StepReport& r) { return r.step < 3; }).completed);
  const fs::path ckpt = c.output_dir / "training_checkpoint.safetensors";
  if (world().rank() == 0) {
    const std::string before = read_file(ckpt);
    PretrainingConfig alone = c;
    alone.resume = true;
    const auto single = make_single_process_communicator();
    try {
      run_pretraining(alone, *single);
      ADD_FAILURE() << "a 1-process resume of a 2-rank run with dropout was accepted";
    } catch (const ModelStateError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("made by a job of 2 rank(s) (world_size 2), this job has 1"), std::string::npos) << what;
      EXPECT_NE(what.find("with dropout 0.1 the dropout streams are per rank"), std::string::npos) << what;
      EXPECT_NE(what.find("resume with mpirun -np 2"), std::string::npos) << what;
    }
    EXPECT_EQ(read_file(ckpt), before) << "a refused resume keeps the checkpoint";
  }
  world().barrier();

  // 1 process -> 2 ranks: every rank refuses alike.
  PretrainingConfig d = tiny("dropout_one");
  d.dropout = 0.1F;
  if (world().rank() == 0) {
    const auto single = make_single_process_communicator();
    EXPECT_FALSE(run_pretraining(d, *single, [](const StepReport& r) { return r.step < 3; }).completed);
  }
  world().barrier();
  d.resume = true;
  d.zero_stage = 1;
  try {
    run_pretraining(d, world());
    ADD_FAILURE() << "a 2-rank resume of a 1-process run with dropout was accepted";
  } catch (const ModelStateError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("made by a job of 1 rank(s) (world_size 1), this job has 2"), std::string::npos) << what;
    EXPECT_NE(what.find("dropout streams are per rank"), std::string::npos) << what;
    EXPECT_NE(what.find("resume with one process"), std::string::npos) << what;
  }
  world().barrier();
  EXPECT_TRUE(fs::exists(d.output_dir / "training_checkpoint.safetensors"));
  EXPECT_FALSE(fs::exists(d.output_dir / "metadata.json"));
}
