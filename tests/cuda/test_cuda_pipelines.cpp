// The pipelines on one GPU (device cuda): a short pretraining run against the
// same run on the CPU (within pipeline_compare.hpp's tolerances), two cuda
// runs bit for bit, resume on cuda (bit for bit against a straight cuda run,
// and a cpu checkpoint continued on cuda), LoRA post-training on cuda.
// Every test skips without a CUDA device.
#include <gtest/gtest.h>

#include "cuda_skip.hpp"
#include "pipeline_compare.hpp"
#include "riftco_transformer/memory.hpp"

using namespace rt_device_test;

TEST(CudaPipelines, PretrainingMatchesTheCpuRunAndRepeatsBitForBit) {
  SKIP_WITHOUT_CUDA();
  const fs::path dir = fresh_dir("pretrain");
  PretrainingConfig c = tiny(dir);
  c.output_dir = dir / "cpu";
  ASSERT_TRUE(run_pretraining(c).completed);
  c.device = Backend::Cuda;
  for (const char* name : {"cuda", "cuda_again"}) {
    c.output_dir = dir / name;
    const RunResult r = run_pretraining(c);
    ASSERT_TRUE(r.completed);
    EXPECT_GT(r.peak_bytes, 0);  // the cuda allocator's peak
  }
  EXPECT_EQ(read_file(dir / "cuda" / "model.safetensors"), read_file(dir / "cuda_again" / "model.safetensors"));
  EXPECT_EQ(losses(dir / "cuda"), losses(dir / "cuda_again"));
  expect_close_runs(dir / "cpu", dir / "cuda");
  const nlohmann::json meta = metadata(dir / "cuda");
  EXPECT_EQ(meta["config"]["device"], "cuda");
  EXPECT_EQ(meta["facts"]["communicator"], "single-process");
  // The file holds host bytes: a CPU load reads it.
  EXPECT_NO_THROW(load_model(dir / "cuda" / "model.safetensors"));
}

TEST(CudaPipelines, ResumeOnCudaIsBitIdenticalAndACpuCheckpointContinuesOnCuda) {
  SKIP_WITHOUT_CUDA();
  const fs::path dir = fresh_dir("resume");
  PretrainingConfig c = tiny(dir);
  c.dropout = 0.1F;  // the dropout stream is restored too
  c.device = Backend::Cuda;
  c.output_dir = dir / "straight";
  ASSERT_TRUE(run_pretraining(c).completed);
  c.output_dir = dir / "interrupted";
  ASSERT_FALSE(run_pretraining(c, [](const StepReport& s) { return s.step < 4; }).completed);
  c.resume = true;
  const RunResult resumed = run_pretraining(c);
  EXPECT_EQ(resumed.resumed_from_step, 3);
  EXPECT_EQ(read_file(dir / "straight" / "model.safetensors"), read_file(dir / "interrupted" / "model.safetensors"));
  EXPECT_EQ(losses(dir / "straight"), losses(dir / "interrupted"));
  // Started on the CPU, continued on cuda: the saved parameters and moments
  // are loaded onto the device; the numbers stay within the cpu/cuda tolerance.
  c.dropout = 0.0F;
  c.resume = false;
  c.device = Backend::Cpu;
  c.output_dir = dir / "cpu";
  ASSERT_TRUE(run_pretraining(c).completed);
  c.output_dir = dir / "cpu_then_cuda";
  ASSERT_FALSE(run_pretraining(c, [](const StepReport& s) { return s.step < 4; }).completed);
  c.resume = true;
  c.device = Backend::Cuda;
  EXPECT_EQ(run_pretraining(c).resumed_from_step, 3);
  expect_close_runs(dir / "cpu", dir / "cpu_then_cuda");
  EXPECT_EQ(metadata(dir / "cpu_then_cuda")["config"]["device"], "cuda");
}

TEST(CudaPipelines, LoraPostTrainingMatchesTheCpuRun) {
  SKIP_WITHOUT_CUDA();
  const fs::path dir = fresh_dir("post");
  PretrainingConfig c = tiny(dir);
  c.output_dir = dir / "base";
  ASSERT_TRUE(run_pretraining(c).completed);
  PostTrainingConfig p;
  p.base_model = dir / "base" / "model.safetensors";
  p.data = fs::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl";
  p.steps = 4;
  p.batch = 2;
  p.sequence_length = 32;
  p.eval_interval = 0;
  p.eval_batches = 1;
  p.checkpoint_interval = 2;
  for (const Backend device : {Backend::Cpu, Backend::Cuda}) {
    p.device = device;
    p.output_dir = dir / backend_name(device);
    ASSERT_TRUE(run_post_training(p).completed);
  }
  expect_close_runs(dir / "cpu", dir / "cuda", "adapter.safetensors");
}
