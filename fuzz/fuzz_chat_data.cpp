// libFuzzer: the data loaders on the same bytes — JSON Lines chat data
// (ChatDataset::parse), text corpora (the UTF-8 check load_text_file makes,
// then TextDataset and a batch from each split) — and the bounded JSON
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
  if (!first_invalid_utf8(text) && !text.empty()) {
    try {
      const TextDataset dataset(text, ByteTokenizer{}, 0.1);
      Random random(1);
      for (const Split split : {Split::Train, Split::Validation}) {
        if (static_cast<std::int64_t>(dataset.tokens(split).size()) > 9) dataset.sample_batch(random, 2, 8, split);
      }
    } catch (const DataError&) {
    } catch (const ValueError&) {
    }
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
