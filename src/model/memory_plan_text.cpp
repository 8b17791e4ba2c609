// The activation memory planner's text: byte sizes ("256MiB") and a plan's
// description (include/riftco_transformer/memory_plan.hpp).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "memory_plan_terms.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {

using namespace memory_plan_detail;

std::int64_t parse_byte_size(const std::string& text, const char* op) {
  const auto bad = [&](const std::string& why) {
    return ValueError(std::string("[") + op + "] '" + text + "' is not a byte size (" + why +
                      "; e.g. 256MiB, 1.5GiB, 300MB or a number of bytes)");
  };
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t j = i;
  while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) ++j;
  if (j == i) throw bad("it does not start with a number");
  const std::string number = text.substr(i, j - i);
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) throw bad("the number is malformed");
  std::string unit;
  for (std::size_t k = j; k < text.size(); ++k) {
    if (!std::isspace(static_cast<unsigned char>(text[k]))) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[k])));
  }
  double scale = 0;
  const struct { const char* name; double scale; } units[] = {
      {"", 1},       {"b", 1},         {"k", 1e3},        {"kb", 1e3},          {"kib", 1024.0},
      {"m", 1e6},    {"mb", 1e6},      {"mib", 1048576.0}, {"g", 1e9},           {"gb", 1e9},
      {"gib", 1073741824.0}, {"t", 1e12}, {"tb", 1e12},   {"tib", 1099511627776.0}};
  for (const auto& u : units) {
    if (unit == u.name) scale = u.scale;
  }
  if (scale == 0) throw bad("unknown unit '" + unit + "'");
  const double bytes = std::floor(value * scale);
  if (!(bytes >= 1)) throw bad("it must be at least one byte");
  if (bytes > 9.0e18) throw bad("it is too large");
  return static_cast<std::int64_t>(bytes);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t u = 0;
  while (std::fabs(bytes) >= 1024.0 && u + 1 < std::size(units)) {
    bytes /= 1024.0;
    ++u;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buffer;
}

std::string describe_activation_memory_plan(const ActivationMemoryProfile& profile, const ActivationMemoryPlan& plan) {
  char line[256];
  std::string out;
  std::snprintf(line, sizeof line, "activation memory budget %s: %s\n", format_bytes(static_cast<double>(plan.budget_bytes)).c_str(),
                describe_plan(plan.plan).c_str());
  out += line;
  std::snprintf(line, sizeof line,
                "  predicted activation peak %s (keeping everything: %s; the smallest plan: %s)\n",
                format_bytes(static_cast<double>(plan.predicted_peak_bytes)).c_str(),
                format_bytes(static_cast<double>(plan.disabled_peak_bytes)).c_str(),
                format_bytes(static_cast<double>(plan.smallest_feasible_bytes)).c_str());
  out += line;
  if (profile.activation_offload) {
    std::snprintf(line, sizeof line, "  activation offload: %s of block inputs in pinned host memory\n",
                  format_bytes(static_cast<double>(plan.pinned_host_bytes)).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  recompute %.3g GFLOP per step (%.1f%% of the forward)\n", plan.recompute_flops / 1e9,
                profile.forward_flops > 0 ? 100.0 * plan.recompute_flops / profile.forward_flops : 0.0);
  out += line;
  std::int64_t first = 0;
  for (std::size_t i = 0; i < plan.plan.size();) {
    const CheckpointGroup& g = plan.plan[i];
    std::size_t j = i;
    while (j < plan.plan.size() && plan.plan[j] == g) ++j;  // a run of equal groups: one line
    const std::int64_t blocks = static_cast<std::int64_t>(j - i) * g.blocks;
    const std::int64_t saved = g.recompute == BlockRecompute::Whole ? profile.block_input_bytes
                                                                    : profile.kept_bytes(g.recompute);
    const std::int64_t kept = offloaded(profile, g) ? saved - profile.block_input_bytes : saved;  // on the device
    const std::string which = blocks == 1 ? "block " + std::to_string(first)
                                          : "blocks " + std::to_string(first) + "-" + std::to_string(first + blocks - 1);
    const std::string what = g.blocks > 1 ? "segments of " + std::to_string(g.blocks) + " blocks"
                             : g.recompute == BlockRecompute::Nothing ? std::string("keep everything")
                                                                      : std::string("recompute ") + block_recompute_name(g.recompute);
    std::snprintf(line, sizeof line, "  %-14s %-28s keeps %s per %s\n", which.c_str(), what.c_str(),
                  format_bytes(static_cast<double>(kept)).c_str(), g.blocks > 1 ? "segment" : "block");
    out += line;
    first += blocks;
    i = j;
  }
  return out;
}

}  // namespace riftco_transformer
