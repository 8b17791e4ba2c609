// rt-eval: loss, perplexity and bits per byte of a saved model on a text.
//   rt-eval --model M [--adapter A] [--tokenizer T] --data FILE [--split all|train|validation]
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/evaluation.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;

int main(int argc, char** argv) {
  CLI::App app("Evaluates a saved model on a text: mean loss (nats per token), perplexity and bits per byte "
               "(comparable across tokenizers). The text is cut into non-overlapping windows of the sequence "
               "length; every token but the first is scored once.",
               "rt-eval");
  rt_cli::style(app);
  std::string model_path, adapter_path, tokenizer_path, data, split = "all";
  double validation_fraction = 0.1;
  EvaluationOptions o;
  bool json = false;
  LoadOptions load;
  // Required, but checked after parsing: a --config file may name it.
  app.add_option("--model", model_path, "model-state file (required)")->type_name("PATH");
  app.add_option("--adapter", adapter_path, "LoRA adapter file to apply")->type_name("PATH");
  app.add_option("--tokenizer", tokenizer_path,
                 "SentencePiece model the model was trained with (default: the one it records, or bytes)")
      ->type_name("PATH");
  app.add_option("--data", data, "UTF-8 text file (default: the default corpus)")->type_name("PATH");
  app.add_option("--split", split,
                 "which part of the text: all, or the train/validation part a pretraining run with "
                 "--validation-fraction holds out (the same text for every tokenizer)")
      ->type_name("PART")
      ->check(CLI::IsMember({"all", "train", "validation"}));
  app.add_option("--validation-fraction", validation_fraction, "tail of the text held out (with --split)")
      ->type_name("F")
      ->check(rt_cli::kFiniteFloat);
  app.add_option("--batch", o.batch, "windows per forward pass")->type_name("N")->check(rt_cli::integer_at_least(1));
  app.add_option("--sequence-length", o.sequence_length, "window length (0: the model's context length)")
      ->type_name("N")
      ->check(rt_cli::integer_at_least(0));
  app.add_flag("--json", json, "print one JSON object instead of text");
  app.add_flag("--allow-non-finite", load.allow_non_finite, "load weights holding NaN or infinity");
  app.add_flag("--allow-base-mismatch", load.allow_base_mismatch,
               "apply an adapter trained on another base model of the same dimensions");
  std::string device = "cpu";
  rt_cli::add_device_option(app, device);
  rt_cli::add_config_option(app);
  return rt_cli::run_tool("rt-eval", app, argc, argv, [&](bool& running) {
    if (model_path.empty()) throw rt_cli::UsageError("--model PATH is required");
    const Backend backend = rt_cli::device_to_use("rt-eval", device);
    if (app.count("--data") > 0 && data.empty()) {
      throw rt_cli::UsageError("option '--data' must name a file (leave it out for the default corpus)");
    }
    if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
      throw rt_cli::UsageError("option '--validation-fraction' must be in [0, 1)");
    }
    const Tokenizer tokenizer = tokenizer_for_model(model_path, tokenizer_path, true);
    // evaluate() checks these too, but after `running`: a bad option value
    // is a usage error (exit 2), checked against the model's header.
    if (o.batch > 65536) {
      throw rt_cli::UsageError("option '--batch' must be in [1, 65536], got " + std::to_string(o.batch));
    }
    const std::int64_t context = read_model_dimensions(model_path).context_length;
    if (o.sequence_length > context) {
      throw rt_cli::UsageError("option '--sequence-length' must be at most the model's context length " +
                               std::to_string(context) + " (0: the context length), got " +
                               std::to_string(o.sequence_length));
    }
    running = true;
    std::unique_ptr<DecoderOnlyTransformer> model =
        load_model(model_path, FullSequenceAttentionKind::Flash, ActivationCheckpointingKind::Disabled, load);
    if (!adapter_path.empty()) load_adapter_state(*model, adapter_path, load);
    if (backend != Backend::Cpu) model->to(backend);  // adapters included
    const std::string text = data.empty() ? load_default_corpus() : load_text_file(data);
    std::string_view part = text;
    if (split != "all") part = split_text(text, split == "train" ? Split::Train : Split::Validation, validation_fraction);
    const EvaluationResult r = evaluate(*model, part, tokenizer, o);
    if (json) {
      const nlohmann::json out = {{"loss", r.loss},         {"perplexity", r.perplexity},
                                  {"bits_per_byte", r.bits_per_byte}, {"tokens", r.tokens},
                                  {"bytes", r.bytes},       {"tokenizer", tokenizer.description()},
                                  {"split", split}};
      std::cout << out.dump() << "\n";
    } else {
      char line[256];
      std::snprintf(line, sizeof line, "loss %.4f nats/token  perplexity %.3f  bits per byte %.4f  (%lld tokens, %lld bytes)",
                    r.loss, r.perplexity, r.bits_per_byte, static_cast<long long>(r.tokens),
                    static_cast<long long>(r.bytes));
      std::cout << line << "\n";
    }
    return 0;
  });
}
