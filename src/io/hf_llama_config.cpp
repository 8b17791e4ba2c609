// config.json of a transformers Llama checkpoint ↔ TransformerDimensions.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "json_read.hpp"
#include "hf_llama_names.hpp"
#include "model_metadata.hpp"
#include "riftco_transformer/hf_llama.hpp"
#include "safetensors_header.hpp"

namespace riftco_transformer {

using detail::Json;
using detail::load_error;

namespace {

constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();

std::int64_t integer_field(const std::filesystem::path& path, const Json& config, const char* key) {
  if (!config.contains(key)) load_error(path, std::string("config.json has no \"") + key + "\"");
  try {
    return detail::json_integer(config, key, 1, kMaxInt);
  } catch (const detail::JsonReadError& e) {
    load_error(path, std::string("config.json ") + e.what() + " (must be an integer >= 1)");
  }
}

double number_field(const std::filesystem::path& path, const Json& config, const char* key, double fallback) {
  if (!config.contains(key) || config.at(key).is_null()) return fallback;
  try {
    return detail::json_number(config, key);
  } catch (const detail::JsonReadError& e) {
    load_error(path, std::string("config.json ") + e.what());
  }
}

bool bool_field(const std::filesystem::path& path, const Json& config, const char* key, bool fallback) {
  if (!config.contains(key) || config.at(key).is_null()) return fallback;
  if (!config.at(key).is_boolean()) {
    load_error(path, std::string("config.json \"") + key + "\" must be true or false, got " +
                         detail::quote_json(config.at(key)));
  }
  return config.at(key).get<bool>();
}

void refuse(const std::filesystem::path& path, const char* key, const Json& value, const std::string& why) {
  load_error(path, std::string("config.json \"") + key + "\" is " + detail::quote_json(value) + ": " + why);
}

}  // namespace

HfLlamaConfig parse_hf_llama_config(const std::filesystem::path& path, const std::string& text) {
  Json config;
  try {
    config = detail::parse_untrusted_json(text);
  } catch (const detail::JsonReadError& e) {
    load_error(path, std::string("config.json ") + e.what());
  }
  if (!config.is_object()) load_error(path, "config.json is not a JSON object");
  if (config.contains("model_type") && config.at("model_type") != "llama") {
    refuse(path, "model_type", config.at("model_type"), "only \"llama\" checkpoints are supported");
  }
  if (config.contains("architectures")) {
    const Json& a = config.at("architectures");
    if (!a.is_null() && (!a.is_array() || a.size() != 1 || a[0] != "LlamaForCausalLM")) {
      refuse(path, "architectures", a, "only [\"LlamaForCausalLM\"] is supported");
    }
  }
  if (config.contains("rope_scaling") && !config.at("rope_scaling").is_null()) {
    refuse(path, "rope_scaling", config.at("rope_scaling"), "RoPE scaling is not supported (only null)");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (bool_field(path, config, key, false)) refuse(path, key, config.at(key), "the model has no biases");
  }
  if (config.contains("hidden_act") && config.at("hidden_act") != "silu") {
    refuse(path, "hidden_act", config.at("hidden_act"), "only \"silu\" (SwiGLU) is supported");
  }
  if (number_field(path, config, "attention_dropout", 0.0) != 0.0) {
    refuse(path, "attention_dropout", config.at("attention_dropout"), "attention dropout is not supported (only 0)");
  }

  HfLlamaConfig out;
  TransformerDimensions& d = out.dimensions;
  d.vocab_size = integer_field(path, config, "vocab_size");
  d.context_length = integer_field(path, config, "max_position_embeddings");
  d.model_width = integer_field(path, config, "hidden_size");
  d.heads = integer_field(path, config, "num_attention_heads");
  d.layers = integer_field(path, config, "num_hidden_layers");
  d.feed_forward_width = integer_field(path, config, "intermediate_size");
  d.key_value_heads = config.contains("num_key_value_heads") && !config.at("num_key_value_heads").is_null()
                          ? integer_field(path, config, "num_key_value_heads")
                          : d.heads;
  if (d.model_width % d.heads != 0 || (d.model_width / d.heads) % 2 != 0) {
    refuse(path, "num_attention_heads", config.at("num_attention_heads"),
           "hidden_size " + std::to_string(d.model_width) + " must split into that many heads of even width");
  }
  if (d.key_value_heads > d.heads || d.heads % d.key_value_heads != 0) {
    refuse(path, "num_key_value_heads", config.at("num_key_value_heads"),
           "must divide num_attention_heads " + std::to_string(d.heads));
  }
  if (d.key_value_heads == d.heads) d.key_value_heads = 0;  // ordinary multi-head attention
  if (config.contains("head_dim") && !config.at("head_dim").is_null()) {
    const std::int64_t head_dim = integer_field(path, config, "head_dim");
    if (head_dim != d.model_width / d.heads) {  // exact (checked above); head_dim * heads could overflow
      refuse(path, "head_dim", config.at("head_dim"),
             "must equal hidden_size / num_attention_heads = " + std::to_string(d.model_width) + " / " +
                 std::to_string(d.heads));
    }
  }
  const double base = number_field(path, config, "rope_theta", 10000.0);
  if (!is_valid_rope_base(base)) {  // the model's own rule: whatever a run saves exports and reads back
    refuse(path, "rope_theta", config.at("rope_theta"), "must be a number > 1 that is a finite float");
  }
  d.rope_base = static_cast<float>(base);
  d.tie_embeddings = bool_field(path, config, "tie_word_embeddings", false);
  const double eps = number_field(path, config, "rms_norm_eps", 1.0e-6);
  if (!is_valid_norm_epsilon(eps)) {  // the model's own rule: whatever save_hf_llama writes reads back
    refuse(path, "rms_norm_eps", config.at("rms_norm_eps"), "must be a number > 0 that is a finite float");
  }
  out.norm_epsilon = static_cast<float>(eps);
  try {
    d.validate();
  } catch (const ValueError& e) {
    load_error(path, std::string("config.json describes a model this library cannot build: ") + e.what());
  }
  return out;
}

std::string hf_llama_config_json(const TransformerDimensions& d, float norm_epsilon) {
  // Shortest decimal text of the float values ("1e-05", not 9.99999974e-06).
  auto shortest = [](float value) { return std::stod(detail::float_string(value)); };
  nlohmann::ordered_json config = nlohmann::ordered_json::object();  // in this order
  config["architectures"] = nlohmann::ordered_json::array({"LlamaForCausalLM"});
  config["model_type"] = "llama";
  config["vocab_size"] = d.vocab_size;
  config["max_position_embeddings"] = d.context_length;
  config["hidden_size"] = d.model_width;
  config["intermediate_size"] = d.feed_forward_width;
  config["num_attention_heads"] = d.heads;
  config["num_hidden_layers"] = d.layers;
  config["num_key_value_heads"] = d.kv_heads();
  config["hidden_act"] = "silu";
  config["rms_norm_eps"] = shortest(norm_epsilon);
  config["rope_theta"] = shortest(d.rope_base);
  config["rope_scaling"] = nullptr;
  config["tie_word_embeddings"] = d.tie_embeddings;
  config["attention_bias"] = false;
  config["attention_dropout"] = 0.0;
  config["mlp_bias"] = false;
  config["pretraining_tp"] = 1;
  config["initializer_range"] = 0.02;
  config["torch_dtype"] = "float32";
  config["use_cache"] = true;
  return config.dump(2) + "\n";
}

}  // namespace riftco_transformer
