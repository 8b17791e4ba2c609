// The ranks of a data-parallel job must run the same configuration on the
// same data (docs/distributed.md, "Every rank runs the same run"): a job whose
// ranks were started with different settings fails at setup, on every rank,
// with one ValueError naming the first differing field and both values;
// before, such jobs hung (steps, checkpoint_interval), failed in MPI
// (zero_stage) or trained wrongly with exit 0 (accumulation, dropout, data).
// Run under `mpirun -np 2`; rank 1 changes one field.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "job_dir.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

using riftco_mpi_test::world;

fs::path job_dir() { return riftco_mpi_test::job_dir("riftco_agree_"); }

PretrainingConfig tiny(const std::string& name) {
  PretrainingConfig c = riftco_mpi_test::tiny_run(job_dir(), name);
  c.steps = 4;
  c.checkpoint_interval = 2;
  return c;
}

/// Runs `c` after rank 1 applies `change`; expects the ValueError on every
/// rank within seconds, naming `expected`, and no output directory.
void expect_refused(const std::string& name, const std::function<void(PretrainingConfig&)>& change,
                    const std::string& expected) {
  PretrainingConfig c = tiny(name);
  if (world().rank() == 1) change(c);
  const auto start = std::chrono::steady_clock::now();
  std::string message = "(no error)";
  try {
    run_pretraining(c, world());
  } catch (const ValueError& e) {
    message = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("the ranks of this job were started with different settings: " + expected),
            std::string::npos)
      << "rank " << world().rank() << ": " << message;
  EXPECT_LT(seconds, 10.0);
  EXPECT_FALSE(fs::exists(c.output_dir)) << "a refused job created " << c.output_dir;
  world().barrier();
}

// The silent ones first: before the fix they completed with exit 0.
TEST(ConfigAgreement, GradientAccumulationDiffers) {
  expect_refused("accumulation", [](PretrainingConfig& c) { c.gradient_accumulation_steps = 2; },
                 "'gradient_accumulation_steps' is 1 on rank 0 and 2 on rank 1");
}

TEST(ConfigAgreement, DropoutDiffers) {
  expect_refused("dropout", [](PretrainingConfig& c) { c.dropout = 0.25F; },
                 "'dropout' is 0.0 on rank 0 and 0.25 on rank 1");
}

TEST(ConfigAgreement, DataDiffers) {
  const fs::path other = job_dir() / "other.txt";
  if (world().rank() == 0) {
    std::ofstream(other) << std::string(2000, 'a') + "\n" + std::string(2000, 'b') + "\n";
  }
  world().barrier();
  expect_refused("data", [&](PretrainingConfig& c) { c.data = other; }, "'data' is ");
}

// These hung (or ended in an MPI error) before the fix.
TEST(ConfigAgreement, StepsDiffer) {
  expect_refused("steps", [](PretrainingConfig& c) { c.steps = 5; }, "'steps' is 4 on rank 0 and 5 on rank 1");
}

TEST(ConfigAgreement, CheckpointIntervalDiffers) {
  expect_refused("interval", [](PretrainingConfig& c) { c.checkpoint_interval = 3; },
                 "'checkpoint_interval' is 2 on rank 0 and 3 on rank 1");
}

TEST(ConfigAgreement, ZeroStageDiffers) {
  expect_refused("zero", [](PretrainingConfig& c) { c.zero_stage = 1; }, "'zero_stage' is 0 on rank 0 and 1 on rank 1");
}

TEST(ConfigAgreement, ModelDimensionsDiffer) {
  expect_refused("layers", [](PretrainingConfig& c) { c.dimensions.layers = 2; },
                 "'dimensions.layers' is 3 on rank 0 and 2 on rank 1");
}

// Rank 1 alone resuming: rank 0's fresh start would have removed the
// interrupted run while rank 1 loaded its checkpoint.
TEST(ConfigAgreement, ResumeOnOneRankOnly) {
  expect_refused("resume", [](PretrainingConfig& c) { c.resume = true; }, "'resume' is false on rank 0 and true on rank 1");
}

// How a rank keeps its activations is its own choice: the job runs.
TEST(ConfigAgreement, ActivationPolicyMayDifferPerRank) {
  PretrainingConfig c = tiny("policy");
  if (world().rank() == 1) c.activation_checkpointing = ActivationCheckpointingKind::TransformerBlock;
  EXPECT_TRUE(run_pretraining(c, world()).completed);
  world().barrier();
}

}  // namespace
