// rt_adam_*, rt_decode_session_*, rt_generate, rt_run_*: training and decoding.
#include <cmath>
#include <memory>
#include <utility>

#include "c_api_common.hpp"
#include "riftco_transformer/evaluation.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace rt_c;
namespace rt = riftco_transformer;

namespace {


const rt::DecoderOnlyTransformer& model_of(const rt_model* model, const char* function) {
  const rt_model& m = require(model, function, "model");
  if (!m.model) bad_argument(function, "model handle holds no model");
  return *m.model;
}

rt::StageSettings stage_settings(const rt_stage_settings& c, const char* function) {
  rt::StageSettings s;
  s.attention = rt_c::attention(c.attention, function);
  s.activation_checkpointing = policy(c.activation_checkpointing, function);
  s.checkpoint_segment_blocks = c.checkpoint_segment_blocks;
  s.dropout = c.dropout;
  if (c.data != nullptr) s.data = c.data;
  s.steps = c.steps;
  s.batch = c.batch;
  s.sequence_length = c.sequence_length;
  s.learning_rate = c.learning_rate;
  s.warmup_steps = c.warmup_steps;
  s.min_learning_rate_ratio = c.min_learning_rate_ratio;
  s.weight_decay = c.weight_decay;
  s.max_grad_norm = c.max_grad_norm;
  s.beta1 = c.beta1;
  s.beta2 = c.beta2;
  s.seed = c.seed;
  s.eval_interval = c.eval_interval;
  s.eval_batches = c.eval_batches;
  s.checkpoint_interval = c.checkpoint_interval;
  if (c.output_dir != nullptr && c.output_dir[0] != '\0') s.output_dir = c.output_dir;
  s.resume = c.resume != 0;
  return s;
}

rt_stage_settings stage_defaults(const rt::StageSettings& s) {
  rt_stage_settings c{};
  c.attention = to_c(s.attention);
  c.activation_checkpointing = to_c(s.activation_checkpointing);
  c.checkpoint_segment_blocks = s.checkpoint_segment_blocks;
  c.dropout = s.dropout;
  c.data = nullptr;
  c.steps = s.steps;
  c.batch = s.batch;
  c.sequence_length = s.sequence_length;
  c.learning_rate = s.learning_rate;
  c.warmup_steps = s.warmup_steps;
  c.min_learning_rate_ratio = s.min_learning_rate_ratio;
  c.weight_decay = s.weight_decay;
  c.max_grad_norm = s.max_grad_norm;
  c.beta1 = s.beta1;
  c.beta2 = s.beta2;
  c.seed = s.seed;
  c.eval_interval = s.eval_interval;
  c.eval_batches = s.eval_batches;
  c.checkpoint_interval = s.checkpoint_interval;
  c.output_dir = nullptr;  // the C++ default, runs/run
  c.resume = s.resume ? 1 : 0;
  return c;
}

/// The fields appended to rt_pretraining_config / rt_post_training_config
/// after ABI 2.0, where the caller's struct_size covers them.
template <typename Config>
void appended_settings(const Config& c, rt::StageSettings& s, const char* function) {
  if (RT_C_COVERS(c, gradient_accumulation_steps)) s.gradient_accumulation_steps = c.gradient_accumulation_steps;
  if (RT_C_COVERS(c, decay_embeddings)) s.decay_embeddings = c.decay_embeddings != 0;
  if (RT_C_COVERS(c, tokenizer) && c.tokenizer != nullptr) s.tokenizer = c.tokenizer;
  if (RT_C_COVERS(c, activation_memory_budget)) s.activation_memory_budget = c.activation_memory_budget;
  if (RT_C_COVERS(c, activation_offload)) s.activation_offload = c.activation_offload != 0;
  if (RT_C_COVERS(c, zero_stage)) s.zero_stage = c.zero_stage;
  if (RT_C_COVERS(c, gradient_bucket_mib)) s.gradient_bucket_mib = c.gradient_bucket_mib;
  if (RT_C_COVERS(c, device)) s.device = rt_c::backend(c.device, function);  // another value: INVALID_ARGUMENT
  if (RT_C_COVERS(c, optimizer_in_backward)) s.optimizer_in_backward = c.optimizer_in_backward != 0;
}

rt::GenerationOptions generation_options(const rt_generation_options& o, const char* function) {
  rt::GenerationOptions g;
  g.max_new_tokens = o.max_new_tokens;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.seed = o.seed;
  if (RT_C_COVERS(o, top_p)) g.top_p = o.top_p;
  if (RT_C_COVERS(o, repetition_penalty)) g.repetition_penalty = o.repetition_penalty;
  if (RT_C_COVERS(o, stop_count) && o.stop_count > 0) {
    if (o.stop == nullptr) bad_argument(function, "options->stop is NULL but stop_count is " + std::to_string(o.stop_count));
    if (o.stop_count > 65536) bad_argument(function, "options->stop_count " + std::to_string(o.stop_count) + " is over 65536");
    for (std::size_t i = 0; i < o.stop_count; ++i) {
      if (o.stop[i] == nullptr) bad_argument(function, "options->stop[" + std::to_string(i) + "] is NULL");
      g.stop.emplace_back(o.stop[i]);
    }
  }
  if (RT_C_COVERS(o, num_samples)) g.num_samples = o.num_samples;
  if (RT_C_COVERS(o, stop_token_count) && o.stop_token_count > 0) {
    if (o.stop_tokens == nullptr) {
      bad_argument(function, "options->stop_tokens is NULL but stop_token_count is " +
                                 std::to_string(o.stop_token_count));
    }
    if (o.stop_token_count > 65536) {
      bad_argument(function, "options->stop_token_count " + std::to_string(o.stop_token_count) + " is over 65536");
    }
    g.stop_tokens.assign(o.stop_tokens, o.stop_tokens + o.stop_token_count);  // checked against the vocabulary there
  }
  return g;
}

rt::ProgressCallback progress_of(rt_progress_fn progress, void* user_data) {
  if (progress == nullptr) return {};
  return [progress, user_data](const rt::StepReport& r) {
    rt_step_report c{sizeof(rt_step_report), r.step, r.total_steps, r.loss, r.validation_loss ? 1 : 0,
                     r.validation_loss.value_or(0.0F), r.learning_rate, r.grad_norm, r.tokens_per_second,
                     r.elapsed_seconds, r.eta_seconds, r.peak_bytes, r.activation_peak_bytes};
    return progress(&c, user_data) == 0;
  };
}

/// Before a run: the result struct can be written and the paths will fit it
/// (a run that cannot report must not train and write files first).
void check_result(rt_run_result* out, const std::filesystem::path& output_dir, const char* function) {
  const rt_run_result& r = require(out, function, "result");
  if (r.struct_size < abi20_size<rt_run_result>()) {
    bad_argument(function, "result->struct_size is " + std::to_string(r.struct_size) + ", smaller than ABI 2.0's " +
                               std::to_string(abi20_size<rt_run_result>()));
  }
  const std::size_t longest = (output_dir / "adapter.safetensors").string().size();
  if (longest >= RT_PATH_CAPACITY) {
    bad_argument(function, "the output directory's paths (" + std::to_string(longest) +
                               " bytes) do not fit RT_PATH_CAPACITY (" + std::to_string(RT_PATH_CAPACITY) + ")");
  }
}

void write_result(const rt::RunResult& r, rt_run_result* out, const char* function) {
  rt_run_result c{};
  c.completed = r.completed ? 1 : 0;
  c.steps = r.steps;
  c.resumed_from_step = r.resumed_from_step;
  c.final_train_loss = r.final_train_loss;
  c.final_validation_loss = r.final_validation_loss;
  c.tokens_per_second = r.tokens_per_second;
  c.peak_bytes = r.peak_bytes;
  const std::string dir = r.output_dir.string();
  const std::string weights = r.weights.string();
  if (dir.size() >= RT_PATH_CAPACITY || weights.size() >= RT_PATH_CAPACITY) {
    bad_argument(function, "an output path is longer than RT_PATH_CAPACITY - 1 bytes");
  }
  std::memcpy(c.output_dir, dir.c_str(), dir.size() + 1);
  std::memcpy(c.weights, weights.c_str(), weights.size() + 1);
  write_struct(out, c, function, "result");
}

/// Base and adapter parameters that require grad, in the model's order.
std::vector<rt::NamedParameter> trainable_parameters(const rt::DecoderOnlyTransformer& m) {
  std::vector<rt::NamedParameter> params;
  for (const auto& list : {m.parameters(), m.lora_parameters()}) {
    for (const rt::NamedParameter& p : list) {
      if (p.variable.requires_grad()) params.push_back(p);
    }
  }
  return params;
}

rt::AdamOptions adam_options(const rt_adam_options& o) {
  rt::AdamOptions a;
  a.learning_rate = o.learning_rate;
  a.beta1 = o.beta1;
  a.beta2 = o.beta2;
  a.epsilon = o.epsilon;
  a.weight_decay = o.weight_decay;
  a.max_grad_norm = o.max_grad_norm;
  return a;
}

}  // namespace

extern "C" {

rt_status rt_adam_create(rt_model* model, const rt_adam_options* options, rt_adam** out) {
  constexpr const char* f = "rt_adam_create";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    const rt_adam_options& o = require_struct(options, f, "options");
    require(out, f, "out");
    std::vector<rt::Variable> params;
    for (const rt::NamedParameter& p : trainable_parameters(m)) params.push_back(p.variable);
    *out = new rt_adam{rt::Adam(std::move(params), adam_options(o))};
  });
}

rt_status rt_adam_create_grouped(rt_model* model, const rt_adam_options* options, int decay_embeddings,
                                 rt_adam** out) {
  constexpr const char* f = "rt_adam_create_grouped";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    const rt_adam_options& o = require_struct(options, f, "options");
    require(out, f, "out");
    const rt::AdamOptions a = adam_options(o);
    a.validate();  // before the groups: a bad weight decay names the option, not a group
    *out = new rt_adam{
        rt::Adam(rt::default_parameter_groups(trainable_parameters(m), o.weight_decay, decay_embeddings != 0), a)};
  });
}

/// The index in `adam`'s parameters of the one named `name` (a C caller
/// cannot rename a Variable: the model's structural names); ValueError
/// naming the function otherwise.
namespace {
std::size_t parameter_index(const rt::Adam& adam, const char* name, const char* function) {
  for (std::size_t i = 0; i < adam.parameters().size(); ++i) {
    if (adam.parameters()[i].name() == name) return i;
  }
  throw rt::ValueError(std::string("[") + function + "] this Adam trains no parameter named '" + name + "'");
}
}  // namespace

rt_status rt_adam_weight_decay(const rt_adam* adam, const char* parameter_name, float* weight_decay) {
  constexpr const char* f = "rt_adam_weight_decay";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Adam& a = require(adam, f, "adam").adam;
    require(parameter_name, f, "parameter_name");
    float& out = require(weight_decay, f, "weight_decay");
    out = a.weight_decay_of(parameter_index(a, parameter_name, f));
  });
}

rt_status rt_adam_step_count(const rt_adam* adam, int64_t* steps) {
  constexpr const char* f = "rt_adam_step_count";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Adam& a = require(adam, f, "adam").adam;
    require(steps, f, "steps") = a.step_count();
  });
}

rt_status rt_adam_parameter_step_count(const rt_adam* adam, const char* parameter_name, int64_t* steps) {
  constexpr const char* f = "rt_adam_parameter_step_count";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Adam& a = require(adam, f, "adam").adam;
    require(parameter_name, f, "parameter_name");
    int64_t& out = require(steps, f, "steps");
    out = a.parameter_step_count(parameter_index(a, parameter_name, f));
  });
}

rt_status rt_adam_destroy(rt_adam* adam) {
  delete adam;
  return RT_OK;
}

rt_status rt_adam_step(rt_adam* adam, float* grad_norm) {
  constexpr const char* f = "rt_adam_step";
  return guard(f, [&] {
    const ChangeLock lock(f);  // writes the parameters in place: no forward or save reads them meanwhile
    const float norm = require(adam, f, "adam").adam.step();
    if (grad_norm != nullptr) *grad_norm = norm;
  });
}

rt_status rt_adam_backward_and_step(rt_adam* adam, const rt_variable* loss, float* grad_norm) {
  constexpr const char* f = "rt_adam_backward_and_step";
  return guard(f, [&] {
    const ChangeLock lock(f);
    rt::Adam& a = require(adam, f, "adam").adam;
    const float norm = a.backward_and_step(variable_of(loss, f, "loss"), rt::GraphAfterBackward::Release);
    if (grad_norm != nullptr) *grad_norm = norm;
  });
}

rt_status rt_adam_zero_grad(rt_adam* adam) {
  constexpr const char* f = "rt_adam_zero_grad";
  return guard(f, [&] {
    const ReadLock lock;
    require(adam, f, "adam").adam.zero_grad();
  });
}

rt_status rt_adam_set_learning_rate(rt_adam* adam, float learning_rate) {
  constexpr const char* f = "rt_adam_set_learning_rate";
  return guard(f, [&] {
    const ReadLock lock;
    require(adam, f, "adam").adam.set_learning_rate(learning_rate);
  });
}

rt_status rt_decode_session_create(const rt_model* model, rt_decode_session** out) {
  constexpr const char* f = "rt_decode_session_create";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    require(out, f, "out");
    *out = new rt_decode_session{rt::DecodeSession(m)};
  });
}

rt_status rt_decode_session_destroy(rt_decode_session* session) {
  delete session;
  return RT_OK;
}

rt_status rt_decode_session_decode(rt_decode_session* session, int32_t token, float* logits, size_t count) {
  constexpr const char* f = "rt_decode_session_decode";
  return guard(f, [&] {
    const ReadLock lock;
    rt::DecodeSession& s = require(session, f, "session").session;
    require(logits, f, "logits");
    const std::int64_t vocab = s.vocab_size();
    if (static_cast<std::int64_t>(count) != vocab) {
      bad_argument(f, "count is " + std::to_string(count) + " but the vocabulary is " + std::to_string(vocab));
    }
    const rt::Tensor out = s.decode_token(token).to(rt::Backend::Cpu);  // a cuda model's logits too
    std::memcpy(logits, out.data(), count * sizeof(float));
  });
}

rt_status rt_decode_session_reset(rt_decode_session* session) {
  constexpr const char* f = "rt_decode_session_reset";
  return guard(f, [&] {
    const ReadLock lock;
    require(session, f, "session").session.reset();
  });
}

rt_status rt_decode_session_position(const rt_decode_session* session, int64_t* position) {
  constexpr const char* f = "rt_decode_session_position";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecodeSession& s = require(session, f, "session").session;
    require(position, f, "position") = s.position();
  });
}

rt_status rt_generate(const rt_model* model, const int32_t* prompt, size_t prompt_length,
                      const rt_generation_options* options, int32_t* tokens, size_t capacity, size_t* count,
                      int* reached_context) {
  constexpr const char* f = "rt_generate";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    const rt_generation_options& o = require_struct(options, f, "options");
    if (prompt_length > 0) require(prompt, f, "prompt");
    require(count, f, "count");
    if (capacity > 0) require(tokens, f, "tokens");
    if (o.max_new_tokens >= 0 && capacity < static_cast<std::uint64_t>(o.max_new_tokens)) {
      bad_argument(f, "capacity " + std::to_string(capacity) + " is smaller than max_new_tokens " +
                          std::to_string(o.max_new_tokens));
    }
    rt::check_prompt_length(m, prompt_length);  // before a view over the buffer is made
    const rt::GenerationOptions g = generation_options(o, f);
    const rt::GenerationResult r = rt::generate(m, std::span<const std::int32_t>(prompt, prompt_length), g);
    std::copy(r.tokens.begin(), r.tokens.end(), tokens);
    *count = r.tokens.size();
    if (reached_context != nullptr) *reached_context = r.reached_context ? 1 : 0;
  });
}

rt_status rt_generate_samples(const rt_model* model, const int32_t* prompt, size_t prompt_length,
                              const rt_generation_options* options, rt_generation** out) {
  constexpr const char* f = "rt_generate_samples";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::DecoderOnlyTransformer& m = model_of(model, f);
    const rt_generation_options& o = require_struct(options, f, "options");
    if (prompt_length > 0) require(prompt, f, "prompt");
    require(out, f, "out");
    rt::check_prompt_length(m, prompt_length);  // before a view over the buffer is made
    const rt::GenerationOptions g = generation_options(o, f);
    auto generation = std::make_unique<rt_generation>();
    generation->samples = rt::generate_samples(m, std::span<const std::int32_t>(prompt, prompt_length), g);
    *out = generation.release();
  });
}

rt_status rt_generation_sample_count(const rt_generation* generation, size_t* count) {
  constexpr const char* f = "rt_generation_sample_count";
  return guard(f, [&] {
    const ReadLock lock;
    require(count, f, "count") = require(generation, f, "generation").samples.size();
  });
}

rt_status rt_generation_sample(const rt_generation* generation, size_t index, const int32_t** tokens,
                               size_t* token_count, const char** text, size_t* text_length, int64_t* stop_index,
                               int* reached_context) {
  constexpr const char* f = "rt_generation_sample";
  return guard(f, [&] {
    const ReadLock lock;
    const rt_generation& g = require(generation, f, "generation");
    require(tokens, f, "tokens");
    require(token_count, f, "token_count");
    require(text, f, "text");
    require(text_length, f, "text_length");
    if (index >= g.samples.size()) {
      bad_argument(f, "index " + std::to_string(index) + " is out of range (" + std::to_string(g.samples.size()) +
                          " samples)");
    }
    const rt::GenerationResult& r = g.samples[index];
    *tokens = r.tokens.data();
    *token_count = r.tokens.size();
    *text = r.text.data();
    *text_length = r.text.size();
    if (stop_index != nullptr) *stop_index = r.stop_index;
    if (reached_context != nullptr) *reached_context = r.reached_context ? 1 : 0;
  });
}

rt_status rt_generation_destroy(rt_generation* generation) {
  delete generation;
  return RT_OK;
}

rt_status rt_pretraining_config_init(rt_pretraining_config* config, size_t struct_size) {
  constexpr const char* f = "rt_pretraining_config_init";
  return guard(f, [&] {
    const rt::PretrainingConfig d;
    if (config != nullptr && struct_size >= sizeof(rt_c::PretrainingConfig20) &&
        struct_size < offsetof(rt_pretraining_config, gradient_accumulation_steps)) {
      rt_c::PretrainingConfig20 old{};  // a 2.0 caller: the 2.0 layout
      old.struct_size = struct_size;
      old.stage = stage_defaults(d);
      const rt::TransformerDimensions& m = d.dimensions;
      old.model = {sizeof(rt_c::TransformerConfig20), m.vocab_size, m.context_length, m.model_width, m.heads,
                   m.layers, m.feed_forward_width, d.norm_epsilon};
      old.validation_fraction = d.validation_fraction;
      std::memcpy(static_cast<void*>(config), &old, sizeof old);
      return;
    }
    rt_pretraining_config c{};
    c.stage = stage_defaults(d);
    c.model = to_c(d.dimensions, d.norm_epsilon);
    c.validation_fraction = d.validation_fraction;
    c.gradient_accumulation_steps = d.gradient_accumulation_steps;
    c.decay_embeddings = d.decay_embeddings ? 1 : 0;
    c.tokenizer = nullptr;
    c.activation_memory_budget = 0;
    c.activation_offload = 0;
    c.zero_stage = d.zero_stage;
    c.gradient_bucket_mib = d.gradient_bucket_mib;
    c.device = to_c(d.device);
    c.optimizer_in_backward = d.optimizer_in_backward ? 1 : 0;
    init_struct(config, struct_size, c, f);
  });
}

rt_status rt_post_training_config_init(rt_post_training_config* config, size_t struct_size) {
  constexpr const char* f = "rt_post_training_config_init";
  return guard(f, [&] {
    const rt::PostTrainingConfig d;
    rt_post_training_config c{};
    c.stage = stage_defaults(d);
    c.base_model = nullptr;
    c.allow_non_finite = 0;
    c.fine_tuning_method = RT_FINE_TUNING_LORA;
    rt_lora_config_init(&c.lora, sizeof c.lora);
    c.gradient_accumulation_steps = d.gradient_accumulation_steps;
    c.decay_embeddings = d.decay_embeddings ? 1 : 0;
    c.tokenizer = nullptr;
    c.activation_memory_budget = 0;
    c.activation_offload = 0;
    c.zero_stage = d.zero_stage;
    c.gradient_bucket_mib = d.gradient_bucket_mib;
    c.device = to_c(d.device);
    c.optimizer_in_backward = d.optimizer_in_backward ? 1 : 0;
    init_struct(config, struct_size, c, f);
  });
}

rt_status rt_run_pretraining(const rt_pretraining_config* config, rt_progress_fn progress, void* user_data,
                             rt_run_result* result) {
  constexpr const char* f = "rt_run_pretraining";
  return guard(f, [&] {
    const rt_pretraining_config& given = require(config, f, "config");
    rt_pretraining_config c{};
    if (given.struct_size >= sizeof(rt_c::PretrainingConfig20) &&
        given.struct_size < offsetof(rt_pretraining_config, gradient_accumulation_steps)) {
      rt_c::PretrainingConfig20 old{};  // a 2.0 caller: read its layout
      std::memcpy(&old, static_cast<const void*>(&given), sizeof old);
      c.struct_size = sizeof c;
      c.stage = old.stage;
      c.validation_fraction = old.validation_fraction;
      if (old.model.struct_size < sizeof(rt_c::TransformerConfig20)) {
        bad_argument(f, "config->model->struct_size is " + std::to_string(old.model.struct_size) +
                            ", smaller than ABI 2.0's " + std::to_string(sizeof(rt_c::TransformerConfig20)));
      }
      std::memcpy(static_cast<void*>(&c.model), &old.model, sizeof old.model);
      c.model.struct_size = sizeof old.model;  // the appended fields take their defaults
      // ...and so do the fields appended to the config itself.
      c.struct_size = offsetof(rt_pretraining_config, gradient_accumulation_steps);
    } else {
      c = read_struct(config, f, "config");  // an older 2.x caller's struct may end before tokenizer
    }
    const rt_transformer_config& m = require_struct(&c.model, f, "config->model");
    require(result, f, "result");
    rt::PretrainingConfig p;
    static_cast<rt::StageSettings&>(p) = stage_settings(c.stage, f);
    p.dimensions = dimensions(m);
    p.norm_epsilon = m.norm_epsilon;
    p.validation_fraction = c.validation_fraction;
    appended_settings(c, p, f);
    check_result(result, p.output_dir, f);
    write_result(rt::run_pretraining(p, progress_of(progress, user_data)), result, f);
  });
}

rt_status rt_run_post_training(const rt_post_training_config* config, rt_progress_fn progress, void* user_data,
                               rt_run_result* result) {
  constexpr const char* f = "rt_run_post_training";
  return guard(f, [&] {
    const rt_post_training_config& c = require_struct(config, f, "config");
    require(result, f, "result");
    const int method = enum_value(c.fine_tuning_method);
    if (method != RT_FINE_TUNING_LORA && method != RT_FINE_TUNING_FULL) {
      bad_argument(f, "fine_tuning_method " + std::to_string(method) +
                          " is not an rt_fine_tuning_method value (0 lora, 1 full)");
    }
    rt::PostTrainingConfig p;
    static_cast<rt::StageSettings&>(p) = stage_settings(c.stage, f);
    if (c.base_model != nullptr) p.base_model = c.base_model;
    p.allow_non_finite = c.allow_non_finite != 0;
    p.fine_tuning_method = method == RT_FINE_TUNING_FULL ? rt::FineTuningMethod::Full : rt::FineTuningMethod::Lora;
    if (p.fine_tuning_method == rt::FineTuningMethod::Lora) p.lora = lora(require_struct(&c.lora, f, "config->lora"), f);
    appended_settings(c, p, f);
    check_result(result, p.output_dir, f);
    write_result(rt::run_post_training(p, progress_of(progress, user_data)), result, f);
  });
}

rt_status rt_train_tokenizer(const char* data, int64_t vocab_size, const char* model_type, const char* output) {
  constexpr const char* f = "rt_train_tokenizer";
  return guard(f, [&] {
    if (output == nullptr || output[0] == '\0') bad_argument(f, "output is NULL or empty");
    if (model_type == nullptr) bad_argument(f, "model_type is NULL (\"bpe\" or \"unigram\")");
    rt::TokenizerTrainingOptions o;
    o.vocab_size = vocab_size;
    o.model_type = rt::parse_tokenizer_model_type(model_type, f);
    const std::string text = data == nullptr || data[0] == '\0' ? rt::load_default_corpus() : rt::load_text_file(data);
    rt::train_tokenizer(text, o, output);
  });
}

rt_status rt_tokenizer_eos_id(const char* tokenizer, int32_t* eos_id) {
  constexpr const char* f = "rt_tokenizer_eos_id";
  return guard(f, [&] {
    int32_t& out = require(eos_id, f, "eos_id");
    out = tokenizer == nullptr || tokenizer[0] == '\0' ? -1 : rt::Tokenizer::load(tokenizer).eos_id();
  });
}

rt_status rt_evaluate(rt_model* model, const char* text, size_t text_length, const char* tokenizer, int64_t batch,
                      int64_t sequence_length, rt_evaluation_result* result) {
  constexpr const char* f = "rt_evaluate";
  return guard(f, [&] {
    const ReadLock lock;
    rt_model& m = require(model, f, "model");
    if (!m.model) bad_argument(f, "model handle holds no model");
    if (text == nullptr && text_length > 0) bad_argument(f, "text is NULL");
    const rt_evaluation_result& r = require(result, f, "result");
    if (r.struct_size < abi20_size<rt_evaluation_result>()) {
      bad_argument(f, "result->struct_size is " + std::to_string(r.struct_size) + ", smaller than its first version's " +
                          std::to_string(abi20_size<rt_evaluation_result>()));
    }
    const rt::Tokenizer t =
        tokenizer == nullptr || tokenizer[0] == '\0' ? rt::Tokenizer{} : rt::Tokenizer::load(tokenizer);
    rt::EvaluationOptions o;
    o.batch = batch;
    o.sequence_length = sequence_length;
    const rt::EvaluationResult e =
        rt::evaluate(*m.model, std::string_view(text == nullptr ? "" : text, text_length), t, o);
    write_struct(result, rt_evaluation_result{sizeof(rt_evaluation_result), e.tokens, e.bytes, e.loss, e.perplexity,
                                              e.bits_per_byte},
                 f, "result");
  });
}

rt_status rt_split_text(const char* text, size_t text_length, rt_split split, double validation_fraction,
                        size_t* offset, size_t* length) {
  constexpr const char* f = "rt_split_text";
  return guard(f, [&] {
    if (text == nullptr && text_length > 0) bad_argument(f, "text is NULL");
    const int value = rt_c::enum_value(split);
    if (value != RT_SPLIT_TRAIN && value != RT_SPLIT_VALIDATION) {
      bad_argument(f, "split " + std::to_string(value) + " is not an rt_split value (0 train, 1 validation)");
    }
    size_t& at = require(offset, f, "offset");
    size_t& size = require(length, f, "length");
    const std::string_view all(text == nullptr ? "" : text, text_length);
    const std::string_view part = rt::split_text(
        all, value == RT_SPLIT_TRAIN ? rt::Split::Train : rt::Split::Validation, validation_fraction);
    at = static_cast<size_t>(part.data() - all.data());
    size = part.size();
  });
}

}  // extern "C"
