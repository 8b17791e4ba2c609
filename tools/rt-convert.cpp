// rt-convert: Hugging Face Llama checkpoints ↔ model-state files.
//   rt-convert --from-hf DIR --output model.safetensors
//   rt-convert --to-hf model.safetensors --output DIR
// Exit codes as every rt-* tool (tools/cli.hpp): usage errors 2 with a hint,
// failures during the conversion 1 with "rt-convert: error: message".
#include <iostream>

#include "cli.hpp"
#include "riftco_transformer/hf_llama.hpp"

using namespace riftco_transformer;

int main(int argc, char** argv) {
  CLI::App app("Converts transformers LlamaForCausalLM checkpoints (config.json + safetensors, one file or "
               "sharded; F32, F16 or BF16) to riftco model-state files and back. Grouped-query attention, tied "
               "embeddings, rope_theta and rms_norm_eps carry over; anything else config.json asks for that this "
               "model lacks (rope_scaling, biases, another activation) is refused naming the field.",
               "rt-convert");
  rt_cli::style(app);
  std::string from_hf, to_hf, output;
  LoadOptions load;
  CLI::Option* from = app.add_option("--from-hf", from_hf, "transformers checkpoint directory to read")->type_name("DIR");
  CLI::Option* to = app.add_option("--to-hf", to_hf, "model-state file to write as a transformers checkpoint")
                        ->type_name("PATH");
  from->excludes(to);
  // Required, but checked after parsing: a --config file may name it.
  app.add_option("--output", output,
                 "--from-hf: the model-state file to write; --to-hf: the directory to write (config.json and "
                 "model.safetensors) (required)")
      ->type_name("PATH");
  app.add_flag("--allow-non-finite", load.allow_non_finite, "convert weights holding NaN or infinity (refused by default)");
  rt_cli::add_config_option(app);
  return rt_cli::run_tool("rt-convert", app, argc, argv, [&](bool& running) {
    if (from_hf.empty() && to_hf.empty()) throw rt_cli::UsageError("give --from-hf DIR or --to-hf PATH");
    // The command line refuses both (excludes); one from a --config file and
    // the other from the command line meet only here.
    if (!from_hf.empty() && !to_hf.empty()) throw rt_cli::UsageError("give --from-hf DIR or --to-hf PATH, not both");
    if (app.count("--output") == 0) throw rt_cli::UsageError("--output PATH is required");
    if (output.empty()) throw rt_cli::UsageError("--output must not be empty");
    // `running` stays false: the conversions' ValueErrors are about their
    // arguments (an --output that would replace the input), so usage errors;
    // a failed read or write is a ModelStateError (exit 1).
    (void)running;
    if (!from_hf.empty()) {
      convert_from_hf(from_hf, output, load);
      std::cout << "rt-convert: wrote " << output << " from " << from_hf << "\n";
    } else {
      convert_to_hf(to_hf, output, load);
      std::cout << "rt-convert: wrote " << output << "/config.json and " << output << "/model.safetensors from "
                << to_hf << "\n";
    }
    return 0;
  });
}
