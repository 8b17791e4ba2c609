// The CUDA backend against the CPU one: every kernel of backend/cpu/kernels.hpp,
// flash_attention.hpp and decode_attention.hpp run on copies of the same
// random inputs on both backends and compared with a per-kernel tolerance
// (one table, one test per row); plus the CUDA allocator's accounting,
// transfers, host access, and bit-for-bit determinism of the reductions.
// Every test skips, saying why, when no CUDA device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "cuda_skip.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/decode_attention.hpp"
#include "backend/cpu/flash_attention.hpp"
#include "backend/cpu/kernels.hpp"
#include "backend/cuda/decode_attention.hpp"
#include "backend/cuda/flash_attention.hpp"
#include "backend/cuda/kernels.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/tensor.hpp"

using namespace riftco_transformer;

namespace {

Tensor uniform(const Shape& shape, std::uint64_t seed, float low = -1.0F, float high = 1.0F) {
  Random r(seed);
  return Tensor::uniform(shape, r, low, high);
}

Tensor dev(const Tensor& t) { return t.to(Backend::Cuda); }
Tensor host(const Tensor& t) { return t.to(Backend::Cpu); }

/// One compared output: the CPU result and the CUDA result (either backend).
struct Pair {
  std::string what;
  Tensor expected;
  Tensor actual;
};

/// |actual − expected| <= atol + rtol·|expected| everywhere (NaN and inf must match).
void expect_close(const Pair& p, float rtol, float atol) {
  const Tensor e = host(p.expected);
  const Tensor a = host(p.actual);
  ASSERT_EQ(e.shape(), a.shape()) << p.what;
  const float* pe = e.data();
  const float* pa = a.data();
  std::int64_t bad = 0;
  std::int64_t first = -1;
  double worst = 0.0;
  for (std::int64_t i = 0; i < e.numel(); ++i) {
    const float x = pe[i];
    const float y = pa[i];
    bool ok;
    if (std::isnan(x) || std::isnan(y)) {
      ok = std::isnan(x) && std::isnan(y);
    } else if (std::isinf(x) || std::isinf(y)) {
      ok = x == y;
    } else {
      const double diff = std::fabs(static_cast<double>(x) - y);
      ok = diff <= atol + rtol * std::fabs(static_cast<double>(x));
      worst = std::max(worst, diff);
    }
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << p.what << " " << shape_string(e.shape()) << ": " << bad << " elements off; first at " << first
                    << " (cpu " << (first >= 0 ? pe[first] : 0.0F) << ", cuda " << (first >= 0 ? pa[first] : 0.0F)
                    << "); max |diff| " << worst << " (rtol " << rtol << ", atol " << atol << ")";
}

// ---- the table ---------------------------------------------------------------

struct KernelCase {
  const char* name;
  float rtol;
  float atol;
  std::function<std::vector<Pair>()> run;
};

constexpr float kElementwise = 1e-5F;
constexpr float kReduction = 1e-4F;

/// gemm on both backends: C (m, n) at ldc = n + 2, A and B padded too.
std::vector<Pair> gemm_pairs() {
  std::vector<Pair> out;
  const std::int64_t m = 37, n = 29, k = 53;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      for (const std::int64_t kk : {k, std::int64_t{0}}) {
        const std::int64_t lda = (ta ? m : kk) + 3;
        const std::int64_t ldb = (tb ? kk : n) + 1;
        const std::int64_t ldc = n + 2;
        const Tensor a = uniform({ta ? std::max<std::int64_t>(kk, 1) : m, lda}, 11);
        const Tensor b = uniform({tb ? n : std::max<std::int64_t>(kk, 1), ldb}, 12);
        Tensor c_cpu = uniform({m, ldc}, 13);
        Tensor c_gpu = dev(c_cpu);
        const Tensor a_gpu = dev(a);
        const Tensor b_gpu = dev(b);
        for (const float beta : {0.0F, 0.3F}) {
          cpu::gemm(ta, tb, m, n, kk, 0.7F, a.data(), lda, b.data(), ldb, beta, c_cpu.data(), ldc);
          cuda::gemm(ta, tb, m, n, kk, 0.7F, a_gpu.device_data(), lda, b_gpu.device_data(), ldb, beta,
                     c_gpu.device_data(), ldc);
        }
        out.push_back({"gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " k=" + std::to_string(kk),
                       c_cpu.clone(), host(c_gpu)});
      }
    }
  }
  return out;
}

std::vector<Pair> gemm_group_pairs() {
  // Chain 0: C0 = A0 B0 then C0 += A1 B1; chain 1: C1 = A2ᵀ B2.
  const std::int64_t m = 20, n = 18, k = 24;
  const Tensor a0 = uniform({m, k}, 21), b0 = uniform({k, n}, 22), a1 = uniform({m, k}, 23), b1 = uniform({k, n}, 24);
  const Tensor a2 = uniform({k, m}, 25), b2 = uniform({k, n}, 26);
  auto run = [&](bool gpu) {
    auto p = [&](const Tensor& t) { return gpu ? dev(t) : t; };
    const Tensor A0 = p(a0), B0 = p(b0), A1 = p(a1), B1 = p(b1), A2 = p(a2), B2 = p(b2);
    Tensor c0 = Tensor::zeros({m, n}, gpu ? Backend::Cuda : Backend::Cpu);
    Tensor c1 = Tensor::zeros({m, n}, gpu ? Backend::Cuda : Backend::Cpu);
    const cpu::GemmProblem chain0[] = {
        {false, false, m, n, k, 1.0F, A0.device_data(), k, B0.device_data(), n, 0.0F, c0.device_data(), n},
        {false, false, m, n, k, 1.0F, A1.device_data(), k, B1.device_data(), n, 1.0F, c0.device_data(), n}};
    const cpu::GemmProblem chain1[] = {
        {true, false, m, n, k, 0.5F, A2.device_data(), m, B2.device_data(), n, 0.0F, c1.device_data(), n}};
    const std::span<const cpu::GemmProblem> chains[] = {chain0, chain1};
    if (gpu) {
      cuda::gemm_group(chains);
    } else {
      cpu::gemm_group(chains);
    }
    return std::pair{host(c0), host(c1)};
  };
  const auto [c0, c1] = run(false);
  const auto [g0, g1] = run(true);
  return {{"gemm_group chain 0", c0, g0}, {"gemm_group chain 1", c1, g1}};
}

std::vector<Pair> matmul_pairs() {
  struct M {
    Shape a, b;
    bool ta, tb;
  };
  const M cases[] = {{{2, 3, 5, 7}, {7, 4}, false, false},    {{2, 3, 5, 7}, {4, 7}, false, true},
                     {{2, 3, 5, 7}, {2, 3, 7, 4}, false, false}, {{3, 7, 5}, {7, 4}, true, false},
                     {{3, 7, 5}, {3, 4, 7}, true, true},        {{6, 9}, {9, 2}, false, false}};
  std::vector<Pair> out;
  std::uint64_t seed = 30;
  for (const M& c : cases) {
    const Tensor a = uniform(c.a, ++seed);
    const Tensor b = uniform(c.b, ++seed);
    out.push_back({"matmul " + shape_string(c.a) + (c.ta ? "ᵀ" : "") + " x " + shape_string(c.b) + (c.tb ? "ᵀ" : ""),
                   cpu::matmul(a, b, c.ta, c.tb), cuda::matmul(dev(a), dev(b), c.ta, c.tb)});
  }
  return out;
}

std::vector<Pair> elementwise_pairs() {
  const Tensor a = uniform({7, 33}, 41);
  const Tensor b = uniform({7, 33}, 42);
  std::vector<Pair> out;
  out.push_back({"add", cpu::add(a, b), cuda::add(dev(a), dev(b))});
  out.push_back({"scale", cpu::scale(a, -1.7F), cuda::scale(dev(a), -1.7F)});
  Tensor x = a.clone();
  Tensor y = dev(a);
  cpu::add_inplace(x, b);
  cuda::add_inplace(y, dev(b));
  out.push_back({"add_inplace", x.clone(), y.clone()});  // snapshots: both are updated again below
  cpu::axpy_inplace(x, 0.25F, b);
  cuda::axpy_inplace(y, 0.25F, dev(b));
  out.push_back({"axpy_inplace", x, y});
  return out;
}

std::vector<Pair> binary_pairs() {
  struct B {
    Shape a, b, out;
  };
  const B cases[] = {{{4, 5, 6}, {4, 5, 6}, {4, 5, 6}},
                     {{4, 5, 6}, {6}, {4, 5, 6}},
                     {{4, 1, 6}, {1, 5, 1}, {4, 5, 6}},
                     {{3, 1}, {1, 4}, {3, 4}},
                     {{}, {2, 3}, {2, 3}}};
  std::vector<Pair> out;
  std::uint64_t seed = 50;
  for (const B& c : cases) {
    const Tensor a = uniform(c.a, ++seed);
    const Tensor b = uniform(c.b, ++seed);
    for (const cpu::BinaryOp op : {cpu::BinaryOp::Add, cpu::BinaryOp::Sub, cpu::BinaryOp::Mul}) {
      out.push_back({"binary " + std::to_string(static_cast<int>(op)) + " " + shape_string(c.a) + " " +
                         shape_string(c.b),
                     cpu::binary(op, a, b, c.out), cuda::binary(op, dev(a), dev(b), c.out)});
    }
  }
  return out;
}

std::vector<Pair> reduce_pairs() {
  const Tensor g = uniform({4, 5, 6}, 61);
  std::vector<Pair> out;
  for (const Shape& s : {Shape{6}, Shape{5, 1}, Shape{4, 1, 6}, Shape{1, 5, 1}, Shape{}, Shape{4, 5, 6}}) {
    out.push_back({"reduce_to_shape to " + shape_string(s), cpu::reduce_to_shape(g, s),
                   cuda::reduce_to_shape(dev(g), s)});
  }
  return out;
}

std::vector<Pair> permute_pairs() {
  const Tensor x = uniform({2, 3, 4, 5}, 71);
  const Tensor m = uniform({6, 7}, 72);
  const std::int64_t p0[] = {0, 2, 1, 3};
  const std::int64_t p1[] = {3, 1, 0, 2};
  const std::int64_t p2[] = {1, 0};
  return {{"permute 0213", cpu::permute(x, p0), cuda::permute(dev(x), p0)},
          {"permute 3102", cpu::permute(x, p1), cuda::permute(dev(x), p1)},
          {"permute 10", cpu::permute(m, p2), cuda::permute(dev(m), p2)}};
}

std::vector<Pair> activation_pairs() {
  const Tensor x = uniform({9, 41}, 81, -6.0F, 6.0F);
  const Tensor g = uniform({9, 41}, 82);
  std::vector<Pair> out;
  for (const cpu::Activation act : {cpu::Activation::Silu, cpu::Activation::Gelu}) {
    const std::string name = act == cpu::Activation::Silu ? "silu" : "gelu";
    out.push_back({name + " forward", cpu::activation_forward(act, x), cuda::activation_forward(act, dev(x))});
    out.push_back({name + " backward", cpu::activation_backward(act, x, g),
                   cuda::activation_backward(act, dev(x), dev(g))});
  }
  return out;
}

std::vector<Pair> swiglu_pairs() {
  const Tensor gate = uniform({5, 3, 16}, 91, -5.0F, 5.0F);
  const Tensor up = uniform({5, 3, 16}, 92);
  const Tensor g = uniform({5, 3, 16}, 93);
  const Tensor packed = uniform({5, 3, 32}, 94, -5.0F, 5.0F);
  std::vector<Pair> out;
  out.push_back({"swiglu forward", cpu::swiglu_forward(gate, up), cuda::swiglu_forward(dev(gate), dev(up))});
  Tensor dg, du, cdg, cdu;
  cpu::swiglu_backward(gate, up, g, dg, du);
  cuda::swiglu_backward(dev(gate), dev(up), dev(g), cdg, cdu);
  out.push_back({"swiglu backward d_gate", dg, cdg});
  out.push_back({"swiglu backward d_up", du, cdu});
  out.push_back({"swiglu packed forward", cpu::swiglu_packed_forward(packed), cuda::swiglu_packed_forward(dev(packed))});
  out.push_back({"swiglu packed backward", cpu::swiglu_packed_backward(packed, g),
                 cuda::swiglu_packed_backward(dev(packed), dev(g))});
  // In place: g in columns [0, 16) of each row, columns [16, 32) not read.
  Tensor g_in_d = uniform({5, 3, 32}, 95);
  for (std::int64_t r = 0; r < 15; ++r) std::copy_n(g.data() + r * 16, 16, g_in_d.data() + r * 32);
  Tensor cd = dev(g_in_d);
  cuda::swiglu_packed_backward_inplace(dev(packed), cd);
  out.push_back({"swiglu packed backward in place", cpu::swiglu_packed_backward(packed, g), cd});
  Tensor over = dev(packed);  // written over gate_up itself (a donated buffer)
  cuda::swiglu_packed_backward_over(over, dev(g));
  out.push_back({"swiglu packed backward over gate_up", cpu::swiglu_packed_backward(packed, g), over});
  return out;
}

std::vector<Pair> rms_norm_pairs() {
  const Tensor x = uniform({37, 300}, 101, -2.0F, 2.0F);
  const Tensor w = uniform({300}, 102, 0.5F, 1.5F);
  const Tensor g = uniform({37, 300}, 103);
  Tensor rstd, crstd;
  std::vector<Pair> out;
  out.push_back({"rms_norm forward", cpu::rms_norm_forward(x, w, 1e-5F, rstd),
                 cuda::rms_norm_forward(dev(x), dev(w), 1e-5F, crstd)});
  out.push_back({"rms_norm rstd", rstd, crstd});
  Tensor dx, dw, cdx, cdw;
  cpu::rms_norm_backward(x, w, rstd, g, dx, dw, true, true);
  cuda::rms_norm_backward(dev(x), dev(w), crstd, dev(g), cdx, cdw, true, true);
  out.push_back({"rms_norm dx", dx, cdx});
  out.push_back({"rms_norm dw", dw, cdw});
  Tensor only_dx, unused, cuda_only_dx, cuda_unused;
  cuda::rms_norm_backward(dev(x), dev(w), crstd, dev(g), cuda_only_dx, cuda_unused, true, false);
  EXPECT_FALSE(cuda_unused.defined()) << "need_dw = false must leave dw alone";
  out.push_back({"rms_norm dx alone", dx, cuda_only_dx});
  return out;
}

std::vector<Pair> softmax_pairs() {
  Tensor x = uniform({6, 300}, 111, -8.0F, 8.0F);
  {
    float* p = x.data();
    for (std::int64_t j = 0; j < 300; ++j) p[300 + j] = -std::numeric_limits<float>::infinity();  // masked row
    for (std::int64_t j = 150; j < 300; ++j) p[600 + j] = -std::numeric_limits<float>::infinity();  // half masked
  }
  const Tensor g = uniform({6, 300}, 112);
  const Tensor y = cpu::softmax_forward(x);
  const Tensor s = uniform({2, 3, 5, 7}, 113);
  return {{"softmax forward", y, cuda::softmax_forward(dev(x))},
          {"softmax backward", cpu::softmax_backward(y, g), cuda::softmax_backward(dev(y), dev(g))},
          {"causal_fill offset 0", cpu::causal_fill(s, 0, -1e9F), cuda::causal_fill(dev(s), 0, -1e9F)},
          {"causal_fill offset 2", cpu::causal_fill(s, 2, -std::numeric_limits<float>::infinity()),
           cuda::causal_fill(dev(s), 2, -std::numeric_limits<float>::infinity())}};
}

std::vector<Pair> rope_pairs() {
  const Tensor x = uniform({2, 3, 6, 16}, 121);
  std::vector<Pair> out;
  for (const bool inverse : {false, true}) {
    out.push_back({std::string("rope_apply inverse=") + (inverse ? "1" : "0"), cpu::rope_apply(x, 3, 10000.0F, inverse),
                   cuda::rope_apply(dev(x), 3, 10000.0F, inverse)});
  }
  // Packed rows: batch 2, T 5, three heads of 16 inside rows of 64 floats.
  const std::int64_t batch = 2, t = 5, d = 16, width = 48, stride = 64;
  const Tensor src = uniform({batch * t, stride}, 122);
  for (const bool inverse : {false, true}) {
    Tensor dst_cpu = Tensor::zeros({batch * t, width});
    Tensor dst_gpu = Tensor::zeros({batch * t, width}, Backend::Cuda);
    const Tensor src_gpu = dev(src);
    cpu::rope_packed(src.data(), stride, dst_cpu.data(), width, batch, t, width, d, 500.0F, inverse);
    cuda::rope_packed(src_gpu.device_data(), stride, dst_gpu.device_data(), width, batch, t, width, d, 500.0F, inverse);
    out.push_back({std::string("rope_packed inverse=") + (inverse ? "1" : "0"), dst_cpu, dst_gpu});
  }
  Tensor in_place_cpu = src.clone();
  Tensor in_place_gpu = dev(src);
  cpu::rope_packed(in_place_cpu.data(), stride, in_place_cpu.data(), stride, batch, t, width, d, 500.0F, false);
  cuda::rope_packed(in_place_gpu.device_data(), stride, in_place_gpu.device_data(), stride, batch, t, width, d, 500.0F,
                    false);
  out.push_back({"rope_packed in place", in_place_cpu, in_place_gpu});
  return out;
}

const std::vector<std::int32_t>& repeated_ids() {
  static const std::vector<std::int32_t> ids = {3, 0, 10, 3, 3, 7, 1, 0, 10, 5, 3, 2, 9, 9, 4, 3, 6, 8, 0, 3,
                                                1, 1, 2, 7, 3, 10, 4, 5, 5, 3, 0, 6, 3, 8, 9, 2, 3, 3, 1, 4};
  return ids;
}

std::vector<Pair> embedding_pairs() {
  const Tensor w = uniform({11, 13}, 131);
  const auto& ids = repeated_ids();
  const Tensor g = uniform({5, 8, 13}, 132);
  return {{"embedding forward", cpu::embedding_forward(w, ids, {5, 8, 13}), cuda::embedding_forward(dev(w), ids, {5, 8, 13})},
          {"embedding backward", cpu::embedding_backward({11, 13}, ids, g), cuda::embedding_backward({11, 13}, ids, dev(g))}};
}

std::vector<Pair> cross_entropy_pairs() {
  const Tensor logits = uniform({9, 300}, 141, -6.0F, 6.0F);
  const std::vector<std::int32_t> targets = {5, -100, 299, 0, 17, -100, 150, 42, 8};
  Tensor probs, cprobs;
  std::int64_t count = 0, ccount = 0;
  const float loss = cpu::cross_entropy_forward(logits, targets, -100, probs, count);
  const float closs = cuda::cross_entropy_forward(dev(logits), targets, -100, cprobs, ccount);
  EXPECT_EQ(count, ccount);
  EXPECT_NEAR(loss, closs, 1e-5F * std::fabs(loss) + 1e-6F);
  return {{"cross_entropy loss", Tensor::scalar(loss), Tensor::scalar(closs)},
          {"cross_entropy probs", probs, cprobs},
          {"cross_entropy backward", cpu::cross_entropy_backward(probs, targets, -100, count, 0.75F),
           cuda::cross_entropy_backward(cprobs, targets, -100, ccount, 0.75F)}};
}

std::vector<Pair> optimizer_pairs() {
  // sum_of_squares over spans of several chunks and a short one.
  const Tensor x0 = uniform({100000}, 151);
  const Tensor x1 = uniform({7}, 152);
  const Tensor x2 = uniform({40000}, 153);
  const Tensor d0 = dev(x0), d1 = dev(x1), d2 = dev(x2);
  const std::span<const float> host_spans[] = {x0.values(), x1.values(), x2.values()};
  const std::span<const float> device_spans[] = {{d0.device_data(), 100000}, {d1.device_data(), 7},
                                                 {d2.device_data(), 40000}};
  const double expected = cpu::sum_of_squares(host_spans);
  const double actual = cuda::sum_of_squares(device_spans);
  EXPECT_NEAR(expected, actual, 1e-9 * expected) << "sum_of_squares";
  // Adam over two parameters, two steps.
  std::vector<Pair> out;
  const cpu::AdamCoefficients c{0.9F, 0.999F, 0.19F, 0.002F, 1e-3F, 1e-8F, 0.8F};
  Tensor theta[2] = {uniform({70000}, 154), uniform({33}, 155)};
  Tensor m[2] = {uniform({70000}, 156, 0.0F, 0.1F), uniform({33}, 157, 0.0F, 0.1F)};
  Tensor v[2] = {uniform({70000}, 158, 0.0F, 0.01F), uniform({33}, 159, 0.0F, 0.01F)};
  const Tensor grad[2] = {uniform({70000}, 160), uniform({33}, 161)};
  Tensor gt[2] = {dev(theta[0]), dev(theta[1])}, gm[2] = {dev(m[0]), dev(m[1])}, gv[2] = {dev(v[0]), dev(v[1])};
  const Tensor gg[2] = {dev(grad[0]), dev(grad[1])};
  for (int step = 0; step < 2; ++step) {
    const cpu::AdamUpdate host_params[] = {
        {theta[0].data(), m[0].data(), v[0].data(), grad[0].data(), 70000, 0.999F},
        {theta[1].data(), m[1].data(), v[1].data(), grad[1].data(), 33, 1.0F}};
    const cpu::AdamUpdate device_params[] = {
        {gt[0].device_data(), gm[0].device_data(), gv[0].device_data(), gg[0].device_data(), 70000, 0.999F},
        {gt[1].device_data(), gm[1].device_data(), gv[1].device_data(), gg[1].device_data(), 33, 1.0F}};
    cpu::adam_update(host_params, c);
    cuda::adam_update(device_params, c);
  }
  for (int i = 0; i < 2; ++i) {
    out.push_back({"adam theta " + std::to_string(i), theta[i], gt[i]});
    out.push_back({"adam m " + std::to_string(i), m[i], gm[i]});
    out.push_back({"adam v " + std::to_string(i), v[i], gv[i]});
  }
  return out;
}

/// Tensor-form flash attention, forward and backward, on both backends.
std::vector<Pair> flash_pairs(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, std::uint64_t seed) {
  const Tensor q = uniform({B, H, T, D}, seed), k = uniform({B, H, T, D}, seed + 1), v = uniform({B, H, T, D}, seed + 2);
  const Tensor d_out = uniform({B, H, T, D}, seed + 3);
  const float scale = 1.0F / std::sqrt(static_cast<float>(D));
  const cpu::FlashTiles tiles = cpu::flash_default_tiles(D);
  Tensor lse, clse, dq, dk, dv, cdq, cdk, cdv;
  const Tensor out = cpu::flash_attention_forward(q, k, v, scale, tiles, lse);
  const Tensor cout = cuda::flash_attention_forward(dev(q), dev(k), dev(v), scale, tiles, clse);
  cpu::flash_attention_backward(q, k, v, out, lse, d_out, scale, tiles, dq, dk, dv);
  cuda::flash_attention_backward(dev(q), dev(k), dev(v), cout, clse, dev(d_out), scale, tiles, cdq, cdk, cdv);
  const std::string s = " B" + std::to_string(B) + " H" + std::to_string(H) + " T" + std::to_string(T) + " D" +
                        std::to_string(D);
  return {{"flash out" + s, out, cout}, {"flash lse" + s, lse, clse}, {"flash dq" + s, dq, cdq},
          {"flash dk" + s, dk, cdk},    {"flash dv" + s, dv, cdv}};
}

/// Strided form over a packed (B, T, 3·H·D) projection, outputs (B, T, H·D).
std::vector<Pair> flash_strided_pairs() {
  const std::int64_t B = 2, H = 2, T = 45, D = 24, C = H * D;
  const Tensor qkv = uniform({B, T, 3 * C}, 171);
  const Tensor d_out = uniform({B, T, C}, 172);
  const float scale = 0.3F;
  const cpu::FlashTiles tiles{16, 16};
  auto run = [&](bool gpu) {
    const Backend be = gpu ? Backend::Cuda : Backend::Cpu;
    const Tensor x = gpu ? dev(qkv) : qkv;
    const Tensor g = gpu ? dev(d_out) : d_out;
    Tensor out = Tensor::empty({B, T, C}, be);
    Tensor lse = Tensor::empty({B, H, T}, be);
    Tensor dqkv = Tensor::zeros({B, T, 3 * C}, be);
    const float* p = x.device_data();
    const cpu::HeadView q{p, T * 3 * C, D, 3 * C}, k{p + C, T * 3 * C, D, 3 * C}, v{p + 2 * C, T * 3 * C, D, 3 * C};
    const cpu::MutableHeadView o{out.device_data(), T * C, D, C};
    float* pd = dqkv.device_data();
    const cpu::MutableHeadView dq{pd, T * 3 * C, D, 3 * C}, dk{pd + C, T * 3 * C, D, 3 * C},
        dv{pd + 2 * C, T * 3 * C, D, 3 * C};
    const cpu::HeadView oc{o.data, o.batch_stride, o.head_stride, o.row_stride};
    const cpu::HeadView gc{g.device_data(), T * C, D, C};
    if (gpu) {
      cuda::flash_attention_forward(B, H, T, D, q, k, v, o, lse.device_data(), scale, tiles);
      cuda::flash_attention_backward(B, H, T, D, q, k, v, oc, gc, lse.device_data(), dq, dk, dv, scale, tiles);
    } else {
      cpu::flash_attention_forward(B, H, T, D, q, k, v, o, lse.device_data(), scale, tiles);
      cpu::flash_attention_backward(B, H, T, D, q, k, v, oc, gc, lse.device_data(), dq, dk, dv, scale, tiles);
    }
    return std::vector<Tensor>{host(out), host(lse), host(dqkv)};
  };
  const auto c = run(false);
  const auto g = run(true);
  return {{"flash strided out", c[0], g[0]}, {"flash strided lse", c[1], g[1]}, {"flash strided dqkv", c[2], g[2]}};
}

std::vector<Pair> cached_attention_pairs() {
  const Tensor q = uniform({4, 16}, 181);
  const Tensor keys = uniform({2, 20, 16}, 182);
  const Tensor values = uniform({2, 20, 16}, 183);
  return {{"cached_attention length 13", cpu::cached_attention(q, keys, values, 13),
           cuda::cached_attention(dev(q), dev(keys), dev(values), 13)},
          {"cached_attention length 1", cpu::cached_attention(q, keys, values, 1),
           cuda::cached_attention(dev(q), dev(keys), dev(values), 1)}};
}

std::vector<Pair> columns_pairs() {
  const Tensor x = uniform({3, 5, 12}, 211);
  const Tensor delta = uniform({3, 5, 4}, 212);
  return {{"add_columns offset 0", cpu::add_columns(x, delta, 0), cuda::add_columns(dev(x), dev(delta), 0)},
          {"add_columns offset 8", cpu::add_columns(x, delta, 8), cuda::add_columns(dev(x), dev(delta), 8)},
          {"take_columns 3..10", cpu::take_columns(x, 3, 7), cuda::take_columns(dev(x), 3, 7)},
          {"take_columns all", cpu::take_columns(x, 0, 12), cuda::take_columns(dev(x), 0, 12)}};
}

std::vector<Pair> repeat_heads_pairs() {
  const Tensor x = uniform({2, 3, 5, 4}, 221);
  const Tensor g = uniform({2, 6, 5, 4}, 222);
  const Tensor g4 = uniform({2, 12, 5, 4}, 223);
  return {{"repeat_heads x2", cpu::repeat_heads(x, 2), cuda::repeat_heads(dev(x), 2)},
          {"repeat_heads x1", cpu::repeat_heads(x, 1), cuda::repeat_heads(dev(x), 1)},
          {"repeat_heads_backward x2", cpu::repeat_heads_backward(g, 2), cuda::repeat_heads_backward(dev(g), 2)},
          {"repeat_heads_backward x4", cpu::repeat_heads_backward(g4, 4), cuda::repeat_heads_backward(dev(g4), 4)}};
}

/// sum_all (70000 values: three chunks) and all_finite as 0/1 scalars.
std::vector<Pair> reduction_pairs() {
  const Tensor x = uniform({70000}, 231);
  const Tensor gx = dev(x);
  std::vector<Pair> out;
  out.push_back({"sum_all", Tensor::scalar(static_cast<float>(cpu::sum_all(x))),
                 Tensor::scalar(static_cast<float>(cuda::sum_all(gx)))});
  const auto finite = [](bool f) { return Tensor::scalar(f ? 1.0F : 0.0F); };
  out.push_back({"all_finite finite", finite(cpu::all_finite(x.values())),
                 finite(cuda::all_finite({gx.device_data(), 70000}))});
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Tensor y = x.clone();
    y.data()[65537] = bad;  // in the third chunk
    const Tensor gy = dev(y);
    out.push_back({std::string("all_finite with ") + (std::isnan(bad) ? "NaN" : "inf"), finite(cpu::all_finite(y.values())),
                   finite(cuda::all_finite({gy.device_data(), 70000}))});
    EXPECT_FALSE(cuda::all_finite({gy.device_data(), 70000}));
  }
  return out;
}

std::vector<Pair> cache_write_pairs() {
  Tensor cache = uniform({2, 20, 16}, 241);
  Tensor gcache = dev(cache);
  const Tensor rows = uniform({2, 1, 16}, 242);
  cpu::cache_write(cache, rows, 0);
  cuda::cache_write(gcache, dev(rows), 0);
  cpu::cache_write(cache, rows, 19);
  cuda::cache_write(gcache, dev(rows), 19);
  return {{"cache_write rows 0 and 19", cache, gcache}};
}

/// The Philox dropout mask: the device's equals the CPU's bit for bit (sizes
/// that leave 1, 2 and 3 elements in the last group of four).
std::vector<Pair> dropout_pairs() {
  std::vector<Pair> out;
  for (const Shape& shape : {Shape{7}, Shape{3, 5, 2}, Shape{4, 257}, Shape{2, 100003}}) {
    for (const float p : {0.1F, 0.5F}) {
      const std::uint64_t seed = 0x9E3779B97F4A7C15ULL ^ static_cast<std::uint64_t>(shape.back());
      out.push_back({"dropout_mask " + shape_string(shape) + " p " + std::to_string(p),
                     cpu::dropout_mask(shape, seed, p, 1.0F / (1.0F - p)),
                     cuda::dropout_mask(shape, seed, p, 1.0F / (1.0F - p))});
    }
  }
  return out;
}

const std::vector<KernelCase>& kernel_table() {
  static const std::vector<KernelCase> table = {
      {"gemm", kReduction, 1e-4F, gemm_pairs},
      {"gemm_group", kReduction, 1e-4F, gemm_group_pairs},
      {"matmul", kReduction, 1e-4F, matmul_pairs},
      {"elementwise", kElementwise, 1e-6F, elementwise_pairs},
      {"binary", kElementwise, 1e-6F, binary_pairs},
      {"reduce_to_shape", kReduction, 1e-5F, reduce_pairs},
      {"permute", 0.0F, 0.0F, permute_pairs},
      {"activation", kElementwise, 1e-6F, activation_pairs},
      {"swiglu", kElementwise, 1e-6F, swiglu_pairs},
      {"rms_norm", kReduction, 1e-5F, rms_norm_pairs},
      {"softmax", kReduction, 1e-6F, softmax_pairs},
      {"rope", kElementwise, 1e-6F, rope_pairs},
      {"embedding", kReduction, 1e-6F, embedding_pairs},
      {"cross_entropy", kReduction, 1e-6F, cross_entropy_pairs},
      {"optimizer", kElementwise, 1e-7F, optimizer_pairs},
      {"flash_attention_small", kReduction, 1e-5F, [] { return flash_pairs(2, 3, 70, 16, 191); }},
      {"flash_attention_d64", kReduction, 1e-5F, [] { return flash_pairs(1, 2, 130, 64, 195); }},
      {"flash_attention_d128", kReduction, 1e-5F, [] { return flash_pairs(1, 1, 33, 128, 199); }},
      {"flash_attention_strided", kReduction, 1e-5F, flash_strided_pairs},
      {"cached_attention", kReduction, 1e-6F, cached_attention_pairs},
      {"columns", 0.0F, 0.0F, columns_pairs},
      {"repeat_heads", 0.0F, 0.0F, repeat_heads_pairs},
      {"sum_all_all_finite", 1e-6F, 0.0F, reduction_pairs},
      {"cache_write", 0.0F, 0.0F, cache_write_pairs},
      {"dropout_mask", 0.0F, 0.0F, dropout_pairs},
  };
  return table;
}

class CudaKernel : public ::testing::TestWithParam<std::size_t> {};

TEST_P(CudaKernel, MatchesCpu) {
  SKIP_WITHOUT_CUDA();
  const KernelCase& c = kernel_table()[GetParam()];
  const std::vector<Pair> pairs = c.run();
  ASSERT_FALSE(pairs.empty());
  for (const Pair& p : pairs) expect_close(p, c.rtol, c.atol);
}

INSTANTIATE_TEST_SUITE_P(Table, CudaKernel, ::testing::Range<std::size_t>(0, kernel_table().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return std::string(kernel_table()[info.param].name);
                         });

// ---- storage, transfers, accounting ---------------------------------------------

TEST(CudaStorage, BackendAvailableWithADevice) {
  SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(backend_available(Backend::Cuda));
  EXPECT_EQ(Tensor::zeros({3}, Backend::Cuda).backend(), Backend::Cuda);
}

TEST(CudaStorage, RoundTripIsBitExact) {
  SKIP_WITHOUT_CUDA();
  Tensor x = uniform({1000}, 201, -1e30F, 1e30F);
  float* p = x.data();
  p[0] = std::numeric_limits<float>::quiet_NaN();
  p[1] = std::numeric_limits<float>::infinity();
  p[2] = -0.0F;
  p[3] = std::numeric_limits<float>::denorm_min();
  const Tensor gpu = x.to(Backend::Cuda);
  EXPECT_EQ(gpu.backend(), Backend::Cuda);
  EXPECT_EQ(gpu.shape(), x.shape());
  const Tensor back = gpu.to(Backend::Cpu);
  EXPECT_EQ(std::memcmp(back.data(), x.data(), static_cast<std::size_t>(x.nbytes())), 0);
  const Tensor cloned = gpu.clone().to(Backend::Cpu);
  EXPECT_EQ(std::memcmp(cloned.data(), x.data(), static_cast<std::size_t>(x.nbytes())), 0);
  const std::vector<float> values = gpu.to_vector();
  EXPECT_EQ(std::memcmp(values.data(), x.data(), static_cast<std::size_t>(x.nbytes())), 0);
  EXPECT_TRUE(gpu.to(Backend::Cuda).shares_storage(gpu)) << "same backend returns the same buffer";
}

TEST(CudaStorage, FillAndCopyFromAcrossBackends) {
  SKIP_WITHOUT_CUDA();
  Tensor g = Tensor::full({5, 7}, 2.5F, Backend::Cuda);
  for (const float v : g.to_vector()) EXPECT_EQ(v, 2.5F);
  const std::uint64_t before = g.version();
  g.fill(0.0F);
  EXPECT_GT(g.version(), before);
  for (const float v : g.to_vector()) EXPECT_EQ(v, 0.0F);
  const Tensor src = uniform({5, 7}, 202);
  g.copy_from(src);  // cpu -> cuda
  EXPECT_TRUE(bit_equal(g.to(Backend::Cpu), src));
  Tensor h = Tensor::zeros({5, 7});
  h.copy_from(g);  // cuda -> cpu
  EXPECT_TRUE(bit_equal(h, src));
  Tensor g2 = Tensor::zeros({5, 7}, Backend::Cuda);
  g2.copy_from(g);  // cuda -> cuda
  EXPECT_TRUE(bit_equal(g2.to(Backend::Cpu), src));
}

TEST(CudaStorage, HostAccessOfACudaTensorThrows) {
  SKIP_WITHOUT_CUDA();
  Tensor g = Tensor::ones({4}, Backend::Cuda);
  const Tensor& cg = g;
  EXPECT_THROW(g.data(), BackendError);
  EXPECT_THROW(cg.data(), BackendError);
  EXPECT_THROW(cg.values(), BackendError);
  EXPECT_THROW(cg.at({0}), BackendError);
  try {
    cg.data();
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("on cuda"), std::string::npos) << e.what();
  }
}

TEST(CudaStorage, ItemCopiesTheOneElementToTheHost) {
  SKIP_WITHOUT_CUDA();
  const Tensor g = Tensor::full({1, 1}, -2.5F, Backend::Cuda);
  const std::uint64_t version = g.version();
  EXPECT_EQ(g.item(), -2.5F);
  EXPECT_EQ(g.reshape({}).item(), -2.5F);
  EXPECT_EQ(g.version(), version);  // a read: no version bump
  EXPECT_EQ(g.backend(), Backend::Cuda);
  try {
    (void)Tensor::ones({2, 3}, Backend::Cuda).item();
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[item] needs one element, shape is (2, 3)"), std::string::npos) << e.what();
  }
}

TEST(CudaStorage, KernelsRejectCpuTensors) {
  SKIP_WITHOUT_CUDA();
  const Tensor c = Tensor::ones({4});
  try {
    cuda::add(c, dev(c));
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("[add]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
}

TEST(CudaStorage, AllocatorLiveAndPeakAreExact) {
  SKIP_WITHOUT_CUDA();
  reset_peak_memory(Backend::Cuda);
  const MemoryStats start = memory_stats(Backend::Cuda);
  EXPECT_EQ(start.peak_bytes, start.live_bytes);
  {
    const Tensor a = Tensor::empty({1000}, Backend::Cuda);  // 4000 bytes
    EXPECT_EQ(memory_stats(Backend::Cuda).live_bytes, start.live_bytes + 4000);
    {
      const Tensor b = Tensor::empty({1 << 18}, Backend::Cuda);  // 1 MiB
      EXPECT_EQ(memory_stats(Backend::Cuda).live_bytes, start.live_bytes + 4000 + (1 << 20));
    }
    EXPECT_EQ(memory_stats(Backend::Cuda).live_bytes, start.live_bytes + 4000);
  }
  const MemoryStats end = memory_stats(Backend::Cuda);
  EXPECT_EQ(end.live_bytes, start.live_bytes);
  EXPECT_EQ(end.peak_bytes, start.live_bytes + 4000 + (1 << 20));
  EXPECT_EQ(end.allocation_count, start.allocation_count + 2);
  EXPECT_EQ(end.free_count, start.free_count + 2);
  EXPECT_GE(end.reserved_bytes, end.live_bytes);
  reset_peak_memory(Backend::Cuda);
  EXPECT_EQ(memory_stats(Backend::Cuda).peak_bytes, end.live_bytes);
  // The CPU counters do not move for cuda buffers.
  const MemoryStats cpu_before = memory_stats(Backend::Cpu);
  { const Tensor c = Tensor::empty({4096}, Backend::Cuda); }
  EXPECT_EQ(memory_stats(Backend::Cpu).allocation_count, cpu_before.allocation_count);
}

TEST(CudaStorage, ReleaseCachedMemoryGivesBlocksBack) {
  SKIP_WITHOUT_CUDA();
  { const Tensor big = Tensor::empty({1 << 20}, Backend::Cuda); }  // 4 MiB, cached when freed
  const MemoryStats before = memory_stats(Backend::Cuda);
  EXPECT_GT(before.reserved_bytes, before.live_bytes);
  const std::int64_t released = release_cached_memory(Backend::Cuda);
  EXPECT_GT(released, 0);
  const MemoryStats after = memory_stats(Backend::Cuda);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes - released);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(release_cached_memory(Backend::Cuda), 0);
  // A block comes back from the cache with the same size class.
  { const Tensor a = Tensor::empty({1 << 20}, Backend::Cuda); }
  const std::int64_t reserved = memory_stats(Backend::Cuda).reserved_bytes;
  { const Tensor b = Tensor::empty({1 << 20}, Backend::Cuda); }
  EXPECT_EQ(memory_stats(Backend::Cuda).reserved_bytes, reserved) << "the freed block is reused";
}

TEST(CudaStorage, RunningOutOfDeviceMemoryIsAnOutOfMemoryErrorThatLeavesTheCountersAlone) {
  SKIP_WITHOUT_CUDA();
  { const Tensor cached = Tensor::empty({1 << 20}, Backend::Cuda); }  // a cached block: released, then retried
  const MemoryStats before = memory_stats(Backend::Cuda);
  try {
    const Tensor huge = Tensor::empty({std::int64_t{1} << 45}, Backend::Cuda);  // 128 TiB
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {  // a std::bad_alloc: RT_ERROR_OUT_OF_MEMORY, MemoryError (was BackendError)
    const std::string message = e.what();
    EXPECT_NE(message.find("cudaMalloc"), std::string::npos) << message;
    EXPECT_NE(message.find("bytes"), std::string::npos) << message;
  }
  const MemoryStats after = memory_stats(Backend::Cuda);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(after.allocation_count, before.allocation_count);
  EXPECT_LE(after.reserved_bytes, before.reserved_bytes);  // the cache was given back before the retry
  { const Tensor small = Tensor::empty({1000}, Backend::Cuda); }  // the device still works
}

TEST(CudaStorage, TransferDoesNotTouchTheSourceVersion) {
  SKIP_WITHOUT_CUDA();
  const Tensor x = uniform({8}, 203);
  const std::uint64_t v = x.version();
  const Tensor g = x.to(Backend::Cuda);
  EXPECT_EQ(x.version(), v);
  EXPECT_FALSE(g.shares_storage(x));
}

TEST(CudaBlas, Tf32IsOffUnlessAskedFor) {
  SKIP_WITHOUT_CUDA();
  const char* env = std::getenv("RIFTCO_CUDA_TF32");
  EXPECT_EQ(cuda::tf32_enabled(), env != nullptr && std::string(env) == "1");
}

// ---- determinism ------------------------------------------------------------------

TEST(CudaDeterminism, RmsNormBackwardTwiceIsBitIdentical) {
  SKIP_WITHOUT_CUDA();
  const Tensor x = dev(uniform({513, 768}, 211));
  const Tensor w = dev(uniform({768}, 212));
  const Tensor g = dev(uniform({513, 768}, 213));
  Tensor rstd;
  cuda::rms_norm_forward(x, w, 1e-5F, rstd);
  Tensor dx1, dw1, dx2, dw2;
  cuda::rms_norm_backward(x, w, rstd, g, dx1, dw1, true, true);
  cuda::rms_norm_backward(x, w, rstd, g, dx2, dw2, true, true);
  EXPECT_TRUE(bit_equal(host(dx1), host(dx2)));
  EXPECT_TRUE(bit_equal(host(dw1), host(dw2)));
}

TEST(CudaDeterminism, EmbeddingBackwardTwiceIsBitIdentical) {
  SKIP_WITHOUT_CUDA();
  std::vector<std::int32_t> ids(4096);
  Random r(214);
  for (auto& id : ids) id = static_cast<std::int32_t>(r.below(50));  // many repeats
  const Tensor g = dev(uniform({4096, 96}, 215));
  const Tensor a = host(cuda::embedding_backward({50, 96}, ids, g));
  const Tensor b = host(cuda::embedding_backward({50, 96}, ids, g));
  EXPECT_TRUE(bit_equal(a, b));
  // And equal to the CPU's sums within float rounding.
  expect_close({"embedding backward, many repeats", cpu::embedding_backward({50, 96}, ids, host(g)), a}, 1e-4F, 1e-5F);
}

TEST(CudaDeterminism, FlashBackwardTwiceIsBitIdentical) {
  SKIP_WITHOUT_CUDA();
  const Shape s{2, 4, 200, 64};
  const Tensor q = dev(uniform(s, 216)), k = dev(uniform(s, 217)), v = dev(uniform(s, 218)), d = dev(uniform(s, 219));
  const cpu::FlashTiles tiles = cpu::flash_default_tiles(64);
  Tensor lse1, lse2;
  const Tensor out1 = cuda::flash_attention_forward(q, k, v, 0.125F, tiles, lse1);
  const Tensor out2 = cuda::flash_attention_forward(q, k, v, 0.125F, tiles, lse2);
  EXPECT_TRUE(bit_equal(host(out1), host(out2)));
  EXPECT_TRUE(bit_equal(host(lse1), host(lse2)));
  Tensor dq1, dk1, dv1, dq2, dk2, dv2;
  cuda::flash_attention_backward(q, k, v, out1, lse1, d, 0.125F, tiles, dq1, dk1, dv1);
  cuda::flash_attention_backward(q, k, v, out1, lse1, d, 0.125F, tiles, dq2, dk2, dv2);
  EXPECT_TRUE(bit_equal(host(dq1), host(dq2)));
  EXPECT_TRUE(bit_equal(host(dk1), host(dk2)));
  EXPECT_TRUE(bit_equal(host(dv1), host(dv2)));
}

TEST(CudaDeterminism, SumOfSquaresTwiceIsBitIdentical) {
  SKIP_WITHOUT_CUDA();
  const Tensor x = dev(uniform({300000}, 220));
  const std::span<const float> spans[] = {{x.device_data(), 300000}};
  const double a = cuda::sum_of_squares(spans);
  const double b = cuda::sum_of_squares(spans);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
}

}  // namespace
