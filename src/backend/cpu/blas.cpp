// sgemm through OpenBLAS, parallelized by us with OpenMP.
//
// OpenBLAS is kept single-threaded (openblas_set_num_threads(1) before the
// first call with the pthreads build; the OpenMP build needs nothing, see
// single_threaded_blas): its own thread pool (pthreads in Debian's default build)
// would spin on the same cores as our OpenMP team, which idles in a spin
// wait between regions — on a 2-core machine a third of the step went to
// the two pools waiting on each other. Instead a large product is split
// into blocks of C (rows when M >= N, else columns, multiples of 16, at
// least 512 wide where the product allows, up to 4 per thread) and each
// block is one single-threaded sgemm. Blocks are handed out dynamically, so
// on a shared machine a thread that loses its core does not hold the whole
// product at the barrier. Every element of C is computed by one sgemm call
// with the same K order whichever thread runs it: results depend only on
// the blocking, which depends only on the thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels.hpp"

namespace riftco_transformer::cpu {
namespace {

/// Products with fewer multiply-adds run on the calling thread.
constexpr std::int64_t kParallelGemmWork = std::int64_t{1} << 18;
/// Row/column blocks handed to threads are multiples of this (the
/// micro-kernel's unroll), so no block has a ragged edge in the middle.
constexpr std::int64_t kBlockAlign = 16;
/// Each block re-packs the operand it shares with the others (OpenBLAS packs
/// it once per call): about 15/width of the block's time, so blocks are at
/// least this wide (~3%) — a 2048-row product gets 4 blocks on 2 threads.
constexpr std::int64_t kMinBlock = 512;
/// At most this many blocks per thread (enough to rebalance when a thread
/// is descheduled).
constexpr std::int64_t kBlocksPerThread = 4;

void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    // openblas_get_parallel(): 0 sequential build, 1 pthreads, 2 OpenMP. The
    // OpenMP build shares our OpenMP runtime and runs single-threaded inside
    // our parallel regions by itself; its openblas_set_num_threads() would
    // call omp_set_num_threads() and serialize every OpenMP loop of the
    // process, so only the pthreads build is told to use one thread.
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
  });
}

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

/// How a chain's C is cut: `parts` blocks of `chunk` rows (or columns),
/// or one block when the product is too small to split. Depends only on the
/// chain's shape and the thread count, so a product gives the same bits
/// whether it runs alone or in a group.
struct Blocking {
  bool rows = true;
  std::int64_t extent = 0;
  std::int64_t parts = 1;
  std::int64_t chunk = 0;
};

Blocking blocking_for(std::span<const GemmProblem> chain, int threads) {
  const GemmProblem& first = chain.front();
  Blocking b;
  b.rows = first.m >= first.n;
  b.extent = b.rows ? first.m : first.n;
  b.chunk = b.extent;
  bool large = threads > 1 && b.extent >= 2 * kBlockAlign;
  for (const GemmProblem& p : chain) large = large && p.m * p.n * p.k >= kParallelGemmWork;
  if (!large) return b;
  // A multiple of the thread count (balanced when no thread is disturbed).
  const std::int64_t per_thread = std::clamp<std::int64_t>(b.extent / (threads * kMinBlock), 1, kBlocksPerThread);
  const std::int64_t aligned = (b.extent + kBlockAlign - 1) / kBlockAlign;
  b.parts = std::min<std::int64_t>(threads * per_thread, aligned);
  b.chunk = (aligned + b.parts - 1) / b.parts * kBlockAlign;  // parts·chunk >= extent
  return b;
}

/// Product p over rows (or columns) [begin, end) of C.
void run_product_block(const GemmProblem& p, bool rows, std::int64_t begin, std::int64_t end) {
  if (p.k == 0) {
    for (std::int64_t i = rows ? begin : 0; i < (rows ? end : p.m); ++i)
      for (std::int64_t j = rows ? 0 : begin; j < (rows ? p.n : end); ++j)
        p.c[i * p.ldc + j] = p.beta == 0.0F ? 0.0F : p.beta * p.c[i * p.ldc + j];
  } else if (rows) {  // rows [begin, end) of C and op(A)
    const float* ap = p.trans_a ? p.a + begin : p.a + begin * p.lda;
    sgemm(p.trans_a, p.trans_b, end - begin, p.n, p.k, p.alpha, ap, p.lda, p.b, p.ldb, p.beta, p.c + begin * p.ldc,
          p.ldc);
  } else {  // columns [begin, end) of C and op(B)
    const float* bp = p.trans_b ? p.b + begin * p.ldb : p.b + begin;
    sgemm(p.trans_a, p.trans_b, p.m, end - begin, p.k, p.alpha, p.a, p.lda, bp, p.ldb, p.beta, p.c + begin, p.ldc);
  }
}

/// C(i,j) = addend(i,j) + C(i,j) over rows [r0, r1) and columns [c0, c1):
/// one IEEE addition per element, the bits of the elementwise add kernel.
void add_addend(const GemmProblem& p, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
  for (std::int64_t i = r0; i < r1; ++i) {
    float* __restrict c = p.c + i * p.ldc;
    const float* __restrict a = p.addend + i * p.ld_addend;
    for (std::int64_t j = c0; j < c1; ++j) c[j] = a[j] + c[j];
  }
}

/// Rows (or columns) [begin, end) of C for every product of a chain, in
/// order, each followed by its addend while the block is in cache.
void run_block(std::span<const GemmProblem> chain, bool rows, std::int64_t begin, std::int64_t end) {
  for (const GemmProblem& p : chain) {
    run_product_block(p, rows, begin, end);
    if (p.addend != nullptr) add_addend(p, rows ? begin : 0, rows ? end : p.m, rows ? 0 : begin, rows ? p.n : end);
  }
}

}  // namespace

const char* blas_core_name() {
  single_threaded_blas();
  return openblas_get_corename();
}

void gemm_group(std::span<const std::span<const GemmProblem>> chains) {
  single_threaded_blas();
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  struct Task {
    std::size_t chain;
    bool rows;
    std::int64_t begin, end;
    double work;
  };
  std::vector<Task> tasks;
  for (std::size_t c = 0; c < chains.size(); ++c) {
    const std::span<const GemmProblem> chain = chains[c];
    if (chain.empty() || chain.front().m == 0 || chain.front().n == 0) continue;
    double k_sum = 0.0;
    for (const GemmProblem& p : chain) k_sum += static_cast<double>(p.k);
    const Blocking b = blocking_for(chain, threads);
    for (std::int64_t part = 0; part < b.parts; ++part) {
      const std::int64_t begin = part * b.chunk;
      const std::int64_t end = std::min(b.extent, begin + b.chunk);
      if (begin >= end) continue;
      const double other = static_cast<double>(b.rows ? chain.front().n : chain.front().m);
      tasks.push_back({c, b.rows, begin, end, static_cast<double>(end - begin) * other * (k_sum + 1.0)});
    }
  }
  // Largest blocks first (scheduling only: which thread runs a block never
  // changes its bits).
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.work > y.work; });
  const auto count = static_cast<std::int64_t>(tasks.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && count > 1)
  for (std::int64_t t = 0; t < count; ++t) {
    const Task& task = tasks[static_cast<std::size_t>(t)];
    run_block(chains[task.chain], task.rows, task.begin, task.end);
  }
}

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const GemmProblem problem{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc};
  const std::span<const GemmProblem> chain(&problem, 1);
  if (m == 0 || n == 0) return;
  single_threaded_blas();
  const Blocking blocking = blocking_for(chain, omp_in_parallel() ? 1 : omp_get_max_threads());
  if (blocking.parts == 1) {  // small or single-threaded: no task list, no parallel region
    run_block(chain, blocking.rows, 0, blocking.extent);
    return;
  }
  gemm_group(std::span<const std::span<const GemmProblem>>(&chain, 1));
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const std::int64_t ad = a.dim();
  const std::int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const std::int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const std::int64_t n = trans_b ? b.size(-2) : b.size(-1);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = Tensor::empty(out_shape);
  const std::int64_t batch = shape_numel(Shape(out_shape.begin(), out_shape.end() - 2));
  const std::int64_t lda = a.size(-1);
  const std::int64_t ldb = b.size(-1);
  if (b.dim() == 2 && !trans_a) {
    // One GEMM: fold the batch into M.
    const std::int64_t rows = ad == 2 ? m : shape_numel(Shape(a.shape().begin(), a.shape().end() - 1));
    gemm(false, trans_b, rows, n, k, 1.0F, a.data(), lda, b.data(), ldb, 0.0F, out.data(), n);
    return out;
  }
  const bool shared_b = b.dim() == 2;
  const float* pa = a.data();
  const float* pb = b.data();
  float* pc = out.data();
  // Independent products (one per batch item), one thread each when small;
  // a large product parallelizes inside gemm instead.
  const bool per_item = batch > 1 && m * n * k < kParallelGemmWork * 4;
#pragma omp parallel for schedule(static) if (per_item)
  for (std::int64_t i = 0; i < batch; ++i) {
    gemm(trans_a, trans_b, m, n, k, 1.0F, pa + i * m * k, lda, pb + (shared_b ? 0 : i * k * n), ldb, 0.0F,
         pc + i * m * n, n);
  }
  return out;
}

}  // namespace riftco_transformer::cpu
