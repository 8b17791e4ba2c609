// Matrix products through cuBLAS. Row-major C = op(A) op(B) is computed as
// the column-major Cᵀ = op(B)ᵀ op(A)ᵀ: cuBLAS reads each row-major matrix as
// its transpose, so the operands swap places and keep their own op.
//
// One handle for the process, on the legacy default stream, math mode
// CUBLAS_DEFAULT_MATH (full fp32, no TF32) unless RIFTCO_CUDA_TF32=1 asks for
// CUBLAS_TF32_TENSOR_OP_MATH. cuBLAS gives the same bits every run for the
// same problem on the same device (no atomics mode is enabled).
#include <cublas_v2.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda_common.hpp"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

void check_cublas(cublasStatus_t status, const char* op, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw BackendError(std::string("[") + op + "] " + call + " failed on cuda: " + cublas_status_name(status) + " (" +
                       std::to_string(static_cast<int>(status)) + ")");
  }
  detail::profile_mark(op, call);
}

bool read_tf32_switch() {
  const char* value = std::getenv("RIFTCO_CUDA_TF32");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

/// The process's handle, made on first use (never destroyed: the CUDA
/// context may be gone by the time static destructors run). cuBLAS calls
/// through one handle from several host threads are serialized by `lock`.
struct Blas {
  std::mutex lock;
  cublasHandle_t handle = nullptr;
};

Blas& blas(const char* op) {
  static Blas instance;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [&] {
    try {
      check_cublas(cublasCreate(&instance.handle), op, "cublasCreate");
      check_cublas(cublasSetStream(instance.handle, nullptr), op, "cublasSetStream");
      check_cublas(cublasSetMathMode(instance.handle, tf32_enabled() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                   op, "cublasSetMathMode");
      check_cublas(cublasSetAtomicsMode(instance.handle, CUBLAS_ATOMICS_NOT_ALLOWED), op, "cublasSetAtomicsMode");
    } catch (const BackendError& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw BackendError(failure);
  return instance;
}

/// C = beta·C (beta 0: C = 0, not reading C) for the k = 0 products.
__global__ void scale_matrix(float* c, std::int64_t m, std::int64_t n, std::int64_t ldc, float beta) {
  const std::int64_t total = m * n;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float* p = c + (i / n) * ldc + i % n;
    *p = beta == 0.0F ? 0.0F : beta * *p;
  }
}

/// c(i,j) = addend(i,j) + c(i,j): one IEEE addition, the elementwise add's bits.
__global__ void add_to_matrix(float* c, const float* addend, std::int64_t m, std::int64_t n, std::int64_t ldc,
                              std::int64_t ld_addend) {
  const std::int64_t total = m * n;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float* p = c + (i / n) * ldc + i % n;
    *p = __fadd_rn(addend[(i / n) * ld_addend + i % n], *p);
  }
}

}  // namespace

bool tf32_enabled() {
  static const bool enabled = read_tf32_switch();
  return enabled;
}

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  constexpr const char* op = "gemm";
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scale_matrix<<<detail::grid_for(m * n), detail::kThreads>>>(c, m, n, ldc, beta);
    detail::check_launch(op, "scale_matrix");
    return;
  }
  Blas& handle = blas(op);
  std::lock_guard<std::mutex> guard(handle.lock);
  check_cublas(cublasSgemm(handle.handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                           detail::checked_int(n, op, "n"), detail::checked_int(m, op, "m"),
                           detail::checked_int(k, op, "k"), &alpha, b, detail::checked_int(ldb, op, "ldb"), a,
                           detail::checked_int(lda, op, "lda"), &beta, c, detail::checked_int(ldc, op, "ldc")),
               op, "cublasSgemm");
}

void gemm_group(std::span<const std::span<const GemmProblem>> chains) {
  // Chains write disjoint C; within a chain the products run in order.
  for (const std::span<const GemmProblem> chain : chains) {
    for (const GemmProblem& p : chain) {
      gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc);
      if (p.addend != nullptr && p.m > 0 && p.n > 0) {
        add_to_matrix<<<detail::grid_for(p.m * p.n), detail::kThreads>>>(p.c, p.addend, p.m, p.n, p.ldc,
                                                                          p.ld_addend);
        detail::check_launch("gemm", "add_to_matrix");
      }
    }
  }
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  constexpr const char* op = "matmul";
  detail::require_cuda(a, op, "a");
  detail::require_cuda(b, op, "b");
  const std::int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const std::int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const std::int64_t n = trans_b ? b.size(-2) : b.size(-1);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = detail::empty(out_shape);
  const std::int64_t batch = shape_numel(Shape(out_shape.begin(), out_shape.end() - 2));
  const std::int64_t lda = a.size(-1);
  const std::int64_t ldb = b.size(-1);
  const float* pa = a.device_data();
  const float* pb = b.device_data();
  float* pc = out.device_data();
  if (b.dim() == 2 && !trans_a) {  // one product: the batch folded into M
    gemm(false, trans_b, batch * m, n, k, 1.0F, pa, lda, pb, ldb, 0.0F, pc, n);
    return out;
  }
  if (batch == 0 || m == 0 || n == 0) return out;
  if (k == 0 || batch == 1) {
    for (std::int64_t i = 0; i < batch; ++i) {
      gemm(trans_a, trans_b, m, n, k, 1.0F, pa + i * m * k, lda, pb + (b.dim() == 2 ? 0 : i * k * n), ldb, 0.0F,
           pc + i * m * n, n);
    }
    return out;
  }
  // One strided-batched call; a 2-D b is shared by every item (stride 0).
  const float alpha = 1.0F;
  const float beta = 0.0F;
  Blas& handle = blas(op);
  std::lock_guard<std::mutex> guard(handle.lock);
  check_cublas(cublasSgemmStridedBatched(
                   handle.handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                   detail::checked_int(n, op, "n"), detail::checked_int(m, op, "m"), detail::checked_int(k, op, "k"),
                   &alpha, pb, detail::checked_int(ldb, op, "ldb"), b.dim() == 2 ? 0 : k * n, pa,
                   detail::checked_int(lda, op, "lda"), m * k, &beta, pc, detail::checked_int(n, op, "ldc"), m * n,
                   detail::checked_int(batch, op, "batch")),
               op, "cublasSgemmStridedBatched");
  return out;
}

}  // namespace riftco_transformer::cuda
