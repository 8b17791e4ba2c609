// libFuzzer: training checkpoints (metadata, strict numbers, tensors, the
// configuration it was made with), against a live model and Adam that must
// stay untouched on refusal. The fuzz build skips the checksum comparison
// (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION), or no mutated input would get
// past it; the checksum itself is tested in tests/cpp/test_reliability.cpp.
#include <cstdlib>

#include "../src/train/training_checkpoint.hpp"
#include "fuzz_common.hpp"
#include "riftco_transformer/model_state.hpp"

using namespace riftco_transformer;

namespace {

std::vector<Tensor> zeros_like(const std::vector<Variable>& params) {
  std::vector<Tensor> out;
  for (const Variable& p : params) out.push_back(Tensor::zeros(p.shape()));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The model of fuzz/make_corpus.sh's runs.
  static Random random(0);
  static DecoderOnlyTransformer model({256, 32, 16, 2, 2, 32}, random);
  static const std::vector<NamedParameter> trainable = model.parameters();
  static const std::vector<Variable> params = [] {
    std::vector<Variable> v;
    for (const NamedParameter& p : trainable) v.push_back(p.variable);
    return v;
  }();
  static Adam adam(params);
  static const Tensor witness = params[0].value().clone();
  const auto& path = rt_fuzz::write_input("training_checkpoint.safetensors", data, size);
  // Expect the configuration the file claims, so inputs get past that check.
  nlohmann::json config = nlohmann::json::object();
  try {
    const TensorFile file = read_safetensors(path);
    const auto it = file.metadata.find("config");
    if (it != file.metadata.end()) config = nlohmann::json::parse(it->second, nullptr, false, false);
    if (!config.is_object()) config = nlohmann::json::object();
  } catch (const ModelStateError&) {
  }
  stage::TrainingState state;
  try {
    stage::load_training_checkpoint(path, trainable, adam, state, config);
    Variable(params[0]).set_value(witness.clone());
  } catch (const ModelStateError&) {
    bool counts_moved = adam.step_count() != 0;
    for (std::size_t i = 0; i < params.size(); ++i) counts_moved = counts_moved || adam.parameter_step_count(i) != 0;
    if (!bit_equal(params[0].value(), witness) || counts_moved) std::abort();  // half-applied
  }
  adam.set_state(Adam::State{0, zeros_like(params), zeros_like(params)});
  return 0;
}
