#pragma once
// Tokenizers: the byte tokenizer (the default: one id per UTF-8 byte) and
// SentencePiece subword models (BPE or unigram) trained with
// train_tokenizer(). See docs/data.md ("Tokenizers").
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {

/// A data file that is missing, unreadable, empty or malformed (a tokenizer
/// model file included). Message: "[data] <path>: <what>".
class DataError : public Error {
 public:
  using Error::Error;
};

/// One token per byte: UTF-8 text is encoded as its bytes, ids 0..255.
class ByteTokenizer {
 public:
  static constexpr std::int64_t kVocabSize = 256;

  std::vector<std::int32_t> encode(std::string_view text) const;
  /// The bytes back; ValueError naming the first id outside 0..255 and its
  /// position. A cut through a multi-byte character gives those raw bytes.
  std::string decode(std::span<const std::int32_t> ids) const;
  std::int64_t vocab_size() const { return kVocabSize; }
};

enum class TokenizerModelType : std::uint8_t { Bpe = 0, Unigram = 1 };
const char* tokenizer_model_type_name(TokenizerModelType type);  // "bpe" / "unigram"
/// "bpe" / "unigram"; ValueError naming `op` otherwise.
TokenizerModelType parse_tokenizer_model_type(const std::string& name, const char* op = "model_type");

/// The byte tokenizer or a SentencePiece model. Cheap to copy (shared,
/// immutable); safe to use from several threads.
class Tokenizer {
 public:
  /// The byte tokenizer.
  Tokenizer();
  Tokenizer(const ByteTokenizer&);  // NOLINT: implicit, so byte-level callers keep working
  /// A SentencePiece model file (at most 64 MiB). DataError "[tokenizer]
  /// <path>: ..." when it is missing, not a regular file, or not a valid
  /// model, or when the model has no byte-fallback pieces (<0x00>..<0xFF>:
  /// without them some text has no ids and bits per byte are undefined).
  static Tokenizer load(const std::filesystem::path& path);
  /// Same checks on the bytes of a model file; `source` names it in errors.
  static Tokenizer from_serialized(std::string_view model_bytes, const std::filesystem::path& source);

  bool is_bytes() const { return impl_ == nullptr; }
  std::int64_t vocab_size() const;
  std::vector<std::int32_t> encode(std::string_view text) const;
  /// ValueError naming the first id outside [0, vocab_size) and its position.
  std::string decode(std::span<const std::int32_t> ids) const;
  /// Bytes of text the ids stand for: 1 per byte id; for SentencePiece the
  /// piece's UTF-8 length ("▁" counts as the one space it decodes to; byte
  /// pieces 1; unknown/control pieces 0). Summed over encode(text) it is
  /// text.size() for every text the model encodes losslessly.
  std::int64_t byte_length(std::span<const std::int32_t> ids) const;
  /// The model's end-of-sequence id (SentencePiece's eos_id, e.g. 2 in
  /// Llama's tokenizer), for GenerationOptions::stop_tokens; -1 when it has
  /// none (bytes, and the tokenizers `rt-train tokenizer` makes).
  std::int32_t eos_id() const;
  /// Hash64 of the model file's bytes as 16 hex digits; "" for bytes.
  const std::string& checksum() const;
  /// The model file it was loaded from; empty for bytes.
  const std::filesystem::path& path() const;
  /// "bytes (vocabulary 256)" or "sentencepiece <path> (vocabulary N, checksum C)".
  std::string description() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

/// Options of train_tokenizer().
struct TokenizerTrainingOptions {
  std::int64_t vocab_size = 2048;  // [260, 1048576]; pieces beyond the 256 bytes and <unk>
  TokenizerModelType model_type = TokenizerModelType::Bpe;
};

/// Trains a SentencePiece model on `text` (one sentence per non-blank line;
/// no normalization, no dummy prefix, whitespace kept, byte fallback so
/// every text round-trips) with one thread and no sampling, so the same text
/// and options give the same file bytes. Writes it atomically to `output`
/// (creating its folder) and returns it loaded. ValueError for bad options (SentencePiece's own
/// reason included, e.g. a vocabulary too large for the text); DataError for
/// an empty text or one whose every line is over 65536 bytes (SentencePiece
/// skips such lines).
Tokenizer train_tokenizer(std::string_view text, const TokenizerTrainingOptions& options,
                          const std::filesystem::path& output);

}  // namespace riftco_transformer
