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

}  // namespace

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0F ? 0.0F : beta * c[i * ldc + j];
    return;
  }
  single_threaded_blas();
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const bool split_rows = m >= n;
  const std::int64_t extent = split_rows ? m : n;
  if (threads <= 1 || m * n * k < kParallelGemmWork || extent < 2 * kBlockAlign) {
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // A multiple of the thread count (balanced when no thread is disturbed).
  const std::int64_t per_thread =
      std::clamp<std::int64_t>(extent / (threads * kMinBlock), 1, kBlocksPerThread);
  const std::int64_t aligned = (extent + kBlockAlign - 1) / kBlockAlign;
  const std::int64_t parts = std::min<std::int64_t>(threads * per_thread, aligned);
  const std::int64_t chunk = (aligned + parts - 1) / parts * kBlockAlign;  // parts·chunk >= extent
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (std::int64_t p = 0; p < parts; ++p) {
    const std::int64_t begin = p * chunk;
    const std::int64_t end = std::min(extent, begin + chunk);
    if (begin >= end) continue;
    if (split_rows) {  // rows [begin, end) of C and op(A)
      const float* ap = trans_a ? a + begin : a + begin * lda;
      sgemm(trans_a, trans_b, end - begin, n, k, alpha, ap, lda, b, ldb, beta, c + begin * ldc, ldc);
    } else {  // columns [begin, end) of C and op(B)
      const float* bp = trans_b ? b + begin * ldb : b + begin;
      sgemm(trans_a, trans_b, m, end - begin, k, alpha, a, lda, bp, ldb, beta, c + begin, ldc);
    }
  }
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
