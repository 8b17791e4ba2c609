#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "model_fixtures.hpp"
#include "riftco_transformer/adapter_state.hpp"

using namespace riftco_transformer;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {

std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("riftco_adapter_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

LoraConfig config() {
  LoraConfig c;
  c.rank = 2;
  c.alpha = 4.0F;
  c.targets = parse_lora_targets("query,up");
  return c;
}

std::vector<std::uint64_t> versions(const DecoderOnlyTransformer& m) {
  std::vector<std::uint64_t> v;
  for (const NamedParameter& p : m.parameters()) v.push_back(p.variable.version());
  return v;
}

}  // namespace

TEST(AdapterState, RoundTripGivesTheSameLogits) {
  const auto dir = temp_dir("roundtrip");
  Random r1(1);
  DecoderOnlyTransformer trained(tiny_dims(), r1);
  Random lr(2);
  trained.add_lora(config(), lr);
  Random noise(3);
  for (NamedParameter& p : trained.lora_parameters()) p.variable.set_value(Tensor::normal(p.variable.shape(), noise, 0, 0.1F));
  save_adapter_state(trained, dir / "adapter.safetensors");
  Random r2(1);
  DecoderOnlyTransformer fresh(tiny_dims(), r2);
  load_adapter_state(fresh, dir / "adapter.safetensors");
  ASSERT_TRUE(fresh.has_lora());
  EXPECT_EQ(fresh.lora_config().rank, 2);
  EXPECT_EQ(lora_targets_string(fresh.lora_config().targets), "query,up");
  const auto b = random_batch(1, 8, 32, 4);
  EXPECT_TRUE(bit_equal(trained.forward(b.tokens, 1).value(), fresh.forward(b.tokens, 1).value()));
  EXPECT_THROW(load_adapter_state(fresh, dir / "adapter.safetensors"), ValueError);  // already has adapters
}

TEST(AdapterState, IncompatibleFilesAreRejectedAndTheModelIsUntouched) {
  const auto dir = temp_dir("bad");
  Random r1(5);
  DecoderOnlyTransformer model(tiny_dims(), r1);
  EXPECT_THROW(save_adapter_state(model, dir / "none.safetensors"), ValueError);
  save_model_state(model, dir / "model.safetensors");
  // Adapters trained on a wider model.
  auto wide_dims = tiny_dims();
  wide_dims.model_width = 32;
  Random r2(6);
  DecoderOnlyTransformer wide(wide_dims, r2);
  Random lr(7);
  wide.add_lora(config(), lr);
  save_adapter_state(wide, dir / "wide.safetensors");
  // A file with one adapter tensor missing.
  Random lr2(8);
  DecoderOnlyTransformer other(tiny_dims(), r1);
  other.add_lora(config(), lr2);
  std::vector<std::pair<std::string, Tensor>> partial;
  for (const NamedParameter& p : other.lora_parameters()) partial.emplace_back(p.name, p.variable.value());
  partial.pop_back();
  const TensorFile good = read_safetensors([&] {
    save_adapter_state(other, dir / "good.safetensors");
    return dir / "good.safetensors";
  }());
  write_safetensors(dir / "partial.safetensors", partial, good.metadata);

  const auto before = versions(model);
  for (const char* file : {"model.safetensors", "wide.safetensors", "partial.safetensors", "missing.safetensors"}) {
    try {
      load_adapter_state(model, dir / file);
      ADD_FAILURE() << file << " was accepted";
    } catch (const ModelStateError& e) {
      EXPECT_NE(std::string(e.what()).find("[load]"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(model.has_lora()) << file;
    EXPECT_EQ(versions(model), before) << file;
  }
}
