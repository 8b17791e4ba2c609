// libFuzzer: JSON Lines chat data (ChatDataset::parse) and the bounded JSON
// reader every loader uses.
#include "../src/io/json_read.hpp"
#include "riftco_transformer/data.hpp"

using namespace riftco_transformer;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    ChatDataset::parse(text, "fuzz.jsonl", ByteTokenizer{});
  } catch (const DataError&) {
  }
  try {
    const detail::Json json = detail::parse_untrusted_json(text);
    (void)detail::quote_json(json);
    if (json.is_object()) {
      try {
        detail::json_integer(json, "step", 0, 1 << 30);
      } catch (const detail::JsonReadError&) {
      }
    }
  } catch (const detail::JsonReadError&) {
  }
  return 0;
}
