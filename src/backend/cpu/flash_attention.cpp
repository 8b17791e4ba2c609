// FlashAttention-2 style causal attention: tiled forward with an online
// softmax, backward that recomputes P = exp(S·scale − L) tile by tile, both
// in base 2 (2^(S·scale·log2 e − m)) through vec::exp2_fma.
//
// Work is split by (b, h) pair: one thread runs a pair's whole forward (every
// query tile) or backward, so each output element is computed by one thread
// in a fixed order whatever the thread count (pairs are handed out
// dynamically; which thread takes a pair does not change its bits). Product
// operands read as rows of whole 8-float vectors (K, Q, V, dO) are read in
// place through their views when D is a multiple of 8, else packed once per
// pair into per-thread scratch, zero-padded; Kᵀ and Vᵀ (backward) and each
// query tile's Qᵀ (forward) are packed. Every tile product is the
// register-blocked kernel `tile_gemm` below: 4 rows × 2 vectors of the
// result in 8 vector accumulators (at 16 lanes 4 × 4 or 8 × 2 in 16), the
// inner dimension in order, every term one explicit fused multiply-add. The
// forward computes its scores key-major (Sᵀ), so a query's max, sum and
// rescale factor are per-lane operations; Δ uses 8 lanes reduced in a fixed
// order.
#include "flash_attention.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "vec_math.hpp"

// v8 values live inside the AVX2/baseline clones only (see vec_math.hpp).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace riftco_transformer::cpu {

namespace {

using vec::kLanes;
using vec::round_up;
using vec::v8;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// 16 floats: the tile products' vector in the AVX-512 instantiation. The
/// products add each term with an explicit fused multiply-add (vec::fma_lanes:
/// one rounding in every build, libm's fmaf in the baseline one), in the same
/// order at either width, so every build gives the same bits.
using v16 = float __attribute__((vector_size(64)));

template <class V>
constexpr std::int64_t lanes_of = static_cast<std::int64_t>(sizeof(V) / sizeof(float));

template <class V>
[[gnu::always_inline]] inline V load_v(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
[[gnu::always_inline]] inline void store_v(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

/// The pair kernels' instruction sets: the tile products' vector V, and
/// fma(s, b, c) = s·b + c per lane with one rounding (std::fma's bits) on V
/// and on v8 (a last 8-column block at 16 lanes). GCC turns the per-lane
/// fmadd form into a vfmadd only sometimes, so the AVX builds use the
/// intrinsics; those are not always_inline because the product lambdas have
/// no target of their own (each pair kernel, of the same target, inlines
/// them).
struct IsaBaseline {  // 8-lane vectors as SSE pairs, libm's fmaf per lane
  using V = v8;
  [[gnu::always_inline]] static v8 fma(float s, v8 b, v8 c) {
    v8 r;
    for (int i = 0; i < 8; ++i) r[i] = vec::fmadd(s, b[i], c[i]);
    return r;
  }
};
struct IsaAvx2 {
  using V = v8;
  __attribute__((target("avx2,fma"))) static v8 fma(float s, v8 b, v8 c) {
    return reinterpret_cast<v8>(
        _mm256_fmadd_ps(_mm256_set1_ps(s), reinterpret_cast<__m256>(b), reinterpret_cast<__m256>(c)));
  }
};
struct IsaAvx512 {
  using V = v16;
  __attribute__((target("avx512f,fma"))) static v16 fma(float s, v16 b, v16 c) {
    return reinterpret_cast<v16>(
        _mm512_fmadd_ps(_mm512_set1_ps(s), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
  }
  __attribute__((target("avx512f,fma"))) static v8 fma(float s, v8 b, v8 c) {
    return reinterpret_cast<v8>(
        _mm256_fmadd_ps(_mm256_set1_ps(s), reinterpret_cast<__m256>(b), reinterpret_cast<__m256>(c)));
  }
};

/// FlashBuild::Auto: choose by CPU; else the build tests forced.
std::atomic<FlashBuild> g_forced_build{FlashBuild::Auto};

FlashBuild build_to_run() {
  const FlashBuild forced = g_forced_build.load(std::memory_order_relaxed);
  if (forced != FlashBuild::Auto) return forced;
  static const FlashBuild best = [] {
    for (const FlashBuild b : {FlashBuild::Avx512, FlashBuild::Avx2}) {
      if (flash_build_supported(b)) return b;
    }
    return FlashBuild::Baseline;
  }();
  return best;
}

/// Calls with at most this many (B·H·T²) score elements run on one thread.
constexpr std::int64_t kParallelThreshold = 1 << 14;

void check_tiles(FlashTiles tiles) {
  if (tiles.query_rows < 1 || tiles.key_rows < 1) {
    throw ValueError("[flash_attention] tiles must be positive, got " + std::to_string(tiles.query_rows) + "x" +
                     std::to_string(tiles.key_rows));
  }
}

// ---- tile products ----------------------------------------------------------

/// Sentinels for an unbounded first/last term of a row (see tile_rows).
constexpr std::int64_t kNoStart = std::numeric_limits<std::int64_t>::min() / 4;
constexpr std::int64_t kNoEnd = std::numeric_limits<std::int64_t>::max() / 4;

/// R rows of C (R <= 8, n a multiple of 8): C = [diag(row_scale) C +] op(A) B
/// (row_scale: nullptr, or R factors that multiply the loaded C rows), where
/// op(A)(i, p) = a[i·lda + p] (TransA false) or a[p·lda + i] (TransA true)
/// and B is row-major (k, n). Row i sums the terms p in
/// [max(p0, s0 + i), min(k, e0 + i)) in increasing order: under the causal
/// mask the terms outside a row's range have A exactly 0, and leaving them
/// out (instead of adding 0·B) keeps a non-finite B entry of a masked
/// position (0·inf = NaN) out of the row. Columns go in blocks of two
/// vectors V, then one V, then (V wider than 8) one v8: every element is the
/// same sum in the same order whatever V is.
template <class Isa, bool TransA, bool Accumulate, int R>
[[gnu::always_inline]] inline void tile_rows(std::int64_t n, std::int64_t p0, std::int64_t k, std::int64_t s0,
                                             std::int64_t e0, const float* a, std::int64_t lda, const float* b,
                                             std::int64_t ldb, float* c, std::int64_t ldc, const float* row_scale) {
  using V = typename Isa::V;
  auto a_at = [&](int i, std::int64_t p) { return TransA ? a[p * lda + i] : a[i * lda + p]; };
  // [first, head_end): some rows; [head_end, tail_begin): every row;
  // [tail_begin, tail_end): some rows; nothing before first or after tail_end.
  const std::int64_t first = std::clamp(s0, p0, std::max(p0, k));  // no row sees a term before this
  const std::int64_t head_end = std::clamp(s0 + R - 1, first, std::max(first, k));
  const std::int64_t tail_begin = std::clamp(e0, head_end, std::max(head_end, k));
  const std::int64_t tail_end = std::clamp(e0 + R - 1, tail_begin, std::max(tail_begin, k));
  // Columns [j, j + NV·lanes(W)) of the R rows.
  auto columns = [&]<class W, int NV>(std::int64_t j) __attribute__((always_inline)) {
    constexpr std::int64_t L = lanes_of<W>;
    W acc[R][NV];
    for (int i = 0; i < R; ++i) {
      for (int u = 0; u < NV; ++u) acc[i][u] = Accumulate ? load_v<W>(c + i * ldc + j + u * L) : W{};
    }
    if (Accumulate && row_scale != nullptr) {
      for (int i = 0; i < R; ++i) {
        for (int u = 0; u < NV; ++u) acc[i][u] *= row_scale[i];
      }
    }
    // At most R - 1 terms at each end, where only some rows see the term.
    auto ragged = [&](std::int64_t p) __attribute__((always_inline)) {
      W bv[NV];
      for (int u = 0; u < NV; ++u) bv[u] = load_v<W>(b + p * ldb + j + u * L);
      for (int i = 0; i < R; ++i) {
        if (p >= s0 + i && p < e0 + i) {
          const float s = a_at(i, p);
          for (int u = 0; u < NV; ++u) acc[i][u] = Isa::fma(s, bv[u], acc[i][u]);
        }
      }
    };
    for (std::int64_t p = first; p < head_end; ++p) ragged(p);
    for (std::int64_t p = head_end; p < tail_begin; ++p) {  // the bulk: every row
      W bv[NV];
      for (int u = 0; u < NV; ++u) bv[u] = load_v<W>(b + p * ldb + j + u * L);
      for (int i = 0; i < R; ++i) {
        const float s = a_at(i, p);  // one broadcast
        for (int u = 0; u < NV; ++u) acc[i][u] = Isa::fma(s, bv[u], acc[i][u]);
      }
    }
    for (std::int64_t p = tail_begin; p < tail_end; ++p) ragged(p);
    for (int i = 0; i < R; ++i) {
      for (int u = 0; u < NV; ++u) store_v<W>(c + i * ldc + j + u * L, acc[i][u]);
    }
  };
  constexpr std::int64_t L = lanes_of<V>;
  std::int64_t j = 0;
  if constexpr (L > kLanes) {  // 32 vector registers: 16 accumulators and 4 operands fit
    for (; j + 4 * L <= n; j += 4 * L) columns.template operator()<V, 4>(j);
  }
  for (; j + 2 * L <= n; j += 2 * L) columns.template operator()<V, 2>(j);
  if (j + L <= n) {
    columns.template operator()<V, 1>(j);
    j += L;
  }
  if constexpr (L > kLanes) {
    if (j < n) columns.template operator()<v8, 1>(j);  // n is a multiple of 8
  }
}

/// Which part of a tile product the causal mask lets a row block skip.
/// `diag` = i0 − j0 (first query of the tile minus its first key): query
/// row r sees key column c when c <= r + diag.
enum class Causal : std::uint8_t {
  None,       ///< every product term
  Columns,    ///< C rows are query rows, C columns key columns: columns past the
              ///< block's last visible key are not computed (left unwritten)
  ColumnsFrom,  ///< C rows are key rows, C columns query columns: columns before the
                ///< block's first query that sees a key are not computed (left unwritten)
  Inner,      ///< C rows are query rows, the inner index keys: terms past each
              ///< row's last visible key are exactly zero (P or dS) and skipped
  InnerFrom,  ///< C rows are key rows, the inner index queries: terms before the
              ///< first query that sees each row's key are zero and skipped
};

/// C (m, n) = [diag(row_scale) C +] op(A) (m, k) · B (k, n); n a multiple
/// of 8. With Accumulate, a row block none of whose rows has a term left
/// by the mask is not touched, so row_scale must be 1 for rows without terms.
template <class Isa, bool TransA, bool Accumulate>
[[gnu::always_inline]] inline void tile_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                             std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                                             std::int64_t ldc, Causal causal = Causal::None, std::int64_t diag = 0,
                                             const float* row_scale = nullptr) {
  auto row_a = [&](std::int64_t i) { return TransA ? a + i : a + i * lda; };
  auto block = [&]<int R>(std::int64_t i) __attribute__((always_inline)) {
    std::int64_t nb = n;
    std::int64_t js = 0;  // columns [js, nb) are computed
    std::int64_t s0 = kNoStart;  // row i + r sums terms [max(0, s0 + r), min(k, e0 + r))
    std::int64_t e0 = kNoEnd;
    switch (causal) {
      case Causal::None:
        break;
      case Causal::Columns:  // last row i+R-1 sees columns < i + R + diag
        nb = std::clamp<std::int64_t>(round_up(i + R + diag, kLanes), 0, n);
        break;
      case Causal::ColumnsFrom:  // key row i is seen from query column i - diag on
        js = std::clamp<std::int64_t>((i - diag) / kLanes * kLanes, 0, n);
        break;
      case Causal::Inner:  // query row i sees keys < i + diag + 1
        e0 = i + diag + 1;
        break;
      case Causal::InnerFrom:  // key row i is seen from query i - diag on
        s0 = i - diag;
        break;
    }
    const bool any_term = std::max<std::int64_t>(0, s0) < std::min(k, e0 + R - 1);
    if (nb > js && (Accumulate ? any_term : true)) {
      tile_rows<Isa, TransA, Accumulate, R>(nb - js, 0, k, s0, e0, row_a(i), lda, b + js, ldb, c + i * ldc + js, ldc,
                                          row_scale == nullptr ? nullptr : row_scale + i);
    }
  };
  std::int64_t i = 0;
  if constexpr (lanes_of<typename Isa::V> > kLanes) {  // at most 2 vectors a row: 8 rows, 16 accumulators
    if (n <= 2 * lanes_of<typename Isa::V>) {
      for (; i + 8 <= m; i += 8) block.template operator()<8>(i);
    }
  }
  for (; i + 4 <= m; i += 4) block.template operator()<4>(i);
  switch (m - i) {
    case 3:
      block.template operator()<3>(i);
      break;
    case 2:
      block.template operator()<2>(i);
      break;
    case 1:
      block.template operator()<1>(i);
      break;
    default:
      break;
  }
}

// ---- row helpers ------------------------------------------------------------

/// Shifts (row maxima m of S·scale·log2 e, log-sum-exps) at or above this
/// magnitude take the exponent's argument as x·pre − shift with two
/// roundings. With one (a fused multiply-add), the max's own argument is
/// the rounding error of its product, up to half an ulp of the shift: 0.004
/// below 2^16, but ±4e12 for scores near 1e20, which exp2 clamped to 2^±127
/// (output inf, or a wrong key weighted like the max). Below it nothing
/// changes (no realistic score gets near: |S·scale| < 45,000).
constexpr float kFusedShiftLimit = 0x1p16F;

/// Whether a shift needs the two-rounding argument (infinite ones do not:
/// both forms give the same there).
[[gnu::always_inline]] inline bool large_shift(float shift) {
  const float a = std::fabs(shift);
  return a >= kFusedShiftLimit && a < std::numeric_limits<float>::infinity();
}

/// 2^(x·pre − shift): one rounding, or two when `Large` (see above); a
/// template argument, so that the loops are compiled apart.
template <bool Large>
[[gnu::always_inline]] inline float exp2_shifted(float x, float pre, float shift) {
  return vec::exp2_fma(Large ? x * pre - shift : vec::fmadd(x, pre, -shift));
}

/// x[c] = 2^(x[c]·pre − shift) for c < valid, 0 for valid <= c < n (the
/// argument with one rounding, exp2_fma as the forward uses it). The
/// loop runs whole vectors over [0, n) and masks by selection (entries from
/// `valid` on may be unwritten, and are never multiplied).
[[gnu::always_inline]] inline void exp_row(float* __restrict x, std::int64_t valid, std::int64_t n, float pre,
                                           float shift) {
  auto row = [&]<bool Large>() __attribute__((always_inline)) {
    for (std::int64_t c = 0; c < n; ++c) {
      const float e = exp2_shifted<Large>(x[c], pre, shift);
      x[c] = c < valid ? e : 0.0F;
    }
  };
  if (large_shift(shift)) {
    row.template operator()<true>();
  } else {
    row.template operator()<false>();
  }
}

/// Σ_d a[d]·b[d] over 8 lanes reduced in a fixed order.
[[gnu::always_inline]] inline float dot(const float* a, const float* b, std::int64_t n) {
  v8 acc{};
  std::int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) acc += vec::load(a + d) * vec::load(b + d);
  float total = vec::sum_lanes(acc);
  for (; d < n; ++d) total += a[d] * b[d];
  return total;
}

/// dst (rows, ld) = src rows (row stride `stride`, `width` floats), zero
/// padded to `ld` columns and to `padded_rows` rows.
void pack_rows(const float* src, std::int64_t stride, std::int64_t rows, std::int64_t width, float* dst,
               std::int64_t ld, std::int64_t padded_rows) {
  for (std::int64_t t = 0; t < rows; ++t) {
    std::copy(src + t * stride, src + t * stride + width, dst + t * ld);
    std::fill(dst + t * ld + width, dst + (t + 1) * ld, 0.0F);
  }
  std::fill(dst + rows * ld, dst + padded_rows * ld, 0.0F);
}

/// The 8 × 8 block of rows r[0..7] transposed: out[j][i] = r[i][j]
/// (interleave single lanes, then pairs, then halves; data movement only).
[[gnu::always_inline]] inline void transpose8(const v8 (&r)[8], v8 (&out)[8]) {
  v8 a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    a[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) {
    b[i] = __builtin_shufflevector(a[i], a[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    b[i + 1] = __builtin_shufflevector(a[i], a[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    b[i + 2] = __builtin_shufflevector(a[i + 1], a[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    b[i + 3] = __builtin_shufflevector(a[i + 1], a[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = __builtin_shufflevector(b[j], b[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    out[j + 4] = __builtin_shufflevector(b[j], b[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

/// dst (width, ld) = transpose of src rows (row stride `stride`, `width`
/// floats each), columns rows..ld-1 zero. Whole 8 × 8 blocks go through
/// registers (a scalar scatter was 9% of the forward's samples); the ragged
/// rows and columns element by element.
[[gnu::always_inline]] inline void pack_transposed(const float* src, std::int64_t stride, std::int64_t rows,
                                                   std::int64_t width, float* dst, std::int64_t ld) {
  const std::int64_t rows8 = rows / kLanes * kLanes, width8 = width / kLanes * kLanes;
  for (std::int64_t t = 0; t < rows8; t += kLanes) {
    for (std::int64_t d = 0; d < width8; d += kLanes) {
      v8 r[8], out[8];
      for (int i = 0; i < 8; ++i) r[i] = vec::load(src + (t + i) * stride + d);
      transpose8(r, out);
      for (int j = 0; j < 8; ++j) vec::store(dst + (d + j) * ld + t, out[j]);
    }
    for (std::int64_t i = t; i < t + kLanes; ++i) {
      for (std::int64_t d = width8; d < width; ++d) dst[d * ld + i] = src[i * stride + d];
    }
  }
  for (std::int64_t i = rows8; i < rows; ++i) {
    for (std::int64_t d = 0; d < width; ++d) dst[d * ld + i] = src[i * stride + d];
  }
  for (std::int64_t d = 0; d < width; ++d) std::fill(dst + d * ld + rows, dst + (d + 1) * ld, 0.0F);
}

// ---- one (b, h) pair ---------------------------------------------------------

/// Lanes per block of the softmax loops (two 8-float vectors, one 16-float
/// one): the forward's query lanes and the backward's score-tile columns are
/// padded to it, so those loops run whole vectors.
constexpr std::int64_t kQueryBlock = 16;

struct PairGeometry {
  std::int64_t T, D, Dp, Tk, br, brq, bc, bcp;
  explicit PairGeometry(std::int64_t t, std::int64_t d, FlashTiles tiles)
      : T(t),
        D(d),
        Dp(round_up(d, kLanes)),
        Tk(round_up(t, kLanes) + kLanes),
        br(std::min(tiles.query_rows, t)),
        brq(round_up(std::min(tiles.query_rows, t), kQueryBlock)),
        bc(std::min(tiles.key_rows, t)),
        bcp(round_up(std::min(tiles.key_rows, t), kQueryBlock)) {}
  /// K, Q, V and dO rows are read in place as product operands when D is a
  /// multiple of 8 (the products load whole 8-float vectors of a row);
  /// otherwise they are packed zero-padded to Dp.
  bool packs_rows() const { return D != Dp; }
  std::int64_t forward_floats() const {
    return D * brq + (packs_rows() ? T * Dp : 0) + bc * brq + br * Dp + 4 * brq;
  }
  std::int64_t backward_floats() const {
    return 2 * D * Tk + (packs_rows() ? 6 : 3) * T * Dp + 2 * br * bcp + T;
  }
};

/// One (b, h) pair's forward. Scores are computed key-major: the tile Sᵀ =
/// K Qᵀ holds key c's scores against the tile's queries in row c, so a
/// query's running max, its sum of exponentials and its rescale factor are
/// lane-wise operations over contiguous rows (no reduction across lanes; a
/// query's sum adds its keys one by one in key order, the same at every
/// vector width), and P V reads Pᵀ as a transposed left operand.
template <class Isa>
[[gnu::always_inline]] inline void forward_pair_impl(const PairGeometry& g, const float* q, std::int64_t q_stride,
                                                     const float* k, std::int64_t k_stride, const float* v,
                                                     std::int64_t v_stride, float* out, std::int64_t out_stride,
                                                     float* lse, float scale, float* scratch) {
  const std::int64_t T = g.T, D = g.D, Dp = g.Dp, br = g.br, brp = g.brq, bc = g.bc;
  const float scale2 = scale * vec::kLog2e;
  float* qt = scratch;             // (D, brp): Qᵀ of the query tile, zero columns from its rows
  float* st = qt + D * brp;        // (bc, brp): Sᵀ, then Pᵀ
  float* o = st + bc * brp;        // (br, Dp): unnormalized output accumulator
  float* __restrict m = o + br * Dp;  // (brp): running max of S·scale2
  float* __restrict l = m + brp;      // (brp): running sum
  float* __restrict tile_max = l + brp;  // (brp): this key tile's max (unscaled), then rescale factor
  float* __restrict tile_sum = tile_max + brp;  // (brp): this key tile's sum
  const float* vb = v;  // V rows (Dp floats): in place, or packed
  std::int64_t ldv = v_stride;
  if (g.packs_rows()) {
    float* vp = tile_sum + brp;  // (T, Dp)
    pack_rows(v, v_stride, T, D, vp, Dp, T);
    vb = vp;
    ldv = Dp;
  }
  for (std::int64_t i0 = 0; i0 < T; i0 += br) {
    const std::int64_t rows = std::min(br, T - i0);
    // Query lanes [0, n): whole blocks of kQueryBlock, so the loops below
    // over queries run whole vectors (lanes from `rows` on are padding:
    // zero queries, computed and never written out).
    const std::int64_t n = round_up(rows, kQueryBlock);
    pack_transposed(q + i0 * q_stride, q_stride, rows, D, qt, brp);
    const std::int64_t key_end = i0 + rows;  // keys >= key_end are masked for every row of this tile
    for (std::int64_t j0 = 0; j0 < key_end; j0 += bc) {
      const std::int64_t cols = std::min(bc, key_end - j0);
      const std::int64_t diag = i0 - j0;  // key c is seen by queries r >= c - diag
      const bool first = j0 == 0;         // every query sees key 0: m, l and O start here
      tile_gemm<Isa, false, false>(cols, n, D, k + j0 * k_stride, k_stride, qt, brp, st, brp, Causal::ColumnsFrom,
                                 diag);  // Sᵀ = K Qᵀ
      // Key c is seen by queries [r0, n), r0 = first_query(c); the loops
      // start at r0 rounded down to a whole block and mask lanes before r0
      // by selection (never by multiplying: those entries may be unwritten).
      // A tile wholly left of the diagonal (diag >= cols − 1: every query
      // sees every key) runs them unmasked. Query indices are int (n is at
      // most a query tile, whose bc × n scores are allocated): 16 of them
      // fit one vector compare.
      auto softmax = [&]<bool Masked>() __attribute__((always_inline)) {
        const int ni = static_cast<int>(n);
        auto first_query = [&](std::int64_t c) {
          return Masked ? static_cast<int>(std::clamp<std::int64_t>(c - diag, 0, rows)) : 0;
        };
        // Max over the tile's visible keys (NaN skipped, as std::max skips a
        // NaN second argument); exact, so the order does not matter.
        std::fill(tile_max, tile_max + n, kNegInf);
        for (std::int64_t c = 0; c < cols; ++c) {
          const float* __restrict sc = st + c * brp;
          const int r0 = first_query(c);
          for (int r = r0 / kQueryBlock * kQueryBlock; r < ni; ++r) {
            const float x = r >= r0 ? sc[r] : kNegInf;
            tile_max[r] = tile_max[r] < x ? x : tile_max[r];
          }
        }
        // Base 2: m is the max of S·scale2 (scale2 = scale·log2 e, positive,
        // so max(S)·scale2 = max(S·scale2) exactly) and every exponential is
        // 2^(s·scale2 − m), its argument rounded once.
        if (first) {
          for (int r = 0; r < ni; ++r) m[r] = tile_max[r] * scale2;
        } else {
          for (int r = 0; r < ni; ++r) {
            const float mx = tile_max[r] * scale2;
            const float next = m[r] < mx ? mx : m[r];
            tile_max[r] = vec::exp2_fma(m[r] - next);  // the rescale factor α: exactly 1 when m stays
            m[r] = next;
          }
        }
        bool large = false;  // the whole tile's arguments with two roundings when any row's max is large
        for (int r = 0; r < ni; ++r) large |= large_shift(m[r]);
        std::fill(tile_sum, tile_sum + n, 0.0F);
        auto exponentials = [&]<bool Large>() __attribute__((always_inline)) {
          for (std::int64_t c = 0; c < cols; ++c) {
            float* __restrict pc = st + c * brp;
            const int r0 = first_query(c);
            const int rb = r0 / kQueryBlock * kQueryBlock;
            std::fill(pc, pc + rb, 0.0F);  // masked (and possibly unwritten) entries
            for (int r = rb; r < ni; ++r) {
              const float e = exp2_shifted<Large>(pc[r], scale2, m[r]);
              const float p = r >= r0 ? e : 0.0F;
              pc[r] = p;
              tile_sum[r] += p;
            }
          }
        };
        if (large) {
          exponentials.template operator()<true>();
        } else {
          exponentials.template operator()<false>();
        }
      };
      if (diag >= cols - 1) {
        softmax.template operator()<false>();
      } else {
        softmax.template operator()<true>();
      }
      if (first) {
        std::copy(tile_sum, tile_sum + n, l);
        tile_gemm<Isa, true, false>(rows, Dp, cols, st, brp, vb, ldv, o, Dp, Causal::Inner, diag);  // O = P V
      } else {
        for (std::int64_t r = 0; r < n; ++r) l[r] = l[r] * tile_max[r] + tile_sum[r];
        // O = diag(α) O + P V: a row that sees no key of this tile has α = 1.
        tile_gemm<Isa, true, true>(rows, Dp, cols, st, brp, vb + j0 * ldv, ldv, o, Dp, Causal::Inner, diag, tile_max);
      }
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0F / l[r];
      const float* orow = o + r * Dp;
      float* dst = out + (i0 + r) * out_stride;
      for (std::int64_t d = 0; d < D; ++d) dst[d] = orow[d] * inv;
      lse[i0 + r] = vec::fmadd(m[r], vec::kLn2, std::log(l[r]));  // natural log: m·ln 2 + log l
    }
  }
}

template <class Isa>
[[gnu::always_inline]] inline void backward_pair_impl(
    const PairGeometry& g, const float* q, std::int64_t q_stride, const float* k, std::int64_t k_stride,
    const float* v, std::int64_t v_stride, const float* o, std::int64_t o_stride, const float* d_out,
    std::int64_t do_stride, const float* lse, float* dq, std::int64_t dq_stride, float* dk, std::int64_t dk_stride,
    float* dv, std::int64_t dv_stride, float scale, float* scratch) {
  const std::int64_t T = g.T, D = g.D, Dp = g.Dp, Tk = g.Tk, br = g.br, bc = g.bc, bcp = g.bcp;
  const float scale2 = scale * vec::kLog2e;  // as the forward's
  float* kt = scratch;        // (D, Tk): Kᵀ
  float* vt = kt + D * Tk;    // (D, Tk): Vᵀ
  float* dqa = vt + D * Tk;   // (T, Dp): dQ, += over key tiles
  float* dka = dqa + T * Dp;  // (T, Dp): dK, += over query tiles
  float* dva = dka + T * Dp;  // (T, Dp): dV, += over query tiles
  float* p = dva + T * Dp;    // (br, bcp): P
  float* ds = p + br * bcp;   // (br, bcp): dP, then dS
  float* delta = ds + br * bcp;  // (T): rowsum(dO ∘ O)
  // K, Q and dO as right operands (rows of Dp floats): in place, or packed.
  const float* kp = k;
  const float* qp = q;
  const float* dop = d_out;
  std::int64_t ldk = k_stride, ldq = q_stride, lddo = do_stride;
  if (g.packs_rows()) {
    float* packed = delta + T;  // (3, T, Dp)
    pack_rows(k, k_stride, T, D, packed, Dp, T);
    pack_rows(q, q_stride, T, D, packed + T * Dp, Dp, T);
    pack_rows(d_out, do_stride, T, D, packed + 2 * T * Dp, Dp, T);
    kp = packed;
    qp = packed + T * Dp;
    dop = packed + 2 * T * Dp;
    ldk = ldq = lddo = Dp;
  }
  pack_transposed(k, k_stride, T, D, kt, Tk);
  pack_transposed(v, v_stride, T, D, vt, Tk);
  std::fill(dqa, dqa + 3 * T * Dp, 0.0F);
  for (std::int64_t i = 0; i < T; ++i) delta[i] = dot(d_out + i * do_stride, o + i * o_stride, D);

  for (std::int64_t j0 = 0; j0 < T; j0 += bc) {
    const std::int64_t cols = std::min(bc, T - j0);
    const std::int64_t n = round_up(cols, kLanes);
    const std::int64_t nv = round_up(cols, lanes_of<typename Isa::V>);  // the row loops run whole vectors
    // Query tiles that can see key j0 or later: i >= j0.
    for (std::int64_t i0 = (j0 / br) * br; i0 < T; i0 += br) {
      const std::int64_t rows = std::min(br, T - i0);
      const std::int64_t diag = i0 - j0;
      tile_gemm<Isa, false, false>(rows, n, D, q + i0 * q_stride, q_stride, kt + j0, Tk, p, bcp, Causal::Columns,
                              diag);  // S = Q Kᵀ
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t valid = std::clamp<std::int64_t>(r + diag + 1, 0, cols);  // keys j <= i
        exp_row(p + r * bcp, valid, nv, scale2, lse[i0 + r] * vec::kLog2e);  // P = exp(S·scale − L), 0 from `valid` on
      }
      tile_gemm<Isa, true, true>(cols, Dp, rows, p, bcp, dop + i0 * lddo, lddo, dva + j0 * Dp, Dp, Causal::InnerFrom,
                            diag);  // dV += Pᵀ dO
      tile_gemm<Isa, false, false>(rows, n, D, d_out + i0 * do_stride, do_stride, vt + j0, Tk, ds, bcp, Causal::Columns,
                              diag);  // dP = dO Vᵀ
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* pr = p + r * bcp;
        float* dsr = ds + r * bcp;
        const float di = delta[i0 + r];
        const std::int64_t valid = std::clamp<std::int64_t>(r + diag + 1, 0, cols);
        for (std::int64_t c = 0; c < nv; ++c) {  // dS = P ∘ (dP − Δ) · scale; masked (maybe unwritten) entries 0
          const float d = pr[c] * (dsr[c] - di) * scale;
          dsr[c] = c < valid ? d : 0.0F;
        }
      }
      tile_gemm<Isa, false, true>(rows, Dp, cols, ds, bcp, kp + j0 * ldk, ldk, dqa + i0 * Dp, Dp, Causal::Inner,
                             diag);  // dQ += dS K
      tile_gemm<Isa, true, true>(cols, Dp, rows, ds, bcp, qp + i0 * ldq, ldq, dka + j0 * Dp, Dp, Causal::InnerFrom,
                            diag);  // dK += dSᵀ Q
    }
  }
  for (std::int64_t t = 0; t < T; ++t) {
    std::copy(dqa + t * Dp, dqa + t * Dp + D, dq + t * dq_stride);
    std::copy(dka + t * Dp, dka + t * Dp + D, dk + t * dk_stride);
    std::copy(dva + t * Dp, dva + t * Dp + D, dv + t * dv_stride);
  }
}

// The pair kernels per instruction set: 8-lane products in the AVX2 + FMA
// and baseline builds, 16-lane ones where AVX-512F runs; the same bits (the
// baseline's fused multiply-adds are libm calls: slow, only for CPUs
// without FMA). The
// forward's per-query loops run whole vectors and mask the lanes before a
// key's first query by selection; GCC's loop splitting would cut them at
// that query and leave scalar remainders (9% of the forward's samples), so
// it is off there (the backward is faster with it).
#define RIFTCO_FORWARD_PAIR_ARGS                                                                                  \
  const PairGeometry &g, const float *q, std::int64_t q_stride, const float *k, std::int64_t k_stride,            \
      const float *v, std::int64_t v_stride, float *out, std::int64_t out_stride, float *lse, float scale,        \
      float *scratch
#define RIFTCO_BACKWARD_PAIR_ARGS                                                                                 \
  const PairGeometry &g, const float *q, std::int64_t q_stride, const float *k, std::int64_t k_stride,            \
      const float *v, std::int64_t v_stride, const float *o, std::int64_t o_stride, const float *d_out,           \
      std::int64_t do_stride, const float *lse, float *dq, std::int64_t dq_stride, float *dk,                     \
      std::int64_t dk_stride, float *dv, std::int64_t dv_stride, float scale, float *scratch
#define RIFTCO_BACKWARD_PAIR_CALL                                                                                 \
  g, q, q_stride, k, k_stride, v, v_stride, o, o_stride, d_out, do_stride, lse, dq, dq_stride, dk, dk_stride, dv, \
      dv_stride, scale, scratch

#define RIFTCO_FORWARD_PAIR_CALL g, q, q_stride, k, k_stride, v, v_stride, out, out_stride, lse, scale, scratch

#if defined(__clang__)
#define RIFTCO_FLASH_ISA_BUILDS 0
#else
#define RIFTCO_FLASH_ISA_BUILDS 1
#endif
using ForwardPairFn = void (*)(RIFTCO_FORWARD_PAIR_ARGS);
using BackwardPairFn = void (*)(RIFTCO_BACKWARD_PAIR_ARGS);

__attribute__((optimize("no-split-loops"))) void forward_pair_baseline(RIFTCO_FORWARD_PAIR_ARGS) {
  forward_pair_impl<IsaBaseline>(RIFTCO_FORWARD_PAIR_CALL);
}
#if RIFTCO_FLASH_ISA_BUILDS
__attribute__((target("avx2,fma"), optimize("no-split-loops"))) void forward_pair_avx2(RIFTCO_FORWARD_PAIR_ARGS) {
  forward_pair_impl<IsaAvx2>(RIFTCO_FORWARD_PAIR_CALL);
}
__attribute__((target("avx512f,fma"), optimize("no-split-loops"))) void forward_pair_avx512(
    RIFTCO_FORWARD_PAIR_ARGS) {
  forward_pair_impl<IsaAvx512>(RIFTCO_FORWARD_PAIR_CALL);
}
#endif
void backward_pair_baseline(RIFTCO_BACKWARD_PAIR_ARGS) { backward_pair_impl<IsaBaseline>(RIFTCO_BACKWARD_PAIR_CALL); }
#if RIFTCO_FLASH_ISA_BUILDS
__attribute__((target("avx2,fma"))) void backward_pair_avx2(RIFTCO_BACKWARD_PAIR_ARGS) {
  backward_pair_impl<IsaAvx2>(RIFTCO_BACKWARD_PAIR_CALL);
}
__attribute__((target("avx512f,fma"))) void backward_pair_avx512(RIFTCO_BACKWARD_PAIR_ARGS) {
  backward_pair_impl<IsaAvx512>(RIFTCO_BACKWARD_PAIR_CALL);
}

#else
// Clang does not give a lambda its enclosing function's target attribute, so
// the AVX instantiations do not compile there: a clang build (the fuzzers')
// runs the baseline build everywhere, which gives the same bits, slower.
constexpr ForwardPairFn forward_pair_avx2 = forward_pair_baseline;
constexpr ForwardPairFn forward_pair_avx512 = forward_pair_baseline;
constexpr BackwardPairFn backward_pair_avx2 = backward_pair_baseline;
constexpr BackwardPairFn backward_pair_avx512 = backward_pair_baseline;
#endif

using ForwardPair = void (*)(RIFTCO_FORWARD_PAIR_ARGS);
using BackwardPair = void (*)(RIFTCO_BACKWARD_PAIR_ARGS);
ForwardPair forward_pair_for(FlashBuild b) {
  return b == FlashBuild::Avx512 ? forward_pair_avx512 : b == FlashBuild::Avx2 ? forward_pair_avx2 : forward_pair_baseline;
}
BackwardPair backward_pair_for(FlashBuild b) {
  return b == FlashBuild::Avx512 ? backward_pair_avx512
         : b == FlashBuild::Avx2 ? backward_pair_avx2
                                 : backward_pair_baseline;
}
#undef RIFTCO_FORWARD_PAIR_ARGS
#undef RIFTCO_FORWARD_PAIR_CALL
#undef RIFTCO_BACKWARD_PAIR_ARGS
#undef RIFTCO_BACKWARD_PAIR_CALL

/// One allocator-counted workspace split into per-thread slices for a team
/// of `team` threads.
struct Workspace {
  Tensor buffer;
  std::int64_t per_thread;
  Workspace(std::int64_t per_thread_floats, int team)
      : buffer(Tensor::empty({std::int64_t{team} * per_thread_floats})), per_thread(per_thread_floats) {}
  float* slice() { return buffer.data() + omp_get_thread_num() * per_thread; }
};

/// Threads for `pairs` independent (b, h) items: never more than the items.
int team_size(std::int64_t pairs, std::int64_t T) {
  if (pairs * T * T <= kParallelThreshold || pairs <= 1) return 1;
  return static_cast<int>(std::min<std::int64_t>(omp_get_max_threads(), pairs));
}

}  // namespace

bool flash_build_supported(FlashBuild build) {
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma") != 0;
  switch (build) {
    case FlashBuild::Auto:
    case FlashBuild::Baseline:
      return true;
    case FlashBuild::Avx2:
      return RIFTCO_FLASH_ISA_BUILDS && fma && __builtin_cpu_supports("avx2") != 0;
    case FlashBuild::Avx512:
      return RIFTCO_FLASH_ISA_BUILDS && fma && __builtin_cpu_supports("avx512f") != 0;
  }
  return false;
}

void flash_force_build(FlashBuild build) {
  const int code = static_cast<int>(build);
  if (code < 0 || code > static_cast<int>(FlashBuild::Avx512)) {
    throw ValueError("[flash_force_build] unknown build " + std::to_string(code) +
                     " (0 auto, 1 baseline, 2 AVX2 + FMA, 3 AVX-512F + FMA)");
  }
  if (!flash_build_supported(build)) {
    throw ValueError("[flash_force_build] build " + std::to_string(code) + " (" +
                     (build == FlashBuild::Avx2 ? "AVX2 + FMA" : "AVX-512F + FMA") +
                     ") needs instructions this CPU does not have");
  }
  g_forced_build.store(build);
}

FlashTiles flash_default_tiles(std::int64_t head_width) {
  constexpr std::int64_t kTileWork = std::int64_t{1} << 18;
  FlashTiles tiles;
  while (tiles.key_rows > 16 && tiles.query_rows * tiles.key_rows * head_width > kTileWork) tiles.key_rows /= 2;
  while (tiles.query_rows > 16 && tiles.query_rows * tiles.key_rows * head_width > kTileWork) tiles.query_rows /= 2;
  return tiles;
}

namespace {
/// First row of head h of batch item b in a view.
template <class View>
auto at(View view, std::int64_t b, std::int64_t h) {
  return view.data + b * view.batch_stride + h * view.head_stride;
}
}  // namespace

void flash_attention_forward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                             HeadView v, MutableHeadView out, float* lse, float scale, FlashTiles tiles) {
  check_tiles(tiles);
  if (B * H * T == 0) return;
  const PairGeometry g(T, D, tiles);
  const std::int64_t pairs = B * H;
  const int team = team_size(pairs, T);
  Workspace ws(g.forward_floats(), team);
  const ForwardPair pair_kernel = forward_pair_for(build_to_run());
  // Pairs are handed out dynamically (a descheduled thread does not stall the
  // rest); each pair is computed entirely by whichever thread takes it.
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (std::int64_t bh = 0; bh < pairs; ++bh) {
    const std::int64_t b = bh / H;
    const std::int64_t h = bh % H;
    pair_kernel(g, at(q, b, h), q.row_stride, at(k, b, h), k.row_stride, at(v, b, h), v.row_stride, at(out, b, h),
                 out.row_stride, lse + bh * T, scale, ws.slice());
  }
}

void flash_attention_backward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                              HeadView v, HeadView out, HeadView d_out, const float* lse, MutableHeadView dq,
                              MutableHeadView dk, MutableHeadView dv, float scale, FlashTiles tiles) {
  check_tiles(tiles);
  if (B * H * T == 0) return;
  const PairGeometry g(T, D, tiles);
  const std::int64_t pairs = B * H;
  const int team = team_size(pairs, T);
  Workspace ws(g.backward_floats(), team);
  const BackwardPair pair_kernel = backward_pair_for(build_to_run());
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (std::int64_t bh = 0; bh < pairs; ++bh) {
    const std::int64_t b = bh / H;
    const std::int64_t h = bh % H;
    pair_kernel(g, at(q, b, h), q.row_stride, at(k, b, h), k.row_stride, at(v, b, h), v.row_stride,
                  at(out, b, h), out.row_stride, at(d_out, b, h), d_out.row_stride, lse + bh * T, at(dq, b, h),
                  dq.row_stride, at(dk, b, h), dk.row_stride, at(dv, b, h), dv.row_stride, scale, ws.slice());
  }
}

namespace {

HeadView heads_of(const Tensor& t) {
  const std::int64_t H = t.size(1), T = t.size(2), D = t.size(3);
  return {t.data(), H * T * D, T * D, D};
}
MutableHeadView heads_of(Tensor& t) {
  const std::int64_t H = t.size(1), T = t.size(2), D = t.size(3);
  return {t.data(), H * T * D, T * D, D};
}

}  // namespace

Tensor flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale, FlashTiles tiles,
                               Tensor& lse) {
  check_tiles(tiles);
  const std::int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  Tensor out = Tensor::empty(q.shape());  // (B, H, T, D)
  lse = Tensor::empty({B, H, T});          // (B, H, T)
  flash_attention_forward(B, H, T, D, heads_of(q), heads_of(k), heads_of(v), heads_of(out), lse.data(), scale,
                          tiles);
  return out;
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& d_out, float scale, FlashTiles tiles, Tensor& dq, Tensor& dk, Tensor& dv) {
  check_tiles(tiles);
  const std::int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  dq = Tensor::empty(q.shape());  // (B, H, T, D)
  dk = Tensor::empty(k.shape());  // (B, H, T, D)
  dv = Tensor::empty(v.shape());  // (B, H, T, D)
  flash_attention_backward(B, H, T, D, heads_of(q), heads_of(k), heads_of(v), heads_of(out), heads_of(d_out),
                           lse.data(), heads_of(dq), heads_of(dk), heads_of(dv), scale, tiles);
}

}  // namespace riftco_transformer::cpu
