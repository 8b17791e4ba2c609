// rt-generate: model state (+ optional LoRA adapters) + prompt → text.
#include <iostream>

#include "cli.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/pipelines.hpp"

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
  std::string model_path, adapter_path, tokenizer_path, prompt = "\n";
  GenerationOptions o;
  o.max_new_tokens = 200;
  o.temperature = 0.8F;
  o.top_k = 40;
  LoadOptions load;
  // Required, but checked after parsing: a --config file may name it.
  app.add_option("--model", model_path, "model-state file (required)")->type_name("PATH");
  app.add_option("--adapter", adapter_path, "LoRA adapter file to apply")->type_name("PATH");
  app.add_option("--tokenizer", tokenizer_path,
                 "SentencePiece model the model was trained with (default: the one it records, or bytes)")
      ->type_name("PATH");
  app.add_option("--prompt", prompt, "text to continue (default: a newline)")
      ->type_name("TEXT")
      ->default_str("");  // the default "\n" would break the help's column layout
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate")
      ->type_name("N")
      ->check(rt_cli::integer_at_least(0));
  app.add_option("--temperature", o.temperature, "0 = greedy")
      ->type_name("T")
      ->check(rt_cli::kFiniteFloat);
  app.add_option("--top-k", o.top_k, "sample from the K most likely and any tied with the K-th, as Hugging Face (0 = all)")
      ->type_name("K")
      ->check(rt_cli::integer_at_least(0));
  app.add_option("--seed", o.seed, "sampling seed (sample i of --num-samples uses seed + i*0x9E3779B97F4A7C15)")
      ->type_name("S")
      ->check(rt_cli::kUnsigned64);
  app.add_option("--top-p", o.top_p, "nucleus sampling: the smallest set of tokens with mass >= P (1 = off)")
      ->type_name("P")
      ->check(rt_cli::kFiniteFloat);
  app.add_option("--repetition-penalty", o.repetition_penalty,
                 "divide positive / multiply negative logits of tokens already seen (1 = off)")
      ->type_name("R")
      ->check(rt_cli::kFiniteFloat);
  app.add_option("--stop", o.stop, "stop when the generated text contains TEXT (repeatable; not printed)")
      ->type_name("TEXT")
      ->allow_extra_args(false);
  std::vector<long long> stop_tokens;
  app.add_option("--stop-token", stop_tokens,
                 "stop at this token id (repeatable; default: the tokenizer's end-of-sequence id, if it has one)")
      ->type_name("ID")
      ->allow_extra_args(false)
      ->check(rt_cli::integer_in(0, 2147483647));
  bool ignore_eos = false;
  app.add_flag("--ignore-eos", ignore_eos, "do not stop at the tokenizer's end-of-sequence id");
  app.add_option("--num-samples", o.num_samples, "independent samples, printed one after another")
      ->type_name("N")
      ->check(rt_cli::integer_at_least(1));
  app.add_flag("--allow-non-finite", load.allow_non_finite,
               "load weights holding NaN or infinity (refused by default)");
  app.add_flag("--allow-base-mismatch", load.allow_base_mismatch,
               "apply an adapter trained on another base model of the same dimensions");
  std::string device = "cpu";
  rt_cli::add_device_option(app, device);
  rt_cli::add_config_option(app);
  return rt_cli::run_tool("rt-generate", app, argc, argv, [&](bool& running) {
    if (model_path.empty()) throw rt_cli::UsageError("--model PATH is required");
    const Backend backend = rt_cli::device_to_use("rt-generate", device);
    if (prompt.empty()) throw rt_cli::UsageError("--prompt must not be empty");
    if (o.temperature < 0.0F) throw rt_cli::UsageError("option '--temperature' must be >= 0 (0 = greedy)");
    if (!(o.top_p > 0.0F && o.top_p <= 1.0F)) throw rt_cli::UsageError("option '--top-p' must be in (0, 1]");
    if (!(o.repetition_penalty > 0.0F)) throw rt_cli::UsageError("option '--repetition-penalty' must be > 0");
    for (const std::string& stop : o.stop) {
      if (stop.empty()) throw rt_cli::UsageError("option '--stop' must not be empty");
    }
    o.validate();
    // The model's tokenizer: the given one must be the recorded one (a
    // mismatch is a usage error: exit 2).
    const Tokenizer tokenizer = tokenizer_for_model(model_path, tokenizer_path, true);
    if (!tokenizer.is_bytes()) {  // text and stop strings through the subword decoder
      o.detokenize = [tokenizer](std::span<const std::int32_t> ids) { return tokenizer.decode(ids); };
    }
    // Stop tokens: the ones given, else the tokenizer's end-of-sequence id
    // (Hugging Face's generate stops at eos_token_id the same way).
    for (const long long id : stop_tokens) o.stop_tokens.push_back(static_cast<std::int32_t>(id));
    if (stop_tokens.empty() && !ignore_eos && tokenizer.eos_id() >= 0) o.stop_tokens.push_back(tokenizer.eos_id());
    running = true;
    std::unique_ptr<DecoderOnlyTransformer> model =
        load_model(model_path, FullSequenceAttentionKind::Materialized, ActivationCheckpointingKind::Disabled, load);
    if (!adapter_path.empty()) load_adapter_state(*model, adapter_path, load);
    if (backend != Backend::Cpu) model->to(backend);  // adapters included
    std::vector<std::int32_t> ids = tokenizer.encode(prompt);
    const std::int64_t context = model->dimensions().context_length;
    if (static_cast<std::int64_t>(ids.size()) > context) {
      std::cerr << "rt-generate: the prompt has " << ids.size() << " tokens; keeping the last " << context
                << " (the context length)\n";
      ids.erase(ids.begin(), ids.end() - context);
    }
    const std::vector<GenerationResult> samples = generate_samples(*model, ids, o);
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const GenerationResult& r = samples[i];
      // Several samples: a header line before each, so they split clearly.
      if (samples.size() > 1) std::cout << "=== sample " << i + 1 << "/" << samples.size() << " ===\n";
      std::cout << printable(prompt + r.text) << "\n";  // r.text ends before a matched --stop
      if (r.reached_context) std::cerr << "rt-generate: " << (samples.size() > 1 ? "sample " + std::to_string(i + 1) + ": " : "") << r.message << "\n";
    }
    return 0;
  });
}
