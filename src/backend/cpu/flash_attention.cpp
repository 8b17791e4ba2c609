// FlashAttention-2 style causal attention: tiled forward with an online
// softmax, backward that recomputes P = exp(S − L) tile by tile.
#include "flash_attention.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "kernels.hpp"

namespace riftco_transformer::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// One workspace Tensor (counted by the allocator) split into equal
/// per-thread slices of `per_thread` floats.
struct Workspace {
  Tensor buffer;
  std::int64_t per_thread;
  explicit Workspace(std::int64_t per_thread_floats)
      : buffer(Tensor::empty({std::max<std::int64_t>(omp_get_max_threads(), 1) * per_thread_floats})),
        per_thread(per_thread_floats) {}
  float* slice() { return buffer.data() + omp_get_thread_num() * per_thread; }
};

/// Calls with at most this many (B·H·T²) score elements run on one thread.
constexpr std::int64_t kParallelThreshold = 1 << 14;

/// x[c] = exp(x[c] - shift) for n elements: the Cephes expf polynomial
/// after reducing by n·ln2 (max relative error 8.2e-8 against double exp
/// on [-87, 5]). Arguments are clamped to [-87.34, 88]: below that the
/// result is 1.2e-38 instead of a denormal or 0 (irrelevant next to the
/// row's largest term, which is >= 1 in the forward and ~1 in the
/// backward); NaN stays NaN. The clamps and the NaN test work on the bit
/// patterns (no float branches) so the loop vectorizes. Elementwise mul/add
/// only, no reduction, and the AVX2 clone has no FMA to contract into, so
/// the AVX2 and baseline clones give the same bits (checked on 1M patterns).
__attribute__((target_clones("avx2", "default"))) void exp_shifted(float* x, std::int64_t n, float shift) {
  constexpr std::uint32_t kSign = 0x80000000U;
  constexpr std::uint32_t kLowBits = 0xC2AEAC4FU;   // -87.33654f
  constexpr std::uint32_t kHighBits = 0x42B00000U;  // 88.0f
  constexpr std::uint32_t kInfBits = 0x7F800000U;
  constexpr std::uint32_t kQuietNanBits = 0x7FC00000U;  // OR-ed into any float: a NaN
  for (std::int64_t c = 0; c < n; ++c) {
    const std::uint32_t raw = std::bit_cast<std::uint32_t>(x[c] - shift);
    // Floats of one sign order like their bit patterns (by magnitude).
    const std::uint32_t limit = raw < kSign ? kHighBits : kLowBits;
    const std::uint32_t bits = raw < limit ? raw : limit;
    const float a = std::bit_cast<float>(bits);
    const float t = a * 1.44269504088896341F + 12582912.0F;  // adding 1.5·2^23 rounds a·log2(e) to an integer
    const float fn = t - 12582912.0F;
    const std::int32_t n2 = std::bit_cast<std::int32_t>(t) - 0x4B400000;  // that integer, in [-126, 127]
    const float r = (a - fn * 0.693359375F) + fn * 2.12194440e-4F;          // a - n·ln2 in two parts
    float y = 1.9875691500e-4F;
    y = y * r + 1.3981999507e-3F;
    y = y * r + 8.3334519073e-3F;
    y = y * r + 4.1665795894e-2F;
    y = y * r + 1.6666665459e-1F;
    y = y * r + 5.0000001201e-1F;
    y = y * r * r + r + 1.0F;
    const float result = y * std::bit_cast<float>(static_cast<std::uint32_t>(n2 + 127) << 23);  // · 2^n
    const bool nan = (raw & ~kSign) > kInfBits;
    x[c] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(result) | (nan ? kQuietNanBits : 0U));
  }
}

void check_tiles(FlashTiles tiles) {
  if (tiles.query_rows < 1 || tiles.key_rows < 1) {
    throw ValueError("[flash_attention] tiles must be positive, got " + std::to_string(tiles.query_rows) + "x" +
                     std::to_string(tiles.key_rows));
  }
}

}  // namespace

FlashTiles flash_default_tiles(std::int64_t head_width) {
  // OpenBLAS runs a GEMM on the calling thread when M·N·K <= 65536·4; every
  // tile product here has M·N·K = query_rows·key_rows·D.
  constexpr std::int64_t kSingleThreadedGemm = std::int64_t{1} << 18;
  FlashTiles tiles;
  while (tiles.key_rows > 16 && tiles.query_rows * tiles.key_rows * head_width > kSingleThreadedGemm) {
    tiles.key_rows /= 2;
  }
  while (tiles.query_rows > 16 && tiles.query_rows * tiles.key_rows * head_width > kSingleThreadedGemm) {
    tiles.query_rows /= 2;
  }
  return tiles;
}

Tensor flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale, FlashTiles tiles,
                               Tensor& lse) {
  check_tiles(tiles);
  const std::int64_t B = q.size(0);
  const std::int64_t H = q.size(1);
  const std::int64_t T = q.size(2);
  const std::int64_t D = q.size(3);
  const std::int64_t br = tiles.query_rows;
  const std::int64_t bc = tiles.key_rows;
  Tensor out = Tensor::empty(q.shape());  // (B, H, T, D)
  lse = Tensor::empty({B, H, T});          // (B, H, T)
  const std::int64_t q_tiles = (T + br - 1) / br;
  const std::int64_t items = B * H * q_tiles;
  Workspace ws(br * bc + 2 * br);  // S/P (br, bc), running max m (br), running sum l (br)
  const float* pq = q.data();
  const float* pk = k.data();
  const float* pv = v.data();
  float* po = out.data();
  float* pl = lse.data();

  // Items (bh, query tile) are independent and each is computed by one
  // thread. Round-robin over items whose tile order reverses on odd pairs
  // keeps the causal triangle's cost balanced.
#pragma omp parallel for schedule(static, 1) if (B * H * T * T > kParallelThreshold)
  for (std::int64_t item = 0; item < items; ++item) {
    const std::int64_t bh = item / q_tiles;
    const std::int64_t tile = bh % 2 == 0 ? item % q_tiles : q_tiles - 1 - item % q_tiles;
    const std::int64_t i0 = tile * br;
    const std::int64_t rows = std::min(br, T - i0);
    const float* qi = pq + (bh * T + i0) * D;  // (rows, D)
    const float* kb = pk + bh * T * D;         // (T, D)
    const float* vb = pv + bh * T * D;         // (T, D)
    float* oi = po + (bh * T + i0) * D;        // (rows, D): unnormalized accumulator until the end
    float* s = ws.slice();                     // (rows, bc) scores, then probabilities
    float* m = s + br * bc;                    // (rows)
    float* l = m + br;                         // (rows)
    std::fill(oi, oi + rows * D, 0.0F);
    std::fill(m, m + rows, kNegInf);
    std::fill(l, l + rows, 0.0F);
    const std::int64_t key_end = i0 + rows;  // keys >= key_end are masked for every row of this tile
    for (std::int64_t j0 = 0; j0 < key_end; j0 += bc) {
      const std::int64_t cols = std::min(bc, key_end - j0);
      gemm(false, true, rows, cols, D, scale, qi, D, kb + j0 * D, D, 0.0F, s, bc);  // S = Q Kᵀ · scale
      for (std::int64_t r = 0; r < rows; ++r) {
        float* sr = s + r * bc;
        const std::int64_t valid = std::min(cols, i0 + r - j0 + 1);  // keys j <= i
        if (valid <= 0) {  // whole row masked in this tile: contributes nothing
          std::fill(sr, sr + cols, 0.0F);
          continue;
        }
        float mx = m[r];
        for (std::int64_t c = 0; c < valid; ++c) mx = std::max(mx, sr[c]);
        const float alpha = std::exp(m[r] - mx);  // 0 on the first tile (m = -inf)
        exp_shifted(sr, valid, mx);
        float total = 0.0F;
        for (std::int64_t c = 0; c < valid; ++c) total += sr[c];
        std::fill(sr + valid, sr + cols, 0.0F);
        l[r] = l[r] * alpha + total;
        m[r] = mx;
        if (alpha != 1.0F) {
          float* orow = oi + r * D;
          for (std::int64_t d = 0; d < D; ++d) orow[d] *= alpha;
        }
      }
      gemm(false, false, rows, D, cols, 1.0F, s, bc, vb + j0 * D, D, 1.0F, oi, D);  // O += P V
    }
    float* li = pl + bh * T + i0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0F / l[r];
      float* orow = oi + r * D;
      for (std::int64_t d = 0; d < D; ++d) orow[d] *= inv;
      li[r] = m[r] + std::log(l[r]);
    }
  }
  return out;
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& d_out, float scale, FlashTiles tiles, Tensor& dq, Tensor& dk, Tensor& dv) {
  check_tiles(tiles);
  const std::int64_t B = q.size(0);
  const std::int64_t H = q.size(1);
  const std::int64_t T = q.size(2);
  const std::int64_t D = q.size(3);
  const std::int64_t br = tiles.query_rows;
  const std::int64_t bc = tiles.key_rows;
  dq = Tensor::zeros(q.shape());  // (B, H, T, D), += over key tiles
  dk = Tensor::zeros(k.shape());  // (B, H, T, D), += over query tiles
  dv = Tensor::zeros(v.shape());  // (B, H, T, D), += over query tiles
  Tensor delta = Tensor::empty({B, H, T});  // (B, H, T): rowsum(dO ∘ O)
  Workspace ws(2 * br * bc);                // P (br, bc), dP then dS (br, bc)
  const float* pq = q.data();
  const float* pk = k.data();
  const float* pv = v.data();
  const float* po = out.data();
  const float* pdo = d_out.data();
  const float* pl = lse.data();
  float* pdq = dq.data();
  float* pdk = dk.data();
  float* pdv = dv.data();
  float* pdelta = delta.data();

  // Whole (b, h) pairs per thread: dQ, dK, dV of a pair are accumulated by
  // one thread in a fixed tile order (no atomics, no cross-thread sums).
#pragma omp parallel for schedule(static) if (B * H * T * T > kParallelThreshold)
  for (std::int64_t bh = 0; bh < B * H; ++bh) {
    const std::int64_t base = bh * T * D;
    const float* lb = pl + bh * T;
    float* db = pdelta + bh * T;
    for (std::int64_t i = 0; i < T; ++i) {
      const float* o = po + base + i * D;
      const float* g = pdo + base + i * D;
      float acc = 0.0F;
      for (std::int64_t d = 0; d < D; ++d) acc += g[d] * o[d];
      db[i] = acc;
    }
    float* p = ws.slice();  // (rows, bc)
    float* ds = p + br * bc;  // (rows, bc)
    for (std::int64_t j0 = 0; j0 < T; j0 += bc) {
      const std::int64_t cols = std::min(bc, T - j0);
      const float* kj = pk + base + j0 * D;  // (cols, D)
      const float* vj = pv + base + j0 * D;  // (cols, D)
      float* dkj = pdk + base + j0 * D;      // (cols, D)
      float* dvj = pdv + base + j0 * D;      // (cols, D)
      // Query tiles that can see key j0 or later: i >= j0.
      for (std::int64_t i0 = (j0 / br) * br; i0 < T; i0 += br) {
        const std::int64_t rows = std::min(br, T - i0);
        const float* qi = pq + base + i0 * D;    // (rows, D)
        const float* doi = pdo + base + i0 * D;  // (rows, D)
        float* dqi = pdq + base + i0 * D;        // (rows, D)
        gemm(false, true, rows, cols, D, scale, qi, D, kj, D, 0.0F, p, bc);  // S = Q Kᵀ · scale
        for (std::int64_t r = 0; r < rows; ++r) {
          float* pr = p + r * bc;
          const float li = lb[i0 + r];
          const std::int64_t valid = std::clamp<std::int64_t>(i0 + r - j0 + 1, 0, cols);  // keys j <= i
          exp_shifted(pr, valid, li);  // P = exp(S − L)
          std::fill(pr + valid, pr + cols, 0.0F);
        }
        gemm(true, false, cols, D, rows, 1.0F, p, bc, doi, D, 1.0F, dvj, D);   // dV += Pᵀ dO
        gemm(false, true, rows, cols, D, 1.0F, doi, D, vj, D, 0.0F, ds, bc);  // dP = dO Vᵀ
        for (std::int64_t r = 0; r < rows; ++r) {
          const float* pr = p + r * bc;
          float* dsr = ds + r * bc;
          const float di = db[i0 + r];
          for (std::int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] - di);  // dS = P ∘ (dP − Δ)
        }
        gemm(false, false, rows, D, cols, scale, ds, bc, kj, D, 1.0F, dqi, D);  // dQ += dS K · scale
        gemm(true, false, cols, D, rows, scale, ds, bc, qi, D, 1.0F, dkj, D);   // dK += dSᵀ Q · scale
      }
    }
  }
}

}  // namespace riftco_transformer::cpu
