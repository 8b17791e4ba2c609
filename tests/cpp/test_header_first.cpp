// Every loader refuses what the safetensors header alone shows to be wrong
// (format, dimensions, tensor names and shapes) before it reads, or
// allocates, a byte of tensor data: a sparse file of a few KiB on disk that
// claims a 1 GiB tensor costs nothing.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../../src/train/training_checkpoint.hpp"
#include "message_of.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/hf_llama.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/model_state.hpp"
#include "scratch.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kClaimed = std::uint64_t{1} << 30;  // bytes of the tensor the file claims

/// A file of kClaimed + header bytes that takes a few KiB on disk: `metadata`
/// and the claimed tensors, whose data is a hole.
void write_sparse(const fs::path& path, const std::map<std::string, std::string>& metadata,
                  const std::vector<std::string>& names = {"junk"}) {
  nlohmann::ordered_json header = {{"__metadata__", metadata}};
  const std::uint64_t each = kClaimed / names.size();
  std::uint64_t offset = 0;
  for (const std::string& name : names) {
    header[name] = {{"dtype", "F32"}, {"shape", {each / 4}}, {"data_offsets", {offset, offset + each}}};
    offset += each;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  bytes += text;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes.size() + kClaimed)), 0);
  ::close(fd);
}

/// `load` throws a ModelStateError whose message holds `expected`, and the
/// calling thread never held more than 1 MiB of tensors meanwhile.
template <typename F>
void expect_refused_cheaply(F&& load, const std::string& expected) {
  ThreadMemoryMeter meter;
  const std::string message = rt_test::message_of<ModelStateError>(load);
  EXPECT_NE(message.find(expected), std::string::npos) << message;
  EXPECT_LT(meter.peak_bytes(), std::int64_t{1} << 20) << message;
}

class HeaderFirst : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = rt_test::fresh_dir("header_first", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    save_model_state(model_, dir_ / "model.safetensors");
    model_metadata_ = read_safetensors(dir_ / "model.safetensors").metadata;
  }
  void TearDown() override { fs::remove_all(dir_); }

  Random random_{3};
  DecoderOnlyTransformer model_{rt_test::tiny_dims(), random_};
  fs::path dir_;
  std::map<std::string, std::string> model_metadata_;
};

TEST_F(HeaderFirst, ModelLoadersRefuseASparseFileBeforeReadingItsData) {
  const fs::path file = dir_ / "sparse.safetensors";
  write_sparse(file, {{"format", "riftco.model_state"}});
  expect_refused_cheaply([&] { load_model(file); }, "has no \"schema_version\"");
  expect_refused_cheaply([&] { load_model_state(model_, file); }, "has no \"schema_version\"");
  write_sparse(file, {{"format", "not-riftco"}});
  expect_refused_cheaply([&] { load_model(file); }, "format 'not-riftco'");
  // The model's own metadata, but a tensor the model does not have.
  write_sparse(file, model_metadata_);
  expect_refused_cheaply([&] { load_model(file); }, "the file holds 268435456 values but its dimensions");
  expect_refused_cheaply([&] { load_model_state(model_, file); }, "tensor 'token_embedding.weight' is missing");
}

TEST_F(HeaderFirst, AdapterAndCheckpointLoadersRefuseASparseFileBeforeReadingItsData) {
  const fs::path file = dir_ / "sparse.safetensors";
  write_sparse(file, {{"format", "riftco.model_state"}});
  expect_refused_cheaply([&] { load_adapter_state(model_, file); }, "is this a model-state file?");
  EXPECT_FALSE(model_.has_lora());
  // A real adapter's metadata, but a tensor that is not an adapter.
  DecoderOnlyTransformer with_lora(rt_test::tiny_dims(), random_);
  with_lora.add_lora(LoraConfig{}, random_);
  save_adapter_state(with_lora, dir_ / "adapter.safetensors");
  write_sparse(file, read_safetensors(dir_ / "adapter.safetensors").metadata);
  LoadOptions lenient;
  lenient.allow_base_mismatch = true;
  expect_refused_cheaply([&] { load_adapter_state(model_, file, lenient); }, "is missing");
  EXPECT_FALSE(model_.has_lora());

  std::vector<Variable> variables;
  for (const NamedParameter& p : model_.parameters()) variables.push_back(p.variable);
  Adam adam(variables);
  stage::TrainingState state;
  write_sparse(file, {{"format", "riftco.model_state"}});
  expect_refused_cheaply([&] { stage::load_training_checkpoint(file, model_.parameters(), adam, state, {}); },
                         "not a riftco training checkpoint");
  write_sparse(file, {{"format", "riftco.training_checkpoint"}});  // the run's config is compared first
  expect_refused_cheaply([&] { stage::load_training_checkpoint(file, model_.parameters(), adam, state, {}); },
                         "metadata 'config' missing");
}

TEST_F(HeaderFirst, HfImportRefusesASparseShardBeforeReadingItsData) {
  save_hf_llama(model_, dir_ / "hf");
  write_sparse(dir_ / "hf" / "model.safetensors", {{"format", "pt"}}, {"model.embed_tokens.weight"});
  expect_refused_cheaply([&] { load_hf_llama(dir_ / "hf"); }, "has shape (268435456,) but config.json needs (32, 16)");
  write_sparse(dir_ / "hf" / "model.safetensors", {{"format", "pt"}});
  expect_refused_cheaply([&] { load_hf_llama(dir_ / "hf"); }, "a Llama model of config.json's shape does not: 'junk'");
  write_sparse(dir_ / "hf" / "model.safetensors", {{"format", "pt"}},
               {"model.layers.0.self_attn.rotary_emb.inv_freq"});
  expect_refused_cheaply([&] { load_hf_llama(dir_ / "hf"); }, "too large for a rotary buffer");
}

}  // namespace
