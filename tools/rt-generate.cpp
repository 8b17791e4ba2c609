// rt-generate: model state (+ optional LoRA adapters) + prompt → text.
#include <iostream>

#include "cli.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/decode.hpp"

using namespace riftco_transformer;

namespace {

/// Bytes → printable text: invalid UTF-8 sequences become U+FFFD.
std::string printable(std::string bytes) {
  std::string out;
  std::string_view rest = bytes;
  while (!rest.empty()) {
    const auto bad = first_invalid_utf8(rest);
    if (!bad) {
      out += rest;
      break;
    }
    out += rest.substr(0, *bad);
    out += "\xEF\xBF\xBD";
    rest.remove_prefix(*bad + 1);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  rt_cli::Parser p("rt-generate", "Generates text from a saved model with incremental (K/V-cached) decoding.");
  p.add("model", "PATH", "model-state file (required)");
  p.add("adapter", "PATH", "LoRA adapter file to apply");
  p.add("prompt", "TEXT", "text to continue", "\"\\n\"");
  p.add("max-new-tokens", "N", "bytes to generate", "200");
  p.add("temperature", "T", "0 = greedy", "0.8");
  p.add("top-k", "K", "sample from the K most likely (0 = all)", "40");
  p.add("seed", "S", "sampling seed", "0");
  p.add("allow-non-finite", "", "load weights holding NaN or infinity (refused by default)");
  p.add("allow-base-mismatch", "", "apply an adapter trained on another base model of the same dimensions");
  try {
    p.parse(argc, argv, 1);
    if (p.help()) {
      std::cout << p.usage("--model PATH [options]");
      return 0;
    }
    if (!p.has("model")) throw rt_cli::UsageError("--model PATH is required");
    GenerationOptions o;
    o.max_new_tokens = p.integer("max-new-tokens", 200);
    if (o.max_new_tokens < 0) throw rt_cli::UsageError("option '--max-new-tokens' must be >= 0");
    o.temperature = static_cast<float>(p.number("temperature", 0.8));
    if (o.temperature < 0.0F) throw rt_cli::UsageError("option '--temperature' must be >= 0 (0 = greedy)");
    o.top_k = p.integer("top-k", 40);
    if (o.top_k < 0) throw rt_cli::UsageError("option '--top-k' must be >= 0 (0 = all tokens)");
    const std::int64_t seed = p.integer("seed", 0);
    if (seed < 0) throw rt_cli::UsageError("option '--seed' must be >= 0");
    o.seed = static_cast<std::uint64_t>(seed);
    const std::string prompt = p.text("prompt", "\n");
    if (prompt.empty()) throw rt_cli::UsageError("--prompt must not be empty");
    LoadOptions load;
    load.allow_non_finite = p.has("allow-non-finite");
    load.allow_base_mismatch = p.has("allow-base-mismatch");
    std::unique_ptr<DecoderOnlyTransformer> model = load_model(
        p.text("model"), FullSequenceAttentionKind::Materialized, ActivationCheckpointingKind::Disabled, load);
    if (model->dimensions().vocab_size != ByteTokenizer::kVocabSize) {
      throw ValueError("[rt-generate] the model's vocabulary is " + std::to_string(model->dimensions().vocab_size) +
                       "; rt-generate decodes byte tokens (256)");
    }
    if (p.has("adapter")) load_adapter_state(*model, p.text("adapter"), load);
    ByteTokenizer tokenizer;
    std::vector<std::int32_t> ids = tokenizer.encode(prompt);
    const std::int64_t context = model->dimensions().context_length;
    if (static_cast<std::int64_t>(ids.size()) > context) {
      std::cerr << "rt-generate: the prompt has " << ids.size() << " bytes; keeping the last " << context
                << " (the context length)\n";
      ids.erase(ids.begin(), ids.end() - context);
    }
    const GenerationResult r = generate(*model, ids, o);
    std::cout << printable(prompt + tokenizer.decode(r.tokens)) << "\n";
    if (r.reached_context) std::cerr << "rt-generate: " << r.message << "\n";
    return 0;
  } catch (const rt_cli::UsageError& e) {
    std::cerr << "rt-generate: " << e.what() << "\nTry 'rt-generate --help'.\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "rt-generate: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "rt-generate: error: " << e.what() << "\n";
    return 1;
  }
}
