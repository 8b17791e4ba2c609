// libFuzzer: the C ABI's file entry points (rt_model_load_new, rt_model_load,
// rt_model_load_adapter) with every flag combination. Every call must return
// a documented status with a message, and a failed load must leave the model
// handle usable.
#include <cstdlib>
#include <cstring>

#include "fuzz_common.hpp"
#include "riftco_transformer/rt.h"

namespace {

bool documented(rt_status s) { return s >= RT_OK && s <= RT_ERROR_INTERNAL && s != RT_ERROR_INTERNAL; }

void expect(rt_status s) {
  if (!documented(s)) std::abort();  // RT_ERROR_INTERNAL is a bug by definition
  if (s != RT_OK && std::strlen(rt_last_error_message()) == 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static rt_model* base = [] {
    rt_transformer_config c;
    rt_transformer_config_default(&c);
    c.context_length = 32;
    c.model_width = 16;
    c.heads = 2;
    c.layers = 2;
    c.feed_forward_width = 32;
    rt_model* m = nullptr;
    if (rt_model_create(&c, 0, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED, &m) != RT_OK) std::abort();
    return m;
  }();
  const std::string path = rt_fuzz::write_input("c_abi.safetensors", data, size).string();
  for (uint32_t flags = 0; flags < 4; ++flags) {
    rt_model* loaded = nullptr;
    const rt_status s = rt_model_load_new(path.c_str(), RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED,
                                          flags, &loaded);
    expect(s);
    if ((s == RT_OK) != (loaded != nullptr)) std::abort();
    rt_model_destroy(loaded);
    expect(rt_model_load(base, path.c_str(), flags));
    const rt_status a = rt_model_load_adapter(base, path.c_str(), flags);
    expect(a);
    if (a == RT_OK) expect(rt_model_remove_lora(base));
    int has = 1;
    if (rt_model_has_lora(base, &has) != RT_OK || has != 0) std::abort();
  }
  return 0;
}
