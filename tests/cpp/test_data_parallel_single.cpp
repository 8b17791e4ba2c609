// The data-parallel pieces that need no MPI (docs/distributed.md): the
// world size a training checkpoint records, synchronize_gradients and the
// parameter checksum on one process. tests/mpi runs them on two ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "../../src/train/training_checkpoint.hpp"
#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "scratch.hpp"
#include "tiny_pretraining.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

PretrainingConfig tiny(const fs::path& dir) {
  PretrainingConfig c = rt_test::tiny_pretraining(dir);
  c.checkpoint_interval = 2;
  c.output_dir = dir / "run";
  return c;
}

/// Rewrites a training checkpoint's metadata (with a valid checksum, as a writer would).
void edit_checkpoint(const fs::path& path, const std::function<void(std::map<std::string, std::string>&)>& edit) {
  TensorFile f = read_safetensors(path);
  edit(f.metadata);
  f.metadata["checksum"] = stage::checkpoint_checksum(f.metadata, f.tensors);
  write_safetensors(path, f.tensors, f.metadata);
}

}  // namespace

TEST(DataParallelSingle, ACheckpointRecordsTheWorldSizeAndAnotherIsRefusedWithDropout) {
  const fs::path dir = rt_test::fresh_dir("dp_single", "world");
  PretrainingConfig c = tiny(dir);
  c.dropout = 0.1F;  // each rank's dropout stream is its own: N may not change
  ASSERT_FALSE(run_pretraining(c, [](const StepReport& r) { return r.step < 3; }).completed);
  const fs::path ckpt = c.output_dir / stage::kTrainingCheckpointFile;
  EXPECT_EQ(read_safetensors(ckpt).metadata.at("world_size"), "1");
  const std::string good = rt_test::read_file(ckpt);

  // As if a 2-rank job had written it: one process refuses, naming both.
  edit_checkpoint(ckpt, [](auto& m) {
    m["world_size"] = "2";
    m["dropout_random.rank1"] = m.at("dropout_random");
  });
  c.resume = true;
  try {
    run_pretraining(c);
    ADD_FAILURE() << "a 2-rank checkpoint was resumed by one process";
  } catch (const ModelStateError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("made by a job of 2 rank(s) (world_size 2), this job has 1"), std::string::npos) << what;
    EXPECT_NE(what.find("the dropout streams are per rank"), std::string::npos) << what;
    EXPECT_NE(what.find("resume with mpirun -np 2"), std::string::npos) << what;
  }
  EXPECT_TRUE(fs::exists(ckpt)) << "a refused resume keeps the checkpoint";

  // A checkpoint from before world sizes were recorded: one process, resumes.
  std::ofstream(ckpt, std::ios::binary) << good;
  edit_checkpoint(ckpt, [](auto& m) { m.erase("world_size"); });
  const RunResult r = run_pretraining(c);
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(r.resumed_from_step, 2);
  EXPECT_EQ(nlohmann::json::parse(rt_test::read_file(c.output_dir / "metadata.json"))["world_size"], 1);
}

TEST(DataParallelSingle, WithoutDropoutAnotherWorldSizeResumesAndTheHistoryIsRecorded) {
  const fs::path dir = rt_test::fresh_dir("dp_single", "history");
  PretrainingConfig c = tiny(dir);  // dropout 0
  ASSERT_FALSE(run_pretraining(c, [](const StepReport& r) { return r.step < 3; }).completed);
  const fs::path ckpt = c.output_dir / stage::kTrainingCheckpointFile;
  EXPECT_EQ(nlohmann::json::parse(read_safetensors(ckpt).metadata.at("world_size_history")),
            nlohmann::json::parse(R"([{"world_size":1,"first_step":1,"last_step":2}])"));
  const std::string good = rt_test::read_file(ckpt);
  c.resume = true;

  // A damaged history is refused before anything changes.
  for (const char* bad : {R"(not json)", R"([])", R"([{"world_size":1,"first_step":2,"last_step":2}])",
                          R"([{"world_size":2,"first_step":1,"last_step":2}])",
                          R"([{"world_size":1,"first_step":1,"last_step":1}])", R"([{"world_size":-1}])"}) {
    edit_checkpoint(ckpt, [bad](auto& m) { m["world_size_history"] = bad; });
    try {
      run_pretraining(c);
      ADD_FAILURE() << "history " << bad << " was accepted";
    } catch (const ModelStateError& e) {
      EXPECT_NE(std::string(e.what()).find("metadata 'world_size_history'"), std::string::npos) << e.what();
    }
    std::ofstream(ckpt, std::ios::binary) << good;
  }
  // Hostile entries: a last step at the int64 limit (no overflow), beyond
  // the checkpoint's step, a world size no job has, duplicate or extra keys
  // (a padded entry must not make a megabyte message), deep nesting.
  const std::string pad(200000, 'x');
  for (const std::string bad :
       {std::string(R"([{"world_size":1,"first_step":1,"last_step":9223372036854775807}])"),
        std::string(R"([{"world_size":1,"first_step":1,"last_step":18446744073709551615}])"),
        std::string(R"([{"world_size":1,"first_step":1,"last_step":1},{"world_size":1,"first_step":2,"last_step":9}])"),
        std::string(R"([{"world_size":4294967298,"first_step":1,"last_step":1},)") +
            R"({"world_size":1,"first_step":2,"last_step":2}])",
        std::string(R"([{"world_size":1,"world_size":1,"first_step":1,"last_step":2}])"),
        std::string(R"([{"world_size":1,"first_step":1,"last_step":2,"pad":")") + pad + "\"}]",
        std::string(R"([{"world_size":1,"first_step":1,"last_step":2.0}])"),
        std::string(100000, '[') + std::string(100000, ']')}) {
    edit_checkpoint(ckpt, [&bad](auto& m) { m["world_size_history"] = bad; });
    const std::string edited = rt_test::read_file(ckpt);
    try {
      run_pretraining(c);
      ADD_FAILURE() << "history " << bad.substr(0, 120) << " was accepted";
    } catch (const ModelStateError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("metadata 'world_size_history'"), std::string::npos) << what.substr(0, 300);
      EXPECT_LT(what.size(), 1000U) << what.substr(0, 300);
    }
    EXPECT_EQ(rt_test::read_file(ckpt), edited) << "the refused checkpoint was changed";
    std::ofstream(ckpt, std::ios::binary) << good;
  }

  // As if a 2-rank job had written it at step 2: one process continues.
  edit_checkpoint(ckpt, [](auto& m) {
    m["world_size"] = "2";
    m["dropout_random.rank1"] = m.at("dropout_random");
    m["world_size_history"] = R"([{"world_size":2,"first_step":1,"last_step":2}])";
  });
  const RunResult r = run_pretraining(c);
  ASSERT_TRUE(r.completed);
  EXPECT_EQ(r.resumed_from_step, 2);
  const nlohmann::json meta = nlohmann::json::parse(rt_test::read_file(c.output_dir / "metadata.json"));
  EXPECT_EQ(meta["world_size"], 1);
  EXPECT_EQ(meta["world_size_history"],
            nlohmann::json::parse(R"([{"world_size":2,"first_step":1,"last_step":2},
                                      {"world_size":1,"first_step":3,"last_step":6}])"));
}

TEST(DataParallelSingle, SynchronizeGradientsOnOneProcessKeepsEveryValue) {
  const auto one = make_single_process_communicator();
  std::vector<Variable> params = {Variable(Tensor::zeros({2, 2}), true, "w"), Variable(Tensor::zeros({3}), true, "b")};
  const Tensor given = Tensor::from_data({2, 2}, {1.0F, -2.0F, 0.5F, 3.0F});
  std::vector<Tensor> grads = {given, Tensor()};
  synchronize_gradients(*one, params, grads);
  EXPECT_EQ(std::vector<float>(grads[0].values().begin(), grads[0].values().end()),
            (std::vector<float>{1.0F, -2.0F, 0.5F, 3.0F}));
  EXPECT_FALSE(grads[1].defined()) << "no rank has a gradient: Adam skips the parameter";
  std::vector<Tensor> wrong = {Tensor::zeros({4}), Tensor()};
  try {
    synchronize_gradients(*one, params, wrong);
    ADD_FAILURE() << "a gradient of the wrong shape was accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("the gradient of 'w' is (4,), the parameter is (2, 2)"), std::string::npos)
        << e.what();
  }
  std::vector<Tensor> too_few = {given};
  EXPECT_THROW(synchronize_gradients(*one, params, too_few), ShapeError);
}

TEST(DataParallelSingle, TheParameterChecksumSeesOneBit) {
  std::vector<Variable> params = {Variable(Tensor::full({4}, 0.25F), true, "w")};
  const std::uint64_t before = parameter_checksum(params);
  EXPECT_EQ(parameter_checksum(params), before);
  params[0].mutable_value().data()[2] = std::nextafter(0.25F, 1.0F);
  EXPECT_NE(parameter_checksum(params), before);
  // The shape counts too: the same bytes as (2, 2) differ from (4).
  std::vector<Variable> square = {Variable(Tensor::full({2, 2}, 0.25F), true, "w")};
  std::vector<Variable> flat = {Variable(Tensor::full({4}, 0.25F), true, "w")};
  EXPECT_NE(parameter_checksum(square), parameter_checksum(flat));
  const auto one = make_single_process_communicator();
  EXPECT_NO_THROW(check_parameters_identical(*one, params, 1, "test"));
}
