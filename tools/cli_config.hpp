#pragma once
// `--config FILE` for the rt-* tools: a TOML file (CLI11's own reader) or a
// JSON object, including a run's metadata.json, whose "config" object is
// replayed. Keys are the option names with '_' or '-' (`learning_rate`,
// `sequence-length`); nested tables/objects flatten to "<parent>-<key>"
// (`lora.rank` → --lora-rank) or to "<key>" (`dimensions.layers` →
// --layers). Options given on the command line win over the file.
//
// A key naming no option is an error, except the facts a run records but
// nobody sets (fingerprints, the vocabulary the tokenizer decides, the
// default corpus's description), which are skipped.
//
// The file is untrusted: it must be a regular file of at most 1 MiB, tables
// or objects nest at most kMaxConfigDepth deep, and no key or value may hold
// a NUL byte (a path "a\u0000b" would silently name the file "a").
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "riftco_transformer/atomic_file.hpp"

namespace rt_cli {

/// Tables/objects (and dotted keys) deeper than this are refused.
inline constexpr int kMaxConfigDepth = 16;
/// A config file (a run's metadata.json included) is far smaller.
inline constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{1} << 20;

class RunConfigFile : public CLI::ConfigTOML {
 public:
  explicit RunConfigFile(const CLI::App* app) : app_(app) {}

  /// The recorded facts of the last file read ("data-fingerprint",
  /// "base-model-fingerprint", "tokenizer-checksum", "vocab-size" → value).
  const std::map<std::string, std::string>& facts() const { return facts_; }

  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto first = text.find_first_not_of(" \t\r\n");
    std::vector<CLI::ConfigItem> raw;
    // A TOML file may open with a [table]; a JSON array (even an empty one) is JSON.
    if (first != std::string::npos &&
        (text[first] == '{' || (text[first] == '[' && nlohmann::json::accept(text)))) {
      raw = from_json(text, app_->get_name());
    } else {
      check_toml_depth(text);
      std::istringstream toml(text);
      raw = CLI::ConfigTOML::from_config(toml);
    }
    std::vector<CLI::ConfigItem> out;
    // option -> the key that set it; by the option itself, so that its
    // aliases ("zero" and "zero_stage" for --zero,--zero-stage) count as one.
    std::map<const CLI::Option*, std::string> set_by;
    facts_.clear();
    for (CLI::ConfigItem& item : raw) {
      if (item.name == "++" || item.name == "--") continue;  // CLI11's section markers
      check_no_nul(item);
      if (const std::string option = resolve(item); !option.empty()) {
        // Two keys for one option ("layers" and "dimensions.layers", "output"
        // and "output_dir", an option's two names): which one wins would be a guess.
        const CLI::Option* target = app_->get_option_no_throw("--" + option);
        const auto [it, fresh] = set_by.emplace(target, item.fullname());
        if (!fresh) {
          throw CLI::ConfigError("config file: '" + it->second + "' and '" + item.fullname() + "' both set " +
                                 target->get_name() + "; keep one");
        }
        item.parents.clear();
        item.name = option;
        out.push_back(std::move(item));
      }
    }
    return out;
  }

 private:
  static std::string dashed(std::string name) {
    std::replace(name.begin(), name.end(), '_', '-');
    return name;
  }

  /// A NUL byte would cut a path short (open(2) stops at it) or a message.
  static void check_no_nul(const CLI::ConfigItem& item) {
    const auto has_nul = [](const std::string& s) { return s.find('\0') != std::string::npos; };
    bool bad = has_nul(item.name);
    for (const std::string& p : item.parents) bad = bad || has_nul(p);
    for (const std::string& v : item.inputs) bad = bad || has_nul(v);
    if (bad) {
      std::string name = item.fullname();
      std::replace(name.begin(), name.end(), '\0', '?');
      throw CLI::ConfigError("config file: '" + name + "' holds a NUL byte (\\u0000), which no option accepts");
    }
  }

  /// CLI11 expands a dotted key or [section] into one level per part, at a
  /// cost quadratic in the parts: a line of thousands of dots is refused first.
  static void check_toml_depth(const std::string& text) {
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      const std::size_t first = line.find_first_not_of(" \t");
      if (first == std::string::npos || line[first] == '#') continue;
      const std::size_t end = line[first] == '[' ? line.find(']', first) : line.find('=', first);
      const std::string key = line.substr(first, end == std::string::npos ? std::string::npos : end - first);
      if (std::count(key.begin(), key.end(), '.') >= kMaxConfigDepth) {
        throw CLI::ConfigError("config file: '" + key.substr(0, 60) + (key.size() > 60 ? "..." : "") +
                               "' nests deeper than " + std::to_string(kMaxConfigDepth) + " levels");
      }
    }
  }

  bool has_option(const std::string& name) const {
    return app_->get_option_no_throw("--" + name) != nullptr && name != "config" && name != "help";
  }

  /// The option an item sets, or "" for a recorded fact that is skipped.
  std::string resolve(const CLI::ConfigItem& item) const {
    const std::string leaf = dashed(item.name);
    const std::string parent = item.parents.empty() ? "" : dashed(item.parents.back());
    static const std::set<std::string> renamed_from = {"output-dir", "fine-tuning-method"};
    std::vector<std::string> candidates;
    if (!parent.empty()) candidates.push_back(parent + "-" + leaf);
    candidates.push_back(leaf);
    if (leaf == "output-dir") candidates.push_back("output");
    if (leaf == "fine-tuning-method") candidates.push_back("method");
    for (const std::string& c : candidates) {
      if (has_option(c)) {
        // metadata.json describes the default corpus instead of naming a file.
        if (c == "data" && item.inputs.size() == 1 && item.inputs[0].rfind("default corpus", 0) == 0) return "";
        return c;
      }
    }
    static const std::set<std::string> recorded_facts = {"data-fingerprint", "base-model-fingerprint",
                                                         "vocab-size", "tokenizer-checksum"};
    if (recorded_facts.contains(leaf)) {
      if (item.inputs.size() == 1) facts_[leaf] = item.inputs[0];  // checked against the files (replayed_facts)
      return "";
    }
    throw CLI::ConfigError("config file: '" + item.fullname() + "' is not an option of " + app_->get_name() +
                           " (see --help)");
  }

  /// A JSON object (or metadata.json's "config") as flat config items.
  static std::vector<CLI::ConfigItem> from_json(const std::string& text, const std::string& command) {
    nlohmann::json root;
    // Refused while parsing: a deeply nested object would overflow the
    // stack in flatten() (and its parents' copies are quadratic), and a key
    // given twice in one object (nlohmann keeps the last one silently).
    std::vector<std::set<std::string>> keys;  // of each open object
    const auto check = [&keys](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      using Event = nlohmann::json::parse_event_t;
      if (depth > kMaxConfigDepth) {
        throw CLI::ConfigError("config file: objects or arrays nest deeper than " + std::to_string(kMaxConfigDepth) +
                               " levels");
      }
      if (event == Event::object_start) keys.emplace_back();
      if (event == Event::object_end && !keys.empty()) keys.pop_back();
      if (event == Event::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second) {
        std::string key = parsed.get<std::string>();
        std::replace(key.begin(), key.end(), '\0', '?');
        throw CLI::ConfigError("config file: the key '" + key + "' appears twice in one object");
      }
      return true;
    };
    try {
      root = nlohmann::json::parse(text, check);
    } catch (const nlohmann::json::exception& e) {
      throw CLI::ConfigError(std::string("config file: not valid JSON: ") + e.what());
    }
    if (!root.is_object()) throw CLI::ConfigError("config file: expected a JSON object");
    // A run's metadata.json: its settings are the "config" object.
    if (root.contains("config") && root["config"].is_object() && root.contains("stage")) {
      const std::string stage = root["stage"].is_string() ? root["stage"].get<std::string>() : "";
      const std::string expected = command == "pretrain" ? "pretraining" : command == "post-train" ? "post_training" : "";
      if (!expected.empty() && stage != expected) {
        throw CLI::ConfigError("config file: metadata of a '" + stage + "' run cannot configure " + command);
      }
      root = root["config"];
    }
    std::vector<CLI::ConfigItem> items;
    flatten(root, {}, items);
    return items;
  }

  static void flatten(const nlohmann::json& object, const std::vector<std::string>& parents,
                      std::vector<CLI::ConfigItem>& items) {
    for (const auto& [key, value] : object.items()) {
      if (value.is_object()) {
        std::vector<std::string> inner = parents;
        inner.push_back(key);
        flatten(value, inner, items);
        continue;
      }
      // null is not "unset": {"data": null} trained on the default corpus and
      // {"steps": null} the default 200 steps, silently. Leave the key out.
      if (value.is_null()) {
        throw CLI::ConfigError("config file: '" + key + "' is null: give it a value, or leave the key out for the "
                               "default");
      }
      CLI::ConfigItem item;
      item.parents = parents;
      item.name = key;
      const auto scalar = [&](const nlohmann::json& v) -> std::string {
        if (v.is_string()) return v.get<std::string>();
        if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
        if (v.is_number()) return v.dump();
        throw CLI::ConfigError("config file: '" + key + "' must be a string, number or boolean");
      };
      if (value.is_array()) {
        for (const auto& v : value) item.inputs.push_back(scalar(v));
      } else {
        item.inputs.push_back(scalar(value));
      }
      items.push_back(std::move(item));
    }
  }

  const CLI::App* app_;
  mutable std::map<std::string, std::string> facts_;
};

/// What the last apply_config_file filled: the options the file set (the
/// command line left them unset; names without dashes, "data") and the facts
/// it recorded (a run's metadata.json: its data and base-model fingerprints,
/// its tokenizer's checksum). A replay checks the facts against the files.
struct ConfigFileUse {
  std::set<std::string> options;
  std::map<std::string, std::string> facts;
  bool from_file(const std::string& option) const { return options.contains(option); }
};

inline ConfigFileUse& config_file_use() {
  static ConfigFileUse use;
  return use;
}

/// Adds `--config FILE` to `app` (a subcommand or a tool's only app);
/// run_tool applies it after parsing (CLI11 reads config files for the
/// top-level app only, and these belong to subcommands).
inline void add_config_option(CLI::App& app) {
  app.add_option("--config", "read options from a TOML or JSON file (a run's metadata.json replays it)")
      ->type_name("FILE")
      ->configurable(false);
}

/// Fills every option of `app` the command line left unset from FILE, with
/// the same validators and conversions as the command line.
inline void apply_config_file(CLI::App& app, const std::string& path) {
  RunConfigFile format(&app);
  if (path.empty()) throw CLI::FileError::Missing("(empty path)");
  // Not CLI11's from_file: a directory, a FIFO or /dev/zero is refused by
  // name without blocking or reading without end.
  std::string text;
  if (const auto why = riftco_transformer::read_regular_file(path, text, kMaxConfigBytes)) {
    throw CLI::FileError("config file " + path + ": " + *why);
  }
  std::istringstream in(text);
  const std::vector<CLI::ConfigItem> items = format.from_config(in);
  ConfigFileUse& use = config_file_use();
  use = ConfigFileUse{{}, format.facts()};
  for (const CLI::ConfigItem& item : items) {
    CLI::Option* option = app.get_option("--" + item.name);
    if (option->count() > 0) continue;  // the command line wins
    use.options.insert(item.name);
    if (option->get_expected_min() == 0) {  // a flag
      option->add_result(option->get_flag_value(item.name, format.to_flag(item)));
    } else {
      option->add_result(item.inputs);
    }
    option->run_callback();
  }
}

}  // namespace rt_cli
