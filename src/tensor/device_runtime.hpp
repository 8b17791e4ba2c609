#pragma once
// The few CUDA runtime calls the tensor layer needs (allocation, copies,
// zero fill), behind plain functions so memory.cpp and tensor.cpp stay free
// of CUDA headers. Without RIFTCO_CUDA every call but the queries throws
// BackendError "the cuda backend is not built in this package".
#include <cstddef>
#include <string>

#include "riftco_transformer/memory.hpp"  // Backend

namespace riftco_transformer::detail {

/// True when built with CUDA and at least one device is visible (asked once).
bool cuda_device_present();
/// Why the cuda backend cannot be used ("" when it can).
std::string cuda_unavailable_reason();

/// cudaMalloc; throws BackendError naming the call, the bytes and the reason.
void* cuda_malloc(std::size_t bytes);
/// cudaFree; errors are ignored (called from destructors).
void cuda_free(void* ptr) noexcept;

enum class CopyKind : unsigned char { HostToDevice, DeviceToHost, DeviceToDevice };
/// cudaMemcpy (synchronous with the host); throws BackendError naming `op`.
void cuda_copy(void* dst, const void* src, std::size_t bytes, CopyKind kind, const char* op);
/// cudaMemset to zero bytes; throws BackendError naming `op`.
void cuda_zero(void* dst, std::size_t bytes, const char* op);
/// Copies `bytes` between buffers on any two backends: memcpy between host
/// buffers, else cuda_copy in the direction the backends give (synchronous).
/// Nothing for 0 bytes. Throws BackendError naming `op`.
void copy_bytes(void* dst, Backend dst_backend, const void* src, Backend src_backend, std::size_t bytes,
                const char* op);

// ---- activation offload (offload.cpp) -------------------------------------
/// cudaHostAlloc (page-locked host memory); throws BackendError naming `op`.
void* cuda_host_alloc(std::size_t bytes, const char* op);
/// Waits for the copy stream, then cudaFreeHost; errors are ignored.
void cuda_host_free(void* ptr) noexcept;

/// Compute: the legacy default stream every kernel runs on. Copy: one
/// non-blocking stream (made at first use) for the offload copies only.
enum class Stream : unsigned char { Compute, Copy };
using CudaEvent = void*;
/// A cudaEvent (timing disabled) recorded now on `stream`.
CudaEvent cuda_record_event(Stream stream, const char* op);
/// `stream` waits on the device, not the host, for `event`.
void cuda_wait_event(Stream stream, CudaEvent event, const char* op);
void cuda_destroy_event(CudaEvent event) noexcept;
/// cudaMemcpyAsync on the copy stream (the host buffer must be pinned).
void cuda_copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, const char* op);

}  // namespace riftco_transformer::detail
