// TextDataset: one token stream, split by position, sampled as random windows.
#include <cmath>

#include "riftco_transformer/data.hpp"
#include "sampling.hpp"

namespace riftco_transformer {

TextDataset::TextDataset(std::string_view text, const Tokenizer& tokenizer, double validation_fraction) {
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
    throw ValueError("[TextDataset] validation_fraction " + std::to_string(validation_fraction) +
                     " must be in [0, 1)");
  }
  if (tokenizer.is_bytes()) {
    tokens_ = tokenizer.encode(text);
    const auto count = static_cast<std::int64_t>(tokens_.size());
    const auto validation = static_cast<std::int64_t>(std::floor(validation_fraction * static_cast<double>(count)));
    train_count_ = count - validation;
    return;
  }
  tokens_ = tokenizer.encode(split_text(text, Split::Train, validation_fraction));
  train_count_ = static_cast<std::int64_t>(tokens_.size());
  const std::vector<std::int32_t> held_out = tokenizer.encode(split_text(text, Split::Validation, validation_fraction));
  tokens_.insert(tokens_.end(), held_out.begin(), held_out.end());
}

std::string_view split_text(std::string_view text, Split split, double validation_fraction) {
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
    throw ValueError("[split_text] validation_fraction " + std::to_string(validation_fraction) + " must be in [0, 1)");
  }
  const auto held = static_cast<std::size_t>(std::floor(validation_fraction * static_cast<double>(text.size())));
  std::size_t cut = text.size() - held;
  while (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) ++cut;
  return split == Split::Train ? text.substr(0, cut) : text.substr(cut);
}

std::span<const std::int32_t> TextDataset::tokens(Split split) const {
  const std::span<const std::int32_t> all(tokens_);
  return split == Split::Train ? all.first(static_cast<std::size_t>(train_count_))
                               : all.subspan(static_cast<std::size_t>(train_count_));
}

TokenBatch TextDataset::sample_batch(Random& random, std::int64_t batch, std::int64_t seq_len, Split split) const {
  data_detail::check_batch_shape("TextDataset::sample_batch", batch, seq_len);
  const std::span<const std::int32_t> stream = tokens(split);
  const auto size = static_cast<std::int64_t>(stream.size());
  if (size < seq_len + 1) {
    throw DataError(std::string("[data] ") + data_detail::split_name(split) + " split has " + std::to_string(size) +
                    " tokens; seq_len " + std::to_string(seq_len) + " needs at least " +
                    std::to_string(seq_len + 1));
  }
  TokenBatch out;
  out.batch = batch;
  out.seq_len = seq_len;
  out.tokens.resize(static_cast<std::size_t>(batch * seq_len));   // (B, T)
  out.targets.resize(static_cast<std::size_t>(batch * seq_len));  // (B, T)
  const auto starts = static_cast<std::uint64_t>(size - seq_len);  // s in [0, size - seq_len - 1]
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto s = static_cast<std::size_t>(data_detail::draw_index(random, starts));
    const auto row = static_cast<std::size_t>(b * seq_len);
    for (std::int64_t t = 0; t < seq_len; ++t) {
      out.tokens[row + static_cast<std::size_t>(t)] = stream[s + static_cast<std::size_t>(t)];
      out.targets[row + static_cast<std::size_t>(t)] = stream[s + static_cast<std::size_t>(t) + 1];
    }
  }
  return out;
}

}  // namespace riftco_transformer
