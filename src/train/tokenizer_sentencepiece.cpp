// Tokenizer (bytes or a SentencePiece model) and train_tokenizer().
// SentencePiece reports failures as a Status; every call here checks it, so
// a bad model file or bad options become typed errors, never an abort. Some
// malformed models make it throw instead (its trie builder rejects an empty
// piece with a Darts exception): those become the same typed errors.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "../io/atomic_file.hpp"
#include "../tensor/hash.hpp"
#include "tokenizer_charsmap.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/data.hpp"

namespace riftco_transformer {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
  std::vector<std::int32_t> piece_bytes;  // byte_length of each id
  std::string checksum;
  std::filesystem::path path;
};

namespace {

constexpr std::size_t kMaxModelBytes = std::size_t{64} << 20;
const std::string kNoChecksum;
const std::filesystem::path kNoPath;

[[noreturn]] void tokenizer_error(const std::filesystem::path& source, const std::string& what) {
  throw DataError("[tokenizer] " + source.string() + ": " + what);
}

// One non-blank line at a time, without copying the text.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view text) : text_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (pos_ < text_.size()) {
      std::size_t end = text_.find('\n', pos_);
      if (end == std::string_view::npos) end = text_.size();
      const std::string_view line = text_.substr(pos_, end - pos_);
      pos_ = end + 1;
      if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
        value_.assign(line);
        return;
      }
    }
    done_ = true;
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
  std::string value_;
  bool done_ = false;
};

void check_ids(std::span<const std::int32_t> ids, std::int64_t vocab, const char* op) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw ValueError(std::string("[") + op + "] id " + std::to_string(ids[i]) + " at position " +
                       std::to_string(i) + " is outside the vocabulary 0.." + std::to_string(vocab - 1));
    }
  }
}

}  // namespace

const char* tokenizer_model_type_name(TokenizerModelType type) {
  return type == TokenizerModelType::Unigram ? "unigram" : "bpe";
}

TokenizerModelType parse_tokenizer_model_type(const std::string& name, const char* op) {
  if (name == "bpe") return TokenizerModelType::Bpe;
  if (name == "unigram") return TokenizerModelType::Unigram;
  throw ValueError(std::string("[") + op + "] unknown tokenizer model type '" + name +
                   "' (expected 'bpe' or 'unigram')");
}

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(const ByteTokenizer&) {}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  if (path.empty()) throw ValueError("[tokenizer] the tokenizer path is empty");
  std::string bytes;
  if (const auto why = read_regular_file(path, bytes, kMaxModelBytes)) tokenizer_error(path, *why);
  return from_serialized(bytes, path);
}

Tokenizer Tokenizer::from_serialized(std::string_view model_bytes, const std::filesystem::path& source) {
  if (model_bytes.empty()) tokenizer_error(source, "the file is empty (not a SentencePiece model)");
  if (model_bytes.size() > kMaxModelBytes) tokenizer_error(source, "larger than 64 MiB (not a tokenizer model)");
  // Before SentencePiece sees the bytes: its Load normalizes the model's
  // self-test samples, so a broken character map crashed inside the load.
  if (const std::string problem = detail::charsmap_problem(model_bytes); !problem.empty()) {
    tokenizer_error(source, "not a usable SentencePiece model (" + problem + ")");
  }
  auto impl = std::make_shared<Impl>();
  sentencepiece::util::Status status;
  try {
    status = impl->processor.LoadFromSerializedProto(model_bytes);
  } catch (const std::exception& e) {
    tokenizer_error(source, std::string("not a valid SentencePiece model (") + e.what() + ")");
  }
  if (!status.ok()) tokenizer_error(source, "not a valid SentencePiece model (" + status.ToString() + ")");
  const int size = impl->processor.GetPieceSize();
  if (size < 2 || size > (1 << 24)) tokenizer_error(source, "vocabulary of " + std::to_string(size) + " pieces");
  impl->piece_bytes.resize(static_cast<std::size_t>(size));
  int byte_pieces = 0;
  for (int id = 0; id < size; ++id) {
    std::int32_t n = 0;
    if (impl->processor.IsByte(id)) {
      n = 1;
      ++byte_pieces;
    } else if (!impl->processor.IsControl(id) && !impl->processor.IsUnknown(id)) {
      const std::string& piece = impl->processor.IdToPiece(id);
      constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
      for (std::size_t i = 0; i < piece.size();) {
        if (piece.compare(i, kSpace.size(), kSpace) == 0) {
          i += kSpace.size();
        } else {
          ++i;
        }
        ++n;
      }
    }
    impl->piece_bytes[static_cast<std::size_t>(id)] = n;
  }
  if (byte_pieces != 256) {
    tokenizer_error(source, "has " + std::to_string(byte_pieces) +
                                " byte-fallback pieces, not 256: some text would have no ids (train one with "
                                "`rt-train tokenizer`, which enables byte fallback)");
  }
  detail::Hash64 hash;
  hash.update(model_bytes);
  impl->checksum = hash.hex();
  impl->path = source;
  Tokenizer out;
  out.impl_ = std::move(impl);
  return out;
}

std::int32_t Tokenizer::eos_id() const {
  if (!impl_) return -1;
  const int id = impl_->processor.eos_id();
  return id >= 0 && id < impl_->processor.GetPieceSize() ? id : -1;
}

std::int64_t Tokenizer::vocab_size() const {
  return impl_ ? impl_->processor.GetPieceSize() : ByteTokenizer::kVocabSize;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  if (!impl_) return ByteTokenizer{}.encode(text);
  std::vector<int> ids;
  sentencepiece::util::Status status;
  try {
    status = impl_->processor.Encode(text, &ids);
  } catch (const std::exception& e) {
    throw ValueError("[Tokenizer::encode] " + impl_->path.string() + ": " + e.what());
  }
  if (!status.ok()) throw ValueError("[Tokenizer::encode] " + impl_->path.string() + ": " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids) const {
  if (!impl_) return ByteTokenizer{}.decode(ids);
  check_ids(ids, vocab_size(), "Tokenizer::decode");
  const std::vector<int> v(ids.begin(), ids.end());
  std::string text;
  sentencepiece::util::Status status;
  try {
    status = impl_->processor.Decode(v, &text);
  } catch (const std::exception& e) {
    throw ValueError("[Tokenizer::decode] " + impl_->path.string() + ": " + e.what());
  }
  if (!status.ok()) throw ValueError("[Tokenizer::decode] " + impl_->path.string() + ": " + status.ToString());
  return text;
}

std::int64_t Tokenizer::byte_length(std::span<const std::int32_t> ids) const {
  check_ids(ids, vocab_size(), "Tokenizer::byte_length");
  if (!impl_) return static_cast<std::int64_t>(ids.size());
  std::int64_t n = 0;
  for (const std::int32_t id : ids) n += impl_->piece_bytes[static_cast<std::size_t>(id)];
  return n;
}

const std::string& Tokenizer::checksum() const { return impl_ ? impl_->checksum : kNoChecksum; }
const std::filesystem::path& Tokenizer::path() const { return impl_ ? impl_->path : kNoPath; }

std::string Tokenizer::description() const {
  if (!impl_) return "bytes (vocabulary 256)";
  return "sentencepiece " + impl_->path.string() + " (vocabulary " + std::to_string(vocab_size()) + ", checksum " +
         impl_->checksum + ")";
}

Tokenizer train_tokenizer(std::string_view text, const TokenizerTrainingOptions& options,
                          const std::filesystem::path& output) {
  if (options.vocab_size < 260 || options.vocab_size > (1 << 20)) {
    throw ValueError("[train_tokenizer] vocab_size must be in [260, 1048576] (256 byte pieces, <unk> and at least "
                     "3 more), got " + std::to_string(options.vocab_size));
  }
  if (options.model_type != TokenizerModelType::Bpe && options.model_type != TokenizerModelType::Unigram) {
    throw ValueError("[train_tokenizer] unknown model type " + std::to_string(static_cast<int>(options.model_type)));
  }
  if (output.empty()) throw ValueError("[train_tokenizer] output must name a file");
  // A target that cannot be written (a directory, a device, a read-only
  // directory) fails now, not after training.
  detail::check_replaceable(output);
  std::error_code no_parent;
  if (std::filesystem::is_directory(output.has_parent_path() ? output.parent_path() : ".", no_parent)) {
    // (A missing directory is made at the end, as before.)
    const std::filesystem::path probe = detail::staging_path(output);
    write_file_atomically(probe, std::string_view());
    std::error_code ignored;
    std::filesystem::remove(probe, ignored);
  }
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    throw DataError("[train_tokenizer] the training text is empty or blank");
  }
  // SentencePiece skips lines over max_sentence_length; with none left it
  // fails with "[!sentences_.empty()]": say what is wrong instead.
  constexpr std::size_t kMaxLineBytes = 65536;
  bool any_line = false;
  for (std::size_t pos = 0; pos < text.size() && !any_line;) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    any_line = line.size() <= kMaxLineBytes && line.find_first_not_of(" \t\r") != std::string_view::npos;
    pos = end + 1;
  }
  if (!any_line) {
    throw DataError("[train_tokenizer] every non-blank line of the training text is longer than " +
                    std::to_string(kMaxLineBytes) + " bytes (SentencePiece skips such lines): split it into lines");
  }
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", tokenizer_model_type_name(options.model_type)},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"max_sentence_length", std::to_string(kMaxLineBytes)},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"minloglevel", "2"},
  };
  LineIterator lines(text);
  std::string model;
  {
    // SentencePiece's trainer keeps global state (its logging level, the
    // random seed): one training at a time in this process.
    static std::mutex mutex;
    const std::lock_guard<std::mutex> lock(mutex);
    sentencepiece::SetRandomGeneratorSeed(1234);
    sentencepiece::util::Status status;
    try {
      status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
    } catch (const std::exception& e) {
      throw ValueError(std::string("[train_tokenizer] SentencePiece failed (") + e.what() + ")");
    }
    if (!status.ok()) {
      const std::string said = status.ToString();
      // "Vocabulary size is too high (300). Please set it to a value <= 258.":
      // a bound below riftco's own minimum is advice no one can follow.
      const std::string marker = "Please set it to a value <= ";
      if (const std::size_t at = said.find(marker); at != std::string::npos) {
        const long long most = std::atoll(said.c_str() + at + marker.size());
        throw ValueError("[train_tokenizer] the training text is too small for vocab_size " +
                         std::to_string(options.vocab_size) + ": SentencePiece can make at most " +
                         std::to_string(most) + " pieces from it" +
                         (most >= 260 ? " (give a vocab_size of at most that, or more text)"
                                      : ", and a tokenizer needs at least 260 (the 256 bytes, <unk> and 3 more): "
                                        "give more text"));
      }
      throw ValueError("[train_tokenizer] SentencePiece refused the training (" + said + ")");
    }
  }
  Tokenizer tokenizer = Tokenizer::from_serialized(model, output);  // checked before anything is written
  if (!output.parent_path().empty()) {
    std::error_code ec;  // a failure shows in the write below, with its reason
    std::filesystem::create_directories(output.parent_path(), ec);
  }
  write_file_atomically(output, model);
  return tokenizer;
}

}  // namespace riftco_transformer
