// ChatDataset: prompt/response pairs from JSON Lines, loss on response bytes.
#include <algorithm>

#include "../io/json_read.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/data.hpp"
#include "sampling.hpp"

namespace riftco_transformer {
namespace {

[[noreturn]] void fail_line(const std::string& source, std::int64_t line, const std::string& what) {
  throw DataError("[data] " + source + ": line " + std::to_string(line) + ": " + what);
}

std::string string_field(const detail::Json& object, const char* key, const std::string& source,
                         std::int64_t line) {
  try {
    std::string value = detail::json_string(object, key);
    if (value.empty()) fail_line(source, line, std::string("\"") + key + "\" is empty");
    return value;
  } catch (const detail::JsonReadError& e) {
    fail_line(source, line, e.what());
  }
}

// s = encode(prompt) + encode(response); tokens = s[0, L-1); targets[i] =
// s[i+1] if i+1 >= P. For bytes this is the bytes of prompt + response.
ChatExample make_example(const Tokenizer& tokenizer, const std::string& prompt, const std::string& response,
                         std::int64_t line) {
  std::vector<std::int32_t> s = tokenizer.encode(prompt);
  const auto prompt_len = static_cast<std::int64_t>(s.size());
  const std::vector<std::int32_t> r = tokenizer.encode(response);
  s.insert(s.end(), r.begin(), r.end());
  ChatExample ex;
  ex.prompt_tokens = prompt_len;
  ex.line = line;
  ex.tokens.assign(s.begin(), s.end() - 1);
  ex.targets.resize(ex.tokens.size());
  for (std::size_t i = 0; i < ex.targets.size(); ++i) {
    ex.targets[i] = static_cast<std::int64_t>(i) + 1 >= prompt_len ? s[i + 1] : kIgnoreTarget;
  }
  return ex;
}

}  // namespace

ChatDataset ChatDataset::load(const std::filesystem::path& path, const Tokenizer& tokenizer) {
  std::string text;
  if (const auto why = read_regular_file(path, text)) throw DataError("[data] " + path.string() + ": " + *why);
  return parse(text, path.string(), tokenizer);
}

ChatDataset ChatDataset::parse(std::string_view jsonl, const std::string& source, const Tokenizer& tokenizer) {
  std::vector<ChatExample> all;
  std::int64_t line_number = 0;
  std::size_t pos = 0;
  while (pos < jsonl.size()) {
    std::size_t end = jsonl.find('\n', pos);
    if (end == std::string_view::npos) end = jsonl.size();
    const std::string_view line = jsonl.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank line
    detail::Json object;
    try {
      object = detail::parse_untrusted_json(line);  // bounded depth, no NUL bytes, no 1e999
    } catch (const detail::JsonReadError& e) {
      fail_line(source, line_number, detail::line_error(e));
    }
    if (!object.is_object()) fail_line(source, line_number, std::string("expected an object, got ") + object.type_name());
    const std::string prompt = string_field(object, "prompt", source, line_number);
    const std::string response = string_field(object, "response", source, line_number);
    all.push_back(make_example(tokenizer, prompt, response, line_number));
  }
  if (all.empty()) throw DataError("[data] " + source + ": no examples (the file is empty or blank)");
  ChatDataset out;
  const bool hold_out = all.size() >= 10;
  for (std::size_t k = 0; k < all.size(); ++k) {
    out.max_length_ = std::max(out.max_length_, static_cast<std::int64_t>(all[k].tokens.size()));
    (hold_out && k % 10 == 9 ? out.validation_ : out.train_).push_back(std::move(all[k]));
  }
  return out;
}

const std::vector<ChatExample>& ChatDataset::examples(Split split) const {
  return split == Split::Train ? train_ : validation_;
}

TokenBatch ChatDataset::sample_batch(Random& random, std::int64_t batch, std::int64_t seq_len, Split split) const {
  data_detail::check_batch_shape("ChatDataset::sample_batch", batch, seq_len);
  const std::vector<ChatExample>& pool = examples(split);
  if (pool.empty()) {
    throw DataError(std::string("[data] the ") + data_detail::split_name(split) +
                    " split has no examples (validation needs at least 10 in the file)");
  }
  // Only examples with a target within seq_len (the response's first token
  // is the target at position prompt_tokens - 1): a row whose response is
  // cut off entirely has nothing to learn or score, and a batch of such
  // rows was a loss of 0 with a step on zero gradients. With none cut off
  // the draws are what they were before the filter.
  std::vector<std::size_t> eligible;
  eligible.reserve(pool.size());
  for (std::size_t k = 0; k < pool.size(); ++k) {
    if (std::max<std::int64_t>(pool[k].prompt_tokens - 1, 0) < seq_len) eligible.push_back(k);
  }
  if (eligible.empty()) {
    throw DataError(std::string("[data] no ") + data_detail::split_name(split) +
                    " example has a response token within the sequence length " + std::to_string(seq_len) +
                    ": raise the sequence length or shorten the prompts");
  }
  TokenBatch out;
  out.batch = batch;
  out.seq_len = seq_len;
  out.tokens.assign(static_cast<std::size_t>(batch * seq_len), 0);                // (B, T), pad 0
  out.targets.assign(static_cast<std::size_t>(batch * seq_len), kIgnoreTarget);  // (B, T)
  for (std::int64_t b = 0; b < batch; ++b) {
    const ChatExample& ex = pool[eligible[data_detail::draw_index(random, eligible.size())]];
    const std::size_t n = std::min(ex.tokens.size(), static_cast<std::size_t>(seq_len));
    const auto row = out.tokens.begin() + b * seq_len;
    std::copy_n(ex.tokens.begin(), n, row);
    std::copy_n(ex.targets.begin(), n, out.targets.begin() + b * seq_len);
  }
  return out;
}

}  // namespace riftco_transformer
