// libFuzzer: SentencePiece model files as Tokenizer::from_serialized reads
// them (any bytes: a typed error or a usable tokenizer, never an abort), and
// a loaded tokenizer on the same bytes as text (encode, decode, byte_length).
// The bytes are also tried as the precompiled character map of a good model's
// normalizer and denormalizer, which SentencePiece checks only for size.
#include <cstdint>
#include <string>

#include "riftco_transformer/data.hpp"

using namespace riftco_transformer;

namespace {

std::string length_delimited(int number, std::string_view bytes) {
  std::string out(1, static_cast<char>((number << 3) | 2));
  for (std::size_t n = bytes.size(); ; n >>= 7) {
    if (n < 0x80) {
      out += static_cast<char>(n);
      break;
    }
    out += static_cast<char>((n & 0x7F) | 0x80);
  }
  return out.append(bytes);
}

std::string varint_field(int number, std::uint64_t value) {
  std::string out;
  for (std::uint64_t key = static_cast<std::uint64_t>(number) << 3; ; key >>= 7) {
    if (key < 0x80) {
      out += static_cast<char>(key);
      break;
    }
    out += static_cast<char>((key & 0x7F) | 0x80);
  }
  for (;; value >>= 7) {
    if (value < 0x80) return out + static_cast<char>(value);
    out += static_cast<char>((value & 0x7F) | 0x80);
  }
}

/// A small BPE model with byte fallback and identity rules, built field by
/// field (ModelProto: 1 pieces {1 piece, 3 type}, 2 trainer_spec {3
/// model_type, 35 byte_fallback}, 3 normalizer_spec {1 name}).
const std::string& good_model() {
  static const std::string model = [] {
    const auto piece = [](const std::string& text, int type) {
      return length_delimited(1, length_delimited(1, text) + varint_field(3, type));
    };
    std::string out = piece("<unk>", 2);
    const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) out += piece(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 6);
    for (const char* text : {"a", "b", "ab", "\xE2\x96\x81"}) out += piece(text, 1);
    out += length_delimited(2, varint_field(3, 2) + varint_field(35, 1));
    return out + length_delimited(3, length_delimited(1, "identity"));
  }();
  return model;
}

void use(std::string_view model, std::string_view text) {
  try {
    const Tokenizer t = Tokenizer::from_serialized(model, "fuzz.model");
    const std::vector<std::int32_t> ids = t.encode(text);
    (void)t.decode(ids);
    (void)t.byte_length(ids);
  } catch (const DataError&) {
  } catch (const ValueError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  use(bytes, "The quick brown fox, caf\xC3\xA9.\n");
  for (const int spec : {3, 5}) {  // normalizer_spec, denormalizer_spec
    const std::string model = good_model() + length_delimited(spec, length_delimited(1, "custom") +
                                                                      length_delimited(2, bytes));
    use(model, bytes);
  }
  return 0;
}
