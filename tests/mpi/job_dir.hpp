#pragma once
// What the MPI pipeline tests share (tests/mpi, run under `mpirun`): the
// job's communicator, a whole-file read, the largest weight difference of two
// safetensors files, one scratch folder per job,
// holding the corpus every test trains on and removed when every rank is done,
// and the small run they train.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <unistd.h>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"

namespace riftco_mpi_test {

namespace fs = std::filesystem;

inline riftco_transformer::Communicator& world() { return riftco_transformer::Communicator::world(); }

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The largest |a - b| over every tensor of two weight files (same names and shapes).
inline float max_weight_difference(const fs::path& a, const fs::path& b) {
  const riftco_transformer::TensorFile fa = riftco_transformer::read_safetensors(a);
  const riftco_transformer::TensorFile fb = riftco_transformer::read_safetensors(b);
  EXPECT_EQ(fa.tensors.size(), fb.tensors.size());
  float most = 0.0F;
  for (std::size_t i = 0; i < std::min(fa.tensors.size(), fb.tensors.size()); ++i) {
    EXPECT_EQ(fa.tensors[i].first, fb.tensors[i].first);
    const auto x = fa.tensors[i].second.values();
    const auto y = fb.tensors[i].second.values();
    EXPECT_EQ(x.size(), y.size());
    for (std::size_t j = 0; j < std::min(x.size(), y.size()); ++j) most = std::max(most, std::fabs(x[j] - y[j]));
  }
  return most;
}

namespace detail {
inline std::optional<fs::path>& made_job_dir() {
  static std::optional<fs::path> dir;
  return dir;
}
}  // namespace detail

/// One scratch folder for the whole job, `<temp>/<prefix><rank 0's pid>`
/// (broadcast), so every rank writes to and reads from the same place. The
/// first call makes it, with `corpus.txt` (200 lines of text): collective,
/// every rank makes it with the same prefix. Later calls return it.
inline const fs::path& job_dir(std::string_view prefix) {
  std::optional<fs::path>& dir = detail::made_job_dir();
  if (dir) return *dir;
  // The pid as two 16-bit halves, each exact as a float: the communicator moves floats.
  float pid[2] = {static_cast<float>(::getpid() & 0xFFFF), static_cast<float>(::getpid() >> 16)};
  world().broadcast(std::span<float>(pid, 2), 0);
  const auto id = static_cast<long>(pid[0]) + (static_cast<long>(pid[1]) << 16);
  const fs::path d = fs::temp_directory_path() / (std::string(prefix) + std::to_string(id));
  if (world().rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
    std::ofstream(d / "corpus.txt") << text;
  }
  world().barrier();
  dir = d;
  return *dir;
}

/// Removes the job's scratch folder, if a test made it, when every rank is done.
class RemoveJobDir : public ::testing::Environment {
 public:
  void TearDown() override {
    world().barrier();
    if (world().rank() == 0 && detail::made_job_dir()) fs::remove_all(*detail::made_job_dir());
  }
};
inline const auto* const kRemoveJobDir = ::testing::AddGlobalTestEnvironment(new RemoveJobDir);

/// The small run the pipeline tests train on the corpus in `dir`, into
/// dir / name: 20 steps of batch 4 (warmup 2), an evaluation (2 batches)
/// every 10 steps, a checkpoint every 5.
inline riftco_transformer::PretrainingConfig tiny_run(const fs::path& dir, const std::string& name) {
  riftco_transformer::PretrainingConfig c;
  c.dimensions = {256, 32, 16, 2, 3, 32};
  c.data = dir / "corpus.txt";
  c.steps = 20;
  c.batch = 4;
  c.sequence_length = 16;
  c.warmup_steps = 2;
  c.eval_interval = 10;
  c.eval_batches = 2;
  c.checkpoint_interval = 5;
  c.output_dir = dir / name;
  return c;
}

}  // namespace riftco_mpi_test
