#pragma once
// Host-side helpers shared by the CUDA kernels: error checks that turn every
// failed CUDA call into a BackendError naming the kernel and the call,
// argument checks, and small device buffers taken from the counted allocator.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>

#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::cuda::detail {

/// Throws BackendError "[op] call failed on cuda: <reason>" unless status is cudaSuccess.
void check(cudaError_t status, const char* op, const char* call);
/// After a kernel launch: cudaGetLastError() through check().
void check_launch(const char* op, const char* kernel);
/// RIFTCO_CUDA_PROFILE=1 only: waits for the device and books the GPU time since the previous mark to op/kernel
/// (profile.cpp); otherwise returns at once.
void profile_mark(const char* op, const char* kernel);
/// BackendError unless `t` is a defined cuda tensor.
void require_cuda(const Tensor& t, const char* op, const char* name);
/// BackendError "[op] <what> does not fit the 32-bit size cuBLAS/CUDA takes" when value > INT32_MAX.
int checked_int(std::int64_t value, const char* op, const char* what);

/// A cuda tensor of `shape` (uninitialized).
inline Tensor empty(const Shape& shape) { return Tensor::empty(shape, Backend::Cuda); }

/// Threads per block of the one-dimensional kernels.
constexpr int kThreads = 256;
/// Blocks of a grid-stride loop over n elements.
inline unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > (1 << 20) ? (1 << 20) : blocks));
}

/// `count` values of T in device memory from the counted cuda allocator,
/// optionally copied from host memory; freed on destruction.
template <class T>
class DeviceArray {
 public:
  DeviceArray(std::size_t count, const char* op)
      : bytes_(count * sizeof(T)),
        data_(static_cast<T*>(riftco_transformer::detail::allocate_bytes(Backend::Cuda, bytes_))) {
    (void)op;
  }
  DeviceArray(std::span<const T> host, const char* op) : DeviceArray(host.size(), op) {
    if (bytes_ != 0) {
      const cudaError_t status = cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice);
      if (status != cudaSuccess) {
        riftco_transformer::detail::free_bytes(Backend::Cuda, data_, bytes_);
        check(status, op, "cudaMemcpy (host to device)");
      }
    }
  }
  ~DeviceArray() { riftco_transformer::detail::free_bytes(Backend::Cuda, data_, bytes_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return data_; }
  /// Copies the values back to `host` (size() values).
  void copy_to(std::span<T> host, const char* op) const {
    if (bytes_ != 0) check(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), op, "cudaMemcpy (device to host)");
  }

 private:
  std::size_t bytes_;
  T* data_;
};

}  // namespace riftco_transformer::cuda::detail
