// Tokenizer models with normalization rules (SentencePiece's precompiled
// character maps): real ones load and normalize; broken ones, which
// SentencePiece loads and then reads out of bounds with at the first encode
// or decode (SIGSEGV before), are DataErrors at load.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "message_of.hpp"
#include "scratch.hpp"
#include "riftco_transformer/data.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

std::string varint(std::uint64_t n) {
  std::string out;
  for (; n >= 0x80; n >>= 7) out += static_cast<char>((n & 0x7F) | 0x80);
  return out + static_cast<char>(n);
}
std::string field(int number, const std::string& bytes) { return varint((number << 3) | 2) + varint(bytes.size()) + bytes; }
std::string u32(std::uint32_t v) {
  std::string out(4, '\0');
  std::memcpy(out.data(), &v, 4);
  return out;
}
/// A precompiled map: trie size, trie units, replacement strings.
std::string charsmap(const std::vector<std::uint32_t>& units, const std::string& strings) {
  std::string trie;
  for (std::uint32_t u : units) trie += u32(u);
  return u32(static_cast<std::uint32_t>(trie.size())) + trie + strings;
}
/// `model` with a normalizer (field 3) or denormalizer (field 5) that has
/// `map`: a repeated message field merges into the earlier one, so this
/// replaces the model's map.
std::string with_map(const std::string& model, int spec, const std::string& map) {
  return model + field(spec, field(1, "custom") + field(2, map));
}

/// A model trained by SentencePiece itself with its default NFKC rules
/// (a ~240 KB precompiled map) and byte fallback, as a user's spm_train gives.
std::string nfkc_model(const fs::path& dir) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog number " + std::to_string(i) + "\n";
  std::ofstream(dir / "text.txt") << text;
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (dir / "text.txt").string() + " --model_prefix=" + (dir / "nfkc").string() +
      " --vocab_size=300 --byte_fallback=true --normalization_rule_name=nmt_nfkc --minloglevel=2");
  EXPECT_TRUE(status.ok()) << status.ToString();
  return rt_test::read_file(dir / "nfkc.model");
}

}  // namespace

TEST(TokenizerCharsmap, ARealNormalizationMapLoadsAndNormalizes) {
  const fs::path dir = rt_test::fresh_dir("charsmap", "real");
  const Tokenizer t = Tokenizer::from_serialized(nfkc_model(dir), "nfkc.model");
  // NFKC maps fullwidth letters to ASCII: the same ids as the plain word.
  EXPECT_EQ(t.encode("\xEF\xBD\x86\xEF\xBD\x8F\xEF\xBD\x98"), t.encode("fox"));  // "ｆｏｘ"
  // SentencePiece's defaults give </s> id 2, as Llama's tokenizer: the stop
  // token generation uses (GenerationOptions::stop_tokens).
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(Tokenizer().eos_id(), -1);  // bytes have none
  fs::remove_all(dir);
}

TEST(TokenizerCharsmap, ABrokenMapIsADataErrorAtLoadNeverACrashAtUse) {
  const fs::path dir = rt_test::fresh_dir("charsmap", "broken");
  TokenizerTrainingOptions options;
  options.vocab_size = 280;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "abc abd bcd cab " + std::to_string(i) + "\n";
  EXPECT_EQ(train_tokenizer(text, options, dir / "good.model").eos_id(), -1);  // riftco's tokenizers have none
  const std::string good = rt_test::read_file(dir / "good.model");
  const struct {
    const char* name;
    int spec;
    std::string map;
    const char* says;
  } cases[] = {
      // The attack's map: the root's offset sends every input byte past the trie.
      {"trie out of bounds", 3, charsmap({0xFFFFFFFF, 0x7FFFFFFF}, std::string("abc\0", 4)), "reads unit"},
      {"denormalizer", 5, u32(4) + std::string(12, '\xFF'), "denormalizer"},
      // A 256-unit trie whose 'a' (97) is a leaf whose value unit says byte 1000.
      {"replacement past the strings", 3, [] {
         std::vector<std::uint32_t> units(256, 0);  // the root (unit 0) has offset 0: children at 0 ^ byte
         units[97] = 97 | (1U << 8);  // label 'a', a leaf, offset 0: its value unit is itself, 353
         return charsmap(units, std::string("x\0", 2));
       }(), "precompiled character map"},
      {"no trie units", 3, u32(0) + std::string("x\0", 2), "no units"},
      // A trie size SentencePiece's check lets through (below the whole map's
      // size) that still runs past the map: the fuzzer's CgAAAAIKPw8AAAI=
      // (11 bytes, trie 10) threw std::out_of_range from the check itself.
      {"trie 1 byte past", 3, u32(8) + std::string(7, '\x01'), "runs past the map"},
      {"trie 3 bytes past", 3, u32(10) + std::string("\x02\x0a\x3f\x0f\x00\x00\x02", 7), "runs past the map"},
      {"trie 3 bytes past (denormalizer)", 5, u32(10) + std::string(7, 'x'), "runs past the map"},
      // SentencePiece's normalizer refuses these at init, but Load checks only
      // the normalizer's status: as a denormalizer each loaded and every
      // decode() returned "".
      {"denormalizer of 3 bytes", 5, std::string("\x01\x02\x03", 3), "too few for its trie size field"},
      {"denormalizer trie as large as the map", 5, u32(8) + std::string(4, 'x'), "is not smaller than the map"},
  };
  for (const auto& c : cases) {
    const std::string model = with_map(good, c.spec, c.map);
    // Also with a self-test sample (ModelProto field 4): SentencePiece's Load
    // normalizes it, so the check must run before the load (SIGSEGV inside
    // LoadFromSerializedProto before).
    const std::string with_self_test = model + field(4, field(1, field(1, "hello") + field(2, "x")));
    const std::string early =
        rt_test::message_of<DataError>([&] { (void)Tokenizer::from_serialized(with_self_test, "selftest.model"); });
    EXPECT_NE(early.find(c.says), std::string::npos) << c.name << " (self-test): " << early;
    const std::string message =
        rt_test::message_of<DataError>([&] { (void)Tokenizer::from_serialized(model, "broken.model"); });
    EXPECT_NE(message.find(c.says), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find("broken.model"), std::string::npos) << message;
  }
  // Field tags as the protobuf-lite parser SentencePiece bundles reads them:
  // at most 5 bytes, the low 32 bits kept. 9A 80 80 80 10 is field 3
  // (normalizer_spec) to it; read as 64 bits it was field 3 + 2^29, so its
  // map went unchecked and crashed at use.
  const auto tag5 = [](std::uint32_t number) {  // the 5-byte tag of (number, wire type 2), bit 32 set
    const std::uint32_t k = (number << 3) | 2;
    return std::string{static_cast<char>((k & 0x7F) | 0x80), static_cast<char>(((k >> 7) & 0x7F) | 0x80),
                       static_cast<char>(((k >> 14) & 0x7F) | 0x80), static_cast<char>(((k >> 21) & 0x7F) | 0x80),
                       static_cast<char>(((k >> 28) & 0x0F) | 0x10)};
  };
  const std::string bad_map = charsmap({0xFFFFFFFF, 0x7FFFFFFF}, std::string("abc\0", 4));
  const std::string spec = field(1, "custom") + field(2, bad_map);
  const std::string inner = field(1, "custom") + tag5(2) + varint(bad_map.size()) + bad_map;
  for (const auto& [name, model] : std::vector<std::pair<std::string, std::string>>{
           {"normalizer", good + tag5(3) + varint(spec.size()) + spec},
           {"denormalizer", good + tag5(5) + varint(spec.size()) + spec},
           {"normalizer", good + field(3, inner)},
       }) {
    const std::string message =
        rt_test::message_of<DataError>([&] { (void)Tokenizer::from_serialized(model, "tag5.model"); });
    EXPECT_NE(message.find("the " + name + "'s precompiled character map is broken"), std::string::npos) << message;
  }
  // A group (wire type 3) the parser skips as an unknown field is skipped
  // whole: a model with one still loads, and a broken map after it is still
  // found. A tag longer than 5 bytes, or an unclosed group, is malformed.
  const std::string group = varint((1000 << 3) | 3) + varint((1 << 3) | 0) + varint(7) + varint((1000 << 3) | 4);
  EXPECT_FALSE(Tokenizer::from_serialized(good + group, "group.model").encode("abc").empty());
  const std::string after_group = rt_test::message_of<DataError>(
      [&] { (void)Tokenizer::from_serialized(with_map(good + group, 3, bad_map), "group.model"); });
  EXPECT_NE(after_group.find("precompiled character map is broken"), std::string::npos) << after_group;
  for (const std::string& malformed : {good + std::string("\x9A\x80\x80\x80\x80\x00", 6) + varint(1) + "x",
                                       good + varint((1000 << 3) | 3) + varint((1 << 3) | 0) + varint(7)}) {
    const std::string message =
        rt_test::message_of<DataError>([&] { (void)Tokenizer::from_serialized(malformed, "malformed.model"); });
    EXPECT_NE(message.find("not a well-formed protocol buffer"), std::string::npos) << message;
  }
  // Rules "a", "aa", ... "a"·n: every unit in bounds, but SentencePiece keeps
  // 32 matches of one input in a stack array and loops over all it finds
  // (n = 33: SIGSEGV at encode; the review's deep_trie.py).
  const auto deep_map = [](int n) {
    std::vector<std::uint32_t> units(256 * static_cast<std::size_t>(n + 2), 0);
    const auto base = [](int i) { return 256U * static_cast<std::uint32_t>(i + 1); };
    units[0] = base(0) << 10;         // the root: children in block 1
    units[base(0)] = 1U << 31;        // byte 0 matches nothing
    for (int i = 0; i < n; ++i) {
      const std::uint32_t at = base(i) ^ 0x61U;  // 'a'
      const std::uint32_t child = base(i + 1);
      units[at] = ((at ^ child) << 10) | (1U << 8) | 0x61U;  // label 'a', a rule ends here
      units[child] = 1U << 31;                                // its value: byte 0 of the strings
    }
    return charsmap(units, std::string("b\0", 2));
  };
  const std::string deep =
      rt_test::message_of<DataError>([&] { (void)Tokenizer::from_serialized(with_map(good, 3, deep_map(33)), "deep.model"); });
  EXPECT_NE(deep.find("more than 32 of its rules match prefixes of one input"), std::string::npos) << deep;
  const Tokenizer thirty_two = Tokenizer::from_serialized(with_map(good, 3, deep_map(32)), "deep32.model");
  EXPECT_FALSE(thirty_two.encode(std::string(32, 'a')).empty());  // within the limit: works
  // Every byte of a real map flipped in turn (a sample): a DataError or a
  // tokenizer that encodes and decodes every byte, never a crash.
  const std::string nfkc = nfkc_model(dir);
  std::string all_bytes;
  for (int b = 1; b < 256; ++b) all_bytes += static_cast<char>(b);
  int refused = 0;
  int loaded = 0;
  for (std::size_t i = 0; i < nfkc.size(); i += nfkc.size() / 307 + 1) {
    std::string flipped = nfkc;
    flipped[i] = static_cast<char>(flipped[i] ^ 0xA5);
    try {
      const Tokenizer t = Tokenizer::from_serialized(flipped, "flipped.model");
      (void)t.decode(t.encode(all_bytes));
      (void)t.decode(t.encode("the quick \xEF\xBD\x86\xEF\xBD\x8F\xEF\xBD\x98"));
      ++loaded;
    } catch (const DataError&) {
      ++refused;
    } catch (const ValueError&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(loaded, 0);
  fs::remove_all(dir);
}
