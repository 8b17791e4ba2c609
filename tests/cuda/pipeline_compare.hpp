#pragma once
// What the pipelines' device tests share (tests/cuda/test_cuda_pipelines.cpp,
// tests/nccl/test_nccl_pipelines.cpp): a tiny pretraining config, and the
// comparisons of two runs' files, bit for bit or within the tolerance a
// cpu-against-cuda comparison states.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"

namespace rt_device_test {

using namespace riftco_transformer;
namespace fs = std::filesystem;

/// Tolerances of a cuda run against the cpu run of the same config (six
/// steps of the tiny model below): the kernels round differently (cuBLAS's
/// summation order, the flash kernel's tiles), and Adam's g / sqrt(v)
/// carries those differences into the parameters at about the learning
/// rate's scale at most.
inline constexpr double kLossRelativeTolerance = 1e-3;
inline constexpr double kParameterTolerance = 2e-3;  // max |cpu - cuda| over every parameter element

/// dir/corpus.txt, the text tiny() trains on.
inline void write_corpus(const fs::path& dir) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
  std::ofstream(dir / "corpus.txt") << text;
}

/// An empty <tmp>/riftco_device_<name> holding the corpus.
inline fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("riftco_device_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_corpus(dir);
  return dir;
}

/// A six-step run on dir/corpus.txt (write_corpus), a checkpoint at step 3.
inline PretrainingConfig tiny(const fs::path& dir) {
  PretrainingConfig c;
  c.dimensions = {256, 32, 32, 4, 2, 64};
  c.data = dir / "corpus.txt";
  c.steps = 6;
  c.batch = 4;
  c.sequence_length = 16;
  c.learning_rate = 1e-3F;
  c.warmup_steps = 2;
  c.eval_interval = 3;
  c.eval_batches = 2;
  c.checkpoint_interval = 3;
  return c;
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// metrics.jsonl's training losses, one per step.
inline std::vector<double> losses(const fs::path& run) {
  std::vector<double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

inline nlohmann::json metadata(const fs::path& run) {
  return nlohmann::json::parse(read_file(run / "metadata.json"));
}

/// The largest |a - b| over every tensor of two model-state files (the same names and shapes).
inline double max_parameter_difference(const fs::path& a, const fs::path& b) {
  const TensorFile fa = read_safetensors(a);
  const TensorFile fb = read_safetensors(b);
  EXPECT_EQ(fa.tensors.size(), fb.tensors.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < std::min(fa.tensors.size(), fb.tensors.size()); ++i) {
    EXPECT_EQ(fa.tensors[i].first, fb.tensors[i].first);
    const auto va = fa.tensors[i].second.values();
    const auto vb = fb.tensors[i].second.values();
    EXPECT_EQ(va.size(), vb.size()) << fa.tensors[i].first;
    for (std::size_t k = 0; k < std::min(va.size(), vb.size()); ++k) {
      worst = std::max(worst, std::abs(static_cast<double>(va[k]) - static_cast<double>(vb[k])));
    }
  }
  return worst;
}

/// Two runs' per-step losses and final weights within the stated tolerances.
inline void expect_close_runs(const fs::path& a, const fs::path& b, const std::string& weights = "model.safetensors") {
  const std::vector<double> la = losses(a);
  const std::vector<double> lb = losses(b);
  ASSERT_EQ(la.size(), lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) {
    EXPECT_NEAR(la[i], lb[i], kLossRelativeTolerance * std::abs(la[i])) << "step " << i + 1;
  }
  EXPECT_LE(max_parameter_difference(a / weights, b / weights), kParameterTolerance);
}

}  // namespace rt_device_test
