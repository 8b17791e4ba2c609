/* An out-of-tree C consumer of the installed package: one training step with
 * block checkpointing, then one decoded token. */
#include <stdio.h>

#include <riftco_transformer/rt.h>

#define TRY(call)                                                                       \
  do {                                                                                  \
    if ((call) != RT_OK) {                                                              \
      fprintf(stderr, "%s failed: %s\n", #call, rt_last_error_message());               \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

int main(void) {
  rt_transformer_config config;
  TRY(rt_transformer_config_default(&config));
  config.context_length = 16;
  config.model_width = 16;
  config.heads = 2;
  config.layers = 2;
  config.feed_forward_width = 24;
  rt_model* model = NULL;
  TRY(rt_model_create(&config, 1, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, &model));
  rt_adam_options options;
  TRY(rt_adam_options_default(&options));
  rt_adam* adam = NULL;
  TRY(rt_adam_create(model, &options, &adam));
  int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int32_t targets[8] = {2, 3, 4, 5, 6, 7, 8, 9};
  rt_variable* loss = NULL;
  TRY(rt_model_loss(model, tokens, targets, 1, 8, &loss));
  float value = 0.0f;
  TRY(rt_variable_item(loss, &value));
  TRY(rt_variable_backward(loss));
  TRY(rt_adam_step(adam, NULL));
  rt_decode_session* session = NULL;
  TRY(rt_decode_session_create(model, &session));
  float logits[256];
  TRY(rt_decode_session_decode(session, 1, logits, 256));
  printf("ABI %u.%u: loss %.4f, one step, one token decoded\n", rt_abi_version() >> 16, rt_abi_version() & 0xFFFFu,
         value);
  rt_decode_session_destroy(session);
  rt_variable_destroy(loss);
  rt_adam_destroy(adam);
  rt_model_destroy(model);
  return 0;
}
