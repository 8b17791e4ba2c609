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
  CLI::App app("Generates text from a saved model with incremental (K/V-cached) decoding.", "rt-generate");
  rt_cli::style(app);
  std::string model_path, adapter_path, prompt = "\n";
  GenerationOptions o;
  o.max_new_tokens = 200;
  o.temperature = 0.8F;
  o.top_k = 40;
  LoadOptions load;
  app.add_option("--model", model_path, "model-state file")->type_name("PATH")->required();
  app.add_option("--adapter", adapter_path, "LoRA adapter file to apply")->type_name("PATH");
  app.add_option("--prompt", prompt, "text to continue")->type_name("TEXT");
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate")
      ->type_name("N")
      ->check(rt_cli::integer_at_least(0));
  app.add_option("--temperature", o.temperature, "0 = greedy")
      ->type_name("T")
      ->check(rt_cli::kFiniteFloat);
  app.add_option("--top-k", o.top_k, "sample from the K most likely (0 = all)")
      ->type_name("K")
      ->check(rt_cli::integer_at_least(0));
  app.add_option("--seed", o.seed, "sampling seed")->type_name("S")->check(rt_cli::integer_at_least(0));
  app.add_flag("--allow-non-finite", load.allow_non_finite,
               "load weights holding NaN or infinity (refused by default)");
  app.add_flag("--allow-base-mismatch", load.allow_base_mismatch,
               "apply an adapter trained on another base model of the same dimensions");
  rt_cli::add_config_option(app);
  return rt_cli::run_tool("rt-generate", app, argc, argv, [&](bool& running) {
    if (prompt.empty()) throw rt_cli::UsageError("--prompt must not be empty");
    if (o.temperature < 0.0F) throw rt_cli::UsageError("option '--temperature' must be >= 0 (0 = greedy)");
    running = true;
    std::unique_ptr<DecoderOnlyTransformer> model =
        load_model(model_path, FullSequenceAttentionKind::Materialized, ActivationCheckpointingKind::Disabled, load);
    if (model->dimensions().vocab_size != ByteTokenizer::kVocabSize) {
      throw ValueError("[rt-generate] the model's vocabulary is " + std::to_string(model->dimensions().vocab_size) +
                       "; rt-generate decodes byte tokens (256)");
    }
    if (!adapter_path.empty()) load_adapter_state(*model, adapter_path, load);
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
  });
}
