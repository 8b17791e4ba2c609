// Hugging Face Llama checkpoints: tensor names, the rotary row permutation,
// reading single-file and sharded directories, writing one back.
#include "riftco_transformer/hf_llama.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "riftco_transformer/atomic_file.hpp"
#include "atomic_file.hpp"
#include "hf_llama_names.hpp"
#include "json_read.hpp"
#include "model_metadata.hpp"
#include "safetensors_header.hpp"

namespace riftco_transformer {

using detail::load_error;
using detail::save_error;

namespace {

/// rows (heads·D, C): out[h·D + to(r)] = in[h·D + r] for a per-head row map.
Tensor permute_rotary_rows(const Tensor& w, std::int64_t heads, bool to_interleaved, const char* op) {
  if (w.dim() != 2 || heads <= 0 || w.size(0) % heads != 0 || (w.size(0) / heads) % 2 != 0) {
    throw ShapeError(std::string("[") + op + "] weight " + shape_string(w.shape()) + " is not (heads·D, C) for " +
                     std::to_string(heads) + " heads with an even head width D");
  }
  const std::int64_t d = w.size(0) / heads;
  const std::int64_t half = d / 2;
  const std::int64_t cols = w.size(1);
  Tensor src = w.to(Backend::Cpu);
  Tensor out = Tensor::empty(w.shape());
  const float* in = std::as_const(src).data();
  float* o = out.data();
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t i = 0; i < half; ++i) {
      for (std::int64_t j = 0; j < 2; ++j) {
        const std::int64_t ours = h * d + 2 * i + j;
        const std::int64_t hf = h * d + j * half + i;
        const std::int64_t from = to_interleaved ? hf : ours;
        const std::int64_t to = to_interleaved ? ours : hf;
        std::memcpy(o + to * cols, in + from * cols, static_cast<std::size_t>(cols) * sizeof(float));
      }
    }
  }
  return out;
}

constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{1} << 20;

std::string read_small_file(const std::filesystem::path& path, const char* what) {
  std::string text;
  if (const auto error = read_regular_file(path, text, kMaxConfigBytes)) {
    load_error(path, std::string("cannot read ") + what + ": " + *error);
  }
  return text;
}

/// A shard name from the index: a plain file name inside the directory.
void check_shard_name(const std::filesystem::path& index, const std::string& name) {
  const bool plain = !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
                     name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
  if (!plain) {
    load_error(index, "\"weight_map\" names the shard '" + detail::quote(name) +
                          "', which is not a plain file name in the checkpoint directory");
  }
}

/// A rotary buffer older checkpoints saved, of a layer the model has (its
/// attention's q_proj is known): one of a layer it lacks is an unknown tensor.
bool is_rotary_buffer(const std::string& name, const std::map<std::string, Shape>& known) {
  const std::string suffix = ".rotary_emb.inv_freq";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  const std::string attention = name.substr(0, name.size() - suffix.size());  // model.layers.<i>.self_attn
  return attention.ends_with(".self_attn") && known.contains(attention + ".q_proj.weight");
}

/// Refuses, from a shard's header alone (before its data is read), a tensor
/// the model does not have, one of the wrong shape, or one the index places
/// elsewhere. `known`: every Hugging Face name config.json allows, with its shape.
void check_hf_header(const std::filesystem::path& file, const detail::SafetensorsHeader& header,
                     const std::map<std::string, Shape>& known, std::int64_t model_width,
                     const std::map<std::string, std::string>* placed) {
  std::string unknown;
  std::size_t count = 0;
  for (const detail::SafetensorsEntry& entry : header.entries) {
    const std::string& name = entry.name;
    if (placed != nullptr) {
      const auto it = placed->find(name);
      if (it == placed->end() || it->second != file.filename().string()) {
        load_error(file, "tensor '" + detail::quote(name) +
                             "' is in this shard but model.safetensors.index.json does not place it here");
      }
    }
    const auto it = known.find(name);
    if (it != known.end()) {
      if (entry.shape != it->second) {
        load_error(file, "tensor '" + name + "' has shape " + shape_string(entry.shape) + " but config.json needs " +
                             shape_string(it->second));
      }
    } else if (is_rotary_buffer(name, known)) {  // ignored, but never a large allocation
      if (entry.end - entry.begin > 4 * static_cast<std::uint64_t>(model_width)) {
        load_error(file, "tensor '" + detail::quote(name) + "' has shape " + shape_string(entry.shape) +
                             ", too large for a rotary buffer");
      }
    } else if (count++ < 5) {
      unknown += (unknown.empty() ? "'" : ", '") + detail::quote(name) + "'";
    }
  }
  if (count > 0) {
    load_error(file, "the checkpoint has " + std::to_string(count) + " tensor" + (count == 1 ? "" : "s") +
                         " a Llama model of config.json's shape does not: " + unknown + (count > 5 ? ", ..." : ""));
  }
}

/// Every tensor of the checkpoint by its Hugging Face name; each shard's
/// header is checked against `known` (check_hf_header) before its data is read.
std::map<std::string, Tensor> read_hf_tensors(const std::filesystem::path& dir, const LoadOptions& options,
                                              const std::map<std::string, Shape>& known, std::int64_t model_width) {
  std::map<std::string, Tensor> tensors;
  auto add_file = [&](const std::filesystem::path& file, const std::map<std::string, std::string>* expected) {
    TensorFile contents = detail::read_safetensors_as_f32(file, [&](const detail::SafetensorsHeader& header) {
      check_hf_header(file, header, known, model_width, expected);
    });
    if (!options.allow_non_finite) detail::check_finite(file, contents);
    for (auto& [name, tensor] : contents.tensors) {
      if (!tensors.emplace(name, std::move(tensor)).second) {
        load_error(file, "tensor '" + detail::quote(name) + "' appears in two shards");
      }
    }
  };
  const std::filesystem::path single = dir / "model.safetensors";
  const std::filesystem::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (std::filesystem::exists(single, ec)) {
    add_file(single, nullptr);
    return tensors;
  }
  if (!std::filesystem::exists(index, ec)) {
    load_error(dir, "holds neither model.safetensors nor model.safetensors.index.json (only safetensors "
                    "checkpoints are read; save with safe_serialization=True)");
  }
  detail::Json root;
  try {
    root = detail::parse_untrusted_json(read_small_file(index, "the shard index"));
  } catch (const detail::JsonReadError& e) {
    load_error(index, std::string("the shard index ") + e.what());
  }
  if (!root.is_object() || !root.contains("weight_map") || !root.at("weight_map").is_object()) {
    load_error(index, "has no \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shards;
  for (const auto& [name, shard] : root.at("weight_map").items()) {
    if (!shard.is_string()) load_error(index, "\"weight_map\" entry '" + detail::quote(name) + "' is not a string");
    const std::string& file = shard.get_ref<const std::string&>();
    check_shard_name(index, file);
    weight_map.emplace(name, file);
    shards.insert(file);
  }
  if (shards.empty()) load_error(index, "\"weight_map\" is empty");
  for (const std::string& shard : shards) add_file(dir / shard, &weight_map);
  for (const auto& [name, shard] : weight_map) {
    if (tensors.find(name) == tensors.end()) {
      load_error(index, "lists tensor '" + detail::quote(name) + "' in shard '" + detail::quote(shard) +
                            "', which does not hold it");
    }
  }
  return tensors;
}

}  // namespace

Tensor hf_rotary_rows_to_interleaved(const Tensor& weight, std::int64_t heads) {
  return permute_rotary_rows(weight, heads, true, "hf_rotary_rows_to_interleaved");
}

Tensor interleaved_rotary_rows_to_hf(const Tensor& weight, std::int64_t heads) {
  return permute_rotary_rows(weight, heads, false, "interleaved_rotary_rows_to_hf");
}

std::vector<HfTensorName> hf_llama_tensor_names(const TransformerDimensions& d) {
  const std::int64_t v = d.vocab_size, c = d.model_width, f = d.feed_forward_width, kv = d.kv_width();
  std::vector<HfTensorName> names{{"token_embedding.weight", "model.embed_tokens.weight", 0, {v, c}}};
  for (std::int64_t i = 0; i < d.layers; ++i) {
    const std::string ours = "blocks." + std::to_string(i) + ".";
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    names.push_back({ours + "attention_norm.weight", hf + "input_layernorm.weight", 0, {c}});
    names.push_back({ours + "attention.query.weight", hf + "self_attn.q_proj.weight", d.heads, {c, c}});
    names.push_back({ours + "attention.key.weight", hf + "self_attn.k_proj.weight", d.kv_heads(), {kv, c}});
    names.push_back({ours + "attention.value.weight", hf + "self_attn.v_proj.weight", 0, {kv, c}});
    names.push_back({ours + "attention.output.weight", hf + "self_attn.o_proj.weight", 0, {c, c}});
    names.push_back({ours + "mlp_norm.weight", hf + "post_attention_layernorm.weight", 0, {c}});
    names.push_back({ours + "mlp.gate.weight", hf + "mlp.gate_proj.weight", 0, {f, c}});
    names.push_back({ours + "mlp.up.weight", hf + "mlp.up_proj.weight", 0, {f, c}});
    names.push_back({ours + "mlp.down.weight", hf + "mlp.down_proj.weight", 0, {c, f}});
  }
  names.push_back({"final_norm.weight", "model.norm.weight", 0, {c}});
  if (!d.tie_embeddings) names.push_back({"lm_head.weight", "lm_head.weight", 0, {v, c}});
  return names;
}

std::unique_ptr<DecoderOnlyTransformer> load_hf_llama(const std::filesystem::path& directory,
                                                      FullSequenceAttentionKind attention,
                                                      ActivationCheckpointingKind activation_checkpointing,
                                                      const LoadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(directory, ec)) load_error(directory, "is not a directory");
  const std::filesystem::path config_path = directory / "config.json";
  const HfLlamaConfig config = parse_hf_llama_config(config_path, read_small_file(config_path, "config.json"));
  const std::vector<HfTensorName> names = hf_llama_tensor_names(config.dimensions);
  std::map<std::string, Shape> known;
  for (const HfTensorName& name : names) known.emplace(name.hf, name.shape);
  if (config.dimensions.tie_embeddings) known.emplace("lm_head.weight", names.front().shape);  // a tied copy
  std::map<std::string, Tensor> tensors = read_hf_tensors(directory, options, known, config.dimensions.model_width);
  // Every tensor present (shapes were checked from the headers) before a model of config.json's size is built.
  std::vector<Tensor> values;
  for (const HfTensorName& name : names) {
    const auto it = tensors.find(name.hf);
    if (it == tensors.end()) {
      load_error(directory, "tensor '" + name.hf + "' is missing (config.json needs shape " +
                                shape_string(name.shape) + ")");
    }
    values.push_back(name.rotary_heads > 0 ? hf_rotary_rows_to_interleaved(it->second, name.rotary_heads)
                                           : it->second);
    tensors.erase(it);
  }
  if (config.dimensions.tie_embeddings) {
    const auto head = tensors.find("lm_head.weight");
    if (head != tensors.end()) {  // a tied copy is fine when it is a copy
      const Tensor& embedding = values.front();
      const bool same = head->second.shape() == embedding.shape() &&
                        std::memcmp(std::as_const(head->second).data(), std::as_const(embedding).data(),
                                    static_cast<std::size_t>(embedding.nbytes())) == 0;
      if (!same) {
        load_error(directory, "config.json \"tie_word_embeddings\" is true but lm_head.weight differs from "
                              "model.embed_tokens.weight");
      }
      tensors.erase(head);
    }
  }
  // Anything else left is a rotary buffer (check_hf_header refused other names).
  Random random(0);  // every parameter is overwritten below
  auto model = std::make_unique<DecoderOnlyTransformer>(config.dimensions, random, config.norm_epsilon, attention,
                                                        activation_checkpointing);
  for (std::size_t i = 0; i < names.size(); ++i) model->parameter(names[i].ours).set_value(values[i]);
  return model;
}

void save_hf_llama(const DecoderOnlyTransformer& model, const std::filesystem::path& directory) {
  if (model.has_lora()) {
    throw ValueError("[save_hf_llama] the model has LoRA adapters: merge_lora() (or remove_lora()) first");
  }
  model.validate_parameters();
  std::error_code ec;
  if (std::filesystem::exists(directory, ec) && !std::filesystem::is_directory(directory, ec)) {
    save_error(directory, "exists and is not a directory");
  }
  std::filesystem::create_directories(directory, ec);
  if (ec) save_error(directory, "cannot create the directory: " + ec.message());
  const TransformerDimensions& d = model.dimensions();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const HfTensorName& name : hf_llama_tensor_names(d)) {
    const Tensor value = model.parameter(name.ours).value();
    tensors.emplace_back(name.hf, name.rotary_heads > 0 ? interleaved_rotary_rows_to_hf(value, name.rotary_heads)
                                                        : value.to(Backend::Cpu));
  }
  // Both targets checked, and both files written beside them, before either
  // is replaced; a failed second rename puts the old weights back: never new
  // weights beside the old config.json.
  const std::string config = hf_llama_config_json(d, model.norm_epsilon());
  const std::array<detail::StagedFile, 2> files{
      detail::StagedFile{detail::staging_path(directory / "model.safetensors"), directory / "model.safetensors"},
      detail::StagedFile{detail::staging_path(directory / "config.json"), directory / "config.json"}};
  for (const detail::StagedFile& f : files) detail::check_replaceable(f.target);
  struct RemoveStaged {  // on a failed write; after the renames there is nothing left to remove
    const std::array<detail::StagedFile, 2>& files;
    ~RemoveStaged() {
      for (const detail::StagedFile& f : files) ::unlink(f.staged.c_str());
    }
  } remove_staged{files};
  write_safetensors(files[0].staged, tensors, {{"format", "pt"}});
  write_file_atomically(files[1].staged, config);
  detail::rename_staged_files(files);
}

void convert_from_hf(const std::filesystem::path& directory, const std::filesystem::path& output,
                     const LoadOptions& options) {
  // Every file of the checkpoint (config.json, the weights, shards) lies in
  // `directory`: an output there or the directory itself would replace one.
  const std::filesystem::path parent = output.has_parent_path() ? output.parent_path() : ".";
  if (same_file(output, directory) || same_file(parent, directory)) {
    throw ValueError("[convert_from_hf] output " + output.string() + " is inside the checkpoint directory " +
                     directory.string() + " it reads: write it elsewhere");
  }
  const auto model = load_hf_llama(directory, FullSequenceAttentionKind::Materialized,
                                   ActivationCheckpointingKind::Disabled, options);
  save_model_state(*model, output);
}

void convert_to_hf(const std::filesystem::path& model_state, const std::filesystem::path& directory,
                   const LoadOptions& options) {
  for (const char* name : {"model.safetensors", "config.json"}) {
    if (same_file(directory / name, model_state)) {
      throw ValueError("[convert_to_hf] output directory " + directory.string() + " would replace the model-state "
                       "file " + model_state.string() + " it reads (as " + name + "): write it elsewhere");
    }
  }
  const auto model = load_model(model_state, FullSequenceAttentionKind::Materialized,
                                ActivationCheckpointingKind::Disabled, options);
  save_hf_llama(*model, directory);
}

}  // namespace riftco_transformer
