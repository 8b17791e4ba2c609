// libFuzzer: SentencePiece model files as Tokenizer::from_serialized reads
// them (any bytes: a typed error or a usable tokenizer, never an abort), and
// a loaded tokenizer on the same bytes as text (encode, decode, byte_length).
#include "riftco_transformer/data.hpp"

using namespace riftco_transformer;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const Tokenizer t = Tokenizer::from_serialized(bytes, "fuzz.model");
    const std::vector<std::int32_t> ids = t.encode("The quick brown fox, caf\xC3\xA9.\n");
    (void)t.decode(ids);
    (void)t.byte_length(ids);
  } catch (const DataError&) {
  } catch (const ValueError&) {
  }
  return 0;
}
