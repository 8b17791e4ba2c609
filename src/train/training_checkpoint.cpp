#include "training_checkpoint.hpp"

#include <charconv>
#include <cstring>
#include <limits>

#include "../tensor/hash.hpp"
#include "../io/json_read.hpp"
#include "../io/safetensors_header.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/model_state.hpp"

namespace riftco_transformer::stage {
namespace {

constexpr const char* kFormat = "riftco.training_checkpoint";

std::string encode(const Random::State& s) {
  std::uint64_t spare_bits = 0;
  std::memcpy(&spare_bits, &s.spare_normal, sizeof spare_bits);
  return std::to_string(s.state) + ":" + std::to_string(s.increment) + ":" + (s.has_spare_normal ? "1" : "0") + ":" +
         std::to_string(spare_bits);
}

/// Strict: four colon-separated decimal fields, digits only (no sign, no
/// blanks), the third 0 or 1.
Random::State decode(const std::string& text, const std::filesystem::path& path) {
  auto bad = [&] {
    throw ModelStateError("[load] " + path.string() + ": bad random state '" + detail::quote(text) +
                          "' (expected four decimal fields a:b:0|1:d)");
  };
  std::uint64_t parts[4] = {};
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  for (int i = 0; i < 4; ++i) {
    if (p == end || *p < '0' || *p > '9') bad();
    const auto r = std::from_chars(p, end, parts[i]);
    if (r.ec != std::errc()) bad();
    p = r.ptr;
    if (i < 3) {
      if (p == end || *p != ':') bad();
      ++p;
    }
  }
  if (p != end || parts[2] > 1) bad();
  Random::State s;
  s.state = parts[0];
  s.increment = parts[1];
  s.has_spare_normal = parts[2] != 0;
  std::memcpy(&s.spare_normal, &parts[3], sizeof parts[3]);
  return s;
}

}  // namespace

std::string checkpoint_checksum(const std::map<std::string, std::string>& metadata,
                     const std::vector<std::pair<std::string, Tensor>>& tensors) {
  detail::Hash64 hash;
  for (const auto& [key, value] : metadata) {
    if (key == "checksum") continue;
    hash.update(key);
    hash.update(std::string_view("\0", 1));
    hash.update(value);
    hash.update(std::string_view("\0", 1));
  }
  for (const auto& [name, tensor] : tensors) hash.update(name, tensor);
  return hash.hex();
}

namespace {

/// A step count: digits only, in [0, 2^62].
std::int64_t parse_count(const std::string& text, const std::string& key, const std::filesystem::path& path) {
  std::int64_t value = -1;
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!digits || r.ec != std::errc() || r.ptr != text.data() + text.size() || value > (std::int64_t{1} << 62)) {
    throw ModelStateError("[load] " + path.string() + ": metadata '" + key + "' is '" + detail::quote(text) +
                          "', not a step count");
  }
  return value;
}

/// "elapsed_seconds": a plain decimal number of seconds in [0, 1e12].
double parse_seconds(const std::string& text, const std::filesystem::path& path) {
  double value = -1.0;
  const bool plain = !text.empty() && text.find_first_not_of("0123456789.e+-") == std::string::npos;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!plain || r.ec != std::errc() || r.ptr != text.data() + text.size() || !(value >= 0.0 && value <= 1e12)) {
    throw ModelStateError("[load] " + path.string() + ": metadata 'elapsed_seconds' is '" + detail::quote(text) +
                          "', not a number of seconds in [0, 1e12]");
  }
  return value;
}

const std::string& meta(const TensorFile& f, const std::string& key, const std::filesystem::path& path) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end()) throw ModelStateError("[load] " + path.string() + ": metadata '" + key + "' missing");
  return it->second;
}

/// A thrower of ModelStateError "<where>metadata '<key>' <why>".
auto metadata_error(const std::string& where, const char* key) {
  return [where, key](const std::string& why) {
    throw ModelStateError(where + "metadata '" + key + "' " + why);
  };
}

/// A metadata value parsed as JSON under the bounded parser (depth, no
/// duplicate keys); `bad` names what is wrong.
template <typename Bad>
nlohmann::json metadata_json(const std::string& text, const Bad& bad) {
  try {
    return nlohmann::json::parse(detail::parse_untrusted_json(text).dump());
  } catch (const detail::JsonReadError& e) {
    bad(e.what());
  }
  return {};  // unreached: bad throws
}

/// "adam_parameter_steps": {name: count} for the trainable parameters with
/// fewer updates than `steps`, each a whole number in [0, steps]; the
/// others (all of them when the key is absent) at `steps`.
std::vector<std::int64_t> read_parameter_steps(const TensorFile& f, const std::vector<NamedParameter>& trainable,
                                               std::int64_t steps, const std::string& where) {
  std::vector<std::int64_t> counts(trainable.size(), steps);
  const auto it = f.metadata.find("adam_parameter_steps");
  if (it == f.metadata.end()) return counts;
  const auto bad = metadata_error(where, "adam_parameter_steps");
  const nlohmann::json h = metadata_json(it->second, bad);
  if (!h.is_object()) bad("is not a JSON object of parameter names and step counts");
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < trainable.size(); ++i) index.emplace(trainable[i].name, i);
  for (const auto& [name, value] : h.items()) {
    const auto at = index.find(name);
    if (at == index.end()) bad("names '" + detail::quote(name) + "', which the run does not train");
    if (!value.is_number_unsigned() || value.get<std::uint64_t>() > static_cast<std::uint64_t>(steps)) {
      bad("gives '" + detail::quote(name) + "' " + detail::quote(value.dump()) + ", not a step count in [0, " +
          std::to_string(steps) + "]");
    }
    counts[at->second] = value.get<std::int64_t>();
  }
  return counts;
}

/// The "world_size_history" of a checkpoint at `step` made by `saved_world`
/// ranks: contiguous entries from step 1 to `step`, the last at
/// `saved_world`. A file without it ran every step at `saved_world`.
nlohmann::json read_world_size_history(const TensorFile& f, std::int64_t step, std::int64_t saved_world,
                                       const std::string& where) {
  const auto it = f.metadata.find("world_size_history");
  if (it == f.metadata.end()) return extend_world_size_history(nlohmann::json::array(), saved_world, 1, step);
  const auto bad = metadata_error(where, "world_size_history");
  const nlohmann::json h = metadata_json(it->second, bad);
  if (!h.is_array() || h.empty()) bad("is not a non-empty JSON array");
  std::int64_t next = 1;
  for (const nlohmann::json& e : h) {
    if (!e.is_object() || e.size() != 3) {
      bad("has an entry that is not {\"world_size\", \"first_step\", \"last_step\"}: " + detail::quote(e.dump()));
    }
    for (const char* key : {"world_size", "first_step", "last_step"}) {
      if (!e.contains(key) || !e[key].is_number_unsigned()) {
        bad(std::string("has an entry without a whole number '") + key + "'");
      }
    }
    // Unsigned JSON numbers: compared before any conversion or addition.
    const auto world = e["world_size"].get<std::uint64_t>();
    const auto first = e["first_step"].get<std::uint64_t>();
    const auto last = e["last_step"].get<std::uint64_t>();
    if (world < 1 || world > static_cast<std::uint64_t>(std::numeric_limits<int>::max()) ||
        first != static_cast<std::uint64_t>(next) || last < first || last > static_cast<std::uint64_t>(step)) {
      bad("is not contiguous from step 1 to step " + std::to_string(step) + " (entry " + detail::quote(e.dump()) +
          ")");
    }
    next = static_cast<std::int64_t>(last) + 1;
  }
  if (next != step + 1 || h.back()["world_size"].get<std::int64_t>() != saved_world) {
    bad("does not end at step " + std::to_string(step) + " with world_size " + std::to_string(saved_world));
  }
  return h;
}

}  // namespace

nlohmann::json extend_world_size_history(const nlohmann::json& history, std::int64_t world_size,
                                         std::int64_t first_step, std::int64_t last_step) {
  nlohmann::json h = history.is_array() ? history : nlohmann::json::array();
  if (last_step < first_step) return h;
  if (!h.empty() && h.back()["world_size"] == world_size && h.back()["last_step"] == first_step - 1) {
    h.back()["last_step"] = last_step;
  } else {
    h.push_back({{"world_size", world_size}, {"first_step", first_step}, {"last_step", last_step}});
  }
  return h;
}

void save_training_checkpoint(const std::filesystem::path& path, const std::vector<NamedParameter>& trainable,
                              const Adam::State& moments, const TrainingState& state, const nlohmann::json& config) {
  if (moments.first_moment.size() != trainable.size() || moments.second_moment.size() != trainable.size()) {
    throw ValueError("[save_training_checkpoint] Adam has " + std::to_string(moments.first_moment.size()) + " and " +
                     std::to_string(moments.second_moment.size()) + " moments, the run trains " +
                     std::to_string(trainable.size()) + " parameters");
  }
  for (std::size_t i = 0; i < trainable.size(); ++i) {
    for (const Tensor* moment : {&moments.first_moment[i], &moments.second_moment[i]}) {
      if (moment->shape() != trainable[i].variable.shape()) {
        throw ShapeError("[save_training_checkpoint] '" + trainable[i].name + "' is " +
                         shape_string(trainable[i].variable.shape()) + " but its Adam moments are " +
                         shape_string(moment->shape()));
      }
    }
  }
  {
    // What a resume's set_state would refuse, refused before the file is
    // written (counts outside [0, steps], a count of 0 beside moments a
    // step made, moments no step makes).
    std::vector<Variable> variables;
    for (const NamedParameter& p : trainable) variables.push_back(p.variable);
    Adam::check_state_values("save_training_checkpoint", moments, variables);
  }
  // On the host (a cuda run's parameters and moments are copied back once
  // per checkpoint; cpu tensors are not copied): the checksum reads them there.
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (std::size_t i = 0; i < trainable.size(); ++i) {
    tensors.emplace_back("param." + trainable[i].name, trainable[i].variable.value().to(Backend::Cpu));
    tensors.emplace_back("adam.m." + trainable[i].name, moments.first_moment[i].to(Backend::Cpu));
    tensors.emplace_back("adam.v." + trainable[i].name, moments.second_moment[i].to(Backend::Cpu));
  }
  std::map<std::string, std::string> metadata = {{"format", kFormat},
                                                 {"step", std::to_string(state.step)},
                                                 {"adam_steps", std::to_string(moments.steps)},
                                                 {"data_random", encode(state.data_random)},
                                                 {"dropout_random", encode(state.dropout_random)},
                                                 {"config", config.dump()},
                                                 {"world_size", std::to_string(state.world_size)},
                                                 {"world_size_history", state.world_size_history.dump()}};
  if (state.other_ranks_dropout_random.size() + 1 != static_cast<std::size_t>(state.world_size)) {
    throw ValueError("[save_training_checkpoint] " + std::to_string(state.other_ranks_dropout_random.size() + 1) +
                     " dropout streams for " + std::to_string(state.world_size) + " ranks");
  }
  // Parameters with fewer updates than the optimizer's steps (a frozen or
  // unreached one: Adam::parameter_step_count); absent when every parameter
  // had every step, as in files from before per-parameter counts.
  nlohmann::json behind = nlohmann::json::object();
  for (std::size_t i = 0; i < moments.parameter_steps.size(); ++i) {
    if (moments.parameter_steps[i] != moments.steps) behind[trainable[i].name] = moments.parameter_steps[i];
  }
  if (!behind.empty()) metadata["adam_parameter_steps"] = behind.dump();
  if (state.elapsed_seconds) {
    char text[32];
    const auto r = std::to_chars(text, text + sizeof text, *state.elapsed_seconds);  // round-trips
    metadata["elapsed_seconds"] = std::string(text, r.ptr);
  }
  for (std::size_t r = 0; r < state.other_ranks_dropout_random.size(); ++r) {
    metadata["dropout_random.rank" + std::to_string(r + 1)] = encode(state.other_ranks_dropout_random[r]);
  }
  metadata["checksum"] = checkpoint_checksum(metadata, tensors);
  write_safetensors(path, tensors, metadata);
}

void load_training_checkpoint(const std::filesystem::path& path, const std::vector<NamedParameter>& trainable,
                              Adam& adam, TrainingState& state, const nlohmann::json& config,
                              std::int64_t world_size, std::int64_t rank) {
  load_training_checkpoint(
      path, trainable, [&adam](const Adam::State& moments) { adam.set_state(moments); }, state, config, world_size,
      rank);
}

void load_training_checkpoint(const std::filesystem::path& path, const std::vector<NamedParameter>& trainable,
                              const std::function<void(const Adam::State&)>& set_state, TrainingState& state,
                              const nlohmann::json& config, std::int64_t world_size, std::int64_t rank) {
  const std::string where = "[load] " + path.string() + ": ";
  // The saved run configuration against this run's (the first differing
  // field named): from the header, before the tensor layout, whose
  // difference would only name a tensor.
  nlohmann::json expected = config;
  const auto compare_config = [&](const std::string& saved_text) {
    nlohmann::json saved;
    try {
      saved = nlohmann::json::parse(detail::parse_untrusted_json(saved_text).dump());
    } catch (const detail::JsonReadError& e) {
      throw ModelStateError(where + "metadata 'config': " + e.what());
    }
    // Execution policy and logistics may change on resume (e.g. switch to
    // block checkpointing after running out of memory: the gradients are the
    // same); everything that decides the numbers must not — the attention
    // kind included: flash and materialized agree only within rounding
    // (docs/attention.md), so a switch gave other weights than the run.
    for (auto* j : {&saved, &expected}) {
      for (const char* key : {"resume", "output_dir", "activation_checkpointing", "checkpoint_segment_blocks",
                              "activation_memory_budget", "activation_offload", "zero_stage",
                              "gradient_bucket_mib", "device", "optimizer_in_backward",
                              "eval_interval", "eval_batches", "checkpoint_interval", "allow_non_finite"}) {
        j->erase(key);
      }
    }
    if (saved.value("gradient_accumulation_steps", nlohmann::json(1)) != expected["gradient_accumulation_steps"]) {
      // Checkpoints are written between optimizer steps only, so a run could
      // continue with another K, but its effective batch (and numbers) change.
      throw ModelStateError(where + "made with gradient_accumulation_steps " +
                            saved.value("gradient_accumulation_steps", nlohmann::json(1)).dump() + ", this run asks for " +
                            expected["gradient_accumulation_steps"].dump() +
                            "; resume with the same value or use a new output directory");
    }
    // A file named another way is the same setting: --data corpus.txt
    // resumes a run started with --data /abs/path/corpus.txt from that cwd.
    for (auto it = expected.begin(); it != expected.end(); ++it) {
      const auto at = saved.find(it.key());
      if (at != saved.end() && at->is_string() && it->is_string() && *at != *it && !at->get<std::string>().empty() &&
          !it->get<std::string>().empty() && same_file(at->get<std::string>(), it->get<std::string>())) {
        *at = *it;
      }
    }
    if (saved != expected) {
      std::string field = "?";
      for (auto it = expected.begin(); it != expected.end(); ++it) {
        if (!saved.contains(it.key()) || saved[it.key()] != it.value()) {
          field = it.key();
          break;
        }
      }
      const auto shown = [](const nlohmann::json& value) {
        std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // any path
        return text.size() > 200 ? text.substr(0, 200) + "..." : text;
      };
      const std::string values = saved.contains(field) && expected.contains(field)
                                     ? ": the checkpoint's " + shown(saved[field]) + ", this run's " + shown(expected[field])
                                     : "";
      throw ModelStateError(where + "made with a different configuration (first difference: '" + field + "'" + values +
                            "); resume with the same settings or use a new output directory");
    }
  };
  // The format and every tensor's name and shape are checked from the
  // header, before any tensor data is read (a sparse file can claim gigabytes).
  const TensorFile f = detail::read_safetensors_checked(path, [&](const detail::SafetensorsHeader& header) {
    const auto format = header.metadata.find("format");
    if (format == header.metadata.end() || format->second != kFormat) {
      throw ModelStateError(where + "not a riftco training checkpoint");
    }
    const auto saved_config = header.metadata.find("config");
    if (saved_config == header.metadata.end()) throw ModelStateError(where + "metadata 'config' missing");
    compare_config(saved_config->second);
    std::vector<std::pair<std::string, Shape>> layout;
    for (const NamedParameter& p : trainable) {
      for (const char* prefix : {"param.", "adam.m.", "adam.v."}) {
        layout.emplace_back(prefix + p.name, p.variable.shape());
      }
    }
    detail::check_tensor_layout(path, detail::tensor_layout(header), layout, "the run");
  });
  // Before anything in it is believed: a flipped bit or an edited field.
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // fuzz builds only: let mutated inputs reach the parsers below
  if (meta(f, "checksum", path) != checkpoint_checksum(f.metadata, f.tensors)) {
    throw ModelStateError(where + "checksum mismatch: the file was damaged or edited after it was written; "
                                  "resume from a copy, or start the run over");
  }
#endif
  // Another number of ranks: the data order is the same at any N (every
  // rank draws the whole global batch from one generator) and the Adam state
  // is the full one, but each rank draws its own dropout masks.
  const auto world_it = f.metadata.find("world_size");
  const std::int64_t saved_world =
      world_it == f.metadata.end() ? 1 : parse_count(world_it->second, "world_size", path);
  if (saved_world < 1) throw ModelStateError(where + "metadata 'world_size' is 0");
  const double dropout = expected.value("dropout", nlohmann::json(0.0)).get<double>();
  if (saved_world != world_size && dropout != 0.0) {
    throw ModelStateError(where + "made by a job of " + std::to_string(saved_world) + " rank(s) (world_size " +
                          std::to_string(saved_world) + "), this job has " + std::to_string(world_size) +
                          ": with dropout " + expected["dropout"].dump() +
                          " the dropout streams are per rank (each rank draws its own masks), so the run cannot "
                          "continue the same at another world size; resume with " +
                          (saved_world > 1 ? "mpirun -np " + std::to_string(saved_world)
                                           : std::string("one process")) +
                          " or use a new output directory (a run without dropout resumes at any world size)");
  }
  std::map<std::string, const Tensor*> by_name;  // the layout was checked from the header
  for (const auto& [name, t] : f.tensors) by_name[name] = &t;
  auto find = [&](const std::string& name) -> const Tensor& { return *by_name.at(name); };
  // The file holds host tensors; the parameters and moments go to the
  // device the run trains on (whatever device the checkpoint was made on).
  Adam::State moments;
  std::vector<Tensor> values;
  for (const NamedParameter& p : trainable) {
    const Backend device = p.variable.backend();
    values.push_back(find("param." + p.name));
    moments.first_moment.push_back(find("adam.m." + p.name).to(device));
    moments.second_moment.push_back(find("adam.v." + p.name).to(device));
  }
  TrainingState loaded;
  auto count = [&](const char* key) { return parse_count(meta(f, key, path), key, path); };
  loaded.step = count("step");
  moments.steps = count("adam_steps");
  const std::int64_t total = config.value("steps", std::int64_t{0});
  if (loaded.step <= 0 || loaded.step >= total || moments.steps != loaded.step) {
    throw ModelStateError(where + "step " + std::to_string(loaded.step) + " (Adam step " +
                          std::to_string(moments.steps) + ") does not fit a run of " + std::to_string(total) +
                          " steps");
  }
  moments.parameter_steps = read_parameter_steps(f, trainable, moments.steps, where);
  if (const auto it = f.metadata.find("elapsed_seconds"); it != f.metadata.end()) {
    loaded.elapsed_seconds = parse_seconds(it->second, path);
  }
  loaded.data_random = decode(meta(f, "data_random", path), path);
  loaded.world_size_history = read_world_size_history(f, loaded.step, saved_world, where);
  loaded.dropout_random = decode(meta(f, "dropout_random", path), path);
  for (std::int64_t r = 1; r < saved_world; ++r) {
    loaded.other_ranks_dropout_random.push_back(decode(meta(f, "dropout_random.rank" + std::to_string(r), path), path));
  }
  if (saved_world != world_size) {
    // Dropout is 0 (above): no stream is drawn from; each rank keeps its
    // fresh one, and the next checkpoint saves this job's streams.
    loaded.dropout_random = state.dropout_random;
    loaded.other_ranks_dropout_random.clear();
  } else if (rank > 0) {
    loaded.dropout_random = loaded.other_ranks_dropout_random.at(static_cast<std::size_t>(rank - 1));
  }
  loaded.world_size = world_size;
  // Everything validated: apply. The optimizer checks the moments' values
  // and counts (nothing changes when it refuses them): a file's fault here.
  try {
    set_state(moments);
  } catch (const ValueError& e) {
    throw ModelStateError(where + "its Adam state: " + e.what());
  }
  for (std::size_t i = 0; i < trainable.size(); ++i) {
    Variable v = trainable[i].variable;
    // One copy: to() makes it on a device; on the cpu it would share the
    // file's buffer, so the clone is the copy.
    const Backend device = v.backend();
    v.set_value(device == Backend::Cpu ? values[i].clone() : values[i].to(device));
  }
  state = loaded;
}

}  // namespace riftco_transformer::stage
