// Without the CUDA backend there is no CUDA kernel table: kernels(cuda)
// throws "not built" (backend/dispatch.cpp). A CUDA build defines
// cuda_kernels() in backend/cuda/ instead of this stub.
#ifndef RIFTCO_CUDA
#include "kernels.hpp"

namespace riftco_transformer::backend {

const Kernels* cuda_kernels() { return nullptr; }

}  // namespace riftco_transformer::backend
#endif
