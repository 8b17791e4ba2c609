#pragma once
// Plain argument types shared by every backend's kernels (the Kernels table,
// src/backend/kernels.hpp, and the cpu:: / cuda:: functions behind it).
// Pointers are addresses on the kernel's own backend: host memory for cpu,
// device memory for cuda (Tensor::device_data()).
#include <cstdint>

namespace riftco_transformer::backend {

/// The gradient norm's chunk grid, on every backend and in ShardedAdam: each
/// parameter is cut from its start into chunks of this many elements, each
/// chunk's sum of squares (in double) is one term of the total, added in
/// order. It fixes the summation order (not the thread count), so changing
/// it changes the norm's bits.
inline constexpr std::int64_t kNormChunk = 32768;

/// One product C(M,N) = alpha·op(A)·op(B) + beta·C for gemm_group, with
/// gemm's arguments (row-major; op transposes when set). With `addend` set,
/// C(i,j) = addend(i,j) + C(i,j) follows the product (rows ld_addend
/// apart): the bits of a separate elementwise add of the two, done while
/// each block of C is still in cache (the residual of a projection).
struct GemmProblem {
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  float alpha;
  const float* a;
  std::int64_t lda;
  const float* b;
  std::int64_t ldb;
  float beta;
  float* c;
  std::int64_t ldc;
  const float* addend = nullptr;
  std::int64_t ld_addend = 0;
};

enum class BinaryOp : std::uint8_t { Add, Sub, Mul };

enum class Activation : std::uint8_t { Silu, Gelu };

/// One Adam(W) update over a parameter: with g' = g·clip,
///   m = b1·m + (1−b1)·g',  v = b2·v + (1−b2)·g'²,
///   θ = θ·decay − lr·(m/c1) / (√(v/c2) + eps).
struct AdamUpdate {
  float* theta;
  float* m;
  float* v;
  const float* grad;
  std::int64_t n;
  float decay;  // 1 − lr·weight_decay of this parameter's group
};
struct AdamCoefficients {
  float beta1, beta2, bias1, bias2, learning_rate, epsilon, clip;
};

/// Rows of queries and keys a flash-attention tile processes (the CPU's
/// cache blocking; other backends may ignore it).
struct FlashTiles {
  std::int64_t query_rows = 64;
  std::int64_t key_rows = 64;
};

/// A read-only (B, H, T, D) view: element (b, h, t, d) is at
/// data[b·batch_stride + h·head_stride + t·row_stride + d].
struct HeadView {
  const float* data;
  std::int64_t batch_stride;
  std::int64_t head_stride;
  std::int64_t row_stride;
};
/// The same for an output.
struct MutableHeadView {
  float* data;
  std::int64_t batch_stride;
  std::int64_t head_stride;
  std::int64_t row_stride;
};

}  // namespace riftco_transformer::backend
