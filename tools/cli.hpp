#pragma once
// What the rt-* tools share on top of CLI11 (Debian libcli11-dev): the
// validators every number option uses, the exit-code convention (usage
// errors: one line, a hint, exit 2; failures during the work: exit 1), and
// small formatting helpers. `--config FILE` (cli_config.hpp) is applied here,
// after parsing, to the subcommand that was chosen.
// Header-only: every tools/*.cpp is a program.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "cli_config.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"

namespace rt_cli {

/// A usage error found after parsing (a missing combination, a bad pairing):
/// reported like CLI11's own parse errors.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Every number option is a 32-bit float setting: inf, nan and values that
/// overflow a float (1e39) are refused by name before anything runs, as are
/// texts that are not a plain decimal number (hex "0x10", blanks: strtod
/// would take them) and non-zero values a float cannot hold (1e-46 would
/// silently be 0).
inline const CLI::Validator kFiniteFloat(
    [](std::string& text) -> std::string {
      // strtod also reads hex ("0x10") and skips leading blanks.
      const bool plain = !text.empty() && text.find_first_of("xX \t\n\r\f\v") == std::string::npos;
      std::size_t used = 0;
      double value = 0;
      try {
        if (plain) value = std::stod(text, &used);
      } catch (const std::out_of_range&) {  // underflow or overflow: judged below from the text
        used = text.size();
        value = text.find_first_of("123456789") == std::string::npos ? 0.0 : HUGE_VAL;
        const std::size_t e = text.find_first_of("eE");
        if (e != std::string::npos && text.find('-', e) != std::string::npos) value = 1e-300;  // tiny, not zero
      } catch (const std::exception&) {
        used = 0;
      }
      if (!plain || used != text.size()) return "expects a number, got '" + text + "'";
      if (!std::isfinite(value) || std::fabs(value) > static_cast<double>(std::numeric_limits<float>::max())) {
        return "expects a finite number, got '" + text + "'";
      }
      if (value != 0.0 && static_cast<float>(value) == 0.0F) {
        return "expects a number a float can hold, got '" + text + "' (it would be 0)";
      }
      return "";
    },
    "", "finite float");

/// `text` read whole as a long long: false for no digits, trailing bytes or
/// a value past its range.
inline bool whole_integer(const std::string& text, long long& value) {
  std::size_t used = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return !text.empty() && used == text.size();
}

/// An integer option's lower bound, checked on the text so the message says
/// what was expected: "expects an integer >= 1, got 'many'".
inline CLI::Validator integer_at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        long long value = 0;
        if (!whole_integer(text, value) || value < minimum) {
          return "expects an integer >= " + std::to_string(minimum) + ", got '" + text + "'";
        }
        return "";
      },
      "", "integer >= " + std::to_string(minimum));
}

/// An integer option in [minimum, maximum] ("expects an integer in [2, 1000], got '5000'").
inline CLI::Validator integer_in(long long minimum, long long maximum) {
  const std::string range = "[" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]";
  return CLI::Validator(
      [minimum, maximum, range](std::string& text) -> std::string {
        long long value = 0;
        if (!whole_integer(text, value) || value < minimum || value > maximum) {
          return "expects an integer in " + range + ", got '" + text + "'";
        }
        return "";
      },
      "", "integer in " + range);
}

/// A 64-bit unsigned option (a seed): every value in [0, 2^64 - 1] (stoll
/// refused the upper half with "expects an integer >= 0"); a sign, a
/// leading blank or anything after the digits is refused.
inline const CLI::Validator kUnsigned64(
    [](std::string& text) -> std::string {
      std::size_t used = 0;
      try {
        if (!text.empty() && text[0] >= '0' && text[0] <= '9') (void)std::stoull(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (text.empty() || used != text.size()) {
        return "expects an integer in [0, " + std::to_string(std::numeric_limits<std::uint64_t>::max()) + "], got '" +
               text + "'";
      }
      return "";
    },
    "", "integer in [0, 2^64)");

/// `rc`, or 1 when what the tool printed could not all be written (a full
/// disk, /dev/full, a closed pipe's EIO): `rt-eval --json > result.json` on a
/// full disk exited 0 with an empty file. As cat and Python do.
inline int finish_output(const std::string& tool, int rc) {
  errno = 0;  // the first failed write sets it: cout's (already failed, badbit) or the flush here
  const bool failed = !std::cout.good() || (std::cout.flush(), !std::cout.good()) || std::fflush(stdout) != 0 ||
                      std::ferror(stdout) != 0;
  if (failed && rc == 0) {
    std::cerr << tool << ": error: writing to standard output failed"
              << (errno != 0 ? std::string(" (") + std::strerror(errno) + ")" : std::string()) << "\n";
    return 1;
  }
  return rc;
}

/// Runs `body` with the tools' exit-code convention. `parse` parses argv
/// (CLI11 errors → exit 2 with a hint naming the subcommand's --help);
/// `body` does the work: a ValueError before `running` is set is still a
/// usage error (a bad option value the library refused), after it exit 1.
inline int run_tool(const std::string& tool, CLI::App& app, int argc, char** argv,
                    const std::function<int(bool& running)>& body) {
  auto hint = [&]() {
    std::string command = tool;
    for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
    return "Try '" + command + " --help'.";
  };
  bool running = false;
  // `--name=` with nothing after the '=': CLI11 takes the next argument as
  // the value (`--prompt= --max-new-tokens=3` prompted with the text
  // "--max-new-tokens=3" and ran with 200 new tokens). Refused, naming it.
  // Only an option the tool defines, and not where an option before it takes
  // this argument as its value (`--prompt '--x ='` is a prompt).
  const auto defined = [&](const std::string& name) -> const CLI::Option* {
    if (const CLI::Option* o = app.get_option_no_throw(name)) return o;
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (const CLI::Option* o = sub->get_option_no_throw(name)) return o;
    }
    return nullptr;
  };
  bool is_value = false;  // argv[i] follows an option that takes a value
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    const bool was_value = is_value;
    const CLI::Option* option = arg.starts_with("--") ? defined(arg.substr(0, arg.find('='))) : nullptr;
    is_value = option != nullptr && arg.find('=') == std::string::npos && option->get_expected_max() > 0;
    if (!was_value && option != nullptr && arg.back() == '=' && arg.find('=') == arg.size() - 1) {
      std::cerr << tool << ": " << arg.substr(0, arg.size() - 1)
                << ": no value after '=' (give one, or leave the option out)\n"
                << hint() << "\n";
      return 2;
    }
  }
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::Success& e) {  // --help
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      std::cerr << tool << ": " << e.what() << "\n" << hint() << "\n";
      return 2;
    }
    CLI::App* target = app.get_subcommands().empty() ? &app : app.get_subcommands().front();
    if (const CLI::Option* config = target->get_option_no_throw("--config"); config && config->count() > 0) {
      apply_config_file(*target, config->as<std::string>());
    }
    return finish_output(tool, body(running));
  } catch (const CLI::ParseError& e) {  // from a --config file
    std::cerr << tool << ": " << e.what() << "\n" << hint() << "\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << tool << ": " << e.what() << "\n" << hint() << "\n";
    return 2;
  } catch (const riftco_transformer::ValueError& e) {
    if (running) {
      std::cerr << "\n" << tool << ": error: " << e.what() << "\n";
      return 1;
    }
    std::cerr << tool << ": " << e.what() << "\n" << hint() << "\n";
    return 2;
  } catch (const riftco_transformer::OutOfMemoryError& e) {  // says what wanted how much
    std::cerr << "\n" << tool << ": error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "\n" << tool << ": error: out of memory (a smaller model, batch or sequence length needs less)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "\n" << tool << ": error: " << e.what() << "\n";
    return 1;
  }
}

/// --device for the tools that run a saved model (rt-generate, rt-eval):
/// where the model moves after loading, as rt-train's --device.
inline CLI::Option* add_device_option(CLI::App& app, std::string& device) {
  return app.add_option("--device", device, "run on this device: the model moves there after loading (default cpu)")
      ->type_name("DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

/// The device --device names, refused (exit 1, before the model is read)
/// when this build or machine has no such device.
inline riftco_transformer::Backend device_to_use(const std::string& tool, const std::string& device) {
  const riftco_transformer::Backend backend = riftco_transformer::parse_backend(device, "--device");
  if (!riftco_transformer::backend_available(backend)) {
    throw riftco_transformer::BackendError("[" + tool + "] device " + device + ": " +
                                           riftco_transformer::backend_unavailable_reason(backend) +
                                           "; use --device cpu");
  }
  return backend;
}

/// The project's help layout: wide enough for the long option names.
inline void style(CLI::App& app) {
  app.get_formatter()->column_width(44);
  app.option_defaults()->always_capture_default();
}

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
