// rt-bench-step: one shape, one checkpointing policy, N training steps
// (forward + backward + Adam) in this process; prints one JSON object.
//
//   rt-bench-step [--vocab V] [--width C] [--heads H] [--layers L] [--ffn F]
//                 [--seq T] [--batch B] [--policy disabled|block|segments|attention|mlp]
//                 [--attention flash|materialized] [--steps N] [--warmup W]
//                 [--backend cpu|cuda] [--activation-offload] [--keep-graph]
//                 [--optimizer-in-backward]
//
// backward() releases the graph as it goes (GraphAfterBackward::Release, as
// PyTorch's backward does without retain_graph); --keep-graph keeps it until
// the step drops it (the default backward(), what the peak was before).
// --optimizer-in-backward runs adam.backward_and_step(loss) instead of
// backward() then step(): each parameter is updated as soon as its gradient
// is final and that gradient is freed (PyTorch's optimizer step in backward).
// The backward and optimizer phases then merge: backward_peak,
// after_backward and backward_seconds include the updates, after_graph is
// what is left without gradients, and optimizer_peak / optimizer_seconds
// only cover zero_grad (nothing left to drop).
//
// Reported (bench/run_benchmarks.py runs it in a fresh process per row):
//   step_seconds      median wall time of the measured steps (and every step)
//   tokens_per_second B·T / step_seconds
//   peak_bytes        the allocator's peak on --backend (cpu: host memory,
//                     cuda: device memory) during a step above the bytes
//                     live before it (parameters, Adam moments)
//   peak_total_bytes  that backend's allocator peak including them
//   rss_growth_bytes  peak resident set of this process during the steps
//                     minus its resident set after setup (model, Adam, data):
//                     the figure bench/torch_step.py measures the same way
//                     (the larger of the warm-up's and the measured steps')
//   rss_growth_after_warmup_bytes  peak resident set during the measured
//                     steps minus the resident set after the warm-up, once
//                     release_cached_memory() and malloc_trim(0) have handed
//                     freed memory back: the figure bench/torch2_step.py
//                     measures for PyTorch 2 (the first measured step faults
//                     its activations in again, on both sides); -1 with
//                     --backend cuda
//   reserved_bytes    bytes the allocator holds (live + cached for reuse)
//   host_peak_bytes   with --backend cuda: the CPU allocator's peak during a
//                     step above its live bytes before it (the pinned host
//                     copies of --activation-offload)
//   blas              the BLAS/OpenMP libraries this process mapped
//   parameter_bytes   the parameters' bytes (one set of gradients is as large)
//   memory_phases     the last step's allocator figures per phase, each above
//                     the bytes live before the step: forward_peak,
//                     after_forward (what the graph keeps: activations),
//                     backward_peak, after_backward (the graph still held:
//                     gradients plus what the pass did not release),
//                     after_graph (the graph dropped: the gradients),
//                     optimizer_peak (Adam step + zero_grad); peak_bytes is
//                     the largest of the three peaks over the measured steps
//   optimizer_in_backward  whether --optimizer-in-backward was given
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../src/backend/cpu/kernels.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
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

/// Resets VmHWM to the current VmRSS (Linux >= 4.0).
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return static_cast<bool>(out);
}

/// Shared libraries of this process whose file name mentions BLAS, LAPACK or OpenMP.
std::vector<std::string> mapped_libraries() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  std::set<std::string> found;
  while (std::getline(in, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string file = path.substr(path.rfind('/') + 1);
    if (file.find("blas") != std::string::npos || file.find("lapack") != std::string::npos ||
        file.find("gomp") != std::string::npos || file.find("libomp") != std::string::npos ||
        file.find("mkl") != std::string::npos) {
      found.insert(path);
    }
  }
  return {found.begin(), found.end()};
}

}  // namespace

int run(int argc, char** argv) {
  TransformerDimensions d;
  d.vocab_size = 256;
  d.model_width = 256;
  d.heads = 8;
  d.layers = 8;
  d.feed_forward_width = 0;  // 0: SwiGLU's 8/3·C rounded down to a multiple of 8
  std::int64_t seq = 256;
  std::int64_t batch = 8;
  std::string policy_name = "disabled";
  std::string attention_name = "flash";
  int steps = 3;
  int warmup = 1;
  std::string backend_name_arg = "cpu";
  bool offload = false;
  bool optimizer_in_backward = false;
  GraphAfterBackward graph = GraphAfterBackward::Release;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "rt-bench-step: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--vocab") d.vocab_size = std::stoll(next());
    else if (a == "--width") d.model_width = std::stoll(next());
    else if (a == "--heads") d.heads = std::stoll(next());
    else if (a == "--layers") d.layers = std::stoll(next());
    else if (a == "--ffn") d.feed_forward_width = std::stoll(next());
    else if (a == "--seq") seq = std::stoll(next());
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--policy") policy_name = next();
    else if (a == "--attention") attention_name = next();
    else if (a == "--steps") steps = std::max(1, std::stoi(next()));
    else if (a == "--warmup") warmup = std::max(0, std::stoi(next()));
    else if (a == "--backend") backend_name_arg = next();
    else if (a == "--activation-offload") offload = true;
    else if (a == "--keep-graph") graph = GraphAfterBackward::Keep;
    else if (a == "--optimizer-in-backward") optimizer_in_backward = true;
    else {
      std::cerr << "usage: rt-bench-step [--vocab V] [--width C] [--heads H] [--layers L] [--ffn F] [--seq T]\n"
                   "                     [--batch B] [--policy disabled|block|segments|attention|mlp]\n"
                   "                     [--attention flash|materialized] [--steps N] [--warmup W]\n"
                   "                     [--backend cpu|cuda] [--activation-offload] [--keep-graph]\n"
                   "                     [--optimizer-in-backward]\n";
      return 2;
    }
  }
  if (d.feed_forward_width == 0) d.feed_forward_width = d.model_width * 8 / 3 / 8 * 8;
  d.context_length = seq;
  const ActivationCheckpointingKind policy = parse_activation_checkpointing(policy_name, "rt-bench-step");
  const FullSequenceAttentionKind attention = parse_attention_kind(attention_name, "rt-bench-step");

  // ---- setup: model, optimizer (moments allocated here), data -------------
  Random random(1);
  DecoderOnlyTransformer model(d, random, 1e-5F, attention, policy);
  if (backend_name_arg != "cpu" && backend_name_arg != "cuda") {
    std::cerr << "rt-bench-step: --backend must be cpu or cuda, not '" << backend_name_arg << "'\n";
    return 2;
  }
  const Backend backend = backend_name_arg == "cuda" ? Backend::Cuda : Backend::Cpu;
  model.set_activation_offload(offload);
  model.to(backend);  // before Adam, whose moments are made on the parameters' backend
  // Kernels run asynchronously on cuda: a copy of the smallest parameter to
  // the host waits for every earlier kernel (the legacy default stream).
  const auto sync = [&] { (void)model.final_norm().value().to(Backend::Cpu); };
  std::vector<Variable> params;
  std::int64_t parameter_bytes = 0;
  for (const NamedParameter& p : model.parameters()) {
    params.push_back(p.variable);
    parameter_bytes += p.variable.value().nbytes();
  }
  Adam adam(params);
  Random data(2);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq));  // (B, T)
  std::vector<std::int32_t> targets(tokens.size());                         // (B, T)
  for (auto& t : tokens) t = static_cast<std::int32_t>(data.below(static_cast<std::uint32_t>(d.vocab_size)));
  for (auto& t : targets) t = static_cast<std::int32_t>(data.below(static_cast<std::uint32_t>(d.vocab_size)));

  const std::int64_t rss_setup = status_bytes("VmRSS");
  const bool hwm_reset = reset_peak_rss();
  std::vector<double> times;
  std::vector<double> forward_times;   // loss() (graph built)
  std::vector<double> backward_times;  // backward() and dropping the graph
  std::vector<double> optimizer_times;  // Adam step + zero_grad
  std::vector<double> cpu_times;  // process CPU seconds per step (all threads): less load-dependent than wall time
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  std::vector<double> losses;
  std::int64_t peak = 0;
  std::int64_t peak_total = 0;
  std::int64_t host_peak = 0;
  nlohmann::json phases;
  sync();
  std::int64_t rss_warm_peak = -1;  // VmHWM over setup and the warm-up steps
  std::int64_t rss_measured_base = -1;
  bool hwm_reset_measured = false;
  // After the warm-up, as bench/torch2_step.py does (gc + malloc_trim): the
  // allocator's cached blocks and glibc's free memory go back to the system,
  // and the measured steps' peak is read above what remains, so pages the
  // warm-up touched once for good (code, OpenBLAS's and OpenMP's buffers,
  // thread stacks) count on neither side.
  const auto start_measured_rss = [&] {
    // CPU runs only: a GPU run's host memory is not the figure, and handing
    // the pinned offload buffers back would make the first measured step
    // pay cudaHostAlloc again.
    if (backend != Backend::Cpu) return;
    rss_warm_peak = status_bytes("VmHWM");
    (void)release_cached_memory(Backend::Cpu);
    (void)malloc_trim(0);
    rss_measured_base = status_bytes("VmRSS");
    hwm_reset_measured = reset_peak_rss();
  };
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup) start_measured_rss();
    const std::int64_t before = memory_stats(backend).live_bytes;
    const std::int64_t host_before = memory_stats(Backend::Cpu).live_bytes;
    std::int64_t step_peak = 0;  // the largest phase peak of this step, absolute
    // Reads the phase's peak (absolute) and starts the next phase's.
    const auto phase_peak = [&] {
      const std::int64_t p = memory_stats(backend).peak_bytes;
      step_peak = std::max(step_peak, p);
      reset_peak_memory(backend);
      return p - before;
    };
    const auto live = [&] { return memory_stats(backend).live_bytes - before; };
    reset_peak_memory(backend);
    if (backend != Backend::Cpu) reset_peak_memory(Backend::Cpu);
    const double cpu_start = cpu_now();
    const auto start = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point forward_end;
    {
      Variable loss = model.loss(tokens, targets, batch);
      losses.push_back(loss.value().to(Backend::Cpu).item());  // waits for the forward
      forward_end = std::chrono::steady_clock::now();
      phases["forward_peak"] = phase_peak();
      phases["after_forward"] = live();
      if (optimizer_in_backward) {
        adam.backward_and_step(loss, graph);  // the updates happen in this phase
      } else {
        loss.backward(graph);
      }
      sync();
      phases["backward_peak"] = phase_peak();
      phases["after_backward"] = live();
    }  // the graph goes here, before the update (as in PyTorch)
    phases["after_graph"] = live();
    reset_peak_memory(backend);  // dropping the graph only frees: the optimizer phase starts here
    const auto backward_end = std::chrono::steady_clock::now();
    if (!optimizer_in_backward) adam.step();
    adam.zero_grad();  // as the training loop does (src/train/stage_loop.cpp)
    sync();
    phases["optimizer_peak"] = phase_peak();
    const auto end = std::chrono::steady_clock::now();
    if (i >= warmup) {
      cpu_times.push_back(cpu_now() - cpu_start);
      times.push_back(std::chrono::duration<double>(end - start).count());
      forward_times.push_back(std::chrono::duration<double>(forward_end - start).count());
      backward_times.push_back(std::chrono::duration<double>(backward_end - forward_end).count());
      optimizer_times.push_back(std::chrono::duration<double>(end - backward_end).count());
    }
    peak = std::max(peak, step_peak - before);
    peak_total = std::max(peak_total, step_peak);
    if (backend != Backend::Cpu) host_peak = std::max(host_peak, memory_stats(Backend::Cpu).peak_bytes - host_before);
  }
  const std::int64_t rss_peak = status_bytes("VmHWM");
  const std::int64_t rss_growth = hwm_reset ? std::max(rss_peak, rss_warm_peak) - rss_setup : -1;
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  const double median = median_of(times);
  nlohmann::json out = {
      {"impl", "riftco"},
      {"vocab", d.vocab_size},
      {"width", d.model_width},
      {"heads", d.heads},
      {"layers", d.layers},
      {"ffn", d.feed_forward_width},
      {"seq", seq},
      {"batch", batch},
      {"policy", policy_name},
      {"attention", attention_name},
      {"backend", backend_name_arg},
      {"activation_offload", offload},
      {"graph", graph == GraphAfterBackward::Release ? "release" : "keep"},
      {"optimizer_in_backward", optimizer_in_backward},
      {"threads", omp_get_max_threads()},
      {"warmup", warmup},
      {"steps", steps},
      {"step_seconds", median},
      {"step_times", times},
      {"step_cpu_seconds", median_of(cpu_times)},
      {"blas_core", cpu::blas_core_name()},
      {"forward_seconds", median_of(forward_times)},
      {"backward_seconds", median_of(backward_times)},
      {"optimizer_seconds", median_of(optimizer_times)},
      {"losses", losses},
      {"tokens_per_second", static_cast<double>(batch * seq) / median},
      {"peak_bytes", peak},
      {"peak_total_bytes", peak_total},
      {"parameter_bytes", parameter_bytes},
      {"memory_phases", phases},
      {"host_peak_bytes", host_peak},
      {"reserved_bytes", memory_stats(backend).reserved_bytes},
      {"rss_setup_bytes", rss_setup},
      {"rss_growth_bytes", rss_growth},
      {"rss_measured_base_bytes", rss_measured_base},
      {"rss_growth_after_warmup_bytes", hwm_reset_measured ? rss_peak - rss_measured_base : -1},
      {"libraries", mapped_libraries()},
  };
  std::cout << out.dump() << std::endl;
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a typed riftco error names the op and the backend
    std::cerr << "rt-bench-step: " << e.what() << "\n";
    return 1;
  }
}
