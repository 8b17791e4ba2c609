#pragma once
// A small command-line parser shared by the rt-* tools: --name VALUE or
// --name=VALUE, flags without values, typed getters whose errors say which
// option and what was expected. Header-only (tools/*.cpp are the programs).
#include <charconv>
#include <cmath>
#include <limits>
#include <cstdint>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rt_cli {

/// A usage error: the tool prints it with a hint and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Option {
  std::string name;  // without the leading dashes
  std::string value_name;  // empty: a flag
  std::string help;
  std::string default_text;  // shown in --help
};

class Parser {
 public:
  Parser(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

  void section(const std::string& title) { options_.push_back({"", "", title, ""}); }
  void add(const std::string& name, const std::string& value_name, const std::string& help,
           const std::string& default_text = "") {
    options_.push_back({name, value_name, help, default_text});
  }

  void parse(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "-h" || arg == "--help") {
        help_ = true;
        continue;
      }
      if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + arg + "'");
      std::string name = arg.substr(2);
      std::optional<std::string> value;
      if (const auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      const Option* opt = find(name);
      if (opt == nullptr) throw UsageError("unknown option '--" + name + "'");
      if (opt->value_name.empty()) {
        if (value) throw UsageError("option '--" + name + "' takes no value");
        values_[name] = "1";
        continue;
      }
      if (!value) {
        if (i + 1 >= argc) throw UsageError("option '--" + name + "' needs a value (" + opt->value_name + ")");
        value = argv[++i];
      }
      values_[name] = *value;
    }
  }

  bool help() const { return help_; }
  bool has(const std::string& name) const { return values_.contains(name); }
  std::string text(const std::string& name, const std::string& fallback = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  std::int64_t integer(const std::string& name, std::int64_t fallback) const {
    if (!has(name)) return fallback;
    const std::string& v = values_.at(name);
    std::int64_t out = 0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), out);
    if (r.ec != std::errc() || r.ptr != v.data() + v.size()) {
      throw UsageError("option '--" + name + "' expects an integer, got '" + v + "'");
    }
    return out;
  }
  double number(const std::string& name, double fallback) const {
    if (!has(name)) return fallback;
    const std::string& v = values_.at(name);
    std::size_t used = 0;
    double out = 0;
    try {
      out = std::stod(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || v.empty()) throw UsageError("option '--" + name + "' expects a number, got '" + v + "'");
    // Every number option is a 32-bit float setting: inf, nan and values
    // that overflow a float (1e39) are refused here, by name.
    if (!std::isfinite(out) || std::fabs(out) > static_cast<double>(std::numeric_limits<float>::max())) {
      throw UsageError("option '--" + name + "' expects a finite number, got '" + v + "'");
    }
    return out;
  }

  std::string usage(const std::string& synopsis) const {
    std::ostringstream out;
    out << "usage: " << program_ << " " << synopsis << "\n\n" << summary_ << "\n";
    for (const Option& o : options_) {
      if (o.name.empty()) {
        out << "\n" << o.help << ":\n";
        continue;
      }
      std::string left = "  --" + o.name + (o.value_name.empty() ? "" : " " + o.value_name);
      out << std::left << std::setw(38) << left << " " << o.help;
      if (!o.default_text.empty()) out << " [" << o.default_text << "]";
      out << "\n";
    }
    out << "  " << std::left << std::setw(37) << "-h, --help" << " show this help\n";
    return out.str();
  }

 private:
  const Option* find(const std::string& name) const {
    for (const Option& o : options_) {
      if (!o.name.empty() && o.name == name) return &o;
    }
    return nullptr;
  }
  std::string program_;
  std::string summary_;
  std::vector<Option> options_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

/// "1h02m", "3m05s", "12s".
inline std::string duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const auto s = static_cast<long>(seconds + 0.5);
  std::ostringstream out;
  if (s >= 3600) {
    out << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  } else if (s >= 60) {
    out << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  } else {
    out << s << "s";
  }
  return out.str();
}

/// A float as a person writes it: 0.001, 3e-05, 16.
inline std::string num(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

inline std::string mib(std::int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return out.str();
}

}  // namespace rt_cli
