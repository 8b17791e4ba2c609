// FlashAttention-2 style causal attention. The scalar kernels below are
// written for clarity; head widths up to 64 take the register-tiled kernels
// further down (same blocks, same summation order, same bits).
//
// Forward: one block per (b, h, query tile of `tile` rows). Q's tile stays in
// shared memory; key/value tiles stream through it; each row keeps a running
// max m, sum l and unnormalized output O (online softmax), and the block
// writes O / l and lse = m + log l.
// Backward: delta = rowsum(dO ∘ O) first; then one block per (b, h, key tile)
// recomputes P = exp(S·scale − lse) and dS = P ∘ (dP − delta)·scale for every
// query tile that sees its keys and accumulates dK, dV in shared memory; and
// one block per (b, h, query tile) recomputes the same dS for every key tile
// its rows see and accumulates dQ. Every output element is summed by one
// thread in a fixed order (no atomics): the bits are the same every run.
// Masked terms (key j > query i) are left out of every sum, not added as 0.
#include <cmath>
#include <string>

#include "cuda_common.hpp"
#include "flash_attention.hpp"

namespace riftco_transformer::cuda {
namespace {

constexpr int kFlashThreads = 128;

/// Where the (b, h) pair's row t starts in a view.
struct View {
  const float* data;
  std::int64_t batch_stride, head_stride, row_stride;
  __device__ const float* row(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return data + b * batch_stride + h * head_stride + t * row_stride;
  }
};
struct OutView {
  float* data;
  std::int64_t batch_stride, head_stride, row_stride;
  __device__ float* row(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return data + b * batch_stride + h * head_stride + t * row_stride;
  }
};
View view_of(HeadView v) { return {v.data, v.batch_stride, v.head_stride, v.row_stride}; }
OutView view_of(MutableHeadView v) { return {v.data, v.batch_stride, v.head_stride, v.row_stride}; }

/// Copies `rows` rows of D floats from (b, h, t0...) into shared memory with row stride `ld`.
__device__ void load_rows(const View& v, std::int64_t b, std::int64_t h, std::int64_t t0, int rows, int D, float* dst,
                          int ld) {
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const int r = e / D;
    const int d = e % D;
    dst[r * ld + d] = v.row(b, h, t0 + r)[d];
  }
}

__device__ float dot(const float* a, const float* b, int D) {
  float s = 0.0F;
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

// ---- forward ------------------------------------------------------------------

/// Shared floats of the forward: Q, O (tile·D), K (tile·(D+1)), V (tile·D), S (tile²), m, l, alpha.
std::int64_t forward_floats(int tile, int D) {
  return std::int64_t{tile} * D * 3 + std::int64_t{tile} * (D + 1) + std::int64_t{tile} * tile + 3 * tile;
}

__global__ void flash_forward_kernel(int H, int T, int D, int tile, View q, View k, View v, OutView out, float* lse,
                                     float scale) {
  extern __shared__ float smem[];
  const int tiles = (T + tile - 1) / tile;
  const std::int64_t bh = blockIdx.x / tiles;
  const std::int64_t b = bh / H;
  const std::int64_t h = bh % H;
  const int i0 = static_cast<int>(blockIdx.x % tiles) * tile;
  const int rows = min(tile, T - i0);
  const int ldk = D + 1;
  float* qs = smem;              // (tile, D)
  float* os = qs + tile * D;     // (tile, D): unnormalized output
  float* ks = os + tile * D;     // (tile, D + 1)
  float* vs = ks + tile * ldk;   // (tile, D)
  float* ss = vs + tile * D;     // (tile, tile): scores, then probabilities
  float* ms = ss + tile * tile;  // (tile): running max
  float* ls = ms + tile;         // (tile): running sum
  float* as = ls + tile;         // (tile): this key tile's rescale factor

  load_rows(q, b, h, i0, rows, D, qs, D);
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) os[e] = 0.0F;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    ms[r] = -INFINITY;
    ls[r] = 0.0F;
  }
  const int key_end = i0 + rows;  // keys >= key_end are masked for every row of the tile
  for (int j0 = 0; j0 < key_end; j0 += tile) {
    const int cols = min(tile, key_end - j0);
    __syncthreads();  // the previous key tile is done with ks, vs, ss
    load_rows(k, b, h, j0, cols, D, ks, ldk);
    load_rows(v, b, h, j0, cols, D, vs, D);
    __syncthreads();
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {  // S = Q Kᵀ·scale on visible entries
      const int r = e / cols;
      const int c = e % cols;
      ss[r * tile + c] = j0 + c <= i0 + r ? dot(qs + r * D, ks + c * ldk, D) * scale : -INFINITY;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {  // online softmax, one thread per row
      float* sr = ss + r * tile;
      const int valid = min(cols, i0 + r - j0 + 1);  // keys j <= i
      if (valid <= 0) {
        as[r] = 1.0F;
        continue;
      }
      float mx = ms[r];
      for (int c = 0; c < valid; ++c) mx = mx < sr[c] ? sr[c] : mx;
      const float alpha = expf(ms[r] - mx);  // 0 on the first tile (m = -inf)
      float total = 0.0F;
      for (int c = 0; c < valid; ++c) {
        sr[c] = expf(sr[c] - mx);
        total += sr[c];
      }
      ls[r] = ls[r] * alpha + total;
      ms[r] = mx;
      as[r] = alpha;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {  // O = O·alpha + P V
      const int r = e / D;
      const int d = e % D;
      const int valid = min(cols, i0 + r - j0 + 1);
      float acc = os[e] * as[r];
      for (int c = 0; c < valid; ++c) acc += ss[r * tile + c] * vs[c * D + d];
      os[e] = acc;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const int r = e / D;
    const int d = e % D;
    out.row(b, h, i0 + r)[d] = os[e] * (1.0F / ls[r]);
  }
  for (int r = threadIdx.x; r < rows; r += blockDim.x) lse[bh * T + i0 + r] = ms[r] + logf(ls[r]);
}

// ---- backward -----------------------------------------------------------------

/// delta[bh·T + t] = Σ_d dO·O of each row.
__global__ void flash_delta_kernel(int H, int T, int D, View out, View d_out, float* delta, std::int64_t rows) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < rows;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = e / T;
    const std::int64_t t = e % T;
    delta[e] = dot(d_out.row(bh / H, bh % H, t), out.row(bh / H, bh % H, t), D);
  }
}

/// P and dS of query row r (i0 + r) and key column c (j0 + c), 0 when masked.
struct Grad {
  float p, ds;
};
__device__ Grad grad_entry(const float* q_row, const float* do_row, const float* k_row, const float* v_row, int D,
                           float lse, float delta, float scale) {
  const float p = expf(dot(q_row, k_row, D) * scale - lse);
  const float dp = dot(do_row, v_row, D);
  return {p, p * (dp - delta) * scale};
}

/// Shared floats of the dK/dV kernel: K, V (tile·(D+1)), dK, dV, Q, dO (tile·D), P, dS (tile²), lse, delta.
std::int64_t dkdv_floats(int tile, int D) {
  return std::int64_t{2} * tile * (D + 1) + std::int64_t{4} * tile * D + std::int64_t{2} * tile * tile + 2 * tile;
}

__global__ void flash_dkdv_kernel(int H, int T, int D, int tile, View q, View k, View v, View d_out,
                                  const float* lse, const float* delta, OutView dk, OutView dv, float scale) {
  extern __shared__ float smem[];
  const int tiles = (T + tile - 1) / tile;
  const std::int64_t bh = blockIdx.x / tiles;
  const std::int64_t b = bh / H;
  const std::int64_t h = bh % H;
  const int j0 = static_cast<int>(blockIdx.x % tiles) * tile;
  const int cols = min(tile, T - j0);
  const int ld = D + 1;
  float* ks = smem;               // (tile, D + 1)
  float* vs = ks + tile * ld;     // (tile, D + 1)
  float* dks = vs + tile * ld;    // (tile, D)
  float* dvs = dks + tile * D;    // (tile, D)
  float* qs = dvs + tile * D;     // (tile, D)
  float* dos = qs + tile * D;     // (tile, D)
  float* ps = dos + tile * D;     // (tile, tile)
  float* dss = ps + tile * tile;  // (tile, tile)
  float* lses = dss + tile * tile;
  float* deltas = lses + tile;

  load_rows(k, b, h, j0, cols, D, ks, ld);
  load_rows(v, b, h, j0, cols, D, vs, ld);
  for (int e = threadIdx.x; e < cols * D; e += blockDim.x) {
    dks[e] = 0.0F;
    dvs[e] = 0.0F;
  }
  for (int i0 = (j0 / tile) * tile; i0 < T; i0 += tile) {  // query tiles that see key j0 or later
    const int rows = min(tile, T - i0);
    __syncthreads();  // the previous query tile is done with qs, dos, ps, dss
    load_rows(q, b, h, i0, rows, D, qs, D);
    load_rows(d_out, b, h, i0, rows, D, dos, D);
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      lses[r] = lse[bh * T + i0 + r];
      deltas[r] = delta[bh * T + i0 + r];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
      const int r = e / cols;
      const int c = e % cols;
      Grad g{0.0F, 0.0F};
      if (j0 + c <= i0 + r) g = grad_entry(qs + r * D, dos + r * D, ks + c * ld, vs + c * ld, D, lses[r], deltas[r], scale);
      ps[r * tile + c] = g.p;
      dss[r * tile + c] = g.ds;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < cols * D; e += blockDim.x) {  // dV += Pᵀ dO, dK += dSᵀ Q over visible rows
      const int c = e / D;
      const int d = e % D;
      float acc_v = dvs[e];
      float acc_k = dks[e];
      for (int r = max(0, j0 + c - i0); r < rows; ++r) {
        acc_v += ps[r * tile + c] * dos[r * D + d];
        acc_k += dss[r * tile + c] * qs[r * D + d];
      }
      dvs[e] = acc_v;
      dks[e] = acc_k;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < cols * D; e += blockDim.x) {
    const int c = e / D;
    const int d = e % D;
    dk.row(b, h, j0 + c)[d] = dks[e];
    dv.row(b, h, j0 + c)[d] = dvs[e];
  }
}

/// Shared floats of the dQ kernel: Q, dO, dQ (tile·D), K, V (tile·(D+1)), dS (tile²), lse, delta.
std::int64_t dq_floats(int tile, int D) {
  return std::int64_t{3} * tile * D + std::int64_t{2} * tile * (D + 1) + std::int64_t{tile} * tile + 2 * tile;
}

__global__ void flash_dq_kernel(int H, int T, int D, int tile, View q, View k, View v, View d_out, const float* lse,
                                const float* delta, OutView dq, float scale) {
  extern __shared__ float smem[];
  const int tiles = (T + tile - 1) / tile;
  const std::int64_t bh = blockIdx.x / tiles;
  const std::int64_t b = bh / H;
  const std::int64_t h = bh % H;
  const int i0 = static_cast<int>(blockIdx.x % tiles) * tile;
  const int rows = min(tile, T - i0);
  const int ld = D + 1;
  float* qs = smem;              // (tile, D)
  float* dos = qs + tile * D;    // (tile, D)
  float* dqs = dos + tile * D;   // (tile, D)
  float* ks = dqs + tile * D;    // (tile, D + 1)
  float* vs = ks + tile * ld;    // (tile, D + 1)
  float* dss = vs + tile * ld;   // (tile, tile)
  float* lses = dss + tile * tile;
  float* deltas = lses + tile;

  load_rows(q, b, h, i0, rows, D, qs, D);
  load_rows(d_out, b, h, i0, rows, D, dos, D);
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) dqs[e] = 0.0F;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    lses[r] = lse[bh * T + i0 + r];
    deltas[r] = delta[bh * T + i0 + r];
  }
  const int key_end = i0 + rows;
  for (int j0 = 0; j0 < key_end; j0 += tile) {
    const int cols = min(tile, key_end - j0);
    __syncthreads();  // the previous key tile is done with ks, vs, dss
    load_rows(k, b, h, j0, cols, D, ks, ld);
    load_rows(v, b, h, j0, cols, D, vs, ld);
    __syncthreads();
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
      const int r = e / cols;
      const int c = e % cols;
      float ds = 0.0F;
      if (j0 + c <= i0 + r) ds = grad_entry(qs + r * D, dos + r * D, ks + c * ld, vs + c * ld, D, lses[r], deltas[r], scale).ds;
      dss[r * tile + c] = ds;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {  // dQ += dS K over visible keys
      const int r = e / D;
      const int d = e % D;
      const int valid = min(cols, i0 + r - j0 + 1);
      float acc = dqs[e];
      for (int c = 0; c < valid; ++c) acc += dss[r * tile + c] * ks[c * ld + d];
      dqs[e] = acc;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) dq.row(b, h, i0 + e / D)[e % D] = dqs[e];
}

// ---- backward, register-tiled path (tile 32, 128 threads, D <= 64) -----------------
//
// The same blocks, tiles and per-element summation order as the kernels
// above (every dot product over d in order, every dK/dV/dQ element over its
// rows or keys in order, fma off), so the bits are the same; each thread
// computes a 2x4 block of P/dS and a 4x4 block of its outputs in registers
// instead of one element at a time from shared memory. Shared rows are padded
// (D + 1, 33) so a warp's reads fall in distinct banks.

constexpr int kFastTile = 32;
constexpr int kFastMaxD = 64;
constexpr int kLdS = kFastTile + 1;

/// P (when ps is set) and dS of the (query tile i0, key tile j0) pair into ps/dss (row stride kLdS).
/// Thread t: rows t/8 + 16n (n < 2), columns t%8 + 8m (m < 4).
__device__ void fast_grad_tile(const float* qs, const float* dos, const float* ks, const float* vs, int ld, int D,
                               const float* lses, const float* deltas, int i0, int j0, int rows, int cols,
                               float scale, float* ps, float* dss) {
  const int cg = threadIdx.x % 8;
  const int rg = threadIdx.x / 8;
  int ri[2];
  int ci[4];
  for (int n = 0; n < 2; ++n) ri[n] = min(rg + 16 * n, rows - 1) * ld;
  for (int m = 0; m < 4; ++m) ci[m] = min(cg + 8 * m, cols - 1) * ld;
  float sqk[2][4] = {};
  float sdv[2][4] = {};
  for (int d = 0; d < D; ++d) {
    float qv[2], ov[2], kv[4], vv[4];
    for (int n = 0; n < 2; ++n) {
      qv[n] = qs[ri[n] + d];
      ov[n] = dos[ri[n] + d];
    }
    for (int m = 0; m < 4; ++m) {
      kv[m] = ks[ci[m] + d];
      vv[m] = vs[ci[m] + d];
    }
    for (int n = 0; n < 2; ++n) {
      for (int m = 0; m < 4; ++m) {
        sqk[n][m] += qv[n] * kv[m];
        sdv[n][m] += ov[n] * vv[m];
      }
    }
  }
  for (int n = 0; n < 2; ++n) {
    const int r = rg + 16 * n;
    if (r >= rows) continue;
    for (int m = 0; m < 4; ++m) {
      const int c = cg + 8 * m;
      if (c >= cols) continue;
      float p = 0.0F;
      float ds = 0.0F;
      if (j0 + c <= i0 + r) {
        p = expf(sqk[n][m] * scale - lses[r]);
        ds = p * (sdv[n][m] - deltas[r]) * scale;
      }
      if (ps != nullptr) ps[r * kLdS + c] = p;
      dss[r * kLdS + c] = ds;
    }
  }
}

/// Shared floats of the fast dK/dV kernel: K, V, Q, dO (32·(D+1)), P, dS (32·33), lse, delta.
std::int64_t fast_dkdv_floats(int D) {
  return std::int64_t{4} * kFastTile * (D + 1) + std::int64_t{2} * kFastTile * kLdS + 2 * kFastTile;
}

__global__ void flash_dkdv_fast_kernel(int H, int T, int D, View q, View k, View v, View d_out, const float* lse,
                                       const float* delta, OutView dk, OutView dv, float scale) {
  extern __shared__ float smem[];
  constexpr int tile = kFastTile;
  const int tiles = (T + tile - 1) / tile;
  const std::int64_t bh = blockIdx.x / tiles;
  const std::int64_t b = bh / H;
  const std::int64_t h = bh % H;
  const int j0 = static_cast<int>(blockIdx.x % tiles) * tile;
  const int cols = min(tile, T - j0);
  const int ld = D + 1;
  float* ks = smem;                // (tile, D + 1)
  float* vs = ks + tile * ld;      // (tile, D + 1)
  float* qs = vs + tile * ld;      // (tile, D + 1)
  float* dos = qs + tile * ld;     // (tile, D + 1)
  float* ps = dos + tile * ld;     // (tile, 33)
  float* dss = ps + tile * kLdS;   // (tile, 33)
  float* lses = dss + tile * kLdS;
  float* deltas = lses + tile;
  // Outputs of this thread: columns cg + 8m, head dims dg + 16k (m, k < 4).
  const int cg = threadIdx.x % 8;
  const int dg = threadIdx.x / 8;
  int dd[4];
  for (int kk = 0; kk < 4; ++kk) dd[kk] = min(dg + 16 * kk, D - 1);
  float acc_v[4][4] = {};
  float acc_k[4][4] = {};

  load_rows(k, b, h, j0, cols, D, ks, ld);
  load_rows(v, b, h, j0, cols, D, vs, ld);
  for (int i0 = (j0 / tile) * tile; i0 < T; i0 += tile) {  // query tiles that see key j0 or later
    const int rows = min(tile, T - i0);
    __syncthreads();  // the previous query tile is done with qs, dos, ps, dss
    load_rows(q, b, h, i0, rows, D, qs, ld);
    load_rows(d_out, b, h, i0, rows, D, dos, ld);
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      lses[r] = lse[bh * T + i0 + r];
      deltas[r] = delta[bh * T + i0 + r];
    }
    __syncthreads();
    fast_grad_tile(qs, dos, ks, vs, ld, D, lses, deltas, i0, j0, rows, cols, scale, ps, dss);
    __syncthreads();
    int first[4];  // first visible row of each column
    for (int m = 0; m < 4; ++m) first[m] = max(0, j0 + cg + 8 * m - i0);
    for (int r = first[0]; r < rows; ++r) {  // dV += Pᵀ dO, dK += dSᵀ Q, rows in order
      float o[4], qq[4];
      for (int kk = 0; kk < 4; ++kk) {
        o[kk] = dos[r * ld + dd[kk]];
        qq[kk] = qs[r * ld + dd[kk]];
      }
      for (int m = 0; m < 4; ++m) {
        if (r < first[m]) continue;
        const float p = ps[r * kLdS + cg + 8 * m];
        const float ds = dss[r * kLdS + cg + 8 * m];
        for (int kk = 0; kk < 4; ++kk) {
          acc_v[m][kk] += p * o[kk];
          acc_k[m][kk] += ds * qq[kk];
        }
      }
    }
  }
  for (int m = 0; m < 4; ++m) {
    const int c = cg + 8 * m;
    if (c >= cols) continue;
    for (int kk = 0; kk < 4; ++kk) {
      const int d = dg + 16 * kk;
      if (d >= D) continue;
      dk.row(b, h, j0 + c)[d] = acc_k[m][kk];
      dv.row(b, h, j0 + c)[d] = acc_v[m][kk];
    }
  }
}

/// Shared floats of the fast dQ kernel: Q, dO, K, V (32·(D+1)), dS (32·33), lse, delta.
std::int64_t fast_dq_floats(int D) {
  return std::int64_t{4} * kFastTile * (D + 1) + std::int64_t{kFastTile} * kLdS + 2 * kFastTile;
}

__global__ void flash_dq_fast_kernel(int H, int T, int D, View q, View k, View v, View d_out, const float* lse,
                                     const float* delta, OutView dq, float scale) {
  extern __shared__ float smem[];
  constexpr int tile = kFastTile;
  const int tiles = (T + tile - 1) / tile;
  const std::int64_t bh = blockIdx.x / tiles;
  const std::int64_t b = bh / H;
  const std::int64_t h = bh % H;
  const int i0 = static_cast<int>(blockIdx.x % tiles) * tile;
  const int rows = min(tile, T - i0);
  const int ld = D + 1;
  float* qs = smem;               // (tile, D + 1)
  float* dos = qs + tile * ld;    // (tile, D + 1)
  float* ks = dos + tile * ld;    // (tile, D + 1)
  float* vs = ks + tile * ld;     // (tile, D + 1)
  float* dss = vs + tile * ld;    // (tile, 33)
  float* lses = dss + tile * kLdS;
  float* deltas = lses + tile;
  // Outputs of this thread: rows rg + 8n, head dims dg + 16k (n, k < 4).
  const int rg = threadIdx.x % 8;
  const int dg = threadIdx.x / 8;
  int dd[4];
  for (int kk = 0; kk < 4; ++kk) dd[kk] = min(dg + 16 * kk, D - 1);
  float acc[4][4] = {};

  load_rows(q, b, h, i0, rows, D, qs, ld);
  load_rows(d_out, b, h, i0, rows, D, dos, ld);
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    lses[r] = lse[bh * T + i0 + r];
    deltas[r] = delta[bh * T + i0 + r];
  }
  const int key_end = i0 + rows;
  for (int j0 = 0; j0 < key_end; j0 += tile) {
    const int cols = min(tile, key_end - j0);
    __syncthreads();  // the previous key tile is done with ks, vs, dss
    load_rows(k, b, h, j0, cols, D, ks, ld);
    load_rows(v, b, h, j0, cols, D, vs, ld);
    __syncthreads();
    fast_grad_tile(qs, dos, ks, vs, ld, D, lses, deltas, i0, j0, rows, cols, scale, nullptr, dss);
    __syncthreads();
    int valid[4];  // visible keys of each row in this tile
    for (int n = 0; n < 4; ++n) valid[n] = min(cols, i0 + rg + 8 * n - j0 + 1);
    for (int c = 0; c < cols; ++c) {  // dQ += dS K, keys in order
      float kv[4];
      for (int kk = 0; kk < 4; ++kk) kv[kk] = ks[c * ld + dd[kk]];
      for (int n = 0; n < 4; ++n) {
        if (c >= valid[n]) continue;
        const float ds = dss[(rg + 8 * n) * kLdS + c];
        for (int kk = 0; kk < 4; ++kk) acc[n][kk] += ds * kv[kk];
      }
    }
  }
  for (int n = 0; n < 4; ++n) {
    const int r = rg + 8 * n;
    if (r >= rows) continue;
    for (int kk = 0; kk < 4; ++kk) {
      const int d = dg + 16 * kk;
      if (d < D) dq.row(b, h, i0 + r)[d] = acc[n][kk];
    }
  }
}

/// Shared floats of the fast forward: Q, K, V (32·(D+1)), S (32·33), m, l, alpha.
std::int64_t fast_forward_floats(int D) {
  return std::int64_t{3} * kFastTile * (D + 1) + std::int64_t{kFastTile} * kLdS + 3 * kFastTile;
}

/// The forward of flash_forward_kernel with register tiles: S by 2x4 blocks per thread (dot products over d in
/// order), the online softmax one thread per row as there, O by 4x4 blocks kept in registers (keys in order).
__global__ void flash_forward_fast_kernel(int H, int T, int D, View q, View k, View v, OutView out, float* lse,
                                          float scale) {
  extern __shared__ float smem[];
  constexpr int tile = kFastTile;
  const int tiles = (T + tile - 1) / tile;
  const std::int64_t bh = blockIdx.x / tiles;
  const std::int64_t b = bh / H;
  const std::int64_t h = bh % H;
  const int i0 = static_cast<int>(blockIdx.x % tiles) * tile;
  const int rows = min(tile, T - i0);
  const int ld = D + 1;
  float* qs = smem;              // (tile, D + 1)
  float* ks = qs + tile * ld;    // (tile, D + 1)
  float* vs = ks + tile * ld;    // (tile, D + 1)
  float* ss = vs + tile * ld;    // (tile, 33): scores, then probabilities
  float* ms = ss + tile * kLdS;  // (tile): running max
  float* ls = ms + tile;         // (tile): running sum
  float* as = ls + tile;         // (tile): this key tile's rescale factor
  const int cg = threadIdx.x % 8;  // S: rows threadIdx.x/8 + 16n, columns cg + 8m
  const int sg = threadIdx.x / 8;
  const int rg = threadIdx.x % 8;  // O: rows rg + 8n, head dims dg + 16k
  const int dg = threadIdx.x / 8;
  int dd[4];
  for (int kk = 0; kk < 4; ++kk) dd[kk] = min(dg + 16 * kk, D - 1);
  float acc[4][4] = {};

  load_rows(q, b, h, i0, rows, D, qs, ld);
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    ms[r] = -INFINITY;
    ls[r] = 0.0F;
  }
  const int key_end = i0 + rows;  // keys >= key_end are masked for every row of the tile
  for (int j0 = 0; j0 < key_end; j0 += tile) {
    const int cols = min(tile, key_end - j0);
    __syncthreads();  // the previous key tile is done with ks, vs, ss
    load_rows(k, b, h, j0, cols, D, ks, ld);
    load_rows(v, b, h, j0, cols, D, vs, ld);
    __syncthreads();
    {  // S = Q Kᵀ·scale on visible entries
      int ri[2];
      int ci[4];
      for (int n = 0; n < 2; ++n) ri[n] = min(sg + 16 * n, rows - 1) * ld;
      for (int m = 0; m < 4; ++m) ci[m] = min(cg + 8 * m, cols - 1) * ld;
      float sqk[2][4] = {};
      for (int d = 0; d < D; ++d) {
        float qv[2], kv[4];
        for (int n = 0; n < 2; ++n) qv[n] = qs[ri[n] + d];
        for (int m = 0; m < 4; ++m) kv[m] = ks[ci[m] + d];
        for (int n = 0; n < 2; ++n) {
          for (int m = 0; m < 4; ++m) sqk[n][m] += qv[n] * kv[m];
        }
      }
      for (int n = 0; n < 2; ++n) {
        const int r = sg + 16 * n;
        for (int m = 0; m < 4; ++m) {
          const int c = cg + 8 * m;
          if (r < rows && c < cols) ss[r * kLdS + c] = j0 + c <= i0 + r ? sqk[n][m] * scale : -INFINITY;
        }
      }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {  // online softmax, one thread per row
      float* sr = ss + r * kLdS;
      const int valid = min(cols, i0 + r - j0 + 1);  // keys j <= i
      if (valid <= 0) {
        as[r] = 1.0F;
        continue;
      }
      float mx = ms[r];
      for (int c = 0; c < valid; ++c) mx = mx < sr[c] ? sr[c] : mx;
      const float alpha = expf(ms[r] - mx);  // 0 on the first tile (m = -inf)
      float total = 0.0F;
      for (int c = 0; c < valid; ++c) {
        sr[c] = expf(sr[c] - mx);
        total += sr[c];
      }
      ls[r] = ls[r] * alpha + total;
      ms[r] = mx;
      as[r] = alpha;
    }
    __syncthreads();
    int valid[4];
    for (int n = 0; n < 4; ++n) {  // O = O·alpha + P V
      const int r = min(rg + 8 * n, rows - 1);
      valid[n] = min(cols, i0 + r - j0 + 1);
      const float alpha = as[r];
      for (int kk = 0; kk < 4; ++kk) acc[n][kk] = acc[n][kk] * alpha;
    }
    for (int c = 0; c < cols; ++c) {
      float vv[4];
      for (int kk = 0; kk < 4; ++kk) vv[kk] = vs[c * ld + dd[kk]];
      for (int n = 0; n < 4; ++n) {
        if (c >= valid[n]) continue;
        const float p = ss[min(rg + 8 * n, rows - 1) * kLdS + c];
        for (int kk = 0; kk < 4; ++kk) acc[n][kk] += p * vv[kk];
      }
    }
  }
  __syncthreads();
  for (int n = 0; n < 4; ++n) {
    const int r = rg + 8 * n;
    if (r >= rows) continue;
    for (int kk = 0; kk < 4; ++kk) {
      const int d = dg + 16 * kk;
      if (d < D) out.row(b, h, i0 + r)[d] = acc[n][kk] * (1.0F / ls[r]);
    }
  }
  for (int r = threadIdx.x; r < rows; r += blockDim.x) lse[bh * T + i0 + r] = ms[r] + logf(ls[r]);
}

// ---- launch helpers -------------------------------------------------------------

/// The largest tile (32, 16 or 8 rows) whose shared memory fits the device;
/// sets the kernel's dynamic shared memory limit when above the default 48 KiB.
template <class Kernel, class Floats>
int pick_tile(Kernel kernel, Floats floats, int D, const char* op, std::size_t& bytes) {
  int device = 0;
  detail::check(cudaGetDevice(&device), op, "cudaGetDevice");
  int optin = 0;
  detail::check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), op,
                "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  for (const int tile : {32, 16, 8}) {
    bytes = static_cast<std::size_t>(floats(tile, D)) * sizeof(float);
    if (bytes <= static_cast<std::size_t>(optin)) {
      detail::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                    op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      return tile;
    }
  }
  throw BackendError(std::string("[") + op + "] head width " + std::to_string(D) + " needs " + std::to_string(bytes) +
                     " bytes of shared memory even with 8-row tiles; the device allows " + std::to_string(optin));
}

void check_sizes(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, const char* op) {
  detail::checked_int(H, op, "H");
  detail::checked_int(T, op, "T");
  detail::checked_int(D, op, "D");
  detail::checked_int(B * H * ((T + 7) / 8), op, "blocks (B·H·T/8)");
  detail::checked_int(B * H * T, op, "B·H·T");
}

HeadView heads_of(const Tensor& t) {
  const std::int64_t H = t.size(1), T = t.size(2), D = t.size(3);
  return {t.device_data(), H * T * D, T * D, D};
}
MutableHeadView heads_of(Tensor& t) {
  const std::int64_t H = t.size(1), T = t.size(2), D = t.size(3);
  return {t.device_data(), H * T * D, T * D, D};
}

}  // namespace

void flash_attention_forward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                             HeadView v, MutableHeadView out, float* lse, float scale, FlashTiles /*tiles*/) {
  constexpr const char* op = "flash_attention_forward";
  if (B * H * T == 0) return;
  check_sizes(B, H, T, D, op);
  if (D >= 1 && D <= kFastMaxD && kFlashThreads == 128) {
    const auto bytes = static_cast<std::size_t>(fast_forward_floats(static_cast<int>(D))) * sizeof(float);
    detail::check(cudaFuncSetAttribute(flash_forward_fast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)),
                  op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    flash_forward_fast_kernel<<<static_cast<unsigned>(B * H * ((T + kFastTile - 1) / kFastTile)), kFlashThreads,
                                bytes>>>(static_cast<int>(H), static_cast<int>(T), static_cast<int>(D), view_of(q),
                                         view_of(k), view_of(v), view_of(out), lse, scale);
    detail::check_launch(op, "flash_forward_fast_kernel");
    return;
  }
  std::size_t bytes = 0;
  const int tile = pick_tile(flash_forward_kernel, forward_floats, static_cast<int>(D), op, bytes);
  const std::int64_t blocks = B * H * ((T + tile - 1) / tile);
  flash_forward_kernel<<<static_cast<unsigned>(blocks), kFlashThreads, bytes>>>(
      static_cast<int>(H), static_cast<int>(T), static_cast<int>(D), tile, view_of(q), view_of(k), view_of(v),
      view_of(out), lse, scale);
  detail::check_launch(op, "flash_forward_kernel");
}

void flash_attention_backward(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, HeadView q, HeadView k,
                              HeadView v, HeadView out, HeadView d_out, const float* lse, MutableHeadView dq,
                              MutableHeadView dk, MutableHeadView dv, float scale, FlashTiles /*tiles*/) {
  constexpr const char* op = "flash_attention_backward";
  if (B * H * T == 0) return;
  check_sizes(B, H, T, D, op);
  const int h = static_cast<int>(H), t = static_cast<int>(T), d = static_cast<int>(D);
  const detail::DeviceArray<float> delta(static_cast<std::size_t>(B * H * T), op);  // (B, H, T)
  flash_delta_kernel<<<detail::grid_for(B * H * T), detail::kThreads>>>(h, t, d, view_of(out), view_of(d_out),
                                                                        delta.get(), B * H * T);
  detail::check_launch(op, "flash_delta_kernel");
  if (d >= 1 && d <= kFastMaxD && kFlashThreads == 128) {
    const unsigned blocks = static_cast<unsigned>(B * H * ((T + kFastTile - 1) / kFastTile));
    std::size_t bytes = static_cast<std::size_t>(fast_dkdv_floats(d)) * sizeof(float);
    detail::check(cudaFuncSetAttribute(flash_dkdv_fast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)),
                  op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    flash_dkdv_fast_kernel<<<blocks, kFlashThreads, bytes>>>(h, t, d, view_of(q), view_of(k), view_of(v),
                                                             view_of(d_out), lse, delta.get(), view_of(dk),
                                                             view_of(dv), scale);
    detail::check_launch(op, "flash_dkdv_fast_kernel");
    bytes = static_cast<std::size_t>(fast_dq_floats(d)) * sizeof(float);
    detail::check(cudaFuncSetAttribute(flash_dq_fast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)),
                  op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    flash_dq_fast_kernel<<<blocks, kFlashThreads, bytes>>>(h, t, d, view_of(q), view_of(k), view_of(v),
                                                           view_of(d_out), lse, delta.get(), view_of(dq), scale);
    detail::check_launch(op, "flash_dq_fast_kernel");
    return;
  }
  std::size_t bytes = 0;
  int tile = pick_tile(flash_dkdv_kernel, dkdv_floats, d, op, bytes);
  flash_dkdv_kernel<<<static_cast<unsigned>(B * H * ((T + tile - 1) / tile)), kFlashThreads, bytes>>>(
      h, t, d, tile, view_of(q), view_of(k), view_of(v), view_of(d_out), lse, delta.get(), view_of(dk), view_of(dv),
      scale);
  detail::check_launch(op, "flash_dkdv_kernel");
  tile = pick_tile(flash_dq_kernel, dq_floats, d, op, bytes);
  flash_dq_kernel<<<static_cast<unsigned>(B * H * ((T + tile - 1) / tile)), kFlashThreads, bytes>>>(
      h, t, d, tile, view_of(q), view_of(k), view_of(v), view_of(d_out), lse, delta.get(), view_of(dq), scale);
  detail::check_launch(op, "flash_dq_kernel");
}

Tensor flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale, FlashTiles tiles,
                               Tensor& lse) {
  constexpr const char* op = "flash_attention_forward";
  detail::require_cuda(q, op, "q");
  detail::require_cuda(k, op, "k");
  detail::require_cuda(v, op, "v");
  const std::int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  Tensor out = detail::empty(q.shape());  // (B, H, T, D)
  lse = detail::empty({B, H, T});         // (B, H, T)
  cuda::flash_attention_forward(B, H, T, D, heads_of(q), heads_of(k), heads_of(v), heads_of(out), lse.device_data(), scale,
                          tiles);
  return out;
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& d_out, float scale, FlashTiles tiles, Tensor& dq, Tensor& dk, Tensor& dv) {
  constexpr const char* op = "flash_attention_backward";
  detail::require_cuda(q, op, "q");
  detail::require_cuda(k, op, "k");
  detail::require_cuda(v, op, "v");
  detail::require_cuda(out, op, "out");
  detail::require_cuda(lse, op, "lse");
  detail::require_cuda(d_out, op, "d_out");
  dq = detail::empty(q.shape());  // (B, H, T, D)
  dk = detail::empty(k.shape());  // (B, H, T, D)
  dv = detail::empty(v.shape());  // (B, H, T, D)
  const std::int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  cuda::flash_attention_backward(B, H, T, D, heads_of(q), heads_of(k), heads_of(v), heads_of(out), heads_of(d_out),
                           lse.device_data(), heads_of(dq), heads_of(dk), heads_of(dv), scale, tiles);
}

}  // namespace riftco_transformer::cuda
