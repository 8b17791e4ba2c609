// rt-bench-checkpoint: what activation checkpointing saves and costs.
//
// For each shape and policy (disabled, block, segments of round(√L)) it runs
// warm-up + measured training steps (forward + backward + Adam) and reports
//   peak bytes   — the CPU allocator's peak during one step, above the bytes
//                  live before it (parameters, Adam state, gradients)
//   graph        — graph_statistics() of the loss right after forward
//   replays      — checkpoint replays during one backward
//   step seconds — median wall time of the measured steps
// and each as a ratio to `disabled`. Writes JSON (--json) and a Markdown
// table (--markdown).
//
//   rt-bench-checkpoint [--quick] [--steps N] [--json PATH] [--markdown PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;

namespace {

struct Shape_ {
  std::string name;
  TransformerDimensions dims;
  std::int64_t batch;
  std::int64_t seq;
};

struct Row {
  std::string shape;
  std::string policy;
  std::int64_t peak_bytes = 0;
  std::int64_t graph_nodes = 0;
  std::int64_t graph_elements = 0;
  std::int64_t replays = 0;
  double step_seconds = 0;
};

TransformerDimensions dims(std::int64_t width, std::int64_t heads, std::int64_t layers, std::int64_t seq) {
  TransformerDimensions d;
  d.vocab_size = 256;
  d.context_length = seq;
  d.model_width = width;
  d.heads = heads;
  d.layers = layers;
  d.feed_forward_width = width * 8 / 3 / 8 * 8;  // SwiGLU's 8/3·C, rounded to 8
  return d;
}

Row measure(const Shape_& s, ActivationCheckpointingKind policy, int steps) {
  Random random(1);
  DecoderOnlyTransformer model(s.dims, random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
  std::vector<Variable> params;
  for (const NamedParameter& p : model.parameters()) params.push_back(p.variable);
  Adam adam(params);
  Random data(2);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(s.batch * s.seq));
  std::vector<std::int32_t> targets(tokens.size());
  for (auto& t : tokens) t = static_cast<std::int32_t>(data.below(256));
  for (auto& t : targets) t = static_cast<std::int32_t>(data.below(256));

  Row row;
  row.shape = s.name;
  row.policy = activation_checkpointing_name(policy);
  std::vector<double> times;
  for (int i = 0; i < steps + 1; ++i) {  // step 0 is warm-up
    const std::int64_t before = memory_stats().live_bytes;
    reset_peak_memory();
    const auto start = std::chrono::steady_clock::now();
    Variable loss = model.loss(tokens, targets, s.batch);
    if (i == 0) {
      const GraphStatistics g = loss.graph_statistics();
      row.graph_nodes = g.node_count;
      row.graph_elements = g.element_count;
    }
    const std::int64_t replays_before = checkpoint_replay_count();
    loss.backward();
    row.replays = checkpoint_replay_count() - replays_before;
    adam.step();
    const auto end = std::chrono::steady_clock::now();
    loss = Variable();
    if (i > 0) times.push_back(std::chrono::duration<double>(end - start).count());
    row.peak_bytes = std::max(row.peak_bytes, memory_stats().peak_bytes - before);
  }
  std::sort(times.begin(), times.end());
  row.step_seconds = times[times.size() / 2];
  return row;
}

std::string mib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string ratio(double a, double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", b == 0 ? 0.0 : a / b);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int steps = 3;
  std::string json_path;
  std::string markdown_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--markdown" && i + 1 < argc) {
      markdown_path = argv[++i];
    } else {
      std::cerr << "usage: rt-bench-checkpoint [--quick] [--steps N] [--json PATH] [--markdown PATH]\n";
      return 2;
    }
  }
  std::vector<Shape_> shapes;
  if (quick) {
    shapes = {{"tiny-deep", dims(32, 2, 8, 32), 2, 32}};
    steps = 1;
  } else {
    shapes = {{"S1 w256 h8 L8 T256 B8", dims(256, 8, 8, 256), 8, 256},
              {"S2 w128 h4 L32 T256 B8 (deep)", dims(128, 4, 32, 256), 8, 256},
              {"S3 w768 h12 L12 T128 B4", dims(768, 12, 12, 128), 4, 128}};
  }
  const auto policies = activation_checkpointing_kinds();  // disabled first: the ratios' base
  nlohmann::json out = nlohmann::json::array();
  std::string md =
      "| shape | policy | peak MiB | peak / disabled | graph nodes | graph elements / disabled | replays | step s | "
      "step / disabled |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Shape_& s : shapes) {
    Row base;
    for (const ActivationCheckpointingKind p : policies) {
      std::cerr << "[rt-bench-checkpoint] " << s.name << " / " << activation_checkpointing_name(p) << " ..."
                << std::flush;
      const Row r = measure(s, p, steps);
      if (p == ActivationCheckpointingKind::Disabled) base = r;
      std::cerr << " peak " << mib(r.peak_bytes) << " MiB, " << r.step_seconds << " s/step\n";
      out.push_back({{"shape", r.shape},
                     {"policy", r.policy},
                     {"peak_bytes", r.peak_bytes},
                     {"peak_ratio", base.peak_bytes ? static_cast<double>(r.peak_bytes) / base.peak_bytes : 0.0},
                     {"graph_nodes", r.graph_nodes},
                     {"graph_elements", r.graph_elements},
                     {"graph_elements_ratio",
                      base.graph_elements ? static_cast<double>(r.graph_elements) / base.graph_elements : 0.0},
                     {"replays_per_backward", r.replays},
                     {"step_seconds", r.step_seconds},
                     {"step_ratio", base.step_seconds > 0 ? r.step_seconds / base.step_seconds : 0.0}});
      md += "| " + r.shape + " | " + r.policy + " | " + mib(r.peak_bytes) + " | " +
            ratio(static_cast<double>(r.peak_bytes), static_cast<double>(base.peak_bytes)) + " | " +
            std::to_string(r.graph_nodes) + " | " +
            ratio(static_cast<double>(r.graph_elements), static_cast<double>(base.graph_elements)) + " | " +
            std::to_string(r.replays) + " | " + seconds(r.step_seconds) + " | " +
            ratio(r.step_seconds, base.step_seconds) + " |\n";
    }
  }
  std::cout << md;
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  if (!markdown_path.empty()) std::ofstream(markdown_path) << md;
  return 0;
}
