// The pipelines' device option on a CPU machine (the CUDA runs are
// tests/cuda/test_cuda_pipelines.cpp): metadata.json's record, an unknown
// device, cuda refused before any file when it cannot be used, and a
// checkpoint made on another device resuming here.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../../src/train/training_checkpoint.hpp"
#include "backend_error.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "scratch.hpp"
#include "tiny_pretraining.hpp"

using namespace riftco_transformer;
using rt_test::backend_error;
namespace fs = std::filesystem;

namespace {

PretrainingConfig tiny(const fs::path& dir) { return rt_test::tiny_pretraining_checkpointed(dir); }

}  // namespace

TEST(PipelineDevice, MetadataRecordsTheDeviceAndAnUnknownOneIsAValueError) {
  const fs::path dir = rt_test::fresh_dir("device", "metadata");
  PretrainingConfig c = tiny(dir);
  EXPECT_EQ(c.device, Backend::Cpu);
  c.steps = 2;
  c.output_dir = dir / "run";
  ASSERT_TRUE(run_pretraining(c).completed);
  const auto meta = nlohmann::json::parse(rt_test::read_file(c.output_dir / "metadata.json"));
  EXPECT_EQ(meta["config"]["device"], "cpu");
  c.output_dir = dir / "bad";
  c.device = static_cast<Backend>(7);
  EXPECT_THROW(c.validate(), ValueError);
  EXPECT_THROW(run_pretraining(c), ValueError);
  EXPECT_FALSE(fs::exists(c.output_dir));
}

TEST(PipelineDevice, CudaWithoutADeviceFailsBeforeAnyFileOnEveryEntryPoint) {
  if (backend_available(Backend::Cuda)) GTEST_SKIP() << "a CUDA device is available: cuda is not refused here";
  const fs::path dir = rt_test::fresh_dir("device", "no_cuda");
  PretrainingConfig c = tiny(dir);
  c.device = Backend::Cuda;
  c.output_dir = dir / "run";
  const std::string why = backend_error([&] { run_pretraining(c); });
  EXPECT_NE(why.find("[pretraining] device cuda: the cuda backend is not built in this package"), std::string::npos)
      << why;
  EXPECT_NE(backend_error([&] { run_pretraining(c, Communicator::world()); }).find("[pretraining] device cuda"),
            std::string::npos);
  EXPECT_THROW(c.check_device("x"), BackendError);
  EXPECT_FALSE(fs::exists(c.output_dir));
  PostTrainingConfig p;
  p.base_model = dir / "missing.safetensors";  // never read: the device is checked first
  p.data = dir / "missing.jsonl";
  p.device = Backend::Cuda;
  p.output_dir = dir / "post";
  EXPECT_NE(backend_error([&] { run_post_training(p); }).find("[post_training] device cuda: "), std::string::npos);
  EXPECT_FALSE(fs::exists(p.output_dir));
}

// A checkpoint's recorded device does not have to match (execution policy):
// one made on cuda (its config says so) or by a build without the field
// resumes here, to the same bits as a straight run on this device.
TEST(PipelineDevice, ACheckpointFromAnotherDeviceOrWithoutTheFieldResumes) {
  const fs::path dir = rt_test::fresh_dir("device", "resume");
  PretrainingConfig c = tiny(dir);
  c.output_dir = dir / "straight";
  ASSERT_TRUE(run_pretraining(c).completed);
  for (const char* recorded : {"cuda", ""}) {
    c.output_dir = dir / (std::string("from_") + (*recorded ? recorded : "old"));
    c.resume = false;
    ASSERT_FALSE(run_pretraining(c, [](const StepReport& s) { return s.step < 4; }).completed);
    // Rewrite the checkpoint's recorded config (and its checksum).
    const fs::path path = c.output_dir / stage::kTrainingCheckpointFile;
    TensorFile f = read_safetensors(path);
    nlohmann::json config = nlohmann::json::parse(f.metadata.at("config"));
    ASSERT_EQ(config["device"], "cpu");
    if (*recorded) {
      config["device"] = recorded;
    } else {
      config.erase("device");
    }
    f.metadata["config"] = config.dump();
    f.metadata["checksum"] = stage::checkpoint_checksum(f.metadata, f.tensors);
    write_safetensors(path, f.tensors, f.metadata);
    c.resume = true;
    const RunResult r = run_pretraining(c);
    EXPECT_EQ(r.resumed_from_step, 3) << recorded;
    EXPECT_EQ(rt_test::read_file(dir / "straight" / "model.safetensors"),
              rt_test::read_file(c.output_dir / "model.safetensors"))
        << recorded;
  }
}
