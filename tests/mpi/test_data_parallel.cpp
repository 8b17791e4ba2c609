// Data-parallel pipelines under `mpirun -np 2` (docs/distributed.md): the
// 2-rank job against one process at the same global batch, bit-identical
// reruns, checkpointing policies, LoRA post-training, resume, the world-size
// and batch checks, and the gradient average and parameter checksum.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <iostream>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <nlohmann/json.hpp>

#include "job_dir.hpp"
#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

using riftco_mpi_test::max_weight_difference;
using riftco_mpi_test::read_file;
using riftco_mpi_test::world;

fs::path job_dir() { return riftco_mpi_test::job_dir("riftco_dp_"); }

/// A folder only this rank uses (for one-process reference runs).
fs::path own_dir(const std::string& name) {
  return job_dir() / ("rank" + std::to_string(world().rank()) + "_" + name);
}

PretrainingConfig tiny(const std::string& name) { return riftco_mpi_test::tiny_run(job_dir(), name); }

struct Trace {
  std::vector<float> losses, validation;
};
ProgressCallback record(Trace& t) {
  return [&t](const StepReport& r) {
    t.losses.push_back(r.loss);
    if (r.validation_loss) t.validation.push_back(*r.validation_loss);
    return true;
  };
}

float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float most = 0.0F;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) most = std::max(most, std::fabs(a[i] - b[i]));
  return most;
}

/// The same configuration as a 2-rank job and as one process on this rank.
struct Pair {
  Trace ranks, single;
  fs::path ranks_weights, single_weights;
};
Pair against_one_process(PretrainingConfig c) {
  Pair p;
  const fs::path name = c.output_dir.filename();
  const RunResult r = run_pretraining(c, world(), record(p.ranks));
  EXPECT_TRUE(r.completed);
  p.ranks_weights = c.output_dir / "model.safetensors";
  c.output_dir = own_dir(name.string() + "_single");
  const auto one = make_single_process_communicator();
  EXPECT_TRUE(run_pretraining(c, *one, record(p.single)).completed);
  p.single_weights = c.output_dir / "model.safetensors";
  return p;
}

}  // namespace

TEST(DataParallel, RunsOnTwoRanks) {
  ASSERT_EQ(world().world_size(), 2) << "run under mpirun -np 2";
  ASSERT_EQ(world().kind(), "mpi");
}

/// The largest loss, validation-loss and weight differences of a Pair,
/// printed by rank 0 (docs/distributed.md records them).
std::array<float, 3> differences(const Pair& p, const char* what) {
  const std::array<float, 3> d = {max_difference(p.ranks.losses, p.single.losses),
                                  max_difference(p.ranks.validation, p.single.validation),
                                  max_weight_difference(p.ranks_weights, p.single_weights)};
  if (world().rank() == 0) {
    std::cout << "[" << what << ", 2 ranks vs 1 process] max |loss difference| " << d[0]
              << ", max |validation loss difference| " << d[1] << ", max |weight difference| " << d[2] << std::endl;
  }
  return d;
}

TEST(DataParallel, OneStepMatchesOneProcess) {
  PretrainingConfig c = tiny("one_step");
  c.steps = 1;
  const std::array<float, 3> d = differences(against_one_process(c), "1 step");
  for (const float v : d) EXPECT_LE(v, 1e-5F);
}

TEST(DataParallel, TwentyStepsMatchOneProcess) {
  const Pair p = against_one_process(tiny("twenty"));
  ASSERT_EQ(p.ranks.losses.size(), 20U);
  for (const float v : differences(p, "20 steps")) EXPECT_LE(v, 1e-5F);
  // Rank 0 alone wrote files; metadata records the world size.
  if (world().rank() == 0) {
    const nlohmann::json meta = nlohmann::json::parse(read_file(job_dir() / "twenty" / "metadata.json"));
    EXPECT_EQ(meta["world_size"], 2);
    const nlohmann::json single = nlohmann::json::parse(read_file(own_dir("twenty_single") / "metadata.json"));
    EXPECT_EQ(single["world_size"], 1);
  }
}

TEST(DataParallel, HundredStepsDifferenceIsRecorded) {
  // docs/distributed.md records these numbers (item 5 of issue 17).
  PretrainingConfig c = tiny("hundred");
  c.steps = 100;
  c.eval_interval = 0;
  c.checkpoint_interval = 0;
  for (const float v : differences(against_one_process(c), "100 steps")) EXPECT_LE(v, 1e-4F);
}

TEST(DataParallel, TwoRankRunsAreBitIdentical) {
  PretrainingConfig a = tiny("again_a");
  PretrainingConfig b = tiny("again_b");
  a.dropout = b.dropout = 0.1F;  // each rank its own masks, the same every run
  Trace ta, tb;
  ASSERT_TRUE(run_pretraining(a, world(), record(ta)).completed);
  ASSERT_TRUE(run_pretraining(b, world(), record(tb)).completed);
  EXPECT_EQ(ta.losses, tb.losses);
  EXPECT_EQ(ta.validation, tb.validation);
  EXPECT_EQ(read_file(a.output_dir / "model.safetensors"), read_file(b.output_dir / "model.safetensors"));
}

TEST(DataParallel, CheckpointingPoliciesGiveTheSameBits) {
  PretrainingConfig disabled = tiny("policy_disabled");
  disabled.steps = 6;
  Trace base;
  ASSERT_TRUE(run_pretraining(disabled, world(), record(base)).completed);
  const std::string expected = read_file(disabled.output_dir / "model.safetensors");
  for (const auto& [name, kind] : {std::pair{"policy_block", ActivationCheckpointingKind::TransformerBlock},
                                   std::pair{"policy_segments", ActivationCheckpointingKind::BlockSegments}}) {
    PretrainingConfig c = disabled;
    c.output_dir = job_dir() / name;
    c.activation_checkpointing = kind;
    Trace t;
    ASSERT_TRUE(run_pretraining(c, world(), record(t)).completed);
    EXPECT_EQ(t.losses, base.losses) << name;
    EXPECT_EQ(read_file(c.output_dir / "model.safetensors"), expected) << name;
  }
}

TEST(DataParallel, LoraPostTrainingMatchesOneProcess) {
  PretrainingConfig base = tiny("lora_base");
  base.steps = 2;
  ASSERT_TRUE(run_pretraining(base, world()).completed);
  PostTrainingConfig c;
  c.base_model = base.output_dir / "model.safetensors";
  c.data = fs::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl";
  c.steps = 6;
  c.batch = 4;
  c.gradient_accumulation_steps = 2;  // shares of masked targets differ per rank and micro-batch
  c.sequence_length = 32;
  c.eval_interval = 3;
  c.eval_batches = 1;
  c.lora.rank = 2;
  c.output_dir = job_dir() / "lora";
  Trace ranks, single;
  const RunResult r = run_post_training(c, world(), record(ranks));
  ASSERT_TRUE(r.completed);
  EXPECT_EQ(r.weights.empty(), world().rank() != 0) << "rank 0 alone writes the adapter";
  c.output_dir = own_dir("lora_single");
  const auto one = make_single_process_communicator();
  ASSERT_TRUE(run_post_training(c, *one, record(single)).completed);
  EXPECT_LE(max_difference(ranks.losses, single.losses), 1e-4F);
  EXPECT_LE(max_difference(ranks.validation, single.validation), 1e-4F);
  EXPECT_LE(max_weight_difference(job_dir() / "lora" / "adapter.safetensors", c.output_dir / "adapter.safetensors"),
            1e-4F);
}

TEST(DataParallel, ResumeMatchesAnUninterruptedRunAndRefusesOtherWorldSizes) {
  PretrainingConfig whole = tiny("resume_whole");
  whole.steps = 9;
  whole.checkpoint_interval = 3;
  whole.dropout = 0.1F;  // every rank's dropout stream is saved and restored
  ASSERT_TRUE(run_pretraining(whole, world()).completed);

  PretrainingConfig part = whole;
  part.output_dir = job_dir() / "resume_part";
  // Rank 1 alone asks to stop after step 5: every rank stops (checkpoint at 3).
  const RunResult stopped = run_pretraining(part, world(), [](const StepReport& r) {
    return !(world().rank() == 1 && r.step == 5);
  });
  EXPECT_FALSE(stopped.completed);
  EXPECT_EQ(stopped.steps, 5);
  ASSERT_TRUE(fs::exists(part.output_dir / "training_checkpoint.safetensors"));

  // One process may not resume a 2-rank run; the directory stays resumable.
  if (world().rank() == 0) {
    PretrainingConfig alone = part;
    alone.resume = true;
    const auto one = make_single_process_communicator();
    try {
      run_pretraining(alone, *one);
      ADD_FAILURE() << "a 1-process resume of a 2-rank run was accepted";
    } catch (const ModelStateError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("made by a job of 2 rank(s)"), std::string::npos) << what;
      EXPECT_NE(what.find("this job has 1"), std::string::npos) << what;
      EXPECT_NE(what.find("mpirun -np 2"), std::string::npos) << what;
    }
  }
  world().barrier();

  part.resume = true;
  const RunResult resumed = run_pretraining(part, world());
  ASSERT_TRUE(resumed.completed);
  EXPECT_EQ(resumed.resumed_from_step, 3);
  EXPECT_EQ(read_file(part.output_dir / "model.safetensors"), read_file(whole.output_dir / "model.safetensors"));
}

namespace {

/// `c` is a ValueError on every rank whose message holds each phrase, and
/// no rank writes its output directory.
void expect_refused_on_every_rank(const PretrainingConfig& c, const std::string& what,
                                  std::initializer_list<const char*> phrases) {
  try {
    run_pretraining(c, world());
    ADD_FAILURE() << what << " was accepted";
  } catch (const ValueError& e) {
    for (const char* phrase : phrases) EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
  world().barrier();
  EXPECT_FALSE(fs::exists(c.output_dir));
}

}  // namespace

TEST(DataParallel, BatchNotDivisibleByTheRanksIsAValueErrorBeforeAnyFile) {
  PretrainingConfig c = tiny("uneven");
  c.batch = 3;
  expect_refused_on_every_rank(c, "batch 3 over 2 ranks", {"batch 3", "not divisible by the 2 ranks"});
}

// The fused step needs every gradient unreduced: refused on every rank (no
// rank waits in a collective), before any file.
TEST(DataParallel, OptimizerInBackwardIsAValueErrorOnEveryRankBeforeAnyFile) {
  PretrainingConfig c = tiny("fused_step");
  c.optimizer_in_backward = true;
  c.max_grad_norm = 0.0F;
  expect_refused_on_every_rank(c, "optimizer_in_backward over 2 ranks",
                               {"[pretraining] optimizer_in_backward", "this job has 2 ranks"});
}

TEST(DataParallel, SynchronizeGradientsAveragesAndKeepsMissingOnesConsistent) {
  const auto rank = static_cast<float>(world().rank());
  std::vector<Variable> params = {Variable(Tensor::zeros({2, 3}), true, "w"), Variable(Tensor::zeros({4}), true, "b"),
                                  Variable(Tensor::zeros({2}), true, "unused")};
  std::vector<Tensor> grads = {Tensor::full({2, 3}, 1.0F + rank), Tensor(), Tensor()};
  if (world().rank() == 1) grads[1] = Tensor::full({4}, 8.0F);
  synchronize_gradients(world(), params, grads);
  for (const float v : grads[0].values()) EXPECT_EQ(v, 1.5F);
  ASSERT_TRUE(grads[1].defined()) << "rank 0 had none: zeros there";
  for (const float v : grads[1].values()) EXPECT_EQ(v, 4.0F);
  EXPECT_FALSE(grads[2].defined()) << "no rank had one: Adam skips it, as one process would";
  // Checked before any communication, alike on every rank.
  std::vector<Tensor> wrong = {Tensor::zeros({3, 2}), Tensor(), Tensor()};
  EXPECT_THROW(synchronize_gradients(world(), params, wrong), ShapeError);
  std::vector<Tensor> short_list = {Tensor::zeros({2, 3})};
  EXPECT_THROW(synchronize_gradients(world(), params, short_list), ShapeError);
}

TEST(DataParallel, ParameterChecksumMismatchNamesRanksAndStep) {
  std::vector<Variable> params = {Variable(Tensor::full({3}, 0.5F), true, "w")};
  EXPECT_NO_THROW(check_parameters_identical(world(), params, 4, "pretraining"));
  if (world().rank() == 1) params[0].set_value(Tensor::full({3}, 0.25F));
  try {
    check_parameters_identical(world(), params, 7, "pretraining");
    ADD_FAILURE() << "different parameters passed the check";
  } catch (const CommunicationError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[pretraining] step 7"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 differs from rank 0"), std::string::npos) << what;
  }
  EXPECT_EQ(parameter_checksum(params), parameter_checksum(params));
}

TEST(DataParallel, ACheckpointOnlyOneRankResumesFromIsRefused) {
  // No shared file system: the same relative output_dir names another
  // folder on each rank (each works in its own directory), so rank 1 does
  // not see rank 0's checkpoint. (The settings are the same on both ranks:
  // a resume on one rank only is refused by the settings check.)
  const fs::path here = fs::current_path();
  const fs::path own = job_dir() / ("resume_one_rank_cwd" + std::to_string(world().rank()));
  fs::create_directories(own);
  fs::current_path(own);
  PretrainingConfig c = tiny("resume_one_rank");
  c.output_dir = "run";
  c.steps = 6;
  c.checkpoint_interval = 2;
  EXPECT_FALSE(run_pretraining(c, world(), [](const StepReport& r) { return r.step < 3; }).completed);
  c.resume = true;
  try {
    run_pretraining(c, world());
    ADD_FAILURE() << "ranks starting at different steps were accepted";
  } catch (const CommunicationError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0 starts at step 2, rank 1 at step 0"), std::string::npos) << what;
  }
  fs::current_path(here);
}
