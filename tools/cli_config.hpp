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
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace rt_cli {

class RunConfigFile : public CLI::ConfigTOML {
 public:
  explicit RunConfigFile(const CLI::App* app) : app_(app) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto first = text.find_first_not_of(" \t\r\n");
    std::vector<CLI::ConfigItem> raw;
    if (first != std::string::npos && text[first] == '{') {
      raw = from_json(text, app_->get_name());
    } else {
      std::istringstream toml(text);
      raw = CLI::ConfigTOML::from_config(toml);
    }
    std::vector<CLI::ConfigItem> out;
    for (CLI::ConfigItem& item : raw) {
      if (item.name == "++" || item.name == "--") continue;  // CLI11's section markers
      if (const std::string option = resolve(item); !option.empty()) {
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
    if (recorded_facts.contains(leaf)) return "";
    throw CLI::ConfigError("config file: '" + item.fullname() + "' is not an option of " + app_->get_name() +
                           " (see --help)");
  }

  /// A JSON object (or metadata.json's "config") as flat config items.
  static std::vector<CLI::ConfigItem> from_json(const std::string& text, const std::string& command) {
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(text);
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
      if (value.is_null()) continue;
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
};

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
  const std::vector<CLI::ConfigItem> items = format.from_file(path);
  for (const CLI::ConfigItem& item : items) {
    CLI::Option* option = app.get_option("--" + item.name);
    if (option->count() > 0) continue;  // the command line wins
    if (option->get_expected_min() == 0) {  // a flag
      option->add_result(option->get_flag_value(item.name, format.to_flag(item)));
    } else {
      option->add_result(item.inputs);
    }
    option->run_callback();
  }
}

}  // namespace rt_cli
