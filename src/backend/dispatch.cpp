// kernels(backend): the table an op dispatches to; kernels_for's error.
#include <string>

#include "kernels.hpp"

namespace riftco_transformer::backend {

const Kernels& kernels(Backend backend, const char* op) {
  switch (backend) {
    case Backend::Cpu:
      return cpu_kernels();
    case Backend::Cuda:
      if (const Kernels* table = cuda_kernels()) return *table;
      throw BackendError(std::string("[") + op + "] the cuda backend is not built in this package");
  }
  throw BackendError(std::string("[") + op + "] unknown backend " + std::to_string(static_cast<int>(backend)));
}

void throw_mixed_backends(const char* op, std::size_t i, Backend a, const Shape& a_shape, std::size_t j, Backend b,
                          const Shape& b_shape) {
  throw BackendError(std::string("[") + op + "] operand " + std::to_string(i) + " " + shape_string(a_shape) +
                     " is on " + backend_name(a) + " but operand " + std::to_string(j) + " " + shape_string(b_shape) +
                     " is on " + backend_name(b));
}

}  // namespace riftco_transformer::backend
