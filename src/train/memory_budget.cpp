#include "memory_budget.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

namespace riftco_transformer::stage {
namespace {

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

MemoryEstimate estimate_training_memory(const TransformerDimensions& d, std::int64_t trainable_parameters,
                                        std::int64_t lora_parameters, const StageSettings& s) {
  // Doubles: the products below can exceed int64 for hostile settings.
  const double f = 4.0;  // bytes per float
  const auto dd = [](std::int64_t v) { return static_cast<double>(v); };
  const double rows = dd(s.batch) * dd(s.sequence_length);  // B·T
  MemoryEstimate e;
  e.parameters = f * (dd(d.parameter_count()) + dd(lora_parameters));
  e.training = f * 3.0 * dd(trainable_parameters);
  const double boundaries = rows * dd(d.model_width) * dd(d.layers + 1);  // h_i of every block, any policy
  const double one_block = rows * (4.0 * dd(d.model_width) + 2.0 * dd(d.feed_forward_width));
  const double scores = s.attention == FullSequenceAttentionKind::Materialized
                            ? dd(s.batch) * dd(d.heads) * dd(s.sequence_length) * dd(s.sequence_length)
                            : 0.0;
  const double logits = 2.0 * rows * dd(d.vocab_size);  // logits and their softmax
  e.activations = f * (boundaries + one_block + scores + logits);
  return e;
}

double available_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  double bytes = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  std::ifstream limit("/sys/fs/cgroup/memory.max");  // cgroup v2; "max" when unlimited
  std::string text;
  if (limit >> text && text != "max") {
    try {
      const double cgroup = std::stod(text);
      if (cgroup > 0) bytes = bytes > 0 ? std::min(bytes, cgroup) : cgroup;
    } catch (const std::exception&) {
    }
  }
  return bytes;
}

void check_memory_budget(const MemoryEstimate& e, const char* op) {
  const double available = available_memory_bytes();
  if (available <= 0 || e.total() <= available) return;
  throw ValueError(std::string("[") + op + "] this run needs at least " + gib(e.total()) + " (weights " +
                   gib(e.parameters) + ", gradients and Adam moments " + gib(e.training) + ", activations " +
                   gib(e.activations) + ") but this machine has " + gib(available) +
                   "; use a smaller model, batch or sequence length, or LoRA rank");
}

}  // namespace riftco_transformer::stage
