// ZeRO-1 and the gradient bucket size in the pipelines under `mpirun -np 2`
// (docs/distributed.md): zero_stage 1 trains the same bits as plain data
// parallelism (pretraining and LoRA post-training), under block
// checkpointing too; its training checkpoints hold the full Adam state, so a
// ZeRO run resumes bit for bit, with ZeRO on or off; 1 MiB buckets give the
// same bits as 25 MiB; each rank holds about half the Adam state.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "job_dir.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

using riftco_mpi_test::read_file;
using riftco_mpi_test::world;

fs::path job_dir() { return riftco_mpi_test::job_dir("riftco_zero_"); }

PretrainingConfig tiny(const std::string& name, std::int64_t zero_stage) {
  PretrainingConfig c = riftco_mpi_test::tiny_run(job_dir(), name);
  c.zero_stage = zero_stage;
  return c;
}

/// About 0.8 M parameters (25 of ShardedAdam's 32768-element chunks, several 1 MiB buckets).
PretrainingConfig medium(const std::string& name, std::int64_t zero_stage) {
  PretrainingConfig c = tiny(name, zero_stage);
  c.dimensions = {256, 32, 128, 4, 4, 344};
  c.steps = 3;
  c.batch = 2;
  c.eval_batches = 1;
  c.checkpoint_interval = 0;
  return c;
}

struct Trained {
  std::vector<float> losses;
  std::string weights;
};
Trained train(const PretrainingConfig& c) {
  Trained r;
  const RunResult result = run_pretraining(c, world(), [&r](const StepReport& s) {
    r.losses.push_back(s.loss);
    return true;
  });
  EXPECT_TRUE(result.completed);
  r.weights = read_file(c.output_dir / "model.safetensors");  // every rank reads rank 0's file
  return r;
}

nlohmann::json metadata(const fs::path& dir) { return nlohmann::json::parse(read_file(dir / "metadata.json")); }

}  // namespace

TEST(ZeroPipelines, RunsOnTwoRanks) { ASSERT_EQ(world().world_size(), 2) << "run under mpirun -np 2"; }

TEST(ZeroPipelines, TwentyStepsAreBitIdenticalToPlainDataParallelism) {
  const Trained plain = train(tiny("plain", 0));
  const Trained zero = train(tiny("zero", 1));
  ASSERT_EQ(zero.losses.size(), 20U);
  EXPECT_EQ(zero.losses, plain.losses);
  EXPECT_EQ(zero.weights, plain.weights);
  EXPECT_FALSE(zero.weights.empty());
  const nlohmann::json meta = metadata(job_dir() / "zero");
  EXPECT_EQ(meta["config"]["zero_stage"], 1);
  EXPECT_EQ(meta["facts"]["zero_sharded"], true);
}

TEST(ZeroPipelines, BlockCheckpointingGivesTheSameBitsAsDisabled) {
  PretrainingConfig disabled = tiny("zero_disabled", 1);
  disabled.steps = 6;
  PretrainingConfig block = disabled;
  block.output_dir = job_dir() / "zero_block";
  block.activation_checkpointing = ActivationCheckpointingKind::TransformerBlock;
  const Trained a = train(disabled);
  const Trained b = train(block);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.weights, b.weights);
}

TEST(ZeroPipelines, OneMibBucketsGiveTheSameBitsAsTwentyFive) {
  PretrainingConfig big = medium("bucket_25", 1);
  PretrainingConfig small = big;
  small.output_dir = job_dir() / "bucket_1";
  small.gradient_bucket_mib = 1;
  const Trained a = train(big);
  const Trained b = train(small);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.weights, b.weights);
}

TEST(ZeroPipelines, AdamStateBytesPerRankAreAboutHalf) {
  const Trained plain = train(medium("state_plain", 0));
  const Trained zero = train(medium("state_zero", 1));
  EXPECT_EQ(plain.weights, zero.weights);
  const auto plain_bytes = metadata(job_dir() / "state_plain")["facts"]["optimizer_state_bytes_per_rank"].get<double>();
  const auto zero_bytes = metadata(job_dir() / "state_zero")["facts"]["optimizer_state_bytes_per_rank"].get<double>();
  ASSERT_GT(plain_bytes, 0.0);
  const double ratio = zero_bytes / plain_bytes;
  if (world().rank() == 0) {
    std::cout << "[ZeRO-1, 2 ranks] Adam state bytes on rank 0 (allocator): " << static_cast<long long>(zero_bytes)
              << " vs plain " << static_cast<long long>(plain_bytes) << " (ratio " << ratio << ")" << std::endl;
  }
  EXPECT_GT(ratio, 0.45);
  EXPECT_LE(ratio, 0.55);
}

TEST(ZeroPipelines, ResumeIsBitForBitWithZeroOnOrOff) {
  PretrainingConfig whole = tiny("zero_resume_whole", 1);
  whole.steps = 9;
  whole.checkpoint_interval = 3;
  whole.dropout = 0.1F;
  const Trained expected = train(whole);
  for (const std::int64_t zero_on_resume : {1, 0}) {
    PretrainingConfig part = whole;
    part.output_dir = job_dir() / ("zero_resume_part" + std::to_string(zero_on_resume));
    const RunResult stopped = run_pretraining(part, world(), [](const StepReport& r) { return r.step != 5; });
    EXPECT_FALSE(stopped.completed);
    ASSERT_TRUE(fs::exists(part.output_dir / "training_checkpoint.safetensors"));
    part.resume = true;
    part.zero_stage = zero_on_resume;  // the checkpoint holds the full state, as plain Adam's
    const RunResult resumed = run_pretraining(part, world());
    ASSERT_TRUE(resumed.completed);
    EXPECT_EQ(resumed.resumed_from_step, 3);
    EXPECT_EQ(read_file(part.output_dir / "model.safetensors"), expected.weights) << "zero " << zero_on_resume;
  }
}

TEST(ZeroPipelines, LoraPostTrainingIsBitIdenticalToPlainDataParallelism) {
  PretrainingConfig base = tiny("zero_lora_base", 0);
  base.steps = 2;
  ASSERT_TRUE(run_pretraining(base, world()).completed);
  std::string adapters[2];
  for (const std::int64_t zero : {0, 1}) {
    PostTrainingConfig c;
    c.base_model = base.output_dir / "model.safetensors";
    c.data = fs::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl";
    c.steps = 6;
    c.batch = 4;
    c.gradient_accumulation_steps = 2;
    c.sequence_length = 32;
    c.eval_interval = 3;
    c.eval_batches = 1;
    c.lora.rank = 2;
    c.zero_stage = zero;  // only the adapters are trainable: only they are sharded
    c.output_dir = job_dir() / ("zero_lora" + std::to_string(zero));
    ASSERT_TRUE(run_post_training(c, world()).completed);
    adapters[zero] = read_file(c.output_dir / "adapter.safetensors");
  }
  EXPECT_FALSE(adapters[0].empty());
  EXPECT_EQ(adapters[0], adapters[1]);
}
