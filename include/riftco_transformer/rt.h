/* riftco C ABI 2.x (2.0 and what 2.1-2.8 appended): a stable C interface over the C++ library.
 *
 * Plain C11 (also valid C++). Every function returns an rt_status; on failure
 * rt_last_error_message() gives the calling thread's message. Exceptions never
 * cross this boundary. Handles are opaque; each *_create / producing call
 * gives the caller one handle to release with the matching *_destroy (NULL is
 * accepted there and does nothing). Ownership, threading and the versioning
 * promise: docs/c-abi.md.
 */
#ifndef RIFTCO_TRANSFORMER_RT_H
#define RIFTCO_TRANSFORMER_RT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define RT_API __attribute__((visibility("default")))
#else
#define RT_API
#endif

#define RT_ABI_VERSION_MAJOR 2
#define RT_ABI_VERSION_MINOR 9

/* ---- status and errors ---------------------------------------------------- */

typedef enum rt_status {
  RT_OK = 0,
  RT_ERROR_INVALID_ARGUMENT = 1,   /* a NULL pointer, an out-of-range enum, a wrong buffer size, a bad struct_size */
  RT_ERROR_VALUE = 2,              /* a value the library refuses (riftco ValueError) */
  RT_ERROR_SHAPE = 3,              /* shapes that do not fit (ShapeError) */
  RT_ERROR_BACKEND = 4,            /* a backend that is not built or not usable (BackendError) */
  RT_ERROR_STALE_GRAPH = 5,        /* a graph built before a change it cannot survive (StaleGraphError) */
  RT_ERROR_CHECKPOINT_CONTRACT = 6,/* the replay contract of checkpoint() (CheckpointContractError) */
  RT_ERROR_BACKWARD = 7,           /* a backward pass that cannot run (BackwardError) */
  RT_ERROR_MODEL_STATE = 8,        /* a model, adapter or checkpoint file that cannot be read or written */
  RT_ERROR_DATA = 9,               /* a data file that is missing or malformed (DataError) */
  RT_ERROR_RUNTIME = 10,           /* a failure of no narrower class: a diverged run, a full disk (riftco Error) */
  RT_ERROR_OUT_OF_MEMORY = 11,     /* an allocation failed */
  RT_ERROR_INTERNAL = 12,          /* anything else: a bug; the message says what */
  /* Appended in ABI 2.6: an optimizer step fused into the backward pass
   * (rt_adam_backward_and_step, optimizer_in_backward) failed after it had
   * updated some parameters (PartialStepError): restore the model and
   * optimizer (e.g. from a training checkpoint) before training on. */
  RT_ERROR_PARTIAL_STEP = 13,
  RT_STATUS_MAX_ENUM = 0x7FFFFFFF  /* keeps every enum of this header 32 bits wide (ABI) */
} rt_status;

/* The message of the calling thread's last failed call ("" if none). Valid
 * until the next rt_* call on this thread. */
RT_API const char* rt_last_error_message(void);
/* "RT_OK", "RT_ERROR_SHAPE", ...; "unknown" for other values. */
RT_API const char* rt_status_name(rt_status status);
/* (RT_ABI_VERSION_MAJOR << 16) | RT_ABI_VERSION_MINOR of the loaded library. */
RT_API uint32_t rt_abi_version(void);

/* ---- enums ------------------------------------------------------------------ */

typedef enum rt_activation_checkpointing {
  RT_ACTIVATION_CHECKPOINTING_DISABLED = 0,
  RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK = 1,
  RT_ACTIVATION_CHECKPOINTING_BLOCK_SEGMENTS = 2,
  RT_ACTIVATION_CHECKPOINTING_ATTENTION = 3, /* recompute each block's attention sub-block */
  RT_ACTIVATION_CHECKPOINTING_MLP = 4,       /* recompute each block's MLP sub-block */
  /* A per-block plan chosen for an activation memory budget (ABI 2.2): reported
     by rt_model_activation_checkpointing, refused by the setters. */
  RT_ACTIVATION_CHECKPOINTING_PLANNED = 5,
  RT_ACTIVATION_CHECKPOINTING_MAX_ENUM = 0x7FFFFFFF
} rt_activation_checkpointing;

typedef enum rt_attention {
  RT_ATTENTION_MATERIALIZED = 0,
  RT_ATTENTION_FLASH = 1,
  RT_ATTENTION_MAX_ENUM = 0x7FFFFFFF
} rt_attention;

typedef enum rt_backend {
  RT_BACKEND_CPU = 0,
  RT_BACKEND_CUDA = 1,
  RT_BACKEND_MAX_ENUM = 0x7FFFFFFF
} rt_backend;

typedef enum rt_fine_tuning_method {
  RT_FINE_TUNING_LORA = 0,
  RT_FINE_TUNING_FULL = 1,
  RT_FINE_TUNING_MAX_ENUM = 0x7FFFFFFF
} rt_fine_tuning_method;

/* LoRA targets, a bit set. */
#define RT_LORA_QUERY 0x01u
#define RT_LORA_KEY 0x02u
#define RT_LORA_VALUE 0x04u
#define RT_LORA_OUTPUT 0x08u
#define RT_LORA_GATE 0x10u
#define RT_LORA_UP 0x20u
#define RT_LORA_DOWN 0x40u

/* Loader flags, a bit set. */
#define RT_LOAD_ALLOW_NON_FINITE 0x01u     /* accept NaN or infinite weights */
#define RT_LOAD_ALLOW_BASE_MISMATCH 0x02u  /* adapters: accept another base model's fingerprint */

/* ---- configuration structs ------------------------------------------------------
 * Each begins with struct_size = sizeof(the struct as the caller compiled it):
 * a later 2.x may append fields, and a library reads only the fields the
 * caller's size covers (missing ones take their defaults) and writes no more
 * than that. Fill one with its *_default function (inline: it passes the
 * caller's sizeof to *_init), then change what you need. A struct nested in
 * another (the pipeline configs' model and lora) keeps its 2.0 layout. */

/* The architecture only: the checkpointing policy is not in it (nor in the
 * model-state file). */
typedef struct rt_transformer_config {
  size_t struct_size;
  int64_t vocab_size;
  int64_t context_length;
  int64_t model_width;
  int64_t heads;
  int64_t layers;
  int64_t feed_forward_width;
  float norm_epsilon;
  /* Appended after ABI 2.0 (a struct_size that ends before them gets the
   * defaults): key/value heads for grouped-query attention (0 = heads), the
   * RoPE base (10000), and nonzero tie_embeddings for an LM head that is the
   * token embedding. Inside rt_pretraining_config: a caller whose
   * rt_pretraining_config struct_size is ABI 2.0's has the 2.0 layout there
   * (the library reads and writes it as such); a newer caller's `model` has
   * these fields too. */
  int64_t key_value_heads;
  float rope_base;
  int32_t tie_embeddings;
} rt_transformer_config;
/* Fills the first struct_size bytes with the defaults and sets struct_size;
 * use the inline rt_transformer_config_default, which passes the caller's sizeof. */
RT_API rt_status rt_transformer_config_init(rt_transformer_config* config, size_t struct_size);
static inline rt_status rt_transformer_config_default(rt_transformer_config* config) { return rt_transformer_config_init(config, sizeof *config); }

typedef struct rt_lora_config {
  size_t struct_size;
  int64_t rank;
  float alpha;
  uint32_t targets; /* RT_LORA_* bits */
} rt_lora_config;
/* Fills the first struct_size bytes with the defaults and sets struct_size;
 * use the inline rt_lora_config_default, which passes the caller's sizeof. */
RT_API rt_status rt_lora_config_init(rt_lora_config* config, size_t struct_size);
static inline rt_status rt_lora_config_default(rt_lora_config* config) { return rt_lora_config_init(config, sizeof *config); }

typedef struct rt_adam_options {
  size_t struct_size;
  float learning_rate;
  float beta1;
  float beta2;
  float epsilon;
  float weight_decay;
  float max_grad_norm; /* 0 disables clipping */
} rt_adam_options;
/* Fills the first struct_size bytes with the defaults and sets struct_size;
 * use the inline rt_adam_options_default, which passes the caller's sizeof. */
RT_API rt_status rt_adam_options_init(rt_adam_options* options, size_t struct_size);
static inline rt_status rt_adam_options_default(rt_adam_options* options) { return rt_adam_options_init(options, sizeof *options); }

typedef struct rt_generation_options {
  size_t struct_size;
  int64_t max_new_tokens;
  float temperature; /* 0 = greedy */
  int64_t top_k;     /* the k most likely and any tied with the k-th; 0 = all */
  uint64_t seed;
  /* Appended after ABI 2.0 (a struct_size that ends before a field gets its
   * default). top_p: nucleus sampling in (0, 1], 1 = off. repetition_penalty:
   * > 0, 1 = off (CTRL / Hugging Face). stop: stop_count NUL-terminated
   * strings (NULL when stop_count is 0): generation stops when the new text
   * (bytes) contains one. num_samples: rt_generate_samples makes that many
   * (sample i seeded seed + i * 0x9E3779B97F4A7C15); rt_generate needs 1. */
  float top_p;
  float repetition_penalty;
  const char* const* stop;
  size_t stop_count;
  int64_t num_samples;
  /* Appended in ABI 2.9: stop_token_count token ids (NULL when the count is
   * 0) that end generation, as Hugging Face's eos_token_id (e.g. the id
   * rt_tokenizer_eos_id gives): the id is the last token written. */
  const int32_t* stop_tokens;
  size_t stop_token_count;
} rt_generation_options;
/* Fills the first struct_size bytes with the defaults and sets struct_size;
 * use the inline rt_generation_options_default, which passes the caller's sizeof. */
RT_API rt_status rt_generation_options_init(rt_generation_options* options, size_t struct_size);
static inline rt_status rt_generation_options_default(rt_generation_options* options) { return rt_generation_options_init(options, sizeof *options); }

typedef struct rt_memory_stats {
  size_t struct_size;
  int64_t live_bytes;
  int64_t peak_bytes;
  int64_t allocation_count;
  int64_t free_count;
  int64_t reserved_bytes; /* held by the allocator: live blocks plus freed blocks kept for reuse */
} rt_memory_stats;

/* ---- handles ------------------------------------------------------------------------ */

typedef struct rt_model rt_model;                   /* a DecoderOnlyTransformer */
typedef struct rt_variable rt_variable;             /* a graph node: a loss, logits, a parameter */
typedef struct rt_adam rt_adam;                     /* an optimizer over some parameters */
typedef struct rt_decode_session rt_decode_session; /* incremental decoding with a K/V cache */
typedef struct rt_generation rt_generation;         /* the samples of one rt_generate_samples call */

/* ---- model ---------------------------------------------------------------------------- */

RT_API rt_status rt_model_create(const rt_transformer_config* config, uint64_t seed, rt_attention attention,
                                 rt_activation_checkpointing activation_checkpointing, rt_model** out);
/* Graphs (variables) and decode sessions made from the model stay usable. */
RT_API rt_status rt_model_destroy(rt_model* model);
/* Fills the fields `config->struct_size` covers. */
RT_API rt_status rt_model_config(const rt_model* model, rt_transformer_config* config);

RT_API rt_status rt_model_set_activation_checkpointing(rt_model* model, rt_activation_checkpointing kind);
RT_API rt_status rt_model_activation_checkpointing(const rt_model* model, rt_activation_checkpointing* kind);
/* Blocks per segment for RT_ACTIVATION_CHECKPOINTING_BLOCK_SEGMENTS; 0 = round(sqrt(layers)). */
RT_API rt_status rt_model_set_checkpoint_segment_blocks(rt_model* model, int64_t blocks);
RT_API rt_status rt_model_set_attention(rt_model* model, rt_attention attention);
RT_API rt_status rt_model_attention(const rt_model* model, rt_attention* attention);
RT_API rt_status rt_model_set_dropout(rt_model* model, float probability, uint64_t seed);
RT_API rt_status rt_model_set_training(rt_model* model, int training);
/* Appended in ABI 2.7: the three settings above read back, as C++'s and
 * Python's getters do. Blocks per segment is the number in use:
 * round(sqrt(layers)) for 0 (at least 1), at most the layers. */
RT_API rt_status rt_model_checkpoint_segment_blocks(const rt_model* model, int64_t* blocks);
RT_API rt_status rt_model_dropout(const rt_model* model, float* probability);
RT_API rt_status rt_model_training(const rt_model* model, int* training);

/* Appended in ABI 2.4. rt_model_to moves every parameter (base weights and
 * adapters, with their gradients) to `backend`, as C++
 * DecoderOnlyTransformer::to: each move bumps the parameter's version, so
 * variables computed before and decode sessions opened before are stale
 * (RT_ERROR_STALE_GRAPH when used; open a new session). Moving to the
 * backend the model is on changes nothing. A backend this library is not
 * built with (or has no usable device for) is RT_ERROR_BACKEND and nothing
 * moves; a value that is not an rt_backend is RT_ERROR_INVALID_ARGUMENT. */
RT_API rt_status rt_model_to(rt_model* model, rt_backend backend);
RT_API rt_status rt_model_backend(const rt_model* model, rt_backend* backend);
/* Appended in ABI 2.4: activation offload (docs/checkpointing.md), 0 by
 * default. Nonzero keeps every checkpointed group's block-boundary input in
 * pinned host memory between its forward and its replay (cuda models; on
 * the CPU nothing moves; gradients are bit-identical either way). Affects
 * later forwards only. */
RT_API rt_status rt_model_set_activation_offload(rt_model* model, int offload);
RT_API rt_status rt_model_activation_offload(const rt_model* model, int* offload);

/* Parameters in the model's fixed order (base weights; not LoRA adapters). */
RT_API rt_status rt_model_parameter_count(const rt_model* model, size_t* count);
/* Total number of parameter elements (base weights). */
RT_API rt_status rt_model_parameter_elements(const rt_model* model, int64_t* elements);
/* Copies parameter `index`'s name into `buffer` (NUL-terminated). `*needed`
 * (may be NULL) receives the size it needs, NUL included; a buffer that is
 * too small gives RT_ERROR_INVALID_ARGUMENT and writes nothing. buffer NULL
 * with buffer_size 0 and `needed` set is a size query: RT_OK (ABI 2.6.1). */
RT_API rt_status rt_model_parameter_name(const rt_model* model, size_t index, char* buffer, size_t buffer_size,
                                         size_t* needed);
/* A handle to the named parameter (base or adapter), for its value and gradient. */
RT_API rt_status rt_model_parameter(const rt_model* model, const char* name, rt_variable** out);

/* tokens: batch * sequence_length ids, row-major. Logits (B, T, V). */
RT_API rt_status rt_model_forward(const rt_model* model, const int32_t* tokens, int64_t batch,
                                  int64_t sequence_length, rt_variable** logits);
/* Mean cross-entropy of the next-token targets (same layout; -100 is skipped). */
RT_API rt_status rt_model_loss(const rt_model* model, const int32_t* tokens, const int32_t* targets, int64_t batch,
                               int64_t sequence_length, rt_variable** loss);

/* LoRA adapters (docs/model-state.md). */
RT_API rt_status rt_model_add_lora(rt_model* model, const rt_lora_config* config, uint64_t seed);
RT_API rt_status rt_model_remove_lora(rt_model* model);
RT_API rt_status rt_model_set_lora_active(rt_model* model, int active);
RT_API rt_status rt_model_merge_lora(rt_model* model);
RT_API rt_status rt_model_set_base_trainable(rt_model* model, int trainable);
RT_API rt_status rt_model_has_lora(const rt_model* model, int* has_lora);

/* State files (safetensors). flags: RT_LOAD_ALLOW_NON_FINITE (the adapter loader
 * below also takes RT_LOAD_ALLOW_BASE_MISMATCH). */
RT_API rt_status rt_model_save(const rt_model* model, const char* path);
RT_API rt_status rt_model_load(rt_model* model, const char* path, uint32_t flags);
/* Hugging Face transformers Llama checkpoints (LlamaForCausalLM; config.json
 * plus model.safetensors or model.safetensors.index.json and shards; F32, F16
 * or BF16). from_hf: checkpoint directory -> model-state file. to_hf:
 * model-state file -> directory (created when missing) holding config.json and
 * model.safetensors. Unsupported config fields (rope_scaling, biases, ...) are
 * RT_ERROR_MODEL_STATE naming the field. flags: RT_LOAD_ALLOW_NON_FINITE. */
RT_API rt_status rt_convert_from_hf(const char* directory, const char* output, uint32_t flags);
RT_API rt_status rt_convert_to_hf(const char* model_state, const char* directory, uint32_t flags);
/* A new model of the file's dimensions with its weights. */
RT_API rt_status rt_model_load_new(const char* path, rt_attention attention,
                                   rt_activation_checkpointing activation_checkpointing, uint32_t flags,
                                   rt_model** out);
RT_API rt_status rt_model_save_adapter(const rt_model* model, const char* path);
RT_API rt_status rt_model_load_adapter(rt_model* model, const char* path, uint32_t flags);
/* 16 hex digits and a NUL into buffer[17] (or larger). */
RT_API rt_status rt_model_fingerprint(const rt_model* model, char* buffer, size_t buffer_size);

/* ---- variables -------------------------------------------------------------------------- */

RT_API rt_status rt_variable_destroy(rt_variable* variable);
RT_API rt_status rt_variable_backward(const rt_variable* variable);
/* Appended in ABI 2.5: backward with a seed and a choice of what happens to
 * the graph (Python's backward(seed, retain_graph=...); C++
 * Variable::backward(seed, GraphAfterBackward)). seed: NULL with
 * seed_count 0 seeds a scalar output with 1 (as rt_variable_backward);
 * otherwise seed_count must equal numel and the seed takes the variable's
 * shape. retain_graph 1 keeps the graph (rt_variable_backward's behaviour: a
 * later backward on it gives the same gradients); 0 frees each node's saved
 * tensors as the pass goes (a lower peak, bit-identical gradients), and a
 * later backward, rt_variable_leaf_count or rt_variable_leaf through the
 * released graph is RT_ERROR_BACKWARD (list the leaves before). Any other
 * retain_graph, or a seed_count that does not fit, is
 * RT_ERROR_INVALID_ARGUMENT and nothing runs. */
RT_API rt_status rt_variable_backward_ex(const rt_variable* variable, const float* seed, size_t seed_count,
                                         int retain_graph);
RT_API rt_status rt_variable_ndim(const rt_variable* variable, size_t* ndim);
/* Copies the shape into dims[0..ndim); max_dims must be >= ndim. */
RT_API rt_status rt_variable_shape(const rt_variable* variable, int64_t* dims, size_t max_dims);
RT_API rt_status rt_variable_numel(const rt_variable* variable, int64_t* numel);
/* count must equal numel. */
RT_API rt_status rt_variable_value(const rt_variable* variable, float* values, size_t count);
/* *has_grad = 0 (values untouched) before the first backward that reached it. */
RT_API rt_status rt_variable_grad(const rt_variable* variable, float* values, size_t count, int* has_grad);
/* Leaves only; count must equal numel. Bumps the version (graphs built before become stale). */
RT_API rt_status rt_variable_set_value(rt_variable* variable, const float* values, size_t count);
RT_API rt_status rt_variable_item(const rt_variable* variable, float* value);
RT_API rt_status rt_variable_name(const rt_variable* variable, char* buffer, size_t buffer_size, size_t* needed);
RT_API rt_status rt_variable_graph_statistics(const rt_variable* variable, int64_t* node_count,
                                              int64_t* element_count);
/* The leaves of the variable's graph that require grad (its parameters), in
 * a fixed order: their gradients stay readable after the model is destroyed. */
RT_API rt_status rt_variable_leaf_count(const rt_variable* variable, size_t* count);
RT_API rt_status rt_variable_leaf(const rt_variable* variable, size_t index, rt_variable** out);

/* ---- Adam ----------------------------------------------------------------------------------- */

/* Over every parameter of the model that requires grad now (base weights and
 * active adapters; frozen ones are left out). */
RT_API rt_status rt_adam_create(rt_model* model, const rt_adam_options* options, rt_adam** out);
/* The same parameters in two groups, as the stage pipelines use them:
 * "decay" (options->weight_decay) and "no_decay" (0: every RMSNorm weight,
 * plus the token embedding and LM head when decay_embeddings is 0). */
RT_API rt_status rt_adam_create_grouped(rt_model* model, const rt_adam_options* options, int decay_embeddings,
                                        rt_adam** out);
/* The weight decay Adam applies to the named parameter (RT_ERROR_VALUE when
 * this Adam does not train it). */
RT_API rt_status rt_adam_weight_decay(const rt_adam* adam, const char* parameter_name, float* weight_decay);
RT_API rt_status rt_adam_destroy(rt_adam* adam);
/* *grad_norm (may be NULL): the global gradient norm before clipping. A
 * gradient this Adam already stepped with is not applied again (a parameter
 * the backward passes since the last step did not reach keeps still). */
RT_API rt_status rt_adam_step(rt_adam* adam, float* grad_norm);
/* Appended in ABI 2.6: the optimizer step fused into the backward pass
 * (C++ Adam::backward_and_step): runs loss's backward, freeing the graph as
 * it goes (as rt_variable_backward_ex with retain_graph 0), and updates each
 * of this Adam's parameters as soon as its gradient is final, then frees that
 * gradient: the weights are bit-identical to a backward then rt_adam_step,
 * and afterwards this Adam's parameters have no gradient. loss must be a
 * scalar. Options with max_grad_norm > 0 are RT_ERROR_VALUE before anything
 * runs (clipping needs every gradient first), as is a loss that reaches none
 * of this Adam's parameters (2.6.1). A failure before the first update (a
 * stale graph, a non-finite gradient) changes no parameter, moment, gradient
 * or step count and has its own status (RT_ERROR_VALUE for a non-finite
 * gradient); the loss's graph, freed as the pass went, is gone as after a
 * failed rt_variable_backward_ex with retain_graph 0 (run the forward
 * again). One after it is RT_ERROR_PARTIAL_STEP. *grad_norm (may be NULL):
 * the global gradient norm. */
RT_API rt_status rt_adam_backward_and_step(rt_adam* adam, const rt_variable* loss, float* grad_norm);
RT_API rt_status rt_adam_zero_grad(rt_adam* adam);
RT_API rt_status rt_adam_set_learning_rate(rt_adam* adam, float learning_rate);
/* Appended in ABI 2.8: how many steps updated at least one parameter (C++
 * Adam::step_count), and how many updates the named parameter has had
 * (Adam::parameter_step_count, PyTorch's per-parameter state['step']): each
 * parameter's bias correction uses its own count, so one that had no
 * gradient at some steps is corrected by the updates it had. A name this
 * Adam does not train is RT_ERROR_VALUE. */
RT_API rt_status rt_adam_step_count(const rt_adam* adam, int64_t* steps);
RT_API rt_status rt_adam_parameter_step_count(const rt_adam* adam, const char* parameter_name, int64_t* steps);

/* ---- decoding --------------------------------------------------------------------------------- */

RT_API rt_status rt_decode_session_create(const rt_model* model, rt_decode_session** out);
RT_API rt_status rt_decode_session_destroy(rt_decode_session* session);
/* Appends `token`; writes the next-token logits (count must equal the vocabulary). */
RT_API rt_status rt_decode_session_decode(rt_decode_session* session, int32_t token, float* logits, size_t count);
RT_API rt_status rt_decode_session_reset(rt_decode_session* session);
RT_API rt_status rt_decode_session_position(const rt_decode_session* session, int64_t* position);

/* Feeds the prompt, then samples up to options->max_new_tokens into
 * tokens[0..capacity); *count receives how many were written; *reached_context
 * (may be NULL) is 1 when the context filled up first. capacity must be at
 * least max_new_tokens. */
RT_API rt_status rt_generate(const rt_model* model, const int32_t* prompt, size_t prompt_length,
                             const rt_generation_options* options, int32_t* tokens, size_t capacity, size_t* count,
                             int* reached_context);
/* options->num_samples independent samples; read them with
 * rt_generation_sample, free with rt_generation_destroy. */
RT_API rt_status rt_generate_samples(const rt_model* model, const int32_t* prompt, size_t prompt_length,
                                     const rt_generation_options* options, rt_generation** out);
RT_API rt_status rt_generation_sample_count(const rt_generation* generation, size_t* count);
/* Sample `index`: its new tokens (with a stop string: up to and including the
 * token that completed it), its text as bytes (cut before the stop string;
 * not NUL-terminated, text_length bytes), and (each may be NULL) stop_index
 * (which of options->stop matched, -1 none) and reached_context. The
 * pointers stay valid until rt_generation_destroy. */
RT_API rt_status rt_generation_sample(const rt_generation* generation, size_t index, const int32_t** tokens,
                                      size_t* token_count, const char** text, size_t* text_length,
                                      int64_t* stop_index, int* reached_context);
RT_API rt_status rt_generation_destroy(rt_generation* generation);

/* ---- memory ------------------------------------------------------------------------------------- */

RT_API rt_status rt_memory_stats_get(rt_backend backend, rt_memory_stats* stats);
RT_API rt_status rt_reset_peak_memory(void);

/* ---- stage pipelines ------------------------------------------------------------------------------ */

#define RT_PATH_CAPACITY 4096

/* Settings both stages share; see docs/pipelines.md. Strings are paths
 * (NUL-terminated, UTF-8); NULL or "" means the default. */
typedef struct rt_stage_settings {
  rt_attention attention;
  rt_activation_checkpointing activation_checkpointing;
  int64_t checkpoint_segment_blocks;
  float dropout;
  const char* data;
  int64_t steps;
  int64_t batch;
  int64_t sequence_length;
  float learning_rate;
  int64_t warmup_steps;
  float min_learning_rate_ratio;
  float weight_decay;
  float max_grad_norm;
  float beta1;
  float beta2;
  uint64_t seed;
  int64_t eval_interval;
  int64_t eval_batches;
  int64_t checkpoint_interval;
  const char* output_dir;
  int resume;
} rt_stage_settings;

/* A caller compiled against ABI 2.0 passes 2.0's (smaller) struct_size and
 * its `model` has the 2.0 layout; the library honours both. */
typedef struct rt_pretraining_config {
  size_t struct_size;
  rt_stage_settings stage;
  rt_transformer_config model; /* its own struct_size must be set too */
  double validation_fraction;
  /* Appended after ABI 2.0 (a smaller struct_size gets the defaults 1 and 1):
   * micro-batches per optimizer step (stage.batch is the micro-batch), and
   * whether the token embedding and LM head are weight-decayed. */
  int64_t gradient_accumulation_steps;
  int decay_embeddings;
  /* Appended after the fields above: a SentencePiece model file
   * (rt_train_tokenizer); NULL or "": the byte tokenizer. model.vocab_size
   * left at 256 takes the tokenizer's. A smaller struct_size reads it as NULL. */
  const char* tokenizer;
  /* Appended in ABI 2.2: bytes every step's activation peak must fit (0: no
   * budget); the run chooses what each block recomputes (stage.
   * activation_checkpointing must stay DISABLED) and records the plan in
   * metadata.json; a budget no plan fits is RT_ERROR_VALUE naming the
   * smallest. A smaller struct_size reads 0. */
  int64_t activation_memory_budget;
  /* Appended in ABI 2.2: nonzero keeps checkpointed groups' block-boundary
   * inputs in pinned host memory (activation offload, docs/checkpointing.md);
   * recorded in metadata.json; it moves inputs on a cuda run (device, ABI
   * 2.5) and nothing on the CPU. A smaller struct_size reads 0. */
  int activation_offload;
  /* Appended in ABI 2.3 (data parallelism under mpirun, docs/distributed.md):
   * zero_stage 0 (plain Adam on every rank) or 1 (ZeRO-1: Adam's moments
   * sharded across the ranks, the same bits; one process: plain Adam);
   * gradient_bucket_mib: the gradient all-reduce bucket size in MiB, in
   * [1, 65536]. Other values are RT_ERROR_VALUE naming the field. A smaller
   * struct_size reads 0 and 25. */
  int64_t zero_stage;
  int64_t gradient_bucket_mib;
  /* Appended in ABI 2.5: the device the run trains on (docs/distributed.md,
   * "The pipelines on CUDA"), RT_BACKEND_CPU by default. RT_BACKEND_CUDA on a
   * library built without CUDA, or with no CUDA device visible, is
   * RT_ERROR_BACKEND before the output directory is touched; a value that is
   * not an rt_backend is RT_ERROR_INVALID_ARGUMENT. Recorded in metadata.json;
   * a resume may change it. A smaller struct_size reads RT_BACKEND_CPU. */
  rt_backend device;
  /* Appended in ABI 2.6: nonzero runs each optimizer step inside the
   * backward pass (rt_adam_backward_and_step; docs/pipelines.md): the same
   * weights to the bit, without every gradient held at once. Needs
   * stage.max_grad_norm 0 (the default is 1), gradient_accumulation_steps 1
   * and one process, else RT_ERROR_VALUE naming the field before anything is
   * read or written. A non-finite gradient after some parameters moved ends
   * the run with RT_ERROR_PARTIAL_STEP (no final model; the last training
   * checkpoint is kept). Recorded in metadata.json; a resume may change it.
   * A smaller struct_size reads 0. */
  int32_t reserved_2_5_tail; /* 2.5's tail padding, named so that the 2.6
                              * field starts at 2.5's sizeof (a 2.5 caller's
                              * struct_size never covers it); never read */
  int optimizer_in_backward;
} rt_pretraining_config;
/* Fills the first struct_size bytes with the defaults and sets struct_size;
 * use the inline rt_pretraining_config_default, which passes the caller's sizeof. */
RT_API rt_status rt_pretraining_config_init(rt_pretraining_config* config, size_t struct_size);
static inline rt_status rt_pretraining_config_default(rt_pretraining_config* config) { return rt_pretraining_config_init(config, sizeof *config); }

typedef struct rt_post_training_config {
  size_t struct_size;
  rt_stage_settings stage;
  const char* base_model;
  int allow_non_finite;
  rt_fine_tuning_method fine_tuning_method;
  rt_lora_config lora; /* its own struct_size must be set too */
  /* Appended after ABI 2.0, as in rt_pretraining_config. */
  int64_t gradient_accumulation_steps;
  int decay_embeddings;
  /* Appended after the fields above: the SentencePiece model file the base
   * model records (NULL or "": bytes); another one, or none for a base that
   * records one, is RT_ERROR_VALUE naming both checksums. A smaller
   * struct_size reads it as NULL. */
  const char* tokenizer;
  /* Appended in ABI 2.2, as in rt_pretraining_config. */
  int64_t activation_memory_budget;
  int activation_offload;
  /* Appended in ABI 2.3, as in rt_pretraining_config. */
  int64_t zero_stage;
  int64_t gradient_bucket_mib;
  /* Appended in ABI 2.5, as in rt_pretraining_config. */
  rt_backend device;
  /* Appended in ABI 2.6, as in rt_pretraining_config (after 2.5's tail padding). */
  int32_t reserved_2_5_tail;
  int optimizer_in_backward;
} rt_post_training_config;
/* Fills the first struct_size bytes with the defaults and sets struct_size;
 * use the inline rt_post_training_config_default, which passes the caller's sizeof. */
RT_API rt_status rt_post_training_config_init(rt_post_training_config* config, size_t struct_size);
static inline rt_status rt_post_training_config_default(rt_post_training_config* config) { return rt_post_training_config_init(config, sizeof *config); }

typedef struct rt_step_report {
  size_t struct_size;
  int64_t step; /* 1-based: steps completed */
  int64_t total_steps;
  float loss;
  int has_validation_loss;
  float validation_loss;
  float learning_rate;
  float grad_norm;
  double tokens_per_second;
  double elapsed_seconds;
  double eta_seconds;
  int64_t peak_bytes;
  /* Appended in ABI 2.2 (check struct_size): the largest activation peak of
   * any micro-batch so far (forward + backward above the bytes live before). */
  int64_t activation_peak_bytes;
} rt_step_report;

/* Called after every step; return non-zero to stop the run (as an
 * interruption: no final files; a resume continues from the last checkpoint). */
typedef int (*rt_progress_fn)(const rt_step_report* report, void* user_data);

typedef struct rt_run_result {
  size_t struct_size;
  int completed;
  int64_t steps;
  int64_t resumed_from_step;
  float final_train_loss;
  float final_validation_loss;
  double tokens_per_second;
  int64_t peak_bytes;
  char output_dir[RT_PATH_CAPACITY];
  char weights[RT_PATH_CAPACITY]; /* model.safetensors or adapter.safetensors ("" when not completed) */
} rt_run_result;

/* progress may be NULL. result->struct_size must be set. */
RT_API rt_status rt_run_pretraining(const rt_pretraining_config* config, rt_progress_fn progress, void* user_data,
                                    rt_run_result* result);
RT_API rt_status rt_run_post_training(const rt_post_training_config* config, rt_progress_fn progress,
                                      void* user_data, rt_run_result* result);

/* ---- tokenizers and evaluation (appended after 2.0) ------------------------------------------------------------ */

/* Trains a SentencePiece tokenizer (model_type "bpe" or "unigram"; byte
 * fallback; deterministic) on the UTF-8 text file `data` (NULL or "": the
 * default corpus) and writes it atomically to `output`. */
RT_API rt_status rt_train_tokenizer(const char* data, int64_t vocab_size, const char* model_type, const char* output);
/* ABI 2.9: the end-of-sequence id of a SentencePiece model file (NULL or ""
 * is bytes), -1 when it has none (bytes, and rt_train_tokenizer's models). */
RT_API rt_status rt_tokenizer_eos_id(const char* tokenizer, int32_t* eos_id);

typedef struct rt_evaluation_result {
  size_t struct_size;
  int64_t tokens;       /* targets scored: every id of the text but the first */
  int64_t bytes;        /* bytes of text those targets stand for */
  double loss;          /* mean cross-entropy per scored token, nats */
  double perplexity;    /* exp(loss) */
  double bits_per_byte; /* loss * tokens / (bytes * ln 2) */
} rt_evaluation_result;

/* Loss, perplexity and bits per byte of `model` on text[0, text_length)
 * (UTF-8), cut into non-overlapping windows of sequence_length ids (0: the
 * context length), `batch` windows per forward. `tokenizer`: a SentencePiece
 * model file, NULL or "" for bytes; its vocabulary must be the model's.
 * result->struct_size must be set. */
RT_API rt_status rt_evaluate(rt_model* model, const char* text, size_t text_length, const char* tokenizer,
                             int64_t batch, int64_t sequence_length, rt_evaluation_result* result);

/* Appended in ABI 2.8: the part of text[0, text_length) that a run with
 * validation_fraction trains on (RT_SPLIT_TRAIN) or holds out
 * (RT_SPLIT_VALIDATION: the last floor(fraction * bytes) bytes, the cut moved
 * forward to a UTF-8 character boundary), as C++ split_text, Python's
 * riftco.split_text and rt-eval --split: *offset and *length locate it in
 * `text` (no copy), so rt_evaluate(model, text + offset, length, ...) scores
 * the held-out part. validation_fraction outside [0, 1) is RT_ERROR_VALUE;
 * another split value RT_ERROR_INVALID_ARGUMENT. */
typedef enum rt_split { RT_SPLIT_TRAIN = 0, RT_SPLIT_VALIDATION = 1, RT_SPLIT_MAX_ENUM = 0x7FFFFFFF } rt_split;
RT_API rt_status rt_split_text(const char* text, size_t text_length, rt_split split, double validation_fraction,
                               size_t* offset, size_t* length);

#ifdef __cplusplus
}
#endif

#endif /* RIFTCO_TRANSFORMER_RT_H */
