// rt_model_*: the model, its policies, parameters, LoRA and state files.
#include "c_api_common.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/hf_llama.hpp"
#include "riftco_transformer/model_state.hpp"

using namespace rt_c;
namespace rt = riftco_transformer;

namespace {

rt::DecoderOnlyTransformer& model_of(const rt_model* model, const char* function) {
  const rt_model& m = require(model, function, "model");
  if (!m.model) bad_argument(function, "model handle holds no model");
  return *m.model;
}

/// `flags` as load options; bits outside `allowed` (the RT_LOAD_* values
/// this function takes) are RT_ERROR_INVALID_ARGUMENT.
rt::LoadOptions load_options(uint32_t flags, const char* function,
                             uint32_t allowed = RT_LOAD_ALLOW_NON_FINITE | RT_LOAD_ALLOW_BASE_MISMATCH) {
  if ((flags & ~allowed) != 0) {
    bad_argument(function, "flags " + std::to_string(flags) + " has bits that are not " +
                               (allowed == RT_LOAD_ALLOW_NON_FINITE ? "RT_LOAD_ALLOW_NON_FINITE (the only flag it takes)"
                                                                    : "RT_LOAD_* values"));
  }
  rt::LoadOptions o;
  o.allow_non_finite = (flags & RT_LOAD_ALLOW_NON_FINITE) != 0;
  o.allow_base_mismatch = (flags & RT_LOAD_ALLOW_BASE_MISMATCH) != 0;
  return o;
}

const char* path_of(const char* path, const char* function) {
  if (path == nullptr) bad_argument(function, "path is NULL");
  return path;
}

std::span<const std::int32_t> ids(const int32_t* data, int64_t batch, int64_t sequence_length, const char* function,
                                  const char* name) {
  if (batch <= 0 || sequence_length <= 0) {
    bad_argument(function, "batch " + std::to_string(batch) + " and sequence_length " +
                               std::to_string(sequence_length) + " must be > 0");
  }
  if (batch > (int64_t{1} << 31) / sequence_length) bad_argument(function, "batch * sequence_length is too large");
  require(data, function, name);
  return {data, static_cast<std::size_t>(batch * sequence_length)};
}

}  // namespace

extern "C" {

rt_status rt_model_create(const rt_transformer_config* config, uint64_t seed, rt_attention attention,
                          rt_activation_checkpointing activation_checkpointing, rt_model** out) {
  constexpr const char* f = "rt_model_create";
  return guard(f, [&] {
    const rt_transformer_config& c = require_struct(config, f, "config");
    require(out, f, "out");
    const rt::FullSequenceAttentionKind a = rt_c::attention(attention, f);
    const rt::ActivationCheckpointingKind p = policy(activation_checkpointing, f);
    rt::Random random(seed);
    auto handle = std::make_unique<rt_model>();
    handle->model = std::make_unique<rt::DecoderOnlyTransformer>(dimensions(c), random, c.norm_epsilon, a, p);
    *out = handle.release();
  });
}

rt_status rt_model_destroy(rt_model* model) {
  delete model;
  return RT_OK;
}

rt_status rt_model_config(const rt_model* model, rt_transformer_config* config) {
  constexpr const char* f = "rt_model_config";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    const rt::TransformerDimensions& d = m.dimensions();
    write_struct(config, to_c(d, m.norm_epsilon()), f, "config");
  });
}

rt_status rt_model_set_activation_checkpointing(rt_model* model, rt_activation_checkpointing kind) {
  constexpr const char* f = "rt_model_set_activation_checkpointing";
  return guard(f, [&] {
    const ReadLock lock;
    model_of(model, f).set_activation_checkpointing_kind(policy(kind, f));
  });
}

rt_status rt_model_activation_checkpointing(const rt_model* model, rt_activation_checkpointing* kind) {
  constexpr const char* f = "rt_model_activation_checkpointing";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(kind, f, "kind") = to_c(m.activation_checkpointing_kind());
  });
}

rt_status rt_model_set_checkpoint_segment_blocks(rt_model* model, int64_t blocks) {
  constexpr const char* f = "rt_model_set_checkpoint_segment_blocks";
  return guard(f, [&] {
    const ReadLock lock;
    model_of(model, f).set_checkpoint_segment_blocks(blocks);
  });
}

rt_status rt_model_set_attention(rt_model* model, rt_attention kind) {
  constexpr const char* f = "rt_model_set_attention";
  return guard(f, [&] {
    const ReadLock lock;
    model_of(model, f).set_attention_kind(rt_c::attention(kind, f));
  });
}

rt_status rt_model_attention(const rt_model* model, rt_attention* kind) {
  constexpr const char* f = "rt_model_attention";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(kind, f, "kind") = to_c(m.attention_kind());
  });
}

rt_status rt_model_set_dropout(rt_model* model, float probability, uint64_t seed) {
  constexpr const char* f = "rt_model_set_dropout";
  return guard(f, [&] {
    const ReadLock lock;
    model_of(model, f).set_dropout(probability, seed);
  });
}

rt_status rt_model_set_training(rt_model* model, int training) {
  constexpr const char* f = "rt_model_set_training";
  return guard(f, [&] {
    const ReadLock lock;
    model_of(model, f).set_training(training != 0);
  });
}

rt_status rt_model_checkpoint_segment_blocks(const rt_model* model, int64_t* blocks) {
  constexpr const char* f = "rt_model_checkpoint_segment_blocks";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(blocks, f, "blocks") = m.checkpoint_segment_blocks();
  });
}

rt_status rt_model_dropout(const rt_model* model, float* probability) {
  constexpr const char* f = "rt_model_dropout";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(probability, f, "probability") = m.dropout();
  });
}

rt_status rt_model_training(const rt_model* model, int* training) {
  constexpr const char* f = "rt_model_training";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(training, f, "training") = m.training() ? 1 : 0;
  });
}

rt_status rt_model_to(rt_model* model, rt_backend backend) {
  constexpr const char* f = "rt_model_to";
  return guard(f, [&] {
    const ChangeLock lock(f);
    rt::DecoderOnlyTransformer& m = model_of(model, f);
    m.to(rt_c::backend(backend, f));  // BackendError before anything moves when not built
  });
}

rt_status rt_model_backend(const rt_model* model, rt_backend* backend) {
  constexpr const char* f = "rt_model_backend";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(backend, f, "backend") = to_c(m.backend());
  });
}

rt_status rt_model_set_activation_offload(rt_model* model, int offload) {
  constexpr const char* f = "rt_model_set_activation_offload";
  return guard(f, [&] {
    const ReadLock lock;
    model_of(model, f).set_activation_offload(offload != 0);
  });
}

rt_status rt_model_activation_offload(const rt_model* model, int* offload) {
  constexpr const char* f = "rt_model_activation_offload";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(offload, f, "offload") = m.activation_offload() ? 1 : 0;
  });
}

rt_status rt_model_parameter_count(const rt_model* model, size_t* count) {
  constexpr const char* f = "rt_model_parameter_count";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(count, f, "count") = m.parameters().size();
  });
}

rt_status rt_model_parameter_elements(const rt_model* model, int64_t* elements) {
  constexpr const char* f = "rt_model_parameter_elements";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(elements, f, "elements") = m.parameter_count();
  });
}

rt_status rt_model_parameter_name(const rt_model* model, size_t index, char* buffer, size_t buffer_size,
                                  size_t* needed) {
  constexpr const char* f = "rt_model_parameter_name";
  return guard(f, [&] {
    const ReadLock lock;
    const std::vector<rt::NamedParameter> params = model_of(model, f).parameters();
    if (index >= params.size()) {
      bad_argument(f, "index " + std::to_string(index) + " is out of range: the model has " +
                          std::to_string(params.size()) + " parameters");
    }
    copy_string(params[index].name, buffer, buffer_size, needed, f);
  });
}

rt_status rt_model_parameter(const rt_model* model, const char* name, rt_variable** out) {
  constexpr const char* f = "rt_model_parameter";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(name, f, "name");
    require(out, f, "out");
    *out = wrap(m.parameter(name));  // base or adapter; a ValueError naming a missing one
  });
}

rt_status rt_model_forward(const rt_model* model, const int32_t* tokens, int64_t batch, int64_t sequence_length,
                           rt_variable** logits) {
  constexpr const char* f = "rt_model_forward";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    const auto t = ids(tokens, batch, sequence_length, f, "tokens");
    require(logits, f, "logits");
    *logits = wrap(m.forward(t, batch));
  });
}

rt_status rt_model_loss(const rt_model* model, const int32_t* tokens, const int32_t* targets, int64_t batch,
                        int64_t sequence_length, rt_variable** loss) {
  constexpr const char* f = "rt_model_loss";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    const auto t = ids(tokens, batch, sequence_length, f, "tokens");
    const auto y = ids(targets, batch, sequence_length, f, "targets");
    require(loss, f, "loss");
    *loss = wrap(m.loss(t, y, batch));
  });
}

rt_status rt_model_add_lora(rt_model* model, const rt_lora_config* config, uint64_t seed) {
  constexpr const char* f = "rt_model_add_lora";
  return guard(f, [&] {
    const ChangeLock lock(f);
    rt::DecoderOnlyTransformer& m = model_of(model, f);
    const rt::LoraConfig c = lora(require_struct(config, f, "config"), f);
    rt::Random random(seed);
    m.add_lora(c, random);
  });
}

rt_status rt_model_remove_lora(rt_model* model) {
  constexpr const char* f = "rt_model_remove_lora";
  return guard(f, [&] {
    const ChangeLock lock(f);
    model_of(model, f).remove_lora();
  });
}

rt_status rt_model_set_lora_active(rt_model* model, int active) {
  constexpr const char* f = "rt_model_set_lora_active";
  return guard(f, [&] {
    const ChangeLock lock(f);
    model_of(model, f).set_lora_active(active != 0);
  });
}

rt_status rt_model_merge_lora(rt_model* model) {
  constexpr const char* f = "rt_model_merge_lora";
  return guard(f, [&] {
    const ChangeLock lock(f);
    model_of(model, f).merge_lora();
  });
}

rt_status rt_model_set_base_trainable(rt_model* model, int trainable) {
  constexpr const char* f = "rt_model_set_base_trainable";
  return guard(f, [&] {
    const ChangeLock lock(f);
    model_of(model, f).set_base_trainable(trainable != 0);
  });
}

rt_status rt_model_has_lora(const rt_model* model, int* has_lora) {
  constexpr const char* f = "rt_model_has_lora";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(has_lora, f, "has_lora") = m.has_lora() ? 1 : 0;
  });
}

rt_status rt_model_save(const rt_model* model, const char* path) {
  constexpr const char* f = "rt_model_save";
  return guard(f, [&] {
    const ReadLock lock;
    rt::save_model_state(model_of(model, f), path_of(path, f));
  });
}

rt_status rt_model_load(rt_model* model, const char* path, uint32_t flags) {
  constexpr const char* f = "rt_model_load";
  return guard(f, [&] {
    rt::DecoderOnlyTransformer& m = model_of(model, f);
    const rt::ModelStateValues values = [&] {  // the file is read beside other threads' readers
      const ReadLock lock;
      return rt::read_model_state_for(m, path_of(path, f), load_options(flags, f, RT_LOAD_ALLOW_NON_FINITE));
    }();
    const ChangeLock lock(f);
    rt::apply_model_state_values(m, values);
  });
}

rt_status rt_convert_from_hf(const char* directory, const char* output, uint32_t flags) {
  constexpr const char* f = "rt_convert_from_hf";
  return guard(f, [&] {
    rt::convert_from_hf(path_of(directory, f), path_of(output, f), load_options(flags, f, RT_LOAD_ALLOW_NON_FINITE));
  });
}

rt_status rt_convert_to_hf(const char* model_state, const char* directory, uint32_t flags) {
  constexpr const char* f = "rt_convert_to_hf";
  return guard(f, [&] {
    rt::convert_to_hf(path_of(model_state, f), path_of(directory, f), load_options(flags, f, RT_LOAD_ALLOW_NON_FINITE));
  });
}

rt_status rt_model_load_new(const char* path, rt_attention attention,
                            rt_activation_checkpointing activation_checkpointing, uint32_t flags, rt_model** out) {
  constexpr const char* f = "rt_model_load_new";
  return guard(f, [&] {
    const char* p = path_of(path, f);
    require(out, f, "out");
    const rt::FullSequenceAttentionKind a = rt_c::attention(attention, f);
    const rt::ActivationCheckpointingKind c = policy(activation_checkpointing, f);
    auto handle = std::make_unique<rt_model>();
    handle->model = rt::load_model(p, a, c, load_options(flags, f, RT_LOAD_ALLOW_NON_FINITE));
    *out = handle.release();
  });
}

rt_status rt_model_save_adapter(const rt_model* model, const char* path) {
  constexpr const char* f = "rt_model_save_adapter";
  return guard(f, [&] {
    const ReadLock lock;
    rt::save_adapter_state(model_of(model, f), path_of(path, f));
  });
}

rt_status rt_model_load_adapter(rt_model* model, const char* path, uint32_t flags) {
  constexpr const char* f = "rt_model_load_adapter";
  return guard(f, [&] {
    rt::DecoderOnlyTransformer& m = model_of(model, f);
    const rt::AdapterStateValues values = [&] {  // read as rt_model_load reads
      const ReadLock lock;
      return rt::read_adapter_state_for(m, path_of(path, f), load_options(flags, f));
    }();
    const ChangeLock lock(f);
    rt::apply_adapter_state_values(m, values);
  });
}

rt_status rt_model_fingerprint(const rt_model* model, char* buffer, size_t buffer_size) {
  constexpr const char* f = "rt_model_fingerprint";
  return guard(f, [&] {
    const ReadLock lock;
    copy_string(rt::model_fingerprint(model_of(model, f)), buffer, buffer_size, nullptr, f);
  });
}

}  // extern "C"
