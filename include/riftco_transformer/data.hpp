#pragma once
// Training data: tokenizers (tokenizer.hpp), text files and the default corpus, a
// pretraining token stream (TextDataset) and a post-training chat set
// (ChatDataset). See docs/data.md for the split rules and target layouts.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/random.hpp"
#include "riftco_transformer/tokenizer.hpp"

namespace riftco_transformer {

/// Target value the losses skip (cross_entropy's default ignore_index).
inline constexpr std::int32_t kIgnoreTarget = -100;

/// Byte offset of the first invalid UTF-8 sequence (strict: no overlong
/// forms, no surrogates, nothing above U+10FFFF); nullopt when valid.
std::optional<std::size_t> first_invalid_utf8(std::string_view text);

/// /usr/share/games/fortunes (Debian package `fortunes`).
std::filesystem::path default_corpus_dir();
/// load_fortune_corpus(default_corpus_dir()).
std::string load_default_corpus();
/// Every plain fortune file in `dir` (regular files without an extension;
/// *.dat, *.u8, links and folders skipped), sorted by name. Each "%"
/// separator line becomes a blank line: fortunes end up separated by exactly
/// one empty line. DataError with an install hint when nothing is found.
std::string load_fortune_corpus(const std::filesystem::path& dir);
/// A user text file (`--data PATH`): must exist, be a regular file, be
/// non-empty and valid UTF-8 (the error gives the first bad byte offset).
std::string load_text_file(const std::filesystem::path& path);

/// batch rows of seq_len positions, row-major; targets[i] is the id the model
/// should predict at position i, or kIgnoreTarget.
struct TokenBatch {
  std::vector<std::int32_t> tokens;   // (batch, seq_len)
  std::vector<std::int32_t> targets;  // (batch, seq_len)
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
};

enum class Split { Train, Validation };

/// The part of `text` a TextDataset with the byte tokenizer holds out
/// (Validation: the last floor(fraction * bytes) bytes, the cut moved forward
/// to a UTF-8 character boundary) or trains on (Train: the rest). Subword
/// tokenizers split the text here too, so every tokenizer holds out the same
/// text and validation bits per byte compare. ValueError for a fraction
/// outside [0, 1).
std::string_view split_text(std::string_view text, Split split, double validation_fraction);

/// A token stream split by position: the first tokens are Train, the last
/// ones Validation: for bytes, the last floor(validation_fraction * count)
/// tokens; for a subword tokenizer, encode() of each part of split_text()
/// (so no token straddles the cut). No window crosses the boundary.
class TextDataset {
 public:
  /// validation_fraction in [0, 1); ValueError otherwise.
  explicit TextDataset(std::string_view text, const Tokenizer& tokenizer = Tokenizer{},
                       double validation_fraction = 0.1);

  std::int64_t train_tokens() const { return train_count_; }
  std::int64_t validation_tokens() const { return static_cast<std::int64_t>(tokens_.size()) - train_count_; }
  /// The ids of one split, in stream order.
  std::span<const std::int32_t> tokens(Split split) const;

  /// `batch` windows, each start drawn uniformly from the split (one
  /// random.below per row, in row order): tokens = stream[s, s + seq_len),
  /// targets = stream[s + 1, s + seq_len + 1). DataError when the split has
  /// fewer than seq_len + 1 tokens; ValueError for batch or seq_len < 1.
  TokenBatch sample_batch(Random& random, std::int64_t batch, std::int64_t seq_len, Split split = Split::Train) const;

 private:
  std::vector<std::int32_t> tokens_;
  std::int64_t train_count_ = 0;
};

/// One prompt/response pair, tokenized. With s = encode(prompt) followed by
/// encode(response) (for bytes: the bytes of prompt + response), P = the
/// prompt's token count, L = |s|: tokens = s[0, L-1), targets[i] = s[i+1] when
/// i + 1 >= P (the next byte is a response byte) and kIgnoreTarget otherwise.
/// So positions 0..P-2 are masked and exactly |response| targets are real.
struct ChatExample {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
  std::int64_t prompt_tokens = 0;
  std::int64_t line = 0;  // 1-based line in the source file
};

/// Post-training pairs from JSON Lines: one {"prompt": str, "response": str}
/// object per line (extra keys ignored, blank lines skipped, both strings
/// non-empty). Example k (0-based, in file order) is Validation when there
/// are at least 10 examples and k % 10 == 9; otherwise it is Train.
class ChatDataset {
 public:
  /// DataError "[data] <path>: line N: <what>" for the first bad line, or
  /// "[data] <path>: <what>" for a missing/empty file.
  static ChatDataset load(const std::filesystem::path& path, const Tokenizer& tokenizer = Tokenizer{});
  /// Same rules on in-memory text; `source` names it in errors.
  static ChatDataset parse(std::string_view jsonl, const std::string& source,
                           const Tokenizer& tokenizer = Tokenizer{});

  const std::vector<ChatExample>& examples(Split split) const;
  std::int64_t size(Split split) const { return static_cast<std::int64_t>(examples(split).size()); }
  /// Longest tokens() of any example (the seq_len that never truncates).
  std::int64_t max_length() const { return max_length_; }

  /// `batch` examples drawn uniformly (one random.below per row) from those
  /// with a response token within seq_len (an example whose prompt fills
  /// the sequence has no target: it is never drawn). Each row is the
  /// example's tokens/targets cut to seq_len, then padded with token 0 and
  /// target kIgnoreTarget. DataError when the split is empty or no example
  /// of it has a target within seq_len.
  TokenBatch sample_batch(Random& random, std::int64_t batch, std::int64_t seq_len, Split split = Split::Train) const;

 private:
  std::vector<ChatExample> train_;
  std::vector<ChatExample> validation_;
  std::int64_t max_length_ = 0;
};

}  // namespace riftco_transformer
