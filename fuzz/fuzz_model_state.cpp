// libFuzzer: model-state files (read_safetensors, load_model, load_model_state
// into a live model that must stay untouched on refusal).
#include <cstdlib>

#include "fuzz_common.hpp"
#include "riftco_transformer/model_state.hpp"

using namespace riftco_transformer;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Random random(0);
  static DecoderOnlyTransformer target({256, 32, 16, 2, 2, 32}, random);
  static const Tensor witness = target.parameter("lm_head.weight").value().clone();
  const auto& path = rt_fuzz::write_input("model.safetensors", data, size);
  try {
    read_safetensors(path);
  } catch (const ModelStateError&) {
  }
  try {
    load_model(path);
  } catch (const ModelStateError&) {
  } catch (const ValueError&) {  // dimensions the model refuses
  }
  try {
    load_model_state(target, path);
    target.parameter("lm_head.weight").set_value(witness.clone());  // accepted: put the witness back
  } catch (const ModelStateError&) {
    if (!bit_equal(target.parameter("lm_head.weight").value(), witness)) std::abort();  // half-applied
  }
  return 0;
}
