// tokenizer_for_model(): the tokenizer a model-state file was trained with.
#include <system_error>

#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"

namespace riftco_transformer {
namespace {

Tokenizer check_vocab(Tokenizer tokenizer, const std::filesystem::path& model) {
  const TransformerDimensions d = read_model_dimensions(model);
  if (tokenizer.vocab_size() != d.vocab_size) {
    throw ValueError("[tokenizer] " + model.string() + " has a vocabulary of " + std::to_string(d.vocab_size) +
                     " but the tokenizer, " + tokenizer.description() + ", has " +
                     std::to_string(tokenizer.vocab_size()));
  }
  return tokenizer;
}

}  // namespace

Tokenizer tokenizer_for_model(const std::filesystem::path& model, const std::filesystem::path& given,
                              bool use_recorded) {
  const TokenizerRecord recorded = read_model_tokenizer(model);
  const std::int64_t vocab = read_model_dimensions(model).vocab_size;
  // A model that records no tokenizer and is not byte-level (an HF import)
  // takes any tokenizer of its vocabulary size (check_vocab).
  const bool unrecorded_subword = recorded.empty() && vocab != Tokenizer{}.vocab_size();
  const std::string recorded_text =
      recorded.empty() ? std::string("the byte tokenizer")
                       : "tokenizer " + recorded.path + " (checksum " + recorded.checksum + ")";
  if (!given.empty()) {
    Tokenizer tokenizer = Tokenizer::load(given);
    if (tokenizer.checksum() != recorded.checksum && !unrecorded_subword) {
      throw ValueError("[tokenizer] " + model.string() + " was trained with " + recorded_text + ", not with " +
                       given.string() + " (checksum " + tokenizer.checksum() + ")");
    }
    return check_vocab(std::move(tokenizer), model);
  }
  if (recorded.empty()) {
    if (unrecorded_subword) {
      throw ValueError("[tokenizer] " + model.string() + " has a vocabulary of " + std::to_string(vocab) +
                       " and records no tokenizer (an HF import?): name one of that vocabulary size (tokenizer / "
                       "--tokenizer); the byte tokenizer has 256");
    }
    return check_vocab(Tokenizer{}, model);
  }
  if (!use_recorded) {
    throw ValueError("[tokenizer] " + model.string() + " was trained with " + recorded_text +
                     "; name it (tokenizer / --tokenizer): the byte tokenizer does not fit this model");
  }
  const std::filesystem::path as_recorded(recorded.path);
  const std::filesystem::path beside = model.parent_path() / as_recorded.filename();
  // The first candidate whose checksum matches; each other one is named with why it was passed over.
  std::string tried;
  for (const std::filesystem::path& candidate : {as_recorded, beside}) {
    std::error_code ec;
    if (candidate == beside && std::filesystem::equivalent(as_recorded, beside, ec)) continue;  // the same file
    std::string why;
    if (!std::filesystem::is_regular_file(candidate, ec)) {
      why = std::filesystem::exists(candidate, ec) ? "not a regular file" : "not found";
    } else {
      try {
        Tokenizer tokenizer = Tokenizer::load(candidate);
        if (tokenizer.checksum() == recorded.checksum) return check_vocab(std::move(tokenizer), model);
        why = "has checksum " + tokenizer.checksum() + " (retrained or replaced)";
      } catch (const Error& e) {
        why = std::string("cannot be loaded: ") + e.what();
      }
    }
    tried += (tried.empty() ? "" : "; ") + candidate.string() + " " + why;
  }
  throw ValueError("[tokenizer] " + model.string() + " was trained with " + recorded_text +
                   ", and no candidate matches: " + tried + "; pass the original with --tokenizer");
}

}  // namespace riftco_transformer
