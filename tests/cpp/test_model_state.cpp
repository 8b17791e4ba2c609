// Model-state files for DecoderOnlyTransformer: save/load round trip, the
// metadata schema (architecture only, no execution policy), and every
// mismatch refused before the model is touched.
//
// PENDING: rename to test_model_state.cpp once src/model/ implements
// transformer.hpp (until then these tests cannot link).
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "riftco_transformer/lora.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

TransformerDimensions small_dimensions() {
  TransformerDimensions d;
  d.vocab_size = 32;
  d.context_length = 16;
  d.model_width = 16;
  d.heads = 2;
  d.layers = 2;
  d.feed_forward_width = 24;
  return d;
}

std::unique_ptr<DecoderOnlyTransformer> make_model(std::uint64_t seed, float norm_epsilon = 1.0e-5F,
                                                   TransformerDimensions dimensions = small_dimensions()) {
  Random random(seed);
  return std::make_unique<DecoderOnlyTransformer>(dimensions, random, norm_epsilon);
}

struct Snapshot {
  std::vector<Tensor> values;
  std::vector<std::uint64_t> versions;
};

Snapshot snapshot(const DecoderOnlyTransformer& model) {
  Snapshot s;
  for (const NamedParameter& p : model.parameters()) {
    s.values.push_back(p.variable.value().clone());
    s.versions.push_back(p.variable.version());
  }
  return s;
}

void expect_same_parameters(const DecoderOnlyTransformer& expected, const DecoderOnlyTransformer& actual) {
  const auto a = expected.parameters();
  const auto b = actual.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(bit_equal(a[i].variable.value(), b[i].variable.value())) << a[i].name;
  }
}

class ModelStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("riftco_model_state_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = dir_ / "model.safetensors";
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  fs::path path_;
};

}  // namespace

TEST_F(ModelStateTest, RoundTripIsBitExactAndBumpsVersions) {
  const auto source = make_model(1);
  const auto target = make_model(2);
  save_model_state(*source, path_);
  const Snapshot before = snapshot(*target);
  load_model_state(*target, path_);
  expect_same_parameters(*source, *target);
  const auto parameters = target->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_GT(parameters[i].variable.version(), before.versions[i]) << parameters[i].name;
  }
  const std::vector<std::int32_t> tokens = {1, 5, 9, 30, 2, 7};
  EXPECT_TRUE(bit_equal(source->forward(tokens, 2).value(), target->forward(tokens, 2).value()));
}

TEST_F(ModelStateTest, FileHoldsEveryParameterAndTheArchitectureOnly) {
  Random random(3);
  DecoderOnlyTransformer model(small_dimensions(), random, 1.0e-6F, FullSequenceAttentionKind::Flash,
                               ActivationCheckpointingKind::TransformerBlock);
  save_model_state(model, path_);
  const TensorFile file = read_safetensors(path_);

  const auto parameters = model.parameters();
  ASSERT_EQ(file.tensors.size(), parameters.size());
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, parameters[i].name);
    EXPECT_TRUE(bit_equal(file.tensors[i].second, parameters[i].variable.value())) << parameters[i].name;
  }

  // Exactly these keys: no checkpointing policy, no attention kind.
  std::vector<std::string> keys;
  for (const auto& [key, value] : file.metadata) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"dimensions", "format", "norm_epsilon", "schema_version"}));
  EXPECT_EQ(file.metadata.at("format"), "riftco.model_state");
  EXPECT_EQ(file.metadata.at("schema_version"), "1");
  EXPECT_EQ(std::stof(file.metadata.at("norm_epsilon")), 1.0e-6F);
  const auto dims = nlohmann::json::parse(file.metadata.at("dimensions"));
  EXPECT_EQ(dims, nlohmann::json::parse(R"({"vocab_size":32,"context_length":16,"model_width":16,
                                             "heads":2,"layers":2,"feed_forward_width":24})"));
  for (const auto& [key, value] : file.metadata) {
    EXPECT_EQ(value.find("checkpoint"), std::string::npos) << key;
    EXPECT_EQ(value.find("flash"), std::string::npos) << key;
  }
}

TEST_F(ModelStateTest, ReadModelDimensions) {
  save_model_state(*make_model(4), path_);
  EXPECT_EQ(read_model_dimensions(path_), small_dimensions());
}

TEST_F(ModelStateTest, LoadModelUsesTheFileArchitectureAndTheCallersPolicy) {
  TransformerDimensions dims = small_dimensions();
  dims.layers = 3;
  const auto source = make_model(5, 1.0e-6F, dims);
  save_model_state(*source, path_);

  const auto plain = load_model(path_);
  EXPECT_EQ(plain->dimensions(), dims);
  EXPECT_EQ(plain->norm_epsilon(), 1.0e-6F);
  EXPECT_EQ(plain->attention_kind(), FullSequenceAttentionKind::Materialized);
  EXPECT_EQ(plain->activation_checkpointing_kind(), ActivationCheckpointingKind::Disabled);
  expect_same_parameters(*source, *plain);
  const std::vector<std::int32_t> tokens = {3, 1, 4, 1, 5};
  EXPECT_TRUE(bit_equal(source->forward(tokens, 1).value(), plain->forward(tokens, 1).value()));

  const auto policed =
      load_model(path_, FullSequenceAttentionKind::Flash, ActivationCheckpointingKind::TransformerBlock);
  EXPECT_EQ(policed->attention_kind(), FullSequenceAttentionKind::Flash);
  EXPECT_EQ(policed->activation_checkpointing_kind(), ActivationCheckpointingKind::TransformerBlock);
  expect_same_parameters(*source, *policed);
}

// ---- mismatches: ModelStateError naming the problem, model untouched ---------

struct Corruption {
  const char* name;
  std::function<void(TensorFile&)> edit;
  const char* message;
};
void PrintTo(const Corruption& c, std::ostream* os) { *os << c.name; }

std::vector<Corruption> corruptions() {
  return {
      {"NotAModelState", [](TensorFile& f) { f.metadata.erase("format"); }, "\"__metadata__\" has no \"format\""},
      {"OtherFormat", [](TensorFile& f) { f.metadata["format"] = "other"; }, "format 'other' is not"},
      {"NoSchemaVersion", [](TensorFile& f) { f.metadata.erase("schema_version"); }, "has no \"schema_version\""},
      {"FutureSchema", [](TensorFile& f) { f.metadata["schema_version"] = "2"; },
       "schema_version '2' is not supported"},
      {"NoDimensions", [](TensorFile& f) { f.metadata.erase("dimensions"); }, "has no \"dimensions\""},
      {"DimensionsNotJson", [](TensorFile& f) { f.metadata["dimensions"] = "{"; }, "not valid JSON"},
      {"DimensionsMissingField",
       [](TensorFile& f) {
         auto d = nlohmann::json::parse(f.metadata["dimensions"]);
         d.erase("heads");
         f.metadata["dimensions"] = d.dump();
       },
       "missing key \"heads\""},
      {"DimensionsInvalid",
       [](TensorFile& f) {
         auto d = nlohmann::json::parse(f.metadata["dimensions"]);
         d["heads"] = 3;  // 16 is not divisible by 3
         f.metadata["dimensions"] = d.dump();
       },
       "metadata \"dimensions\""},
      {"DimensionsDiffer",
       [](TensorFile& f) {
         auto d = nlohmann::json::parse(f.metadata["dimensions"]);
         d["vocab_size"] = 64;
         f.metadata["dimensions"] = d.dump();
       },
       "differ from the model's"},
      {"EpsilonDiffers", [](TensorFile& f) { f.metadata["norm_epsilon"] = "1e-06"; }, "norm_epsilon 1e-06 in the file"},
      {"EpsilonGarbage", [](TensorFile& f) { f.metadata["norm_epsilon"] = "tiny"; }, "not a positive finite number"},
      {"MissingTensor", [](TensorFile& f) { f.tensors.pop_back(); }, "is missing (the model expects shape"},
      {"WrongShape", [](TensorFile& f) { f.tensors.back().second = Tensor::zeros({1, 2, 3}); },
       "has shape (1, 2, 3) in the file, the model expects"},
      {"ExtraTensor", [](TensorFile& f) { f.tensors.emplace_back("blocks.9.extra", Tensor::zeros({2})); },
       "the file has tensors the model does not: 'blocks.9.extra'"},
  };
}

class ModelStateMismatch : public ModelStateTest, public ::testing::WithParamInterface<Corruption> {};

TEST_P(ModelStateMismatch, IsRefusedAndLeavesTheModelUntouched) {
  const auto source = make_model(6);
  save_model_state(*source, path_);
  TensorFile file = read_safetensors(path_);
  GetParam().edit(file);
  write_safetensors(path_, file.tensors, file.metadata);

  const auto target = make_model(7);
  const Snapshot before = snapshot(*target);
  try {
    load_model_state(*target, path_);
    FAIL() << "no error";
  } catch (const ModelStateError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("[load] " + path_.string() + ": ", 0), 0U) << message;
    EXPECT_NE(message.find(GetParam().message), std::string::npos) << message;
  }
  const Snapshot after = snapshot(*target);
  EXPECT_EQ(after.versions, before.versions);
  for (std::size_t i = 0; i < before.values.size(); ++i) EXPECT_TRUE(bit_equal(after.values[i], before.values[i]));
}

INSTANTIATE_TEST_SUITE_P(Cases, ModelStateMismatch, ::testing::ValuesIn(corruptions()),
                         [](const ::testing::TestParamInfo<Corruption>& info) { return info.param.name; });

TEST_F(ModelStateTest, WrongShapeMessageNamesTheTensorAndBothShapes) {
  save_model_state(*make_model(8), path_);
  TensorFile file = read_safetensors(path_);
  const std::string name = file.tensors.front().first;
  const Shape expected = file.tensors.front().second.shape();
  file.tensors.front().second = Tensor::zeros({7});
  write_safetensors(path_, file.tensors, file.metadata);
  const auto model = make_model(9);
  try {
    load_model_state(*model, path_);
    FAIL() << "no error";
  } catch (const ModelStateError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor '" + name + "' has shape (7,) in the file, the model expects " +
                                         shape_string(expected)),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ModelStateTest, CorruptFileIsRefusedBeforeTheModelIsTouched) {
  save_model_state(*make_model(10), path_);
  fs::resize_file(path_, fs::file_size(path_) - 4);
  const auto model = make_model(11);
  const Snapshot before = snapshot(*model);
  EXPECT_THROW(load_model_state(*model, path_), ModelStateError);
  EXPECT_THROW(load_model(path_), ModelStateError);
  EXPECT_EQ(snapshot(*model).versions, before.versions);
}

TEST_F(ModelStateTest, LoadModelRefusesAFileThatIsNotAModelState) {
  write_safetensors(path_, {{"x", Tensor::scalar(1.0F)}}, {});
  EXPECT_THROW(load_model(path_), ModelStateError);
  EXPECT_THROW(read_model_dimensions(path_), ModelStateError);
}

TEST(ModelStateLimits, AHeaderCannotAskForAHugeModel) {
  // Dimensions of a ~4-billion-parameter model and no tensors: refused
  // before anything of that size is allocated.
  const fs::path path = fs::temp_directory_path() / ("riftco_huge_header_" + std::to_string(::getpid()) + ".safetensors");
  write_safetensors(path, {},
                    {{"format", kModelStateFormat},
                     {"schema_version", kModelStateSchemaVersion},
                     {"dimensions", R"({"vocab_size":256,"context_length":1024,"model_width":65536,"heads":64,)"
                                    R"("layers":1,"feed_forward_width":4096})"},
                     {"norm_epsilon", "1e-05"}});
  try {
    load_model(path);
    ADD_FAILURE() << "accepted";
  } catch (const ModelStateError& e) {
    EXPECT_NE(std::string(e.what()).find("the file holds 0 values"), std::string::npos) << e.what();
  }
}

// A Variable's name is a label (Python's Variable.name setter changes it):
// the model names its parameters by its structure, so a renamed parameter
// keeps its key in saved files and in parameter(name). Renaming one used to
// save it under the new label: a file no model could load.
TEST(ModelState, ARenamedParameterKeepsItsStructuralNameInFiles) {
  auto model = make_model(3);
  Variable query = model->parameter("blocks.1.attention.query.weight");
  query.set_name("my favourite weight");
  Random random(4);
  LoraConfig lora;
  lora.rank = 2;
  model->add_lora(lora, random);
  Variable adapter = model->lora_parameters().front().variable;
  const std::string adapter_key = model->lora_parameters().front().name;
  adapter.set_name("renamed adapter");
  EXPECT_EQ(adapter_key, "blocks.0.attention.query.lora_a");
  EXPECT_EQ(model->lora_parameters().front().name, adapter_key);
  EXPECT_EQ(model->parameter("blocks.1.attention.query.weight").node(), query.node());
  for (const NamedParameter& p : model->parameters()) EXPECT_NE(p.name, "my favourite weight");
  const fs::path dir = fs::temp_directory_path() / ("rt_renamed_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  save_model_state(*model, dir / "model.safetensors");
  auto copy = make_model(5);
  load_model_state(*copy, dir / "model.safetensors");
  EXPECT_TRUE(bit_equal(copy->parameter("blocks.1.attention.query.weight").value(), query.value()));
  fs::remove_all(dir);
}
