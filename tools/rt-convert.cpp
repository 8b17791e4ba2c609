// rt-convert: Hugging Face Llama checkpoints ↔ model-state files.
//   rt-convert --from-hf DIR --output model.safetensors
//   rt-convert --to-hf model.safetensors --output DIR
// Usage errors exit 2 with a hint; runtime errors exit 1 with
// "rt-convert: error: message".
#include <CLI/CLI.hpp>
#include <iostream>

#include "riftco_transformer/hf_llama.hpp"

using namespace riftco_transformer;

int main(int argc, char** argv) {
  CLI::App app("Converts transformers LlamaForCausalLM checkpoints (config.json + safetensors, single file or "
               "sharded) to riftco model-state files and back.",
               "rt-convert");
  std::string from_hf;
  std::string to_hf;
  std::string output;
  bool allow_non_finite = false;
  auto* from = app.add_option("--from-hf", from_hf, "transformers checkpoint directory to read")->type_name("DIR");
  auto* to = app.add_option("--to-hf", to_hf, "model-state file to write as a transformers checkpoint")
                 ->type_name("PATH");
  from->excludes(to);
  app.add_option("--output", output,
                 "with --from-hf: the model-state file to write; with --to-hf: the directory to write "
                 "(config.json, model.safetensors)")
      ->type_name("PATH")
      ->required();
  app.add_flag("--allow-non-finite", allow_non_finite, "convert weights holding NaN or infinity (refused by default)");
  try {
    app.parse(argc, argv);
    if (from_hf.empty() && to_hf.empty()) throw CLI::RequiredError("--from-hf DIR or --to-hf PATH");
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "rt-convert: usage error: " << e.what() << "\n"
              << "  try: rt-convert --from-hf DIR --output model.safetensors  (or --help)\n";
    return 2;
  }
  LoadOptions options;
  options.allow_non_finite = allow_non_finite;
  try {
    if (!from_hf.empty()) {
      convert_from_hf(from_hf, output, options);
      std::cout << "rt-convert: wrote " << output << " from " << from_hf << "\n";
    } else {
      convert_to_hf(to_hf, output, options);
      std::cout << "rt-convert: wrote " << output << "/config.json and " << output << "/model.safetensors from "
                << to_hf << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "rt-convert: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
