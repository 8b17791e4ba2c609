// StageSettings: learning-rate schedule, validation, JSON.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <cmath>

#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "../tensor/device_runtime.hpp"
#include "stage_loop.hpp"

namespace riftco_transformer {

float StageSettings::learning_rate_at(std::int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return learning_rate * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  // Steps warmup_steps .. steps-1 decay from lr to lr·ratio, the last one at
  // lr·ratio. A single such step after a warmup (which reached lr) is that
  // last step (before 2026-12-02 it ran at lr: the decay was never reached);
  // a one-step run without warmup runs at lr.
  const std::int64_t decay_steps = steps - warmup_steps - 1;
  const double progress =
      decay_steps <= 0
          ? (warmup_steps > 0 ? 1.0 : 0.0)
          : std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress));
  const double floor = static_cast<double>(min_learning_rate_ratio);
  return static_cast<float>(static_cast<double>(learning_rate) * (floor + (1.0 - floor) * cosine));
}

void StageSettings::check_device(const char* op) const {
  if (device != Backend::Cpu && device != Backend::Cuda) {
    throw ValueError(std::string("[") + op + "] unknown device " + std::to_string(static_cast<int>(device)) +
                     " (expected cpu or cuda)");
  }
  if (!backend_available(device)) {
    throw BackendError(std::string("[") + op + "] device " + backend_name(device) + ": " +
                       backend_unavailable_reason(device) + "; train with device cpu");
  }
}

std::vector<ParameterGroup> default_parameter_groups(const std::vector<NamedParameter>& parameters,
                                                     float weight_decay, bool decay_embeddings) {
  ParameterGroup decay{"decay", {}, weight_decay};
  ParameterGroup no_decay{"no_decay", {}, 0.0F};
  for (const NamedParameter& p : parameters) {
    const bool norm = p.name.find("norm") != std::string::npos;
    const bool embedding = p.name == "token_embedding.weight" || p.name == "lm_head.weight";
    (norm || (embedding && !decay_embeddings) ? no_decay : decay).parameters.push_back(p.variable);
  }
  return {decay, no_decay};
}

std::string file_fingerprint(const std::filesystem::path& path) { return stage::fingerprint(stage::read_bytes(path)); }

namespace stage {

std::string fingerprint(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::string read_bytes(const std::filesystem::path& path) {
  std::string bytes;
  if (const auto why = read_regular_file(path, bytes)) throw DataError("[data] " + path.string() + ": " + *why);
  return bytes;
}

double json_number(float value) {
  char buffer[32];
  const auto r = std::to_chars(buffer, buffer + sizeof buffer, value);  // shortest text that round-trips
  return std::strtod(std::string(buffer, r.ptr).c_str(), nullptr);
}

void validate_settings(const StageSettings& s, std::int64_t context_length, const char* op) {
  auto bad = [op](const std::string& what) { throw ValueError(std::string("[") + op + "] " + what); };
  if (s.steps <= 0) bad("steps must be > 0, got " + std::to_string(s.steps));
  if (s.batch <= 0 || s.batch > (std::int64_t{1} << 20)) {
    bad("batch must be in [1, 1048576], got " + std::to_string(s.batch));
  }
  if (s.gradient_accumulation_steps < 1 || s.gradient_accumulation_steps > 65536) {
    bad("gradient_accumulation_steps must be in [1, 65536], got " + std::to_string(s.gradient_accumulation_steps));
  }
  if (s.sequence_length < 1 || s.sequence_length > context_length) {
    bad("sequence_length must be in [1, context_length " + std::to_string(context_length) + "], got " +
        std::to_string(s.sequence_length));
  }
  if (!(s.learning_rate > 0.0F) || !std::isfinite(s.learning_rate)) {
    bad("learning_rate must be a finite number > 0, got " + float_text(s.learning_rate));
  }
  if (s.warmup_steps < 0) bad("warmup_steps must be >= 0");
  if (!(s.min_learning_rate_ratio >= 0.0F && s.min_learning_rate_ratio <= 1.0F)) {
    bad("min_learning_rate_ratio must be in [0, 1]");
  }
  if (s.batch * s.sequence_length > (std::int64_t{1} << 28)) bad("batch * sequence_length is too large");
  if (!(s.weight_decay >= 0.0F) || !std::isfinite(s.weight_decay)) bad("weight_decay must be finite and >= 0");
  if (!(s.max_grad_norm >= 0.0F) || !std::isfinite(s.max_grad_norm)) {
    bad("max_grad_norm must be finite and >= 0 (0 disables clipping)");
  }
  if (!(s.beta1 >= 0.0F && s.beta1 < 1.0F) || !(s.beta2 >= 0.0F && s.beta2 < 1.0F)) bad("betas must be in [0, 1)");
  if (!(s.dropout >= 0.0F && s.dropout < 1.0F)) bad("dropout must be in [0, 1)");
  if (s.checkpoint_segment_blocks < 0) bad("checkpoint_segment_blocks must be >= 0");
  if (s.activation_memory_budget < 0) bad("activation_memory_budget must be >= 0 bytes (0: no budget)");
  if (s.activation_memory_budget > 0 && s.activation_checkpointing != ActivationCheckpointingKind::Disabled) {
    bad(std::string("activation_memory_budget chooses what each block recomputes: leave activation_checkpointing "
                    "'disabled' (it is '") + activation_checkpointing_name(s.activation_checkpointing) + "')");
  }
  if (s.zero_stage != 0 && s.zero_stage != 1) {
    bad("zero_stage must be 0 (plain Adam) or 1 (Adam state sharded across ranks), got " +
        std::to_string(s.zero_stage));
  }
  if (s.device != Backend::Cpu && s.device != Backend::Cuda) {
    bad("unknown device " + std::to_string(static_cast<int>(s.device)) + " (expected cpu or cuda)");
  }
  if (s.gradient_bucket_mib < 1 || s.gradient_bucket_mib > 65536) {
    bad("gradient_bucket_mib must be in [1, 65536] MiB, got " + std::to_string(s.gradient_bucket_mib));
  }
  check_optimizer_in_backward(s, 1, op);  // the ranks: check_world, once the communicator is known
  if (s.eval_interval < 0) bad("eval_interval must be >= 0");
  if (s.eval_batches <= 0 || s.eval_batches > 100000) {
    bad("eval_batches must be in [1, 100000], got " + std::to_string(s.eval_batches));
  }
  if (s.checkpoint_interval < 0) bad("checkpoint_interval must be >= 0");
  if (s.output_dir.empty()) bad("output_dir must not be empty");
  if (s.attention != FullSequenceAttentionKind::Materialized && s.attention != FullSequenceAttentionKind::Flash) {
    bad("unknown attention kind " + std::to_string(static_cast<int>(s.attention)));
  }
  const auto kinds = activation_checkpointing_kinds();
  if (std::find(kinds.begin(), kinds.end(), s.activation_checkpointing) == kinds.end()) {
    bad("unknown activation checkpointing policy " + std::to_string(static_cast<int>(s.activation_checkpointing)));
  }
}

void check_optimizer_in_backward(const StageSettings& s, int world, const char* op) {
  if (!s.optimizer_in_backward) return;
  const std::string head = std::string("[") + op + "] optimizer_in_backward updates each parameter as soon as its "
                                                   "gradient is final, inside the backward pass; ";
  const std::string off = ", or leave optimizer_in_backward off";
  if (s.max_grad_norm > 0.0F) {
    throw ValueError(head + "gradient clipping needs the global norm of every gradient first, so it needs "
                            "max_grad_norm 0 (got " + float_text(s.max_grad_norm) +
                     "; the pipelines default to 1.0): set max_grad_norm to 0 (--max-grad-norm 0)" + off);
  }
  if (s.gradient_accumulation_steps > 1) {
    throw ValueError(head + "a step over several micro-batches needs their summed gradients first, so it needs "
                            "gradient_accumulation_steps 1 (got " + std::to_string(s.gradient_accumulation_steps) +
                     "): set gradient_accumulation_steps to 1 (a larger batch instead)" + off);
  }
  if (world > 1) {
    throw ValueError(head + "data parallelism needs every gradient in its buckets to all-reduce them before the "
                            "step, so it runs in one process only (this job has " + std::to_string(world) +
                     " ranks): run without mpirun" + off);
  }
}

nlohmann::json settings_json(const StageSettings& s) {
  return {{"attention", attention_kind_name(s.attention)},
          {"activation_checkpointing", activation_checkpointing_name(s.activation_checkpointing)},
          {"checkpoint_segment_blocks", s.checkpoint_segment_blocks},
          {"activation_memory_budget", s.activation_memory_budget},
          {"activation_offload", s.activation_offload},
          {"zero_stage", s.zero_stage},
          {"gradient_bucket_mib", s.gradient_bucket_mib},
          {"device", backend_name(s.device)},
          {"optimizer_in_backward", s.optimizer_in_backward},
          {"dropout", json_number(s.dropout)},
          {"data", s.data.string()},
          {"tokenizer", s.tokenizer.string()},
          {"steps", s.steps},
          {"batch", s.batch},
          {"gradient_accumulation_steps", s.gradient_accumulation_steps},
          {"sequence_length", s.sequence_length},
          {"learning_rate", json_number(s.learning_rate)},
          {"warmup_steps", s.warmup_steps},
          {"min_learning_rate_ratio", json_number(s.min_learning_rate_ratio)},
          {"weight_decay", json_number(s.weight_decay)},
          {"decay_embeddings", s.decay_embeddings},
          {"max_grad_norm", json_number(s.max_grad_norm)},
          {"beta1", json_number(s.beta1)},
          {"beta2", json_number(s.beta2)},
          {"seed", s.seed},
          {"eval_interval", s.eval_interval},
          {"eval_batches", s.eval_batches},
          {"checkpoint_interval", s.checkpoint_interval},
          {"output_dir", s.output_dir.string()}};
}

}  // namespace stage
}  // namespace riftco_transformer
