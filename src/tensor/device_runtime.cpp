// CUDA runtime calls of the tensor layer (device_runtime.hpp). Built in every
// configuration: with RIFTCO_CUDA the calls go to the CUDA runtime, without
// it they throw the "not built" BackendError.
#include "device_runtime.hpp"

#include <cstring>

#include "riftco_transformer/errors.hpp"

#if RIFTCO_CUDA
#include <cuda_runtime_api.h>
#endif

namespace riftco_transformer::detail {

#if RIFTCO_CUDA

namespace {

struct DeviceQuery {
  bool present = false;
  std::string reason;
};

const DeviceQuery& device_query() {
  static const DeviceQuery query = [] {
    DeviceQuery q;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear it, so later calls do not report it again
      q.reason = std::string("the cuda backend is built but no CUDA device is usable (cudaGetDeviceCount: ") +
                 cudaGetErrorString(status) + ")";
    } else if (count == 0) {
      q.reason = "the cuda backend is built but no CUDA device is present (cudaGetDeviceCount: 0)";
    } else {
      q.present = true;
    }
    return q;
  }();
  return query;
}

/// Out of device (or pinned host) memory is an OutOfMemoryError, a
/// std::bad_alloc as the host's is (RT_ERROR_OUT_OF_MEMORY in C, MemoryError
/// in Python), so a caller tells it from a broken device; other failures are
/// BackendErrors.
void check(cudaError_t status, const char* op, const char* call, std::size_t bytes) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  const std::string message = std::string("[") + op + "] " + call + " of " + std::to_string(bytes) +
                              " bytes failed on cuda: " + cudaGetErrorString(status);
  if (status == cudaErrorMemoryAllocation) throw OutOfMemoryError(message);
  throw BackendError(message);
}

}  // namespace

bool cuda_device_present() { return device_query().present; }
std::string cuda_unavailable_reason() { return device_query().reason; }

void* cuda_malloc(std::size_t bytes) {
  if (!cuda_device_present()) throw BackendError("[allocate] " + cuda_unavailable_reason());
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, bytes), "allocate", "cudaMalloc", bytes);
  return ptr;
}

void cuda_free(void* ptr) noexcept {
  if (ptr != nullptr) cudaFree(ptr);
}

void cuda_copy(void* dst, const void* src, std::size_t bytes, CopyKind kind, const char* op) {
  if (bytes == 0) return;
  const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyDeviceToDevice;
  check(cudaMemcpy(dst, src, bytes, k), op, "cudaMemcpy", bytes);
}

void cuda_zero(void* dst, std::size_t bytes, const char* op) {
  if (bytes == 0) return;
  check(cudaMemset(dst, 0, bytes), op, "cudaMemset", bytes);
}

void* cuda_host_alloc(std::size_t bytes, const char* op) {
  if (!cuda_device_present()) throw BackendError(std::string("[") + op + "] " + cuda_unavailable_reason());
  void* ptr = nullptr;
  check(cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault), op, "cudaHostAlloc", bytes);
  return ptr;
}

namespace {
cudaStream_t copy_stream() {
  static const cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "offload", "cudaStreamCreateWithFlags", 0);
    return s;
  }();
  return stream;
}
cudaStream_t stream_of(Stream stream) { return stream == Stream::Copy ? copy_stream() : cudaStreamLegacy; }
}  // namespace

void cuda_host_free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  cudaStreamSynchronize(copy_stream());  // no copy still reads or writes it
  cudaFreeHost(ptr);
}

CudaEvent cuda_record_event(Stream stream, const char* op) {
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), op, "cudaEventCreate", 0);
  const cudaError_t status = cudaEventRecord(event, stream_of(stream));
  if (status != cudaSuccess) cudaEventDestroy(event);
  check(status, op, "cudaEventRecord", 0);
  return event;
}

void cuda_wait_event(Stream stream, CudaEvent event, const char* op) {
  check(cudaStreamWaitEvent(stream_of(stream), static_cast<cudaEvent_t>(event), 0), op, "cudaStreamWaitEvent", 0);
}

void cuda_destroy_event(CudaEvent event) noexcept {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void cuda_copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, const char* op) {
  if (bytes == 0) return;
  const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyDeviceToDevice;
  check(cudaMemcpyAsync(dst, src, bytes, k, copy_stream()), op, "cudaMemcpyAsync", bytes);
}

#else  // !RIFTCO_CUDA

namespace {
[[noreturn]] void not_built(const char* op) {
  throw BackendError(std::string("[") + op + "] the cuda backend is not built in this package");
}
}  // namespace

bool cuda_device_present() { return false; }
std::string cuda_unavailable_reason() { return "the cuda backend is not built in this package"; }
void* cuda_malloc(std::size_t) { not_built("allocate"); }
void cuda_free(void*) noexcept {}
void cuda_copy(void*, const void*, std::size_t, CopyKind, const char* op) { not_built(op); }
void cuda_zero(void*, std::size_t, const char* op) { not_built(op); }
void* cuda_host_alloc(std::size_t, const char* op) { not_built(op); }
void cuda_host_free(void*) noexcept {}
CudaEvent cuda_record_event(Stream, const char* op) { not_built(op); }
void cuda_wait_event(Stream, CudaEvent, const char* op) { not_built(op); }
void cuda_destroy_event(CudaEvent) noexcept {}
void cuda_copy_async(void*, const void*, std::size_t, CopyKind, const char* op) { not_built(op); }

#endif

void copy_bytes(void* dst, Backend dst_backend, const void* src, Backend src_backend, std::size_t bytes,
                const char* op) {
  if (bytes == 0) return;
  if (dst_backend == Backend::Cpu && src_backend == Backend::Cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const CopyKind kind = src_backend == Backend::Cpu   ? CopyKind::HostToDevice
                        : dst_backend == Backend::Cpu ? CopyKind::DeviceToHost
                                                      : CopyKind::DeviceToDevice;
  cuda_copy(dst, src, bytes, kind, op);
}

}  // namespace riftco_transformer::detail
