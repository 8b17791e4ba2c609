// rt-bench-dp-step: the pipelines' training step under data parallelism, one
// shape and checkpointing policy, timed on every rank; each rank writes one
// JSON object. bench/run_data_parallel.py runs it in fresh processes:
//
//   mpirun -np N rt-bench-dp-step --out DIR [--vocab V] [--width C] [--heads H]
//          [--layers L] [--seq T] [--batch B] [--policy disabled|block|segments]
//          [--steps S] [--warmup W] [--zero 0|1] [--allreduce-reps R]
//
// --batch is the global batch (as rt-train's): each rank trains on its
// batch/N rows. With N > 1 a step is the pipelines' own data-parallel step
// (stage::data_parallel_step, src/train/data_parallel_step.cpp: forward and
// backward on the rank's rows, the gradients averaged in 25 MiB buckets
// started during backward (GradientBucketer), the optimizer's step); with N = 1 it is the pipelines'
// single-process step (forward, backward, Adam::step, zero_grad), as
// src/train/stage_loop.cpp runs them. No data loading, logging or file
// writing is inside the timed region; every step starts after a barrier.
// --zero 1: ZeRO-1 as `rt-train --zero 1` runs it (stage::StageOptimizer
// with ShardedAdam: the buckets' averaged gradients, the rank's shard of
// Adam updated, all-gather of the parameters).
//
// DIR/rank<R>.json, per rank:
//   step_seconds, step_times    median and every measured step's wall time
//   cpu_times                   user + system CPU seconds of this rank per
//                               measured step (all its threads)
//   tokens_per_second           global batch·T / step_seconds (all ranks' rows)
//   adam_state_bytes            the allocator's live bytes made by building the
//                               optimizer (both moments; this rank's shard
//                               under --zero 1)
//   peak_bytes                  allocator peak during a step above the live
//                               bytes before it; peak_total_bytes including them
//   rss_setup_bytes, rss_peak_bytes, rss_growth_bytes   VmRSS after setup,
//                               VmHWM over the steps, and their difference
//   forward_seconds, backward_seconds, optimizer_seconds   with N = 1: the
//                               step's phases (medians)
//   allreduce_seconds           median time of all_reduce_sum over as many
//                               floats as the model has parameters (after the
//                               steps); allreduce_latency_seconds: of 1 float
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "rank_shards.hpp"      // src/train: the pipelines' data-parallel step
#include "stage_optimizer.hpp"  // and their optimizer (Adam or ZeRO-1)
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;

namespace {

/// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
std::int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream s(line.substr(field.size() + 1));
      std::int64_t kb = 0;
      s >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// User + system CPU seconds of this process (every thread) so far.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct Options {
  TransformerDimensions d;
  std::int64_t seq = 256;
  std::int64_t batch = 8;
  std::string policy = "disabled";
  int steps = 3;
  int warmup = 1;
  int zero = 0;
  int allreduce_reps = 5;
  std::filesystem::path out;
};

Options parse(int argc, char** argv) {
  Options o;
  o.d.vocab_size = 256;
  o.d.model_width = 256;
  o.d.heads = 8;
  o.d.layers = 8;
  o.d.feed_forward_width = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw ValueError("[rt-bench-dp-step] " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--vocab") o.d.vocab_size = std::stoll(next());
    else if (a == "--width") o.d.model_width = std::stoll(next());
    else if (a == "--heads") o.d.heads = std::stoll(next());
    else if (a == "--layers") o.d.layers = std::stoll(next());
    else if (a == "--seq") o.seq = std::stoll(next());
    else if (a == "--batch") o.batch = std::stoll(next());
    else if (a == "--policy") o.policy = next();
    else if (a == "--steps") o.steps = std::max(1, std::stoi(next()));
    else if (a == "--warmup") o.warmup = std::max(0, std::stoi(next()));
    else if (a == "--zero") o.zero = std::stoi(next());
    else if (a == "--allreduce-reps") o.allreduce_reps = std::max(0, std::stoi(next()));
    else if (a == "--out") o.out = next();
    else {
      throw ValueError("[rt-bench-dp-step] unknown argument '" + a +
                       "'; usage: rt-bench-dp-step --out DIR [--vocab V] [--width C] [--heads H] [--layers L] "
                       "[--seq T] [--batch B] [--policy P] [--steps S] [--warmup W] [--zero 0|1] "
                       "[--allreduce-reps R]");
    }
  }
  if (o.out.empty()) throw ValueError("[rt-bench-dp-step] --out DIR is required");
  if (o.zero != 0 && o.zero != 1) throw ValueError("[rt-bench-dp-step] --zero must be 0 or 1, not " + std::to_string(o.zero));
  if (o.d.feed_forward_width == 0) o.d.feed_forward_width = o.d.model_width * 8 / 3 / 8 * 8;
  o.d.context_length = o.seq;
  return o;
}


}  // namespace

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  Communicator& comm = Communicator::world();
  const int world = comm.world_size();
  const int rank = comm.rank();
  if (o.batch % world != 0) {
    throw ValueError("[rt-bench-dp-step] batch " + std::to_string(o.batch) + " is not divisible by the " +
                     std::to_string(world) + " ranks");
  }
  const ActivationCheckpointingKind policy = parse_activation_checkpointing(o.policy, "rt-bench-dp-step");

  // ---- setup, as the pipelines do: model (seed 1 on every rank), Adam with
  // the default groups, the accumulator, one global batch per step --------
  Random random(1);
  DecoderOnlyTransformer model(o.d, random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
  const std::vector<NamedParameter> named = model.parameters();
  std::int64_t parameter_count = 0;
  for (const NamedParameter& p : named) parameter_count += p.variable.value().numel();
  AdamOptions options;
  options.weight_decay = 0.01F;
  options.max_grad_norm = 1.0F;
  const std::int64_t live_before_optimizer = memory_stats().live_bytes;
  // The pipelines' optimizer: plain Adam, or ZeRO-1's ShardedAdam (--zero 1, as rt-train's).
  stage::StageOptimizer opt(comm, default_parameter_groups(named, 0.01F, false), options, o.zero == 1);
  const std::int64_t adam_state_bytes = memory_stats().live_bytes - live_before_optimizer;
  const std::int64_t reported_state_bytes = opt.state_bytes();
  const std::vector<Variable> ordered = opt.parameters();
  GradientAccumulator accumulator(ordered);
  // As the pipelines: with N > 1, gradients reduced in 25 MiB buckets during backward.
  std::optional<GradientBucketer> buckets;
  if (world > 1) buckets.emplace(comm, ordered);
  Random data(2);
  TokenBatch global;  // the same global batch on every rank
  global.batch = o.batch;
  global.seq_len = o.seq;
  global.tokens.resize(static_cast<std::size_t>(o.batch * o.seq));
  global.targets.resize(global.tokens.size());
  for (auto& t : global.tokens) t = static_cast<std::int32_t>(data.below(static_cast<std::uint32_t>(o.d.vocab_size)));
  for (auto& t : global.targets) t = static_cast<std::int32_t>(data.below(static_cast<std::uint32_t>(o.d.vocab_size)));
  const std::vector<TokenBatch> batches{global};
  const std::function<void()> no_op = [] {};
  const std::function<Error(const std::string&)> diverged = [](const std::string& what) {
    return Error("[rt-bench-dp-step] " + what);
  };

  // One optimizer step: the pipelines' code path for this world size. With
  // N = 1 its phases are timed too (forward, backward, Adam).
  struct Phases {
    double forward = 0, backward = 0, optimizer = 0;
  } phase;
  std::vector<double> forward_times, backward_times, optimizer_times;
  const auto step = [&]() -> float {
    if (world > 1) {
      const stage::ShardedStep done =
          stage::data_parallel_step(comm, model, opt, accumulator, *buckets,
                                    batches, no_op, no_op, diverged);
      opt.zero_grad();
      return done.loss;
    }
    const auto start = std::chrono::steady_clock::now();
    Variable loss = model.loss(global.tokens, global.targets, global.batch);
    const float value = loss.value().item();
    phase.forward = seconds_since(start);
    loss.backward();
    loss = Variable();
    phase.backward = seconds_since(start) - phase.forward;
    opt.step();
    opt.zero_grad();
    phase.optimizer = seconds_since(start) - phase.forward - phase.backward;
    return value;
  };

  const std::int64_t rss_setup = status_bytes("VmRSS");
  const bool hwm_reset = static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5");
  std::vector<double> times;
  std::vector<double> cpu_times;
  std::vector<float> losses;
  std::int64_t peak = 0;
  std::int64_t peak_total = 0;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    comm.barrier();
    const std::int64_t before = memory_stats().live_bytes;
    reset_peak_memory();
    const double cpu_start = cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    losses.push_back(step());
    const double t = seconds_since(start);
    if (i >= o.warmup) {
      times.push_back(t);
      cpu_times.push_back(cpu_seconds() - cpu_start);
      forward_times.push_back(phase.forward);
      backward_times.push_back(phase.backward);
      optimizer_times.push_back(phase.optimizer);
    }
    peak = std::max(peak, memory_stats().peak_bytes - before);
    peak_total = std::max(peak_total, memory_stats().peak_bytes);
  }
  const std::int64_t rss_peak = status_bytes("VmHWM");
  const std::uint64_t checksum = parameter_checksum(ordered);

  // The all-reduce alone: as many floats as the model has parameters (the
  // gradient volume of one step), and one float (the per-collective latency).
  std::vector<double> allreduce_times;
  std::vector<double> latency_times;
  {
    std::vector<float> buffer(static_cast<std::size_t>(parameter_count), 1.0F);
    for (int r = 0; r < o.allreduce_reps; ++r) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      comm.all_reduce_sum(std::span<float>(buffer));
      allreduce_times.push_back(seconds_since(start));
    }
    float one = 1.0F;
    for (int r = 0; r < (o.allreduce_reps > 0 ? 50 : 0); ++r) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      comm.all_reduce_sum(std::span<float>(&one, 1));
      latency_times.push_back(seconds_since(start));
    }
  }

  const double median = median_of(times);
  nlohmann::json out = {
      {"rank", rank},
      {"world_size", world},
      {"communicator", std::string(comm.kind())},
      {"zero", o.zero},
      {"vocab", o.d.vocab_size},
      {"width", o.d.model_width},
      {"heads", o.d.heads},
      {"layers", o.d.layers},
      {"ffn", o.d.feed_forward_width},
      {"seq", o.seq},
      {"batch", o.batch},
      {"rank_rows", o.batch / world},
      {"policy", o.policy},
      {"threads", omp_get_max_threads()},
      {"warmup", o.warmup},
      {"steps", o.steps},
      {"parameters", parameter_count},
      {"gradient_bytes", parameter_count * static_cast<std::int64_t>(sizeof(float))},
      {"step_seconds", median},
      {"step_times", times},
      {"cpu_times", cpu_times},
      {"losses", losses},
      {"forward_seconds", median_of(forward_times)},  // N = 1 only (0 otherwise)
      {"backward_seconds", median_of(backward_times)},
      {"optimizer_seconds", median_of(optimizer_times)},
      {"tokens_per_second", static_cast<double>(o.batch * o.seq) / median},
      {"adam_state_bytes", adam_state_bytes},
      {"adam_state_bytes_reported", reported_state_bytes},
      {"peak_bytes", peak},
      {"peak_total_bytes", peak_total},
      {"rss_setup_bytes", rss_setup},
      {"rss_peak_bytes", rss_peak},
      {"rss_growth_bytes", hwm_reset ? rss_peak - rss_setup : -1},
      {"allreduce_seconds", median_of(allreduce_times)},
      {"allreduce_latency_seconds", median_of(latency_times)},
      {"parameter_checksum", checksum},
  };
  std::filesystem::create_directories(o.out);
  const std::filesystem::path file = o.out / ("rank" + std::to_string(rank) + ".json");
  std::ofstream f(file);
  f << out.dump() << '\n';
  if (!f) throw Error("[rt-bench-dp-step] cannot write " + file.string());
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a typed riftco error names the op; the exit handler ends every rank
    std::cerr << "rt-bench-dp-step: " << e.what() << "\n";
    return 1;
  }
}
