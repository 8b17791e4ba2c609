#pragma once
// Row pieces of a softmax, shared by softmax.cpp and cross_entropy.cpp
// (private to backend/cpu). Every function gives the bits of the plain
// scalar loop it replaces, on every instruction set:
//   row_max          m = m < x[j] ? x[j] : m from -inf (a NaN is never taken);
//                    the lanes may meet ±0 in another order, which no caller
//                    can see (x − (±0) and m + log(Σ) are the same numbers);
//   exp_shifted_row  out[j] = std::exp(x[j] − shift) and Σ out[j] added in
//                    j order in float (a NaN sum may carry another payload). The AVX-512F build computes glibc's
//                    expf (the FMA variant its ifunc picks on CPUs with
//                    AVX2 and FMA: double precision, a 32-entry 2^(i/32)
//                    table) on eight double lanes, the AVX2 + FMA build on
//                    four, and both hand lanes with |x| ≥ 88, inf or NaN to
//                    std::exp. A build is used only after a self-check at
//                    first use has found it equal to std::exp on a probe
//                    set; otherwise (another libm, an older CPU) the scalar
//                    loop runs;
//   scale_row        out[j] = x[j] · s (out may be x).
#include <cstdint>

namespace riftco_transformer::cpu {

float row_max(const float* x, std::int64_t n);
/// out must not overlap x.
float exp_shifted_row(const float* x, float shift, float* out, std::int64_t n);
void scale_row(const float* x, float s, float* out, std::int64_t n);

/// The builds of exp_shifted_row: glibc's expf on 8 or 4 double lanes, or
/// the scalar loop.
enum class ExpRowBuild : std::uint8_t { Avx512f, Avx2Fma, Scalar };
/// True when this CPU can run `build`.
bool exp_row_build_supported(ExpRowBuild build);
/// exp_shifted_row through `build` (must be supported), without the
/// self-check: for tests comparing the builds.
float exp_shifted_row_with(ExpRowBuild build, const float* x, float shift, float* out, std::int64_t n);
/// The scalar loop.
float exp_shifted_row_scalar(const float* x, float shift, float* out, std::int64_t n);
/// The build exp_shifted_row runs here: the first of Avx512f, Avx2Fma that
/// the CPU has and that passed the self-check, else Scalar.
ExpRowBuild exp_row_build();

}  // namespace riftco_transformer::cpu
