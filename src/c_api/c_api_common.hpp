#pragma once
// The C ABI's plumbing (private): handle structs, argument checks, and the
// one place where C++ exceptions become rt_status codes. The rt_* functions
// are thin: check arguments, call the C++ API, copy results out.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <memory>
#include <stdexcept>
#include <string>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/rt.h"
#include "riftco_transformer/transformer.hpp"

struct rt_model {
  std::unique_ptr<riftco_transformer::DecoderOnlyTransformer> model;
};
struct rt_variable {
  riftco_transformer::Variable variable;
};
struct rt_adam {
  riftco_transformer::Adam adam;
};
struct rt_generation {
  std::vector<riftco_transformer::GenerationResult> samples;
};
struct rt_decode_session {
  riftco_transformer::DecodeSession session;
};

namespace rt_c {

/// A bad C argument (NULL, enum out of range, buffer size, struct_size).
struct ArgumentError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The C ABI's process-wide reader/writer lock over what handles share: the
/// models' variables (docs/c-abi.md, "Threading"). A call that replaces
/// variables' values or flags or a model's parameters (set_value, load, to,
/// the LoRA changes) holds it exclusively (ChangeLock); a call that reads
/// them (a forward, backward, optimizer step, decode, generation, save, a
/// value or shape) holds it shared (ReadLock). Without it, a value replaced
/// on one thread under a backward pass on another freed what that pass read
/// (heap corruption). A call nested in one of the same thread takes nothing
/// more. Runs (rt_run_*) hold nothing: their callback may call anything.
class ReadLock {
 public:
  ReadLock();
  ~ReadLock();
  ReadLock(const ReadLock&) = delete;
  ReadLock& operator=(const ReadLock&) = delete;

 private:
  bool held_ = false;
};
class ChangeLock {
 public:
  explicit ChangeLock(const char* function);
  ~ChangeLock();
  ChangeLock(const ChangeLock&) = delete;
  ChangeLock& operator=(const ChangeLock&) = delete;

 private:
  bool held_ = false;
};

/// Records the message for rt_last_error_message() and returns `status`.
rt_status fail(rt_status status, const char* message) noexcept;
const char* last_error() noexcept;

/// Runs `body`, mapping every exception to a status and a message (prefixed
/// with `function`). Exceptions never leave.
template <typename Body>
rt_status guard(const char* function, Body&& body) noexcept;

[[noreturn]] inline void bad_argument(const char* function, const std::string& what) {
  throw ArgumentError(std::string("[") + function + "] " + what);
}

/// An enum argument's value as the caller passed it. Read through its bytes:
/// a C caller may pass any int, and loading an out-of-range value through the
/// C++ enum type would be undefined behaviour.
template <typename E>
int enum_value(const E& value) {
  static_assert(sizeof(E) == sizeof(int), "rt.h enums are 32 bits (the *_MAX_ENUM values)");
  int out = 0;
  std::memcpy(&out, &value, sizeof out);
  return out;
}

template <typename T>
T& require(T* pointer, const char* function, const char* name) {
  if (pointer == nullptr) bad_argument(function, std::string(name) + " is NULL");
  return *pointer;
}

/// The Variable a handle holds: INVALID_ARGUMENT for NULL or an empty handle.
inline const riftco_transformer::Variable& variable_of(const rt_variable* v, const char* function,
                                                       const char* name = "variable") {
  const rt_variable& h = require(v, function, name);
  if (!h.variable.defined()) bad_argument(function, std::string(name) + " handle holds no variable");
  return h.variable;
}

/// rt_transformer_config as ABI 2.0 laid it out (the size callers of 2.0 pass).
struct TransformerConfig20 {
  std::size_t struct_size;
  std::int64_t vocab_size, context_length, model_width, heads, layers, feed_forward_width;
  float norm_epsilon;
};
inline constexpr std::size_t kTransformerConfig20Size = sizeof(TransformerConfig20);
static_assert(kTransformerConfig20Size == offsetof(rt_transformer_config, key_value_heads));
/// rt_pretraining_config as ABI 2.0 laid it out (its `model` had the 2.0
/// layout). A caller compiled against 2.0 passes this size.
struct PretrainingConfig20 {
  std::size_t struct_size;
  rt_stage_settings stage;
  TransformerConfig20 model;
  double validation_fraction;
};
static_assert(sizeof(PretrainingConfig20) < offsetof(rt_pretraining_config, gradient_accumulation_steps));

/// sizeof the struct in ABI 2.0 (structs that grew since say so here: their
/// first appended field's offset, or the 2.0 layout's size).
template <typename T>
constexpr std::size_t abi20_size() {
  if constexpr (std::is_same_v<T, rt_transformer_config>) {
    return kTransformerConfig20Size;
  } else if constexpr (std::is_same_v<T, rt_pretraining_config>) {
    return sizeof(PretrainingConfig20);
  } else if constexpr (std::is_same_v<T, rt_generation_options>) {
    return offsetof(rt_generation_options, top_p);
  } else if constexpr (std::is_same_v<T, rt_post_training_config>) {
    return offsetof(rt_post_training_config, gradient_accumulation_steps);
  } else {
    // Output structs that have not grown since they appeared: their first
    // size is today's. Appending a field breaks one of these asserts, to be
    // answered with a branch above (the size callers built before it pass).
    static_assert(sizeof(rt_memory_stats) == 48 && sizeof(rt_evaluation_result) == 48 &&
                  sizeof(rt_run_result) == 56 + 2 * RT_PATH_CAPACITY);
    return sizeof(T);
  }
}

/// Whether a caller's struct (its struct_size) holds `member`, a field
/// appended after ABI 2.0; otherwise the caller gets the default.
#define RT_C_COVERS(value, member) \
  ((value).struct_size >= offsetof(std::remove_cvref_t<decltype(value)>, member) + sizeof((value).member))

/// A caller's input struct: non-NULL and at least as large as ABI 2.0's.
template <typename T>
const T& require_struct(const T* pointer, const char* function, const char* name) {
  const T& value = require(pointer, function, name);
  if (value.struct_size < abi20_size<T>()) {
    bad_argument(function, std::string(name) + "->struct_size is " + std::to_string(value.struct_size) +
                               ", smaller than ABI 2.0's " + std::to_string(abi20_size<T>()) +
                               " (fill the struct with its *_default function)");
  }
  return value;
}

/// A copy of a caller's input struct (require_struct's checks): the bytes its
/// struct_size covers, zero beyond them (RT_C_COVERS keeps the caller's
/// struct_size, so those fields take their defaults). Never reads past a
/// struct that is smaller than this library's.
template <typename T>
T read_struct(const T* pointer, const char* function, const char* name) {
  const T& given = require_struct(pointer, function, name);
  T value{};
  std::memcpy(static_cast<void*>(&value), static_cast<const void*>(&given),
              given.struct_size < sizeof(T) ? given.struct_size : sizeof(T));
  return value;
}

/// *_init: `value` (defaults) into a caller's struct of `size` bytes (at
/// least ABI 2.0's), struct_size set to `size`.
template <typename T>
void init_struct(T* out, std::size_t size, T value, const char* function) {
  require(out, function, "the struct");
  if (size < abi20_size<T>()) {
    bad_argument(function, "struct_size " + std::to_string(size) + " is smaller than ABI 2.0's " +
                               std::to_string(abi20_size<T>()));
  }
  value.struct_size = size;
  // An older caller's struct gets the fields it has; a newer caller's extra fields stay as they were.
  std::memcpy(static_cast<void*>(out), &value, size < sizeof(T) ? size : sizeof(T));
}

/// Writes `value` into a caller's output struct, as much as its struct_size
/// covers: at least the struct as it first appeared (a smaller struct_size,
/// e.g. 9, would get part of a field), at most this library's.
template <typename T>
void write_struct(T* out, T value, const char* function, const char* name) {
  T& target = require(out, function, name);
  if (target.struct_size < abi20_size<T>()) {
    bad_argument(function, std::string(name) + "->struct_size is " + std::to_string(target.struct_size) +
                               ", smaller than the struct's first version (" + std::to_string(abi20_size<T>()) +
                               " bytes); set it to sizeof the struct");
  }
  const std::size_t size = target.struct_size < sizeof(T) ? target.struct_size : sizeof(T);
  value.struct_size = target.struct_size;
  std::memcpy(static_cast<void*>(&target), &value, size);
}

riftco_transformer::ActivationCheckpointingKind policy(const rt_activation_checkpointing& kind, const char* function);
riftco_transformer::FullSequenceAttentionKind attention(const rt_attention& kind, const char* function);
/// An rt_backend argument (ArgumentError for another value; whether it is
/// built is the caller's check).
riftco_transformer::Backend backend(const rt_backend& kind, const char* function);
rt_backend to_c(riftco_transformer::Backend backend);
rt_activation_checkpointing to_c(riftco_transformer::ActivationCheckpointingKind kind);
rt_attention to_c(riftco_transformer::FullSequenceAttentionKind kind);
/// The architecture fields of `config` (the fields appended after ABI 2.0
/// only where config.struct_size covers them).
riftco_transformer::TransformerDimensions dimensions(const rt_transformer_config& config);
/// rt_transformer_config filled from the model's architecture.
rt_transformer_config to_c(const riftco_transformer::TransformerDimensions& d, float norm_epsilon);
riftco_transformer::LoraConfig lora(const rt_lora_config& config, const char* function);
/// Copies `text` and a NUL into buffer[0..size); `*needed` gets the size it needs.
void copy_string(const std::string& text, char* buffer, std::size_t size, std::size_t* needed, const char* function);
rt_variable* wrap(riftco_transformer::Variable variable);

}  // namespace rt_c

#include "c_api_guard.inl"
