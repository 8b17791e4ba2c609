// libFuzzer: LoRA adapter files against a fixed base model, which must stay
// adapter-free and unchanged on refusal.
#include <cstdlib>

#include "fuzz_common.hpp"
#include "riftco_transformer/adapter_state.hpp"

using namespace riftco_transformer;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Random random(0);
  static DecoderOnlyTransformer base({256, 32, 16, 2, 2, 32}, random);
  const auto& path = rt_fuzz::write_input("adapter.safetensors", data, size);
  for (const bool lenient : {false, true}) {
    LoadOptions options;
    options.allow_base_mismatch = lenient;
    options.allow_non_finite = lenient;
    try {
      load_adapter_state(base, path, options);
      base.remove_lora();
    } catch (const ModelStateError&) {
      if (base.has_lora()) std::abort();  // half-applied
    } catch (const ValueError&) {
      if (base.has_lora()) std::abort();
    }
  }
  return 0;
}
