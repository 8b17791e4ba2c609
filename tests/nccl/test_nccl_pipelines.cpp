// The pipelines with device cuda over the nccl communicator (RIFTCO_NCCL
// builds): run_pretraining picks Communicator::world_for(cuda), the NCCL job
// under mpirun (one GPU per rank), one process otherwise. Against the same
// run with device cpu (the MPI communicator, or one process) within
// pipeline_compare.hpp's tolerances; ZeRO-1 against plain Adam bit for bit.
// CTest runs it in one process ("needs 1 GPU") and under `mpirun -np 2`
// ("needs 2 GPUs"); with fewer devices every test skips.
#include <gtest/gtest.h>

#include "../cuda/pipeline_compare.hpp"
#include "nccl_test_world.hpp"

using namespace rt_device_test;

namespace {

/// The ranks share the output directory (one host): rank 0 makes it.
fs::path shared_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("riftco_nccl_pipelines_" + name);
  if (rt_nccl_test::host().rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_corpus(dir);
  }
  float done = 0.0F;  // every rank waits for rank 0
  rt_nccl_test::host().all_reduce_sum(std::span<float>(&done, 1));
  return dir;
}

}  // namespace

TEST(NcclPipelines, PretrainingOnEveryRanksGpuMatchesTheCpuJobAndZeroOneIsPlainAdam) {
  const std::string why = rt_nccl_test::skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const int world = rt_nccl_test::host().world_size();
  const fs::path dir = shared_dir("pretrain");
  PretrainingConfig c = tiny(dir);
  c.output_dir = dir / "cpu";
  ASSERT_TRUE(run_pretraining(c).completed);
  c.device = Backend::Cuda;
  c.output_dir = dir / "cuda";
  ASSERT_TRUE(run_pretraining(c).completed);  // the parameters' checksum is compared across ranks at the end
  c.zero_stage = 1;
  c.output_dir = dir / "cuda_zero1";
  ASSERT_TRUE(run_pretraining(c).completed);
  if (rt_nccl_test::host().rank() != 0) return;  // rank 0 wrote the files
  const nlohmann::json meta = metadata(dir / "cuda");
  EXPECT_EQ(meta["config"]["device"], "cuda");
  EXPECT_EQ(meta["facts"]["communicator"], world > 1 ? "nccl" : "single-process");
  expect_close_runs(dir / "cpu", dir / "cuda");
  EXPECT_EQ(read_file(dir / "cuda" / "model.safetensors"), read_file(dir / "cuda_zero1" / "model.safetensors"));
  EXPECT_EQ(losses(dir / "cuda"), losses(dir / "cuda_zero1"));
}

TEST(NcclPipelines, ResumeOnTheGpusIsBitIdentical) {
  const std::string why = rt_nccl_test::skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const fs::path dir = shared_dir("resume");
  PretrainingConfig c = tiny(dir);
  c.device = Backend::Cuda;
  c.zero_stage = 1;  // the gathered moments are saved, then sharded again on load
  c.output_dir = dir / "straight";
  ASSERT_TRUE(run_pretraining(c).completed);
  c.output_dir = dir / "interrupted";
  ASSERT_FALSE(run_pretraining(c, [](const StepReport& s) { return s.step < 4; }).completed);
  c.resume = true;
  EXPECT_EQ(run_pretraining(c).resumed_from_step, 3);
  if (rt_nccl_test::host().rank() != 0) return;
  EXPECT_EQ(read_file(dir / "straight" / "model.safetensors"), read_file(dir / "interrupted" / "model.safetensors"));
}
