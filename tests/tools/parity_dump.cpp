// rt-parity-dump: writes what the PyTorch parity test compares against.
//   rt-parity-dump OUT_DIR ATTENTION POLICY
// OUT_DIR/model.safetensors   the model state (save_model_state)
// OUT_DIR/batch.json          dimensions, tokens, targets, batch
// OUT_DIR/outputs.safetensors logits, loss, and grad.<parameter name> for every parameter
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: rt-parity-dump OUT_DIR materialized|flash disabled|block|segments\n";
    return 2;
  }
  try {
    const std::filesystem::path out = argv[1];
    std::filesystem::create_directories(out);
    TransformerDimensions d;
    d.vocab_size = 64;
    d.context_length = 24;
    d.model_width = 32;
    d.heads = 4;
    d.layers = 3;
    d.feed_forward_width = 48;
    Random random(2024);
    DecoderOnlyTransformer model(d, random, 1e-5F, parse_attention_kind(argv[2]),
                                 parse_activation_checkpointing(argv[3]));
    Random data(7);
    const std::int64_t batch = 2;
    const std::int64_t t = 20;
    std::vector<std::int32_t> tokens;
    std::vector<std::int32_t> targets;
    for (std::int64_t i = 0; i < batch * t; ++i) {
      tokens.push_back(static_cast<std::int32_t>(data.below(64)));
      targets.push_back(i % 7 == 3 ? -100 : static_cast<std::int32_t>(data.below(64)));  // some ignored
    }
    const Variable logits = model.forward(tokens, batch);
    const Variable loss = model.loss(tokens, targets, batch);
    loss.backward();
    save_model_state(model, out / "model.safetensors");
    std::vector<std::pair<std::string, Tensor>> tensors = {{"logits", logits.value()}, {"loss", loss.value()}};
    for (const NamedParameter& p : model.parameters()) tensors.emplace_back("grad." + p.name, p.variable.grad());
    write_safetensors(out / "outputs.safetensors", tensors, {});
    nlohmann::json j = {{"tokens", tokens},
                        {"targets", targets},
                        {"batch", batch},
                        {"norm_epsilon", model.norm_epsilon()},
                        {"dimensions",
                         {{"vocab_size", d.vocab_size},
                          {"context_length", d.context_length},
                          {"model_width", d.model_width},
                          {"heads", d.heads},
                          {"layers", d.layers},
                          {"feed_forward_width", d.feed_forward_width}}}};
    std::ofstream(out / "batch.json") << j.dump();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rt-parity-dump: " << e.what() << "\n";
    return 1;
  }
}
