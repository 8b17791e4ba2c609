// evaluate(): loss, perplexity and bits per byte over non-overlapping windows.
#include "riftco_transformer/evaluation.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "riftco_transformer/data.hpp"
#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

EvaluationResult evaluate(DecoderOnlyTransformer& model, std::string_view text, const Tokenizer& tokenizer,
                          const EvaluationOptions& options) {
  const TransformerDimensions& d = model.dimensions();
  if (options.batch < 1 || options.batch > 65536) {
    throw ValueError("[evaluate] batch must be in [1, 65536], got " + std::to_string(options.batch));
  }
  if (options.sequence_length < 0 || options.sequence_length > d.context_length) {
    throw ValueError("[evaluate] sequence_length must be in [0, context_length " + std::to_string(d.context_length) +
                     "] (0: the context length), got " + std::to_string(options.sequence_length));
  }
  if (tokenizer.vocab_size() != d.vocab_size) {
    throw ValueError("[evaluate] the tokenizer's vocabulary is " + std::to_string(tokenizer.vocab_size()) + " (" +
                     tokenizer.description() + "), the model's is " + std::to_string(d.vocab_size));
  }
  if (!tokenizer.is_bytes()) {
    if (const auto bad = first_invalid_utf8(text)) {
      throw DataError("[evaluate] the text is not valid UTF-8 (first bad byte at offset " + std::to_string(*bad) + ")");
    }
  }
  const std::vector<std::int32_t> ids = tokenizer.encode(text);
  if (ids.size() < 2) {
    throw DataError("[evaluate] the text gives " + std::to_string(ids.size()) + " token(s); at least 2 are needed");
  }
  if (tokenizer.byte_length(ids) != static_cast<std::int64_t>(text.size())) {
    throw DataError("[evaluate] " + tokenizer.description() + " does not reproduce the text byte for byte (" +
                    std::to_string(tokenizer.byte_length(ids)) + " bytes from " + std::to_string(text.size()) +
                    "): bits per byte would be wrong");
  }
  const std::int64_t window = options.sequence_length > 0 ? options.sequence_length : d.context_length;
  const auto scored = static_cast<std::int64_t>(ids.size()) - 1;
  const std::int64_t windows = (scored + window - 1) / window;

  const DecoderOnlyTransformer::EvaluationGuard evaluating;  // this thread only; the flag stays
  NoGradGuard no_graph;
  double total_nats = 0.0;
  for (std::int64_t first = 0; first < windows; first += options.batch) {
    if (options.interrupt) options.interrupt();
    const std::int64_t rows = std::min(options.batch, windows - first);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows * window), 0);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(rows * window), kIgnoreTarget);
    std::int64_t real = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t start = (first + r) * window;
      const std::int64_t n = std::min(window, scored - start);
      for (std::int64_t t = 0; t < n; ++t) {
        tokens[static_cast<std::size_t>(r * window + t)] = ids[static_cast<std::size_t>(start + t)];
        targets[static_cast<std::size_t>(r * window + t)] = ids[static_cast<std::size_t>(start + t + 1)];
      }
      real += n;
    }
    const float mean = model.loss(tokens, targets, rows).value().item();  // read on the host
    total_nats += static_cast<double>(mean) * static_cast<double>(real);
  }

  EvaluationResult result;
  result.tokens = scored;
  result.bytes = tokenizer.byte_length(std::span<const std::int32_t>(ids).subspan(1));
  result.loss = total_nats / static_cast<double>(scored);
  result.perplexity = std::exp(result.loss);
  if (result.bytes > 0) {
    result.bits_per_byte =
        result.loss / std::numbers::ln2 * (static_cast<double>(result.tokens) / static_cast<double>(result.bytes));
  }
  return result;
}

}  // namespace riftco_transformer
