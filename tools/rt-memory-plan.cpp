// rt-memory-plan: what each checkpointing plan keeps, for a model shape.
//
// Profiles the shape (memory_plan.hpp), then for every uniform policy and a
// sweep of activation memory budgets (from the smallest feasible to keeping
// everything) reports the bytes kept per block and in total, the predicted
// activation peak, the recompute FLOPs and — with --measure — the allocator's
// measured peak and the fastest training-step time (forward + backward + Adam).
// Writes memory_plan.json, memory_plan.md, memory_plan_peak.svg (predicted
// and measured peak against the budget) and memory_plan_time.svg (step time
// against the budget) into --output.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/memory_plan.hpp"
#include "riftco_transformer/plot.hpp"

using namespace riftco_transformer;

namespace {

struct Options {
  TransformerDimensions dims{256, 256, 256, 8, 8, 680};
  std::int64_t batch = 8, sequence_length = 256, lora_rank = 0, budgets = 6, steps = 3, rounds = 2;
  std::string attention = "flash", shape, output = "memory-plan";
  bool measure = false;
};

/// The benchmark suite's shapes (bench/run_benchmarks.py, docs/benchmarks.md).
void apply_preset(Options& o) {
  const auto set = [&](std::int64_t width, std::int64_t heads, std::int64_t layers, std::int64_t seq, std::int64_t batch) {
    o.dims = {256, seq, width, heads, layers, width * 8 / 3 / 8 * 8};
    o.sequence_length = seq;
    o.batch = batch;
  };
  if (o.shape == "S1") set(256, 8, 8, 256, 8);
  if (o.shape == "S2") set(128, 4, 32, 256, 8);
  if (o.shape == "S3") set(768, 12, 12, 128, 4);
}

struct Measured {
  std::int64_t peak = 0;
  double step_seconds = 0;
};

class Bench {
 public:
  explicit Bench(const Options& o) : o_(o) {
    Random random(1);
    model_ = std::make_unique<DecoderOnlyTransformer>(o.dims, random, 1e-5F, parse_attention_kind(o.attention, "--attention"));
    if (o.lora_rank > 0) {
      LoraConfig lora;
      lora.rank = o.lora_rank;
      model_->add_lora(lora, random);
      model_->set_base_trainable(false);
      for (NamedParameter& p : model_->lora_parameters()) p.variable.set_requires_grad(true);
    }
    std::vector<Variable> params;
    for (const auto& list : {model_->parameters(), model_->lora_parameters()}) {
      for (const NamedParameter& p : list) {
        if (p.variable.requires_grad()) params.push_back(p.variable);
      }
    }
    adam_ = std::make_unique<Adam>(params);
    Random data(2);
    tokens_.resize(static_cast<std::size_t>(o.batch * o.sequence_length));
    targets_.resize(tokens_.size());
    for (auto& t : tokens_) t = static_cast<std::int32_t>(data.below(static_cast<std::uint32_t>(o.dims.vocab_size)));
    for (auto& t : targets_) t = static_cast<std::int32_t>(data.below(static_cast<std::uint32_t>(o.dims.vocab_size)));
  }
  DecoderOnlyTransformer& model() { return *model_; }

  /// Peak of the first step, fastest of `steps` more (forward + backward + Adam).
  Measured run(const ActivationCheckpointingPlan& plan) {
    model_->set_activation_checkpointing_plan(plan);
    Measured m;
    std::vector<double> times;
    for (std::int64_t i = 0; i <= o_.steps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const std::int64_t peak = measure_activation_peak(*model_, tokens_, targets_, o_.batch);
      adam_->step();
      adam_->zero_grad();
      const auto end = std::chrono::steady_clock::now();
      m.peak = std::max(m.peak, peak);
      if (i > 0) times.push_back(std::chrono::duration<double>(end - start).count());
    }
    m.step_seconds = *std::min_element(times.begin(), times.end());  // the fastest: least disturbed by other load
    return m;
  }

 private:
  Options o_;
  std::unique_ptr<DecoderOnlyTransformer> model_;
  std::unique_ptr<Adam> adam_;
  std::vector<std::int32_t> tokens_, targets_;
};

struct Row {
  std::string kind;  // "policy" or "budget"
  std::string name;  // policy name or the budget
  std::int64_t budget = 0;
  ActivationCheckpointingPlan plan;
  std::int64_t kept_total = 0;
  std::int64_t predicted = 0;
  double recompute_flops = 0;
  std::optional<Measured> measured;
};

std::int64_t kept_total(const ActivationMemoryProfile& p, const ActivationCheckpointingPlan& plan) {
  std::int64_t kept = 0;
  for (const CheckpointGroup& g : plan) {
    kept += g.recompute == BlockRecompute::Whole ? p.block_input_bytes : p.kept_bytes(g.recompute);
  }
  return kept;
}

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", bytes / 1048576.0);
  return b;
}
std::string fixed(double v, const char* format) {
  char b[32];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Shows what each activation-checkpointing plan keeps for a model shape: bytes kept per block and in total "
      "for every uniform policy and a sweep of activation memory budgets, the predicted activation peak, the "
      "recompute FLOPs, and with --measure the allocator's measured peak and the step time. Writes a JSON, a "
      "Markdown table and two SVG charts into --output (docs/checkpointing.md)."};
  rt_cli::style(app);
  Options o;
  app.add_option("--shape", o.shape, "a benchmark shape (sets the model, batch and sequence length)")
      ->type_name("S1|S2|S3")
      ->check(CLI::IsMember({"S1", "S2", "S3"}));
  app.add_option("--vocab-size", o.dims.vocab_size)->check(rt_cli::integer_at_least(1));
  app.add_option("--model-width", o.dims.model_width)->check(rt_cli::integer_at_least(1));
  app.add_option("--heads", o.dims.heads)->check(rt_cli::integer_at_least(1));
  app.add_option("--key-value-heads", o.dims.key_value_heads, "0: --heads")->check(rt_cli::integer_at_least(0));
  app.add_option("--layers", o.dims.layers)->check(rt_cli::integer_at_least(1));
  app.add_option("--feed-forward-width", o.dims.feed_forward_width)->check(rt_cli::integer_at_least(1));
  app.add_option("--batch", o.batch)->check(rt_cli::integer_in(1, 1048576));  // PretrainingConfig's bound
  app.add_option("--sequence-length", o.sequence_length)->check(rt_cli::integer_at_least(1));
  app.add_option("--attention", o.attention)->check(CLI::IsMember({"flash", "materialized"}));
  app.add_option("--lora-rank", o.lora_rank, "add LoRA adapters of this rank and freeze the base (0: none)")
      ->check(rt_cli::integer_at_least(0));
  app.add_option("--budgets", o.budgets, "budgets in the sweep, smallest feasible to keeping everything")
      ->check(rt_cli::integer_in(2, 1000));
  app.add_flag("--measure", o.measure, "also run training steps: measured peak and step time");
  app.add_option("--steps", o.steps, "measured steps per row after one warm-up (with --measure)")
      ->check(rt_cli::integer_at_least(1));
  app.add_option("--rounds", o.rounds, "rounds over every row (with --measure); each row keeps its fastest step")
      ->check(rt_cli::integer_at_least(1));
  app.add_option("--output", o.output, "folder for memory_plan.{json,md} and the SVG charts")->type_name("DIR");
  rt_cli::add_config_option(app);
  return rt_cli::run_tool("rt-memory-plan", app, argc, argv, [&](bool& running) {
    if (!o.shape.empty()) {
      apply_preset(o);
      for (const char* manual : {"--model-width", "--heads", "--layers", "--feed-forward-width", "--batch",
                                 "--sequence-length", "--vocab-size"}) {
        if (app.count(manual) > 0) throw rt_cli::UsageError(std::string("--shape sets ") + manual + "; leave one out");
      }
    }
    o.dims.context_length = std::max(o.dims.context_length, o.sequence_length);
    o.dims.validate();
    // The widest activation (batch x sequence x the widest of vocabulary,
    // model and feed-forward width) in bytes must be a number: refused here,
    // not overflowed in the profile. A shape that is merely too big for
    // this machine is "out of memory" (exit 1).
    const std::int64_t widest = std::max({o.dims.vocab_size, o.dims.model_width, o.dims.feed_forward_width});
    std::int64_t tokens = 0, bytes = 0;
    if (__builtin_mul_overflow(o.batch, o.sequence_length, &tokens) ||
        __builtin_mul_overflow(tokens, widest * std::int64_t{4}, &bytes)) {
      throw rt_cli::UsageError("--batch " + std::to_string(o.batch) + " x --sequence-length " +
                               std::to_string(o.sequence_length) + " is too large: an activation of this shape "
                               "would hold more than 2^63 bytes");
    }
    // The output folder is usable before minutes of profiling, not after.
    const std::filesystem::path dir = o.output;
    try {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) throw std::runtime_error("cannot create it: " + ec.message());
      write_file_atomically(dir / ".write_probe", "");
      std::filesystem::remove(dir / ".write_probe", ec);
    } catch (const std::exception& e) {
      throw rt_cli::UsageError("option '--output' " + o.output + ": " + e.what());
    }
    // The model and adapters are built before `running`: a setting they refuse
    // (a LoRA rank above a projection's sides) is a usage error, exit 2.
    Bench bench(o);
    running = true;
    std::cerr << "[rt-memory-plan] profiling " << o.dims.layers << " layers, width " << o.dims.model_width
              << ", batch " << o.batch << ", sequence " << o.sequence_length << " (" << o.attention << ") ...\n";
    const ActivationMemoryProfile profile = profile_activation_memory(bench.model(), o.batch, o.sequence_length);
    std::vector<Row> rows;
    for (const ActivationCheckpointingKind kind : activation_checkpointing_kinds()) {
      bench.model().set_activation_checkpointing_kind(kind);
      Row r{"policy", activation_checkpointing_name(kind), 0, bench.model().activation_checkpointing_plan()};
      rows.push_back(r);
    }
    const ActivationMemoryPlan loosest = plan_activation_memory(profile, std::int64_t{1} << 62);
    const std::int64_t block_peak = predicted_activation_peak(
        profile, ActivationCheckpointingPlan(static_cast<std::size_t>(o.dims.layers), {1, BlockRecompute::Whole}));
    std::vector<std::int64_t> budgets;
    for (std::int64_t i = 0; i < o.budgets; ++i) {
      budgets.push_back(loosest.smallest_feasible_bytes +
                        (loosest.disabled_peak_bytes - loosest.smallest_feasible_bytes) * i / (o.budgets - 1));
    }
    const std::int64_t halfway = (std::max(block_peak, loosest.smallest_feasible_bytes) + loosest.disabled_peak_bytes) / 2;
    budgets.push_back(halfway);
    std::sort(budgets.begin(), budgets.end());
    for (const std::int64_t b : budgets) {
      const ActivationMemoryPlan plan = plan_activation_memory(profile, b);
      rows.push_back({"budget", format_bytes(static_cast<double>(b)) + (b == halfway ? " (halfway)" : ""), b, plan.plan});
    }
    for (Row& r : rows) {
      r.kept_total = kept_total(profile, r.plan);
      r.predicted = predicted_activation_peak(profile, r.plan);
      r.recompute_flops = plan_recompute_flops(profile, r.plan);
    }
    // Rounds over every row, keeping each row's fastest step: load from other
    // processes drifts over minutes, and each row sees every part of it.
    for (std::int64_t round = 0; o.measure && round < o.rounds; ++round) {
      for (Row& r : rows) {
        std::cerr << "[rt-memory-plan] round " << round + 1 << "/" << o.rounds << " " << r.kind << " " << r.name << ": "
                  << describe_plan(r.plan) << " ..." << std::flush;
        const Measured m = bench.run(r.plan);
        if (!r.measured) r.measured = m;
        r.measured->peak = std::max(r.measured->peak, m.peak);
        r.measured->step_seconds = std::min(r.measured->step_seconds, m.step_seconds);
        std::cerr << " peak " << mib(static_cast<double>(m.peak)) << " MiB, " << m.step_seconds << " s\n";
      }
    }
    const double disabled_seconds = rows.front().measured ? rows.front().measured->step_seconds : 0.0;

    std::string md = "| plan | what each block recomputes | kept / block MiB (range) | kept total MiB | predicted peak MiB";
    md += o.measure ? " | measured peak MiB | step s | step / disabled" : "";
    md += " | recompute % of forward |\n|---|---|---|---:|---:|";
    md += o.measure ? "---:|---:|---:|" : "";
    md += "---:|\n";
    nlohmann::json json_rows = nlohmann::json::array();
    for (const Row& r : rows) {
      std::int64_t low = std::numeric_limits<std::int64_t>::max(), high = 0;
      for (const CheckpointGroup& g : r.plan) {
        const std::int64_t per = g.recompute == BlockRecompute::Whole ? profile.block_input_bytes / g.blocks
                                                                      : profile.kept_bytes(g.recompute);
        low = std::min(low, per);
        high = std::max(high, per);
      }
      const std::string range = low == high ? mib(static_cast<double>(low)) : mib(static_cast<double>(low)) + "–" + mib(static_cast<double>(high));
      const double percent = profile.forward_flops > 0 ? 100.0 * r.recompute_flops / profile.forward_flops : 0.0;
      md += "| " + std::string(r.kind == "budget" ? "budget " : "") + r.name + " | " + describe_plan(r.plan) + " | " + range +
            " | " + mib(static_cast<double>(r.kept_total)) + " | " + mib(static_cast<double>(r.predicted));
      if (r.measured) {
        md += " | " + mib(static_cast<double>(r.measured->peak)) + " | " + fixed(r.measured->step_seconds, "%.3f") + " | " +
              fixed(disabled_seconds > 0 ? r.measured->step_seconds / disabled_seconds : 0.0, "%.2f");
      }
      md += " | " + fixed(percent, "%.0f") + " |\n";
      nlohmann::json j = {{"kind", r.kind},           {"name", r.name},
                          {"budget_bytes", r.budget}, {"plan", describe_plan(r.plan)},
                          {"kept_bytes", r.kept_total}, {"predicted_peak_bytes", r.predicted},
                          {"recompute_flops", r.recompute_flops}};
      if (r.measured) {
        j["measured_peak_bytes"] = r.measured->peak;
        j["step_seconds"] = r.measured->step_seconds;
      }
      json_rows.push_back(j);
    }
    std::cout << md;
    nlohmann::json doc = {{"dimensions",
                           {{"vocab_size", o.dims.vocab_size}, {"context_length", o.dims.context_length},
                            {"model_width", o.dims.model_width}, {"heads", o.dims.heads},
                            {"key_value_heads", o.dims.kv_heads()}, {"layers", o.dims.layers},
                            {"feed_forward_width", o.dims.feed_forward_width}}},
                          {"batch", o.batch}, {"sequence_length", o.sequence_length}, {"attention", o.attention},
                          {"lora_rank", o.lora_rank},
                          {"kept_bytes_per_block",
                           {{"keep", profile.kept_bytes(BlockRecompute::Nothing)},
                            {"attention", profile.kept_bytes(BlockRecompute::Attention)},
                            {"mlp", profile.kept_bytes(BlockRecompute::Mlp)},
                            {"block", profile.kept_bytes(BlockRecompute::Whole)}}},
                          {"rows", json_rows}};
    write_file_atomically(dir / "memory_plan.json", doc.dump(2) + "\n");
    write_file_atomically(dir / "memory_plan.md", md);
    // Charts over the budget sweep: the budget line is y = x.
    CurveSeries budget{"budget", {}, 0x7F7F7F}, predicted{"predicted peak", {}, 0x1F77B4}, real{"measured peak", {}, 0xD62728};
    CurveSeries seconds{"planned step / disabled step", {}, 0x2CA02C};
    for (const Row& r : rows) {
      if (r.kind != "budget") continue;
      const double x = static_cast<double>(r.budget) / 1048576.0;
      budget.points.emplace_back(x, x);
      predicted.points.emplace_back(x, static_cast<double>(r.predicted) / 1048576.0);
      if (r.measured) {
        real.points.emplace_back(x, static_cast<double>(r.measured->peak) / 1048576.0);
        seconds.points.emplace_back(x, r.measured->step_seconds / disabled_seconds);
      }
    }
    const std::string what = std::to_string(o.dims.layers) + " layers, width " + std::to_string(o.dims.model_width) +
                             ", B" + std::to_string(o.batch) + " T" + std::to_string(o.sequence_length);
    std::vector<CurveSeries> peak_series{budget, predicted};
    if (o.measure) peak_series.push_back(real);
    write_loss_curve_svg(dir / "memory_plan_peak.svg", peak_series, "activation peak (MiB) vs budget (MiB), " + what);
    if (o.measure) write_loss_curve_svg(dir / "memory_plan_time.svg", {seconds}, "step time / disabled vs budget (MiB), " + what);
    std::cerr << "[rt-memory-plan] wrote " << (dir / "memory_plan.json").string() << ", memory_plan.md, memory_plan_peak.svg"
              << (o.measure ? ", memory_plan_time.svg" : "") << "\n";
    return 0;
  });
}
