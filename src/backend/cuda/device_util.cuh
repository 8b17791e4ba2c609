#pragma once
// Device-side helpers: fixed-order block reductions (a shared-memory tree
// whose shape depends only on blockDim, so the bits are the same every run).
#include <cstdint>

namespace riftco_transformer::cuda::device {

/// Σ of v over the block (blockDim.x a power of two, <= 1024); `scratch`
/// holds blockDim.x values of T. Every thread gets the total.
template <class T>
__device__ T block_sum(T v, T* scratch) {
  const unsigned tid = threadIdx.x;
  scratch[tid] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) scratch[tid] = scratch[tid] + scratch[tid + s];
    __syncthreads();
  }
  const T total = scratch[0];
  __syncthreads();
  return total;
}

/// max of v over the block with std::max's rule (a < b ? b : a: a NaN in b is skipped).
__device__ inline float block_max(float v, float* scratch) {
  const unsigned tid = threadIdx.x;
  scratch[tid] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) {
      const float a = scratch[tid];
      const float b = scratch[tid + s];
      scratch[tid] = a < b ? b : a;
    }
    __syncthreads();
  }
  const float m = scratch[0];
  __syncthreads();
  return m;
}

}  // namespace riftco_transformer::cuda::device
