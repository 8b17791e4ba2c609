#pragma once
// What the NCCL tests share: the host communicator (single-process, or MPI
// under mpirun), the NCCL communicator over it, the skip when this host has
// fewer CUDA devices than ranks ("needs N GPU(s)", which CTest's
// SKIP_REGULAR_EXPRESSION matches), and the helpers the bit comparisons use.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/random.hpp"
#include "riftco_transformer/tensor.hpp"

namespace rt_nccl_test {

using namespace riftco_transformer;

inline Communicator& host() { return Communicator::world(); }

/// "" when every rank of this host can have its own device, else why not.
inline std::string skip_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  const int world = host().world_size();
  if (count >= world && count > 0) return "";
  return "needs " + std::to_string(world) + (world == 1 ? " GPU" : " GPUs") + ", one per rank; " +
         (status != cudaSuccess ? std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(status)
                                : "found " + std::to_string(count));
}

/// The NCCL communicator over the host one, made once (collective; it picks
/// this rank's device, so before any CUDA tensor).
inline Communicator& nccl() {
  static const std::unique_ptr<Communicator> comm = make_nccl_communicator(host());
  return *comm;
}

/// Rank-specific values over several magnitudes (sums that round).
inline std::vector<float> rank_values(int rank, std::size_t n, std::uint64_t seed) {
  Random random(seed * 1000 + static_cast<std::uint64_t>(rank));
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = random.normal() * (i % 3 == 0 ? 1e4F : (i % 3 == 1 ? 1.0F : 1e-3F));
  return v;
}

inline Tensor on_device(const std::vector<float>& values) {
  return Tensor::from_data({static_cast<std::int64_t>(values.size())}, values).to(Backend::Cuda);
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace rt_nccl_test

// Every rank of a host sees the same devices, so every rank skips alike.
#define SKIP_WITHOUT_GPUS()                                    \
  do {                                                         \
    static const std::string why = rt_nccl_test::skip_reason(); \
    if (!why.empty()) GTEST_SKIP() << why;                     \
    rt_nccl_test::nccl();                                      \
  } while (0)
