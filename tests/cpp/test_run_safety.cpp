// A run directory's safety under misuse: a damaged metrics log refused on
// resume, post-training data that cannot train anything, two runs into one
// directory.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "message_of.hpp"
#include "scratch.hpp"
#include "tiny_pretraining.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return rt_test::fresh_dir("safety", name); }
using rt_test::read_file;

using rt_test::message_of;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST(RunSafety, ResumeRefusesAMetricsLogWithDuplicateOrMissingSteps) {
  // Before: the rows were taken as they came; a partial log with a step
  // twice (or none) went into metrics.jsonl of the completed run.
  const fs::path dir = fresh_dir("metrics");
  PretrainingConfig c = rt_test::tiny_pretraining_checkpointed(dir);
  c.output_dir = dir / "run";
  run_pretraining(c, [](const StepReport& s) { return s.step < 5; });  // checkpoint at step 3
  const fs::path partial = c.output_dir / "metrics.partial.jsonl";
  const std::vector<std::string> rows = lines_of(read_file(partial));
  ASSERT_EQ(rows.size(), 5U);
  c.resume = true;
  const auto edited = [&](const std::vector<int>& order, const std::string& needle) {
    std::string text;
    for (const int i : order) text += rows[static_cast<std::size_t>(i)] + "\n";
    std::ofstream(partial, std::ios::binary) << text;
    const std::string msg = message_of<Error>([&] { run_pretraining(c); });
    EXPECT_NE(msg.find(partial.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(read_file(partial), text);  // nothing written
    EXPECT_FALSE(fs::exists(c.output_dir / "metadata.json"));
  };
  edited({0, 0, 1, 2, 3, 4}, "line 2: \"step\" is 1 where step 2 was expected");
  edited({0, 2, 3, 4}, "line 2: \"step\" is 3 where step 2 was expected");
  edited({1, 0, 2, 3, 4}, "line 1: \"step\" is 2 where step 1 was expected");
  edited({0, 1, 2, 3, 4, 1}, "line 6: \"step\" is 2 where step 4 was expected");
  edited({0, 1}, "end at step 2 but the training checkpoint is at step 3");
  // The log as written resumes.
  std::string text;
  for (const std::string& row : rows) text += row + "\n";
  std::ofstream(partial, std::ios::binary) << text;
  EXPECT_TRUE(run_pretraining(c).completed);
  EXPECT_EQ(lines_of(read_file(c.output_dir / "metrics.jsonl")).size(), static_cast<std::size_t>(c.steps));
  fs::remove_all(dir);
}

TEST(RunSafety, PostTrainingWhereNoExampleCanContributeLossIsADataError) {
  // Before: every prompt at least sequence_length long "trained" with loss 0
  // and grad norm 0 and reported success.
  const fs::path dir = fresh_dir("no_loss");
  PretrainingConfig base = rt_test::tiny_pretraining(dir);
  base.steps = 1;
  base.output_dir = dir / "base";
  ASSERT_TRUE(run_pretraining(base).completed);
  std::string chat;
  for (int i = 0; i < 12; ++i) chat += R"({"prompt": ")" + std::string(40, 'p') + R"(", "response": "r\n"})" "\n";
  std::ofstream(dir / "long.jsonl") << chat;
  PostTrainingConfig p;
  p.base_model = base.output_dir / "model.safetensors";
  p.data = dir / "long.jsonl";
  p.steps = 1;
  p.batch = 2;
  p.sequence_length = 32;
  p.eval_batches = 1;
  p.output_dir = dir / "post";
  std::string msg = message_of<DataError>([&] { run_post_training(p); });
  EXPECT_NE(msg.find("no train example has a response token within sequence_length 32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the shortest prompt is 40 tokens"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(p.output_dir));
  // The train split can learn, the validation split (every 10th) cannot.
  chat.clear();
  for (int i = 0; i < 10; ++i) {
    chat += R"({"prompt": ")" + std::string(i == 9 ? 40 : 4, 'p') + R"(", "response": "r\n"})" "\n";
  }
  std::ofstream(dir / "long.jsonl") << chat;
  msg = message_of<DataError>([&] { run_post_training(p); });
  EXPECT_NE(msg.find("no validation example"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(p.output_dir));
  chat.clear();
  for (int i = 0; i < 10; ++i) chat += R"({"prompt": "pppp", "response": "r\n"})" "\n";
  std::ofstream(dir / "long.jsonl") << chat;
  EXPECT_TRUE(run_post_training(p).completed);
  fs::remove_all(dir);
}

TEST(RunSafety, ARunIntoADirectoryAnotherRunIsUsingIsRefused) {
  // Before: two runs into one --output both exited 0 and could leave one
  // run's metadata.json beside the other's weights.
  const fs::path dir = fresh_dir("lock");
  PretrainingConfig c = rt_test::tiny_pretraining_checkpointed(dir);
  c.output_dir = dir / "run";
  ASSERT_TRUE(run_pretraining(c).completed);
  const std::string model = read_file(c.output_dir / "model.safetensors");
  const std::string metadata = read_file(c.output_dir / "metadata.json");
  {
    const int fd = ::open((c.output_dir / ".lock").c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);  // another run holds it
    PretrainingConfig other = c;
    other.seed = 99;
    const std::string msg = message_of<Error>([&] { run_pretraining(other); });
    EXPECT_NE(msg.find("another run is using " + c.output_dir.string()), std::string::npos) << msg;
    EXPECT_EQ(read_file(c.output_dir / "model.safetensors"), model);
    EXPECT_EQ(read_file(c.output_dir / "metadata.json"), metadata);
    EXPECT_FALSE(fs::exists(c.output_dir / "metrics.partial.jsonl"));
    ::close(fd);
  }
  // Two runs at once from two threads: one completes, the other is refused
  // while the first holds the directory (or runs after it).
  PretrainingConfig a = c;
  a.output_dir = dir / "both";
  a.steps = 40;
  PretrainingConfig b = a;
  b.seed = 7;
  std::string refused_a, refused_b;
  const auto attempt = [](const PretrainingConfig& config, std::string& refused) {
    try {
      run_pretraining(config);
    } catch (const Error& e) {
      refused = e.what();
    }
  };
  std::thread first(attempt, std::cref(a), std::ref(refused_a));
  std::thread second(attempt, std::cref(b), std::ref(refused_b));
  first.join();
  second.join();
  for (const std::string* refused : {&refused_a, &refused_b}) {
    if (!refused->empty()) EXPECT_NE(refused->find("another run is using"), std::string::npos) << *refused;
  }
  const nlohmann::json meta = nlohmann::json::parse(read_file(a.output_dir / "metadata.json"));
  const PretrainingConfig& winner = meta["config"]["seed"].get<std::uint64_t>() == a.seed ? a : b;
  PretrainingConfig alone = winner;
  alone.output_dir = dir / "alone";
  ASSERT_TRUE(run_pretraining(alone).completed);
  EXPECT_EQ(read_file(a.output_dir / "model.safetensors"), read_file(alone.output_dir / "model.safetensors"));
  // The lock file does not get in the way of a resume.
  c.output_dir = dir / "resumed";
  run_pretraining(c, [](const StepReport& s) { return s.step < 4; });
  EXPECT_TRUE(fs::exists(c.output_dir / ".lock"));
  c.resume = true;
  EXPECT_TRUE(run_pretraining(c).completed);
  fs::remove_all(dir);
}

// Before: a data file that is one of the run's own files (the partial log,
// metrics.jsonl, the loss curve) was trained on and then deleted or
// replaced, exit 0. Refused by validate(), before anything is written.
TEST(RunSafety, AnInputThatIsOneOfTheRunsFilesIsRefusedAndKept) {
  const fs::path dir = fresh_dir("input-is-output");
  for (const char* name : {"metrics.partial.jsonl", "metrics.jsonl", "loss_curve.svg", "metadata.json"}) {
    PretrainingConfig c = rt_test::tiny_pretraining_checkpointed(dir);
    c.output_dir = dir / (std::string("run-") + name);
    fs::create_directories(c.output_dir);
    const std::string text = "a small corpus for a small model.\n";
    std::ofstream(c.output_dir / name, std::ios::binary) << text;
    c.data = c.output_dir / name;
    const std::string msg = message_of<ValueError>([&] { run_pretraining(c); });
    EXPECT_NE(msg.find("a file this run writes or removes"), std::string::npos) << msg;
    EXPECT_EQ(read_file(c.output_dir / name), text);
    EXPECT_EQ(std::distance(fs::directory_iterator(c.output_dir), fs::directory_iterator{}), 1);
  }
}
