// rt_* errors, version, defaults, enum and struct conversions.
#include <cstdio>

#include "c_api_common.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/shared_mutex.hpp"

namespace rt_c {
namespace {
thread_local std::string t_last_error;
thread_local int t_reading = 0;   // ReadLock scopes open on this thread
thread_local int t_changing = 0;  // ChangeLock scopes open on this thread
riftco_transformer::WriterFirstSharedMutex& handles_lock() {  // a waiting change goes before new reads
  static riftco_transformer::WriterFirstSharedMutex lock;
  return lock;
}
}  // namespace

ReadLock::ReadLock() {
  if (t_reading == 0 && t_changing == 0) {
    handles_lock().lock_shared();
    held_ = true;
  }
  ++t_reading;
}

ReadLock::~ReadLock() {
  --t_reading;
  if (held_) handles_lock().unlock_shared();
}

ChangeLock::ChangeLock(const char* function) {
  if (t_reading > 0) {  // no rt_* call runs another inside a read today; never wait on ourselves
    throw riftco_transformer::ValueError(std::string("[") + function +
                                         "] called from inside a call that reads variables on this thread");
  }
  if (t_changing == 0) {
    handles_lock().lock();
    held_ = true;
  }
  ++t_changing;
}

ChangeLock::~ChangeLock() {
  --t_changing;
  if (held_) handles_lock().unlock();
}

rt_status fail(rt_status status, const char* message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();  // no memory for the message: the status still says what happened
  }
  return status;
}

riftco_transformer::ActivationCheckpointingKind policy(const rt_activation_checkpointing& kind, const char* function) {
  using riftco_transformer::ActivationCheckpointingKind;
  const int value = enum_value(kind);
  if (value == RT_ACTIVATION_CHECKPOINTING_DISABLED) return ActivationCheckpointingKind::Disabled;
  if (value == RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK) return ActivationCheckpointingKind::TransformerBlock;
  if (value == RT_ACTIVATION_CHECKPOINTING_BLOCK_SEGMENTS) return ActivationCheckpointingKind::BlockSegments;
  if (value == RT_ACTIVATION_CHECKPOINTING_ATTENTION) return ActivationCheckpointingKind::AttentionSubBlock;
  if (value == RT_ACTIVATION_CHECKPOINTING_MLP) return ActivationCheckpointingKind::MlpSubBlock;
  if (value == RT_ACTIVATION_CHECKPOINTING_PLANNED) {
    bad_argument(function, "RT_ACTIVATION_CHECKPOINTING_PLANNED is not a policy to set: a plan comes from an "
                           "activation memory budget (the pipeline configs' activation_memory_budget field)");
  }
  bad_argument(function, "activation checkpointing " + std::to_string(value) +
                             " is not an rt_activation_checkpointing value (0 disabled, 1 transformer block, "
                             "2 block segments, 3 attention sub-blocks, 4 MLP sub-blocks)");
}

riftco_transformer::FullSequenceAttentionKind attention(const rt_attention& kind, const char* function) {
  using riftco_transformer::FullSequenceAttentionKind;
  const int value = enum_value(kind);
  if (value == RT_ATTENTION_MATERIALIZED) return FullSequenceAttentionKind::Materialized;
  if (value == RT_ATTENTION_FLASH) return FullSequenceAttentionKind::Flash;
  bad_argument(function, "attention " + std::to_string(value) + " is not an rt_attention value (0 materialized, 1 flash)");
}

riftco_transformer::Backend backend(const rt_backend& kind, const char* function) {
  const int value = enum_value(kind);
  if (value == RT_BACKEND_CPU) return riftco_transformer::Backend::Cpu;
  if (value == RT_BACKEND_CUDA) return riftco_transformer::Backend::Cuda;
  bad_argument(function, "backend " + std::to_string(value) + " is not an rt_backend value (0 cpu, 1 cuda)");
}

rt_backend to_c(riftco_transformer::Backend backend) {
  return backend == riftco_transformer::Backend::Cuda ? RT_BACKEND_CUDA : RT_BACKEND_CPU;
}

rt_activation_checkpointing to_c(riftco_transformer::ActivationCheckpointingKind kind) {
  return static_cast<rt_activation_checkpointing>(static_cast<int>(kind));
}

rt_attention to_c(riftco_transformer::FullSequenceAttentionKind kind) {
  return kind == riftco_transformer::FullSequenceAttentionKind::Flash ? RT_ATTENTION_FLASH
                                                                       : RT_ATTENTION_MATERIALIZED;
}

riftco_transformer::TransformerDimensions dimensions(const rt_transformer_config& c) {
  riftco_transformer::TransformerDimensions d{c.vocab_size, c.context_length, c.model_width,
                                              c.heads,      c.layers,         c.feed_forward_width};
  auto covers = [&c](std::size_t offset, std::size_t size) { return c.struct_size >= offset + size; };
  if (covers(offsetof(rt_transformer_config, key_value_heads), sizeof c.key_value_heads)) {
    d.key_value_heads = c.key_value_heads;
  }
  if (covers(offsetof(rt_transformer_config, rope_base), sizeof c.rope_base)) d.rope_base = c.rope_base;
  if (covers(offsetof(rt_transformer_config, tie_embeddings), sizeof c.tie_embeddings)) {
    d.tie_embeddings = c.tie_embeddings != 0;
  }
  return d;
}

rt_transformer_config to_c(const riftco_transformer::TransformerDimensions& d, float norm_epsilon) {
  rt_transformer_config c{};
  c.struct_size = sizeof c;
  c.vocab_size = d.vocab_size;
  c.context_length = d.context_length;
  c.model_width = d.model_width;
  c.heads = d.heads;
  c.layers = d.layers;
  c.feed_forward_width = d.feed_forward_width;
  c.norm_epsilon = norm_epsilon;
  c.key_value_heads = d.key_value_heads;
  c.rope_base = d.rope_base;
  c.tie_embeddings = d.tie_embeddings ? 1 : 0;
  return c;
}

riftco_transformer::LoraConfig lora(const rt_lora_config& c, const char* function) {
  using riftco_transformer::LoraTarget;
  constexpr std::uint32_t kAll = RT_LORA_QUERY | RT_LORA_KEY | RT_LORA_VALUE | RT_LORA_OUTPUT | RT_LORA_GATE |
                                 RT_LORA_UP | RT_LORA_DOWN;
  if ((c.targets & ~kAll) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%#x", c.targets);
    bad_argument(function, std::string("LoRA targets ") + hex + " has bits that are not RT_LORA_* values");
  }
  riftco_transformer::LoraConfig out;
  out.rank = c.rank;
  out.alpha = c.alpha;
  out.targets.clear();
  const std::pair<std::uint32_t, LoraTarget> bits[] = {
      {RT_LORA_QUERY, LoraTarget::Query}, {RT_LORA_KEY, LoraTarget::Key},   {RT_LORA_VALUE, LoraTarget::Value},
      {RT_LORA_OUTPUT, LoraTarget::Output}, {RT_LORA_GATE, LoraTarget::Gate}, {RT_LORA_UP, LoraTarget::Up},
      {RT_LORA_DOWN, LoraTarget::Down}};
  for (const auto& [bit, target] : bits) {
    if ((c.targets & bit) != 0) out.targets.push_back(target);
  }
  return out;  // validated (rank, alpha, targets non-empty) by the C++ side
}

void copy_string(const std::string& text, char* buffer, std::size_t size, std::size_t* needed, const char* function) {
  if (needed != nullptr) *needed = text.size() + 1;
  if (buffer == nullptr && size == 0 && needed != nullptr) return;  // a size query: RT_OK, nothing written
  if (buffer == nullptr) bad_argument(function, "buffer is NULL");
  if (size < text.size() + 1) {
    bad_argument(function, "buffer of " + std::to_string(size) + " bytes is too small: " +
                               std::to_string(text.size() + 1) + " needed");
  }
  std::memcpy(buffer, text.c_str(), text.size() + 1);
}

rt_variable* wrap(riftco_transformer::Variable variable) { return new rt_variable{std::move(variable)}; }

const char* last_error() noexcept { return t_last_error.c_str(); }

}  // namespace rt_c

using namespace rt_c;
namespace rt = riftco_transformer;

extern "C" {

const char* rt_last_error_message(void) { return last_error(); }

const char* rt_status_name(rt_status status) {  // by value: read through its bytes below
  switch (enum_value(status)) {
    case RT_OK: return "RT_OK";
    case RT_ERROR_INVALID_ARGUMENT: return "RT_ERROR_INVALID_ARGUMENT";
    case RT_ERROR_VALUE: return "RT_ERROR_VALUE";
    case RT_ERROR_SHAPE: return "RT_ERROR_SHAPE";
    case RT_ERROR_BACKEND: return "RT_ERROR_BACKEND";
    case RT_ERROR_STALE_GRAPH: return "RT_ERROR_STALE_GRAPH";
    case RT_ERROR_CHECKPOINT_CONTRACT: return "RT_ERROR_CHECKPOINT_CONTRACT";
    case RT_ERROR_BACKWARD: return "RT_ERROR_BACKWARD";
    case RT_ERROR_MODEL_STATE: return "RT_ERROR_MODEL_STATE";
    case RT_ERROR_DATA: return "RT_ERROR_DATA";
    case RT_ERROR_RUNTIME: return "RT_ERROR_RUNTIME";
    case RT_ERROR_OUT_OF_MEMORY: return "RT_ERROR_OUT_OF_MEMORY";
    case RT_ERROR_INTERNAL: return "RT_ERROR_INTERNAL";
    case RT_ERROR_PARTIAL_STEP: return "RT_ERROR_PARTIAL_STEP";
    default: break;
  }
  return "unknown";
}

uint32_t rt_abi_version(void) { return (RT_ABI_VERSION_MAJOR << 16) | RT_ABI_VERSION_MINOR; }

rt_status rt_transformer_config_init(rt_transformer_config* config, size_t struct_size) {
  return guard("rt_transformer_config_init", [&] {
    const rt::TransformerDimensions d;
    init_struct(config, struct_size, to_c(d, 1.0e-5F), "rt_transformer_config_init");
  });
}

rt_status rt_lora_config_init(rt_lora_config* config, size_t struct_size) {
  return guard("rt_lora_config_init", [&] {
    const rt::LoraConfig d;
    init_struct(config, struct_size, rt_lora_config{0, d.rank, d.alpha, RT_LORA_QUERY | RT_LORA_VALUE},
                "rt_lora_config_init");
  });
}

rt_status rt_adam_options_init(rt_adam_options* options, size_t struct_size) {
  return guard("rt_adam_options_init", [&] {
    const rt::AdamOptions d;
    init_struct(options, struct_size,
                rt_adam_options{0, d.learning_rate, d.beta1, d.beta2, d.epsilon, d.weight_decay, d.max_grad_norm},
                "rt_adam_options_init");
  });
}

rt_status rt_generation_options_init(rt_generation_options* options, size_t struct_size) {
  return guard("rt_generation_options_init", [&] {
    const rt::GenerationOptions d;
    init_struct(options, struct_size,
                rt_generation_options{0, d.max_new_tokens, d.temperature, d.top_k, d.seed, d.top_p,
                                      d.repetition_penalty, nullptr, 0, d.num_samples, nullptr, 0},
                "rt_generation_options_init");
  });
}

rt_status rt_memory_stats_get(rt_backend backend, rt_memory_stats* stats) {
  return guard("rt_memory_stats_get", [&] {
    const rt::Backend b = rt_c::backend(backend, "rt_memory_stats_get");
    if (!rt::backend_available(b)) {
      throw rt::BackendError(std::string("[rt_memory_stats_get] the ") + rt::backend_name(b) +
                             " backend is not built in this library");
    }
    const rt::MemoryStats m = rt::memory_stats(b);
    write_struct(stats, rt_memory_stats{0, m.live_bytes, m.peak_bytes, m.allocation_count, m.free_count, m.reserved_bytes},
                 "rt_memory_stats_get", "stats");
  });
}

rt_status rt_reset_peak_memory(void) {
  return guard("rt_reset_peak_memory", [] { rt::reset_peak_memory(); });
}

}  // extern "C"
