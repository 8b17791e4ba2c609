// rt-bench-plan-search: how long the activation memory planner's search takes
// on a deep model (docs/checkpointing.md, "The search").
//
// Profiles a model of --layers blocks (width 64, 4 heads, batch 4, sequence
// 128: the probes run 1-3 block copies, so this is quick), then plans it for
// --budgets budgets evenly between the smallest plan and keeping everything,
// and prints, per budget, the plan and the process CPU seconds the search
// took (run it with OMP_NUM_THREADS=1: the search is single-threaded). With
// --lora the base (token embedding included) is frozen and rank-4 adapters
// train, so block 0 is probed apart (later_block_extra is not 0).
//
//   rt-bench-plan-search [--layers 96] [--budgets 9] [--lora] [--keep-graph]
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "riftco_transformer/memory_plan.hpp"

using namespace riftco_transformer;

namespace {

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t layers = 96, budgets = 9;
  bool lora = false, keep_graph = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--layers" && i + 1 < argc) {
      layers = std::atoll(argv[++i]);
    } else if (a == "--budgets" && i + 1 < argc) {
      budgets = std::atoll(argv[++i]);
    } else if (a == "--lora") {
      lora = true;
    } else if (a == "--keep-graph") {
      keep_graph = true;
    } else {
      std::fprintf(stderr, "usage: rt-bench-plan-search [--layers N] [--budgets N] [--lora] [--keep-graph]\n");
      return 2;
    }
  }
  if (layers < 1 || budgets < 2) {
    std::fprintf(stderr, "rt-bench-plan-search: --layers must be >= 1 and --budgets >= 2\n");
    return 2;
  }
  TransformerDimensions d{64, 128, 64, 4, layers, 128};
  Random random(7);
  DecoderOnlyTransformer model(d, random, 1e-5F, FullSequenceAttentionKind::Flash);
  if (lora) {
    LoraConfig c;
    c.rank = 4;
    c.targets = {LoraTarget::Query, LoraTarget::Value, LoraTarget::Up};
    model.add_lora(c, random);
    model.set_base_trainable(false);
    for (NamedParameter& p : model.lora_parameters()) p.variable.set_requires_grad(true);
  }
  ActivationMemoryProfile profile = profile_activation_memory(model, 4, 128);
  if (keep_graph) profile.graph = GraphAfterBackward::Keep;  // the kept-graph model of a hand-made profile
  double start = cpu_seconds();
  const ActivationMemoryPlan loosest = plan_activation_memory(profile, std::int64_t{1} << 50);
  double total = cpu_seconds() - start;
  std::printf("%lld blocks, %s profile%s: smallest plan %lld bytes, keeping everything %lld bytes\n",
              static_cast<long long>(layers), keep_graph ? "kept-graph" : "Release", lora ? ", LoRA" : "",
              static_cast<long long>(loosest.smallest_feasible_bytes), static_cast<long long>(loosest.disabled_peak_bytes));
  for (std::int64_t i = 0; i < budgets; ++i) {
    const std::int64_t budget = loosest.smallest_feasible_bytes +
                                (loosest.disabled_peak_bytes - loosest.smallest_feasible_bytes) * i / (budgets - 1);
    start = cpu_seconds();
    const ActivationMemoryPlan plan = plan_activation_memory(profile, budget);
    const double seconds = cpu_seconds() - start;
    total += seconds;
    std::printf("  budget %lld: %.3f s  peak %lld  %s\n", static_cast<long long>(budget), seconds,
                static_cast<long long>(plan.predicted_peak_bytes), describe_plan(plan.plan).c_str());
  }
  std::printf("mean %.3f s CPU per plan\n", total / static_cast<double>(budgets + 1));
  return 0;
}
