// The Hugging Face Llama converter: names, the rotary row permutation,
// round trips, half-precision shards and hostile checkpoint directories.
// (Parity with transformers itself: tests/python/test_hf_llama.py.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <cmath>
#include <nlohmann/json.hpp>

#include "../../src/io/atomic_file.hpp"
#include "model_fixtures.hpp"
#include "scratch.hpp"
#include "riftco_transformer/hf_llama.hpp"
#include "message_of.hpp"
#include "riftco_transformer/ops.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

TransformerDimensions dims(bool tie = false) {
  TransformerDimensions d = rt_test::tiny_dims(2);
  d.model_width = 32;
  d.heads = 4;
  d.key_value_heads = 2;
  d.rope_base = 500000.0F;
  d.tie_embeddings = tie;
  return d;
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

json hf_config(const TransformerDimensions& d) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", d.vocab_size},
          {"max_position_embeddings", d.context_length},
          {"hidden_size", d.model_width},
          {"intermediate_size", d.feed_forward_width},
          {"num_attention_heads", d.heads},
          {"num_hidden_layers", d.layers},
          {"num_key_value_heads", d.kv_heads()},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", d.rope_base},
          {"tie_word_embeddings", d.tie_embeddings},
          {"hidden_act", "silu"},
          {"rope_scaling", nullptr}};
}

class HfLlama : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("riftco_hf_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// A saved random model as an HF directory; returns the model.
  std::unique_ptr<DecoderOnlyTransformer> saved(const fs::path& where, bool tie = false) {
    Random random(21);
    auto model = std::make_unique<DecoderOnlyTransformer>(dims(tie), random, 1e-6F);
    for (const NamedParameter& p : model->parameters()) {  // non-trivial norms so a mix-up shows
      if (p.name.find("norm") != std::string::npos) {
        Variable v = p.variable;
        v.set_value(rt_test::randn(v.shape(), p.name.size()));
      }
    }
    save_hf_llama(*model, where);
    return model;
  }

  /// Expects load_hf_llama(dir) to throw ModelStateError mentioning `needle`.
  void expect_refused(const fs::path& dir, const std::string& needle) {
    try {
      load_hf_llama(dir);
      ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
    } catch (const ModelStateError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }

  fs::path dir_;
};

}  // namespace

TEST(HfRotaryRows, PermutationMatchesTheHalfSplitLayoutAndRoundTrips) {
  // 2 heads of width 4, one column: row r holds the value r.
  Tensor w = Tensor::empty({8, 1});
  for (int r = 0; r < 8; ++r) w.data()[r] = static_cast<float>(r);
  const Tensor ours = hf_rotary_rows_to_interleaved(w, 2);
  // HF head rows (0,1 | 2,3): halves → pairs (0,2), (1,3).
  const float expected[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(ours.data()[r], expected[r]);
  const Tensor big = rt_test::randn({24, 5}, 3);
  EXPECT_TRUE(bit_equal(interleaved_rotary_rows_to_hf(hf_rotary_rows_to_interleaved(big, 3), 3), big));
  EXPECT_THROW(hf_rotary_rows_to_interleaved(big, 5), ShapeError);   // 24 rows, 5 heads
  EXPECT_THROW(hf_rotary_rows_to_interleaved(rt_test::randn({6, 2}, 1), 2), ShapeError);  // odd head width
}

TEST(HfRotaryRows, PermutedRopeEqualsHalfSplitRope) {
  // HF: q·cos + rotate_half(q)·sin on halves; ours on pairs. Same numbers after the permutation.
  const std::int64_t d = 8, t = 5;
  const Tensor q = rt_test::randn({1, 1, t, d}, 9);
  // Do it per position: rows of one head are the D features here.
  for (std::int64_t p = 0; p < t; ++p) {
    Tensor feature = Tensor::empty({d, 1});
    for (std::int64_t i = 0; i < d; ++i) feature.data()[i] = q.data()[p * d + i];
    const Tensor inter = hf_rotary_rows_to_interleaved(feature, 1);
    Tensor row = Tensor::empty({1, 1, 1, d});
    for (std::int64_t i = 0; i < d; ++i) row.data()[i] = inter.data()[i];
    const Tensor rotated = rope(Variable(row, false), p, 500.0F).value();
    for (std::int64_t i = 0; i < d / 2; ++i) {
      const double angle = static_cast<double>(p) * std::pow(500.0, -2.0 * static_cast<double>(i) / d);
      const double a = q.data()[p * d + i], b = q.data()[p * d + i + d / 2];
      EXPECT_NEAR(rotated.data()[2 * i], a * std::cos(angle) - b * std::sin(angle), 1e-5);
      EXPECT_NEAR(rotated.data()[2 * i + 1], b * std::cos(angle) + a * std::sin(angle), 1e-5);
    }
  }
}

TEST_F(HfLlama, SaveWritesHfNamesAndConfigAndLoadsBackBitExact) {
  for (const bool tie : {false, true}) {
    const fs::path where = dir_ / (tie ? "tied" : "untied");
    const auto model = saved(where, tie);
    const TensorFile file = read_safetensors(where / "model.safetensors");
    std::set<std::string> names;
    for (const auto& [name, tensor] : file.tensors) names.insert(name);
    EXPECT_TRUE(names.count("model.embed_tokens.weight"));
    EXPECT_TRUE(names.count("model.layers.1.self_attn.k_proj.weight"));
    EXPECT_TRUE(names.count("model.layers.0.post_attention_layernorm.weight"));
    EXPECT_EQ(names.count("lm_head.weight"), tie ? 0U : 1U);
    EXPECT_EQ(file.metadata.at("format"), "pt");
    std::ifstream in(where / "config.json");
    const json config = json::parse(in);
    EXPECT_EQ(config.at("architectures"), json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(config.at("num_key_value_heads"), 2);
    EXPECT_EQ(config.at("rope_theta"), 500000.0);
    EXPECT_EQ(config.at("rms_norm_eps"), 1e-6);
    EXPECT_EQ(config.at("tie_word_embeddings"), tie);
    const auto back = load_hf_llama(where);
    EXPECT_EQ(back->dimensions(), model->dimensions());
    EXPECT_EQ(back->norm_epsilon(), 1e-6F);
    EXPECT_EQ(model_fingerprint(*back), model_fingerprint(*model));
    // The query rows really were permuted on the way out.
    const Tensor& q = file.tensors[2].second;
    EXPECT_EQ(file.tensors[2].first, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_FALSE(bit_equal(q, model->blocks()[0].query.value()));
  }
}

TEST_F(HfLlama, ConvertBothWaysThroughModelStateFiles) {
  const auto model = saved(dir_ / "hf");
  convert_from_hf(dir_ / "hf", dir_ / "model.safetensors");
  const auto loaded = load_model(dir_ / "model.safetensors");
  EXPECT_EQ(model_fingerprint(*loaded), model_fingerprint(*model));
  convert_to_hf(dir_ / "model.safetensors", dir_ / "hf2");
  const TensorFile a = read_safetensors(dir_ / "hf" / "model.safetensors");
  const TensorFile b = read_safetensors(dir_ / "hf2" / "model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) EXPECT_TRUE(bit_equal(a.tensors[i].second, b.tensors[i].second));
}

TEST_F(HfLlama, ShardedBf16CheckpointLoads) {
  const auto model = saved(dir_ / "single");
  const TensorFile file = read_safetensors(dir_ / "single" / "model.safetensors");
  // Two shards: bf16 (truncated float bits) and f32; an index maps them.
  fs::create_directories(dir_ / "sharded");
  fs::copy_file(dir_ / "single" / "config.json", dir_ / "sharded" / "config.json");
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  std::vector<std::pair<std::string, Tensor>> f32;
  std::string header_json;
  json bf16_header = json::object();
  std::string bf16_data;
  for (std::size_t i = 0; i < file.tensors.size(); ++i) {
    const auto& [name, tensor] = file.tensors[i];
    if (i % 2 == 0) {
      f32.emplace_back(name, tensor);
      index["weight_map"][name] = "model-00002-of-00002.safetensors";
    } else {
      const std::size_t begin = bf16_data.size();
      for (std::int64_t e = 0; e < tensor.numel(); ++e) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, tensor.data() + e, 4);
        const std::uint16_t half = static_cast<std::uint16_t>(bits >> 16);
        bf16_data.append(reinterpret_cast<const char*>(&half), 2);
      }
      bf16_header[name] = {{"dtype", "BF16"}, {"shape", tensor.shape()}, {"data_offsets", {begin, bf16_data.size()}}};
      index["weight_map"][name] = "model-00001-of-00002.safetensors";
    }
  }
  std::string text = bf16_header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  write_text(dir_ / "sharded" / "model-00001-of-00002.safetensors", bytes + text + bf16_data);
  write_safetensors(dir_ / "sharded" / "model-00002-of-00002.safetensors", f32, {{"format", "pt"}});
  write_text(dir_ / "sharded" / "model.safetensors.index.json", index.dump());
  const auto loaded = load_hf_llama(dir_ / "sharded");
  // bf16 tensors equal the originals with the low 16 bits cleared.
  const Tensor& norm = loaded->blocks()[0].attention_norm.value();  // tensor 1: bf16
  const Tensor& original = model->blocks()[0].attention_norm.value();
  for (std::int64_t e = 0; e < norm.numel(); ++e) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, original.data() + e, 4);
    bits &= 0xFFFF0000U;
    float expected = 0.0F;
    std::memcpy(&expected, &bits, 4);
    EXPECT_EQ(norm.data()[e], expected);
  }
  EXPECT_TRUE(bit_equal(loaded->token_embedding().value(), model->token_embedding().value()));  // tensor 0: f32

  // Hostile indexes: a shard outside the directory, a missing shard, a tensor the index misplaces.
  json evil = index;
  evil["weight_map"]["model.norm.weight"] = "../single/model.safetensors";
  write_text(dir_ / "sharded" / "model.safetensors.index.json", evil.dump());
  expect_refused(dir_ / "sharded", "not a plain file name");
  evil = index;
  evil["weight_map"]["model.norm.weight"] = "missing.safetensors";
  write_text(dir_ / "sharded" / "model.safetensors.index.json", evil.dump());
  expect_refused(dir_ / "sharded", "missing.safetensors");
  evil = index;
  evil["weight_map"]["extra.weight"] = "model-00001-of-00002.safetensors";
  write_text(dir_ / "sharded" / "model.safetensors.index.json", evil.dump());
  expect_refused(dir_ / "sharded", "extra.weight");
  write_text(dir_ / "sharded" / "model.safetensors.index.json", "{\"weight_map\": 3}");
  expect_refused(dir_ / "sharded", "weight_map");
}

// The exporter, the importer and the model agree on the norm epsilon: every
// value the model accepts (a finite float > 0: 1 and more too) is written and
// read back exactly, through files and rt-convert's functions; the importer
// refuses exactly what the model refuses.
TEST_F(HfLlama, EveryNormEpsilonTheModelAcceptsRoundTrips) {
  for (const float eps : {1.0F, 2.5F, 1.0e30F, std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), 1.0e-6F}) {
    Random random(2);
    DecoderOnlyTransformer model(dims(), random, eps);
    save_model_state(model, dir_ / "model.safetensors");
    fs::remove_all(dir_ / "hf");
    convert_to_hf(dir_ / "model.safetensors", dir_ / "hf");
    convert_from_hf(dir_ / "hf", dir_ / "back.safetensors");
    EXPECT_EQ(load_model(dir_ / "back.safetensors")->norm_epsilon(), eps) << eps;
    EXPECT_EQ(load_hf_llama(dir_ / "hf")->norm_epsilon(), eps) << eps;
  }
  const json good = hf_config(dims());
  for (const json& bad : {json(0), json(-1), json(1e39), json(1e-50), json("1e-5")}) {
    json config = good;
    config["rms_norm_eps"] = bad;
    write_text(dir_ / "hf" / "config.json", config.dump());
    EXPECT_NE(rt_test::message_of<ModelStateError>([&] { load_hf_llama(dir_ / "hf"); }).find("rms_norm_eps"),
              std::string::npos) << bad;
    EXPECT_FALSE(is_valid_norm_epsilon(bad.is_number() ? bad.get<double>() : 0.0)) << bad;
  }
}

// The same for the RoPE base: every value TransformerDimensions accepts (a
// finite float > 1, 1e35 and FLT_MAX too) is saved, exported and read back
// exactly, and the loaders refuse exactly what the model refuses.
TEST_F(HfLlama, EveryRopeBaseTheModelAcceptsRoundTrips) {
  for (const float base : {1.0000001F, 2.0F, 1.0e30F, 1.0e35F, std::numeric_limits<float>::max()}) {
    TransformerDimensions d = dims();
    d.rope_base = base;
    ASSERT_NO_THROW(d.validate()) << base;
    Random random(2);
    DecoderOnlyTransformer model(d, random);
    save_model_state(model, dir_ / "model.safetensors");
    EXPECT_EQ(load_model(dir_ / "model.safetensors")->dimensions().rope_base, base) << base;
    fs::remove_all(dir_ / "hf");
    convert_to_hf(dir_ / "model.safetensors", dir_ / "hf");
    convert_from_hf(dir_ / "hf", dir_ / "back.safetensors");
    EXPECT_EQ(load_model(dir_ / "back.safetensors")->dimensions().rope_base, base) << base;
    EXPECT_EQ(load_hf_llama(dir_ / "hf")->dimensions().rope_base, base) << base;
  }
  for (const double bad : {1.0, 1.00000001, 0.5, -2.0, 1e39, std::nan("")}) {
    EXPECT_FALSE(is_valid_rope_base(bad)) << bad;
    TransformerDimensions d = dims();
    d.rope_base = static_cast<float>(bad);
    EXPECT_THROW(d.validate(), ValueError) << bad;
  }
  const json good = hf_config(dims());
  for (const json& bad : {json(1), json(0.5), json(1e39), json("1e4")}) {
    json config = good;
    config["rope_theta"] = bad;
    write_text(dir_ / "hf" / "config.json", config.dump());
    EXPECT_NE(rt_test::message_of<ModelStateError>([&] { load_hf_llama(dir_ / "hf"); }).find("rope_theta"),
              std::string::npos) << bad;
  }
}

TEST_F(HfLlama, UnsupportedConfigFieldsAreRefusedByName) {
  saved(dir_ / "hf");
  const json good = hf_config(dims());
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}, "rope_scaling"},
      {{{"attention_bias", true}}, "attention_bias"},
      {{{"mlp_bias", true}}, "mlp_bias"},
      {{{"hidden_act", "gelu"}}, "hidden_act"},
      {{{"head_dim", 4}}, "head_dim"},
      // 4 * (2^62 + 8) wraps to 32 = hidden_size: accepted (and signed overflow) before.
      {{{"head_dim", std::int64_t{4611686018427387912}}}, "head_dim"},
      {{{"model_type", "mistral"}}, "model_type"},
      {{{"num_key_value_heads", 3}}, "\"num_key_value_heads\" is 3"},
      {{{"num_key_value_heads", 8}}, "num_key_value_heads"},
      {{{"num_attention_heads", 3}}, "\"num_attention_heads\" is 3"},
      {{{"num_attention_heads", 32}}, "num_attention_heads"},
      {{{"max_position_embeddings", 0}}, "max_position_embeddings"},
      {{{"vocab_size", 1e300}}, "vocab_size"},
      {{{"tie_word_embeddings", "no"}}, "tie_word_embeddings"},
      {{{"architectures", {"MistralForCausalLM"}}}, "architectures"},
      {{{"attention_dropout", 0.1}}, "attention_dropout"},
      {{{"hidden_size", "32"}}, "hidden_size"},
      {{{"rope_theta", -5}}, "rope_theta"},
      {{{"rms_norm_eps", 0}}, "rms_norm_eps"},
      {{{"rms_norm_eps", 1e-60}}, "rms_norm_eps"},
  };
  for (const auto& [patch, field] : cases) {
    json config = good;
    config.merge_patch(patch);
    write_text(dir_ / "hf" / "config.json", config.dump());
    expect_refused(dir_ / "hf", field);
  }
  json config = good;
  config.erase("num_hidden_layers");
  write_text(dir_ / "hf" / "config.json", config.dump());
  expect_refused(dir_ / "hf", "num_hidden_layers");
  write_text(dir_ / "hf" / "config.json", "{not json");
  expect_refused(dir_ / "hf", "config.json");
  fs::remove(dir_ / "hf" / "config.json");
  expect_refused(dir_ / "hf", "config.json");
}

TEST_F(HfLlama, MissingWrongShapeAndExtraTensorsAreRefused) {
  saved(dir_ / "hf");
  const TensorFile file = read_safetensors(dir_ / "hf" / "model.safetensors");
  auto rewrite = [&](auto edit) {
    auto tensors = file.tensors;
    edit(tensors);
    write_safetensors(dir_ / "hf" / "model.safetensors", tensors, {{"format", "pt"}});
  };
  rewrite([](auto& t) { t.erase(t.begin() + 3); });  // k_proj of layer 0
  expect_refused(dir_ / "hf", "model.layers.0.self_attn.k_proj.weight");
  rewrite([](auto& t) { t[3].second = rt_test::randn({32, 32}, 1); });  // k_proj as if not GQA
  expect_refused(dir_ / "hf", "has shape (32, 32)");
  rewrite([](auto& t) { t.emplace_back("model.layers.0.self_attn.q_proj.bias", rt_test::randn({32}, 1)); });
  expect_refused(dir_ / "hf", "q_proj.bias");
  rewrite([](auto& t) { t.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", rt_test::randn({4}, 1)); });
  EXPECT_NO_THROW(load_hf_llama(dir_ / "hf"));  // an old buffer, ignored
  // ... but not one of a layer the model lacks (it was accepted silently).
  rewrite([](auto& t) { t.emplace_back("model.layers.9.self_attn.rotary_emb.inv_freq", rt_test::randn({4}, 1)); });
  expect_refused(dir_ / "hf", "model.layers.9.self_attn.rotary_emb.inv_freq");
  rewrite([](auto& t) { t[0].second.data()[5] = std::numeric_limits<float>::quiet_NaN(); });
  expect_refused(dir_ / "hf", "holds 1 value that is not finite");
  LoadOptions allow;
  allow.allow_non_finite = true;
  EXPECT_NO_THROW(load_hf_llama(dir_ / "hf", FullSequenceAttentionKind::Materialized,
                                ActivationCheckpointingKind::Disabled, allow));
  fs::remove(dir_ / "hf" / "model.safetensors");
  expect_refused(dir_ / "hf", "neither model.safetensors");
  expect_refused(dir_ / "nothing-here", "is not a directory");
}

TEST_F(HfLlama, TiedCheckpointWithADifferentLmHeadIsRefused) {
  saved(dir_ / "hf", true);
  TensorFile file = read_safetensors(dir_ / "hf" / "model.safetensors");
  file.tensors.emplace_back("lm_head.weight", file.tensors[0].second.clone());
  write_safetensors(dir_ / "hf" / "model.safetensors", file.tensors, {{"format", "pt"}});
  EXPECT_NO_THROW(load_hf_llama(dir_ / "hf"));  // an exact copy is accepted
  file.tensors.back().second.data()[0] += 1.0F;
  write_safetensors(dir_ / "hf" / "model.safetensors", file.tensors, {{"format", "pt"}});
  expect_refused(dir_ / "hf", "tie_word_embeddings");
}

TEST_F(HfLlama, SavingRefusesAdaptersAndAFileInTheWay) {
  Random random(1);
  DecoderOnlyTransformer model(dims(), random);
  LoraConfig config;
  Random lr(2);
  model.add_lora(config, lr);
  EXPECT_THROW(save_hf_llama(model, dir_ / "out"), ValueError);
  model.merge_lora();
  write_text(dir_ / "file", "x");
  EXPECT_THROW(save_hf_llama(model, dir_ / "file"), ModelStateError);
  EXPECT_NO_THROW(save_hf_llama(model, dir_ / "out"));
}

TEST_F(HfLlama, ARefusedConfigJsonLeavesTheOldCheckpointWhole) {
  // A config.json that cannot be replaced (a directory here) was found only
  // after model.safetensors had been replaced: new weights beside the old
  // config. Both targets are checked before either is written.
  saved(dir_ / "hf");
  const auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string before = bytes(dir_ / "hf" / "model.safetensors");
  fs::remove(dir_ / "hf" / "config.json");
  fs::create_directories(dir_ / "hf" / "config.json");
  Random random(99);
  DecoderOnlyTransformer other(dims(), random);
  try {
    save_hf_llama(other, dir_ / "hf");
    ADD_FAILURE() << "saved over a config.json directory";
  } catch (const ModelStateError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  EXPECT_EQ(bytes(dir_ / "hf" / "model.safetensors"), before);
  EXPECT_TRUE(fs::is_directory(dir_ / "hf" / "config.json"));
}

TEST_F(HfLlama, AFailedSecondRenamePutsTheOldWeightsBack) {
  // save_hf_llama renamed the new model.safetensors into place before
  // config.json was written: a failure there (ENOSPC, EIO, an immutable
  // config.json) left new weights beside the old config. Now both are staged
  // and the second rename's failure restores the first target. The failure
  // is injected with a target that rename(2) cannot replace (a directory).
  const auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const fs::path d = dir_ / "hf";
  fs::create_directories(d / "config.json");
  write_text(d / "config.json" / "x", "x");
  for (const bool had_weights : {true, false}) {
    if (had_weights) write_text(d / "model.safetensors", "old weights");
    const std::array<detail::StagedFile, 2> files{
        detail::StagedFile{detail::staging_path(d / "model.safetensors"), d / "model.safetensors"},
        detail::StagedFile{detail::staging_path(d / "config.json"), d / "config.json"}};
    write_text(files[0].staged, "new weights");
    write_text(files[1].staged, "new config");
    try {
      detail::rename_staged_files(files);
      ADD_FAILURE() << "renamed a file over a directory";
    } catch (const ModelStateError& e) {
      EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("put back"), std::string::npos) << e.what();
    }
    if (had_weights) {
      EXPECT_EQ(bytes(d / "model.safetensors"), "old weights");
    } else {
      EXPECT_FALSE(fs::exists(d / "model.safetensors"));
    }
    std::set<std::string> left;
    for (const auto& entry : fs::directory_iterator(d)) left.insert(entry.path().filename().string());
    EXPECT_EQ(left, (had_weights ? std::set<std::string>{"config.json", "model.safetensors"}
                                 : std::set<std::string>{"config.json"}));  // no staged file, no backup
    fs::remove(d / "model.safetensors");
  }
  // save_hf_llama over an existing checkpoint leaves exactly its two files.
  fs::remove_all(d);
  saved(d);
  saved(d, true);
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(d)) left.insert(entry.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"config.json", "model.safetensors"}));
  EXPECT_TRUE(load_hf_llama(d)->dimensions().tie_embeddings);
}

TEST_F(HfLlama, AConversionOutputThatWouldReplaceItsInputIsAValueError) {
  // Before: --from-hf hf --output hf/model.safetensors replaced the HF
  // weights with a model-state file, and --to-hf d/model.safetensors
  // --output d replaced the model-state file; both inputs were lost.
  saved(dir_ / "hf");
  const std::string weights = rt_test::read_file(dir_ / "hf" / "model.safetensors");
  for (const fs::path& out : {dir_ / "hf" / "model.safetensors", dir_ / "hf" / "new.safetensors", dir_ / "hf",
                              dir_ / "hf" / ".." / "hf" / "config.json"}) {
    EXPECT_THROW(convert_from_hf(dir_ / "hf", out), ValueError) << out;
  }
  EXPECT_EQ(rt_test::read_file(dir_ / "hf" / "model.safetensors"), weights);
  fs::create_directories(dir_ / "m");
  convert_from_hf(dir_ / "hf", dir_ / "m" / "model.safetensors");
  const std::string state = rt_test::read_file(dir_ / "m" / "model.safetensors");
  fs::create_hard_link(dir_ / "m" / "model.safetensors", dir_ / "link.safetensors");
  for (const fs::path& out : {dir_ / "m", dir_ / "m/", dir_ / "." / "m"}) {
    EXPECT_THROW(convert_to_hf(dir_ / "m" / "model.safetensors", out), ValueError) << out;
    EXPECT_THROW(convert_to_hf(dir_ / "link.safetensors", out), ValueError) << out;
  }
  EXPECT_EQ(rt_test::read_file(dir_ / "m" / "model.safetensors"), state);
  EXPECT_NO_THROW(convert_to_hf(dir_ / "m" / "model.safetensors", dir_ / "hf2"));
}
