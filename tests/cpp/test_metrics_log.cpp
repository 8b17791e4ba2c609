// The metrics log of a run in progress across failures and resumes
// (docs/pipelines.md, "Resume"): an append the disk cannot take leaves no
// torn line, a torn last line is dropped on resume while damage in complete
// lines is still refused, a missing log is refused like a damaged one, and
// elapsed_seconds continues across a resume instead of restarting at 0.
#include <signal.h>
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../src/train/training_checkpoint.hpp"
#include "message_of.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "scratch.hpp"
#include "tiny_pretraining.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

using rt_test::message_of;
using rt_test::read_file;
using stage::kPartialMetricsFile;
using stage::kTrainingCheckpointFile;

/// 6 steps, a checkpoint at step 3, interrupted after step 5 (rows 4 and 5
/// are past the checkpoint).
PretrainingConfig interrupted(const std::string& name) {
  const fs::path dir = rt_test::fresh_dir("metrics_log", name);
  PretrainingConfig c = rt_test::tiny_pretraining_checkpointed(dir);
  c.output_dir = dir / "run";
  run_pretraining(c, [](const StepReport& s) { return s.step < 5; });
  c.resume = true;
  return c;
}

std::vector<nlohmann::json> rows_of(const fs::path& path) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

void write_bytes(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

/// The process may write files of at most `bytes` (a disk that fills up)
/// until it goes out of scope; writes past it fail with EFBIG, not SIGXFSZ.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
};

}  // namespace

TEST(MetricsLog, AnAppendTheDiskCannotTakeLeavesNoTornLineAndTheRunResumes) {
  // Before: the row was half written; --resume then refused the log
  // ("line 5: invalid JSON ... the metrics log is damaged").
  const fs::path dir = rt_test::fresh_dir("metrics_log", "full_disk");
  PretrainingConfig c = rt_test::tiny_pretraining_checkpointed(dir);
  c.output_dir = dir / "run";
  const fs::path partial = c.output_dir / kPartialMetricsFile;
  std::string before;
  std::optional<FileSizeLimit> full;
  const std::string message = message_of<Error>([&] {
    run_pretraining(c, [&](const StepReport& s) {
      if (s.step == 4) {  // step 5's row gets 20 bytes, then the disk is full
        before = read_file(partial);
        full.emplace(before.size() + 20);
      }
      return true;
    });
  });
  full.reset();
  EXPECT_NE(message.find("cannot append to " + partial.string()), std::string::npos) << message;
  EXPECT_NE(message.find("--resume continues from the last checkpoint"), std::string::npos) << message;
  ASSERT_FALSE(before.empty());
  EXPECT_EQ(read_file(partial), before);  // the torn row was cut off
  c.resume = true;
  ASSERT_TRUE(run_pretraining(c).completed);
  const std::vector<nlohmann::json> rows = rows_of(c.output_dir / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 6U);
  for (std::size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i]["step"], i + 1);
  fs::remove_all(dir);
}

TEST(MetricsLog, ResumeDropsATornLastLineAndStillRefusesDamagedCompleteLines) {
  PretrainingConfig c = interrupted("torn");
  const fs::path partial = c.output_dir / kPartialMetricsFile;
  const std::string good = read_file(partial);
  // A complete line that is damaged: refused, naming the line, nothing written.
  write_bytes(partial, good + "{\"step\": 6, \"lo\n");
  const std::string message = message_of<Error>([&] { run_pretraining(c); });
  EXPECT_NE(message.find(partial.string() + ": line 6: "), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(c.output_dir / "metadata.json"));
  // The same bytes without their newline: an append that never completed.
  write_bytes(partial, good + "{\"step\": 6, \"lo");
  ASSERT_TRUE(run_pretraining(c).completed);
  EXPECT_EQ(rows_of(c.output_dir / "metrics.jsonl").size(), 6U);
  fs::remove_all(c.output_dir.parent_path());
}

TEST(MetricsLog, ResumeWithTheMetricsLogMissingIsRefused) {
  // Before: metrics.jsonl silently held steps 4 to 6 only.
  PretrainingConfig c = interrupted("missing");
  const fs::path partial = c.output_dir / kPartialMetricsFile;
  const std::string good = read_file(partial);
  fs::remove(partial);
  const std::string message = message_of<Error>([&] { run_pretraining(c); });
  EXPECT_NE(message.find(partial.string() + ": the metrics log is missing, but the training checkpoint is at step 3"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("drop resume"), std::string::npos) << message;
  EXPECT_TRUE(fs::exists(c.output_dir / kTrainingCheckpointFile));
  EXPECT_FALSE(fs::exists(c.output_dir / "metrics.jsonl"));
  write_bytes(partial, good);
  ASSERT_TRUE(run_pretraining(c).completed);
  EXPECT_EQ(rows_of(c.output_dir / "metrics.jsonl").size(), 6U);
  fs::remove_all(c.output_dir.parent_path());
}

namespace {

/// A run whose steps 1 and 2 take at least 0.3 s more each (in the callback,
/// after their rows), interrupted after step 5 and resumed; its rows.
std::vector<nlohmann::json> resumed_rows(const std::string& name, bool drop_recorded_elapsed) {
  const fs::path dir = rt_test::fresh_dir("metrics_log", name);
  PretrainingConfig c = rt_test::tiny_pretraining_checkpointed(dir);
  c.output_dir = dir / "run";
  run_pretraining(c, [](const StepReport& s) {
    if (s.step <= 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return s.step < 5;
  });
  if (drop_recorded_elapsed) {  // a checkpoint written before elapsed_seconds was recorded
    const fs::path path = c.output_dir / kTrainingCheckpointFile;
    TensorFile f = read_safetensors(path);
    EXPECT_EQ(f.metadata.erase("elapsed_seconds"), 1U);
    f.metadata["checksum"] = stage::checkpoint_checksum(f.metadata, f.tensors);
    write_safetensors(path, f.tensors, f.metadata);
  }
  c.resume = true;
  EXPECT_TRUE(run_pretraining(c).completed);
  std::vector<nlohmann::json> rows = rows_of(c.output_dir / "metrics.jsonl");
  fs::remove_all(dir);
  return rows;
}

void expect_clock_continues(const std::vector<nlohmann::json>& rows) {
  ASSERT_EQ(rows.size(), 6U);
  EXPECT_GE(rows[2]["elapsed_seconds"].get<double>(), 0.6);
  for (std::size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GE(rows[i]["elapsed_seconds"].get<double>(), rows[i - 1]["elapsed_seconds"].get<double>())
        << "step " << i + 1 << " went back in time";
  }
}

}  // namespace

TEST(MetricsLog, ElapsedSecondsContinueFromTheCheckpointOnResume) {
  // Before: step 4 (the first after the resume) restarted near 0.
  expect_clock_continues(resumed_rows("elapsed", false));
}

TEST(MetricsLog, ElapsedSecondsOfAnOlderCheckpointContinueFromTheLastKeptRow) {
  expect_clock_continues(resumed_rows("elapsed_old", true));
}
