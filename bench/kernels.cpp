// rt-bench-kernels: Google Benchmark micro-benchmarks of the CPU kernels a
// training step spends its time in, each next to this machine's peak
// measured in the same run.
//
//   rt-bench-kernels [--flash-tile-sweep] [--benchmark_filter=REGEX] [google benchmark flags]
//
// Before the benchmarks run, main() measures
//   peak_gflops  a tight loop of independent 8-wide FMAs on every OpenMP
//                thread (12 chains per thread: enough to cover the FMA
//                latency on two pipes), 2 flops per lane; the same with
//                16-wide (512-bit) FMAs where the CPU has AVX-512F, on every
//                thread and on one (the suite's MFU rows divide by it);
//   stream_gbs   a STREAM triad a = b + s·c over 64 MiB arrays on every
//                thread (3 × 4 bytes per element: write-allocate traffic
//                not counted, as in STREAM).
// Every benchmark reports its own rate (GFLOP/s for compute kernels, GB/s of
// compulsory traffic for memory-bound ones) and `of_peak`, the fraction of
// the matching peak. Thread count: OMP_NUM_THREADS (the suite uses 2).
#include <benchmark/benchmark.h>

#include <cmath>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string_view>
#include <vector>

#include "../src/backend/cpu/flash_attention.hpp"
#include "../src/backend/cpu/kernels.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/tensor.hpp"

using namespace riftco_transformer;

namespace {

double g_peak_gflops = 0.0;
double g_peak_gflops_one = 0.0;
double g_peak512_gflops = 0.0;  // 512-bit FMAs, all threads (0 without AVX-512F)
double g_peak512_gflops_one = 0.0;  // 512-bit FMAs, one thread (the 1-thread rows' MFU)
/// What `of_peak` of GFLOP/s rows is against: the widest FMA peak the CPU has
/// (512-bit where AVX-512F exists: OpenBLAS's native kernel set and our flash
/// and SwiGLU kernels use it).
double g_peak_ref_gflops = 0.0;
double g_stream_gbs = 0.0;

using Clock = std::chrono::steady_clock;

__attribute__((target("avx2,fma"))) float fma_chains(std::int64_t iterations) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j) * 1e-3F);
  const __m256 a = _mm256_set1_ps(0.999999F);
  const __m256 b = _mm256_set1_ps(1e-7F);
  for (std::int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  __m256 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, acc[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

/// fma_chains with 512-bit vectors (16 lanes), for CPUs with AVX-512F.
__attribute__((target("avx512f"))) float fma_chains_512(std::int64_t iterations) {
  __m512 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j) * 1e-3F);
  const __m512 a = _mm512_set1_ps(0.999999F);
  const __m512 b = _mm512_set1_ps(1e-7F);
  for (std::int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  // Every chain must reach the result: summing only two of them let the
  // compiler drop the other ten, which inflated this peak ~6x (815 GFLOP/s
  // on 2 threads where the 256-bit loop gives 271).
  __m512 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, acc[j]);
  return _mm512_reduce_add_ps(s);
}

/// GFLOP/s of the FMA loop on `threads` threads (best of 5 runs); `wide`:
/// 512-bit FMAs (0 when the CPU has no AVX-512F).
double measure_peak(int threads, bool wide = false) {
  __builtin_cpu_init();
  if (wide && !__builtin_cpu_supports("avx512f")) return 0.0;
  const int lanes = wide ? 16 : 8;
  constexpr std::int64_t kIterations = 20'000'000;  // 3.84 GFLOP per thread
  double best = 0.0;
  float sink = 0.0F;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += wide ? fma_chains_512(kIterations) : fma_chains(kIterations);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, static_cast<double>(threads) * kIterations * 12 * lanes * 2 / seconds / 1e9);
  }
  benchmark::DoNotOptimize(sink);
  return best;
}

/// GB/s of a STREAM triad over 64 MiB arrays (best of 5).
double measure_stream() {
  const std::int64_t n = std::int64_t{16} << 20;
  std::vector<float> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n), 1.0F),
      c(static_cast<std::size_t>(n), 2.0F);
  float* pa = a.data();
  const float* pb = b.data();
  const float* pc = c.data();
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.0F * pc[i];
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, 3.0 * 4.0 * static_cast<double>(n) / seconds / 1e9);
  }
  benchmark::DoNotOptimize(a.data());
  return best;
}

Tensor randn(const Shape& shape, std::uint64_t seed, float std = 1.0F) {
  Random r(seed);
  return Tensor::normal(shape, r, 0.0F, std);
}

/// Runs `body` for the benchmark's iterations, timing it ourselves, and
/// reports `units / second / 1e9` as `name` and its fraction of `peak`.
template <class F>
void run_rate(benchmark::State& state, double units_per_iteration, const char* name, double peak, F&& body) {
  double seconds = 0.0;
  for (auto _ : state) {
    const auto start = Clock::now();
    body();
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  const double rate = units_per_iteration * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters[name] = rate;
  state.counters["of_peak"] = peak > 0 ? rate / peak : 0.0;
}

// ---- peaks (reported as benchmarks so they sit in the same table) ---------

void BM_PeakFma(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(g_peak_gflops);
  state.counters["GFLOP/s"] = g_peak_gflops;
  state.counters["one_thread_GFLOP/s"] = g_peak_gflops_one;
  // The 512-bit figure: what OpenBLAS's AVX-512 kernel sets and our AVX-512
  // kernels can reach; `of peak` of GFLOP/s rows is against the wider one.
  state.counters["avx512_GFLOP/s"] = g_peak512_gflops;
  state.counters["one_thread_avx512_GFLOP/s"] = g_peak512_gflops_one;
  state.counters["reference_GFLOP/s"] = g_peak_ref_gflops;
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_PeakFma)->Iterations(1);

void BM_PeakStreamTriad(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(g_stream_gbs);
  state.counters["GB/s"] = g_stream_gbs;
}
BENCHMARK(BM_PeakStreamTriad)->Iterations(1);

// ---- matmul ---------------------------------------------------------------

/// C (M, N) = op(A) op(B) through cpu::gemm (the path every matmul takes).
/// Args: M, N, K, trans_a, trans_b.
void BM_Gemm(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  const Tensor a = randn({m * k}, 1);
  const Tensor b = randn({k * n}, 2);
  Tensor c = Tensor::zeros({m * n});
  run_rate(state, 2.0 * m * n * k, "GFLOP/s", g_peak_ref_gflops, [&] {
    cpu::gemm(ta, tb, m, n, k, 1.0F, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.0F, c.data(), n);
  });
}
// Large square products, then the step's shapes: S1 (B·T = 2048 rows, C =
// 256, F = 680), S3 (B·T = 512 rows, C = 768, F = 2048) — forward x Wᵀ,
// backward dX = dY W and dW = dYᵀ X.
BENCHMARK(BM_Gemm)
    ->ArgNames({"M", "N", "K", "tA", "tB"})
    ->Args({1024, 1024, 1024, 0, 0})
    ->Args({2048, 2048, 2048, 0, 0})
    ->Args({2048, 256, 256, 0, 1})
    ->Args({2048, 680, 256, 0, 1})
    ->Args({2048, 256, 680, 0, 0})
    ->Args({680, 256, 2048, 1, 0})
    ->Args({512, 768, 768, 0, 1})
    ->Args({512, 2048, 768, 0, 1})
    ->Args({512, 768, 2048, 0, 0})
    ->Args({2048, 768, 512, 1, 0})
    ->Args({2048, 128, 128, 0, 1})
    ->Args({2048, 768, 256, 0, 1})
    ->Args({2048, 1360, 256, 0, 1})
    ->Args({2048, 256, 768, 0, 0})
    ->Args({2048, 256, 1360, 0, 0})
    ->Args({768, 256, 2048, 1, 0})
    ->Args({1360, 256, 2048, 1, 0})
    ->Args({256, 256, 2048, 1, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- flash attention ------------------------------------------------------

/// Causal flops: every product covers the visible (i >= j) score entries:
/// 2 products forward, 5 backward (as in docs/attention.md), 2·D flops each.
double attention_flops(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d, int products) {
  return static_cast<double>(products) * 2.0 * d * static_cast<double>(b * h) * (t * (t + 1) / 2);
}

/// Args: B, H, T, D, and for the `Tiles` rows query_rows, key_rows (else
/// flash_default_tiles(D), what the model uses).
cpu::FlashTiles tiles_of(const benchmark::State& state, bool explicit_tiles) {
  return explicit_tiles ? cpu::FlashTiles{state.range(4), state.range(5)} : cpu::flash_default_tiles(state.range(3));
}
void flash_forward(benchmark::State& state, bool explicit_tiles) {
  const std::int64_t b = state.range(0), h = state.range(1), t = state.range(2), d = state.range(3);
  const Tensor q = randn({b, h, t, d}, 1), k = randn({b, h, t, d}, 2), v = randn({b, h, t, d}, 3);
  const cpu::FlashTiles tiles = tiles_of(state, explicit_tiles);
  const float scale = 1.0F / std::sqrt(static_cast<float>(d));
  run_rate(state, attention_flops(b, h, t, d, 2), "GFLOP/s", g_peak_ref_gflops, [&] {
    Tensor lse;
    benchmark::DoNotOptimize(cpu::flash_attention_forward(q, k, v, scale, tiles, lse));
  });
}
void flash_backward(benchmark::State& state, bool explicit_tiles) {
  const std::int64_t b = state.range(0), h = state.range(1), t = state.range(2), d = state.range(3);
  const Tensor q = randn({b, h, t, d}, 1), k = randn({b, h, t, d}, 2), v = randn({b, h, t, d}, 3);
  const Tensor g = randn({b, h, t, d}, 4);
  const cpu::FlashTiles tiles = tiles_of(state, explicit_tiles);
  const float scale = 1.0F / std::sqrt(static_cast<float>(d));
  Tensor lse;
  const Tensor o = cpu::flash_attention_forward(q, k, v, scale, tiles, lse);
  run_rate(state, attention_flops(b, h, t, d, 5), "GFLOP/s", g_peak_ref_gflops, [&] {
    Tensor dq, dk, dv;
    cpu::flash_attention_backward(q, k, v, o, lse, g, scale, tiles, dq, dk, dv);
    benchmark::DoNotOptimize(dq.data());
  });
}
void BM_FlashForward(benchmark::State& state) { flash_forward(state, false); }
void BM_FlashBackward(benchmark::State& state) { flash_backward(state, false); }
void BM_FlashForwardTiles(benchmark::State& state) { flash_forward(state, true); }
void BM_FlashBackwardTiles(benchmark::State& state) { flash_backward(state, true); }
/// The step shapes: S1 (B 8, H 8, T 256, D 32), S2 (B 8, H 4, T 256, D 32),
/// S3 (B 4, H 12, T 128, D 64).
void attention_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "H", "T", "D"})->Args({8, 8, 256, 32})->Args({8, 4, 256, 32})->Args({4, 12, 128, 64});
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
/// S2 and S3 with tile shapes other than the default, for choosing it:
/// registered only with --flash-tile-sweep (main), so the suite's kernel
/// table keeps its rows.
void register_tile_sweep() {
  for (const bool forward : {true, false}) {
    auto* b = benchmark::RegisterBenchmark(forward ? "BM_FlashForwardTiles" : "BM_FlashBackwardTiles",
                                           forward ? BM_FlashForwardTiles : BM_FlashBackwardTiles);
    b->ArgNames({"B", "H", "T", "D", "QR", "KR"});
    for (const std::int64_t qr : {32, 64, 128}) {
      for (const std::int64_t kr : {32, 64, 128, 256}) {
        b->Args({8, 4, 256, 32, qr, kr});
        if (kr <= 128) b->Args({4, 12, 128, 64, qr, kr});
      }
    }
    b->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
}
BENCHMARK(BM_FlashForward)->Apply(attention_shapes);
BENCHMARK(BM_FlashBackward)->Apply(attention_shapes);

// ---- memory-bound kernels (GB/s of compulsory traffic) ---------------------

/// Args: rows, C. Reads x, writes y (w and rstd are negligible).
void BM_RmsNormForward(benchmark::State& state) {
  const std::int64_t rows = state.range(0), c = state.range(1);
  const Tensor x = randn({rows, c}, 1);
  const Tensor w = randn({c}, 2);
  run_rate(state, 2.0 * 4.0 * rows * c, "GB/s", g_stream_gbs, [&] {
    Tensor rstd;
    benchmark::DoNotOptimize(cpu::rms_norm_forward(x, w, 1e-5F, rstd));
  });
}
/// Reads x, g; writes dx (dw: C floats).
void BM_RmsNormBackward(benchmark::State& state) {
  const std::int64_t rows = state.range(0), c = state.range(1);
  const Tensor x = randn({rows, c}, 1);
  const Tensor w = randn({c}, 2);
  const Tensor g = randn({rows, c}, 3);
  Tensor rstd;
  cpu::rms_norm_forward(x, w, 1e-5F, rstd);
  run_rate(state, 3.0 * 4.0 * rows * c, "GB/s", g_stream_gbs, [&] {
    Tensor dx, dw;
    cpu::rms_norm_backward(x, w, rstd, g, dx, dw, true, true);
    benchmark::DoNotOptimize(dx.data());
  });
}
BENCHMARK(BM_RmsNormForward)->ArgNames({"rows", "C"})->Args({2048, 256})->Args({512, 768})->UseRealTime();
BENCHMARK(BM_RmsNormBackward)->ArgNames({"rows", "C"})->Args({2048, 256})->Args({512, 768})->UseRealTime();

/// Forward + backward of the fused log-softmax / NLL over (rows, V):
/// reads the logits, writes what the backward needs, reads it, writes dlogits.
void BM_CrossEntropy(benchmark::State& state) {
  const std::int64_t rows = state.range(0), v = state.range(1);
  const Tensor logits = randn({rows, v}, 1);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<std::int32_t>((i * 37) % v);
  run_rate(state, 4.0 * 4.0 * rows * v, "GB/s", g_stream_gbs, [&] {
    Tensor saved;
    std::int64_t count = 0;
    benchmark::DoNotOptimize(cpu::cross_entropy_forward(logits, targets, -100, saved, count));
    Tensor d = cpu::cross_entropy_backward(saved, targets, -100, count, 1.0F);
    benchmark::DoNotOptimize(d.data());
  });
}
BENCHMARK(BM_CrossEntropy)->ArgNames({"rows", "V"})->Args({2048, 256})->Args({512, 256})->UseRealTime();

/// SwiGLU forward + backward over (rows, F): reads gate, up (forward) and
/// gate, up, g (backward); writes out, d_gate, d_up.
void BM_SwiGlu(benchmark::State& state) {
  const std::int64_t rows = state.range(0), f = state.range(1);
  const Tensor gate = randn({rows, f}, 1), up = randn({rows, f}, 2), g = randn({rows, f}, 3);
  run_rate(state, 8.0 * 4.0 * rows * f, "GB/s", g_stream_gbs, [&] {
    benchmark::DoNotOptimize(cpu::swiglu_forward(gate, up));
    Tensor dg, du;
    cpu::swiglu_backward(gate, up, g, dg, du);
    benchmark::DoNotOptimize(dg.data());
  });
}
BENCHMARK(BM_SwiGlu)->ArgNames({"rows", "F"})->Args({2048, 680})->Args({512, 2048})->UseRealTime();

/// RoPE on the packed q/k columns of a fused q/k/v buffer, as the attention
/// op does: rows (B·T) of 3C floats, the first 2C rotated into a (B·T, 2C)
/// buffer (forward) or in place (inverse). Args: B, T, C, D. Reads and
/// writes 2C floats per row.
void BM_RopePacked(benchmark::State& state) {
  const std::int64_t b = state.range(0), t = state.range(1), c = state.range(2), d = state.range(3);
  Tensor qkv = randn({b * t, 3 * c}, 1);
  Tensor rotated = Tensor::empty({b * t, 2 * c});
  run_rate(state, 2.0 * 2.0 * 4.0 * static_cast<double>(b * t * c), "GB/s", g_stream_gbs, [&] {
    cpu::rope_packed(qkv.data(), 3 * c, rotated.data(), 2 * c, b, t, 2 * c, d, 10000.0F, false);
    cpu::rope_packed(qkv.data(), 3 * c, qkv.data(), 3 * c, b, t, 2 * c, d, 10000.0F, true);
    benchmark::DoNotOptimize(rotated.data());
  });
}
BENCHMARK(BM_RopePacked)
    ->ArgNames({"B", "T", "C", "D"})
    ->Args({8, 256, 256, 32})
    ->Args({4, 128, 768, 64})
    ->UseRealTime();

/// The token-embedding gradient: rows of g (rows, C) added into dW (V, C)
/// at their ids. Reads g, writes dW (zeroed, then read and written).
void BM_EmbeddingBackward(benchmark::State& state) {
  const std::int64_t rows = state.range(0), v = state.range(1), c = state.range(2);
  const Tensor g = randn({rows, c}, 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 37) % v);
  run_rate(state, 4.0 * static_cast<double>(rows * c + 3 * v * c), "GB/s", g_stream_gbs, [&] {
    benchmark::DoNotOptimize(cpu::embedding_backward({v, c}, ids, g).data());
  });
}
BENCHMARK(BM_EmbeddingBackward)
    ->ArgNames({"rows", "V", "C"})
    ->Args({2048, 256, 256})
    ->Args({512, 256, 768})
    ->UseRealTime();

/// One Adam::step over `n` parameters in 8 tensors: reads g, θ, m, v and
/// writes θ, m, v (7 floats per parameter), plus the gradient-norm pass.
void BM_AdamStep(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::vector<Variable> params;
  for (int i = 0; i < 8; ++i) params.emplace_back(randn({n / 8}, static_cast<std::uint64_t>(i), 0.02F), true);
  Adam adam(params);
  // Gradients: one backward of Σ p·r per parameter gives r as the gradient.
  for (std::size_t i = 0; i < params.size(); ++i) {
    Variable p = params[i];
    const Variable r(randn({n / 8}, 100 + i, 1e-3F), false);
    sum(mul(p, r)).backward();
  }
  run_rate(state, 8.0 * 4.0 * static_cast<double>(n), "GB/s", g_stream_gbs, [&] { adam.step(); });
}
BENCHMARK(BM_AdamStep)->ArgNames({"params"})->Arg(6'400'000)->Arg(85'000'000 / 8 * 8)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  // --flash-tile-sweep (ours, taken out before Google Benchmark parses the
  // rest): also run the flash kernels over a grid of tile shapes.
  const int original_argc = argc;
  argc = static_cast<int>(std::remove_if(argv + 1, argv + argc,
                                         [](const char* a) { return std::string_view(a) == "--flash-tile-sweep"; }) -
                          argv);
  if (argc != original_argc) register_tile_sweep();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  g_peak_gflops_one = measure_peak(1);
  g_peak_gflops = measure_peak(omp_get_max_threads());
  g_peak512_gflops = measure_peak(omp_get_max_threads(), true);
  g_peak512_gflops_one = measure_peak(1, true);
  g_peak_ref_gflops = std::max(g_peak_gflops, g_peak512_gflops);
  g_stream_gbs = measure_stream();
  std::fprintf(stderr,
               "[rt-bench-kernels] threads %d: FMA peak %.1f GFLOP/s (one thread %.1f; 512-bit %.1f), triad %.1f GB/s; "
               "OpenBLAS kernel set %s\n",
               omp_get_max_threads(), g_peak_gflops, g_peak_gflops_one, g_peak512_gflops, g_stream_gbs,
               cpu::blas_core_name());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
