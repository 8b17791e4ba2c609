// An out-of-tree C++ consumer of the installed package: the C++ API for one
// training step with block checkpointing and one decoded token, and the RAII
// header over the C ABI for the same.
#include <iostream>

#include <riftco_transformer/adam.hpp>
#include <riftco_transformer/decode.hpp>
#include <riftco_transformer/rt.hpp>
#include <riftco_transformer/transformer.hpp>

int main() {
  namespace r = riftco_transformer;
  r::Random random(1);
  r::DecoderOnlyTransformer model({256, 16, 16, 2, 2, 24}, random, 1e-5F, r::FullSequenceAttentionKind::Flash,
                                  r::ActivationCheckpointingKind::TransformerBlock);
  std::vector<r::Variable> params;
  for (const r::NamedParameter& p : model.parameters()) params.push_back(p.variable);
  r::Adam adam(params);
  const std::vector<std::int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::int32_t> targets = {2, 3, 4, 5, 6, 7, 8, 9};
  r::Variable loss = model.loss(tokens, targets, 1);
  loss.backward();
  adam.step();
  r::DecodeSession session(model);
  const r::Tensor logits = session.decode_token(1);

  rt_transformer_config config;
  rt::check(rt_transformer_config_default(&config));
  config.context_length = 16;
  config.model_width = 16;
  config.heads = 2;
  config.layers = 2;
  config.feed_forward_width = 24;
  rt::Model c_model(config, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);
  rt::Adam c_adam(c_model);
  rt::Variable c_loss = c_model.loss(tokens, targets, 1);
  c_loss.backward();
  c_adam.step();
  rt::DecodeSession c_session(c_model);
  const std::vector<float> c_logits = c_session.decode(1);
  // Same seed, same weights: the two APIs agree on the first loss.
  if (c_loss.item() != loss.value().item() || c_logits.size() != static_cast<std::size_t>(logits.numel())) {
    std::cerr << "the C++ API and the C ABI disagree\n";
    return 1;
  }
  std::cout << "C++ API and C ABI: loss " << loss.value().item() << ", one step, one token decoded\n";
  return 0;
}
