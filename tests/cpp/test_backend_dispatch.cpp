// The backend seam (src/backend/kernels.hpp): which table an op gets, the
// errors for a missing backend and for mixed operands, Tensor::device_data(),
// and the kernels added to the table so ops need no host loops (sum_all,
// all_finite, take_columns, cache_write), each against a plain reference.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../../src/backend/kernels.hpp"
#include "backend_error.hpp"
#include "riftco_transformer/tensor.hpp"

using namespace riftco_transformer;
using rt_test::backend_error;

namespace {

Tensor iota(const Shape& shape, float start = 0.0F) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = start + static_cast<float>(i);
  return t;
}

}  // namespace

TEST(BackendDispatch, CpuTableIsTheCpuBackend) {
  const backend::Kernels& k = backend::kernels(Backend::Cpu);
  EXPECT_EQ(k.backend(), Backend::Cpu);
  EXPECT_EQ(&k, &backend::cpu_kernels());
  const Tensor a = Tensor::ones({2, 3});
  EXPECT_EQ(&backend::kernels_for("test", a, a, Tensor()), &k);  // an undefined optional operand is skipped
}

TEST(BackendDispatch, CudaNotBuiltNamesTheOp) {
  if (backend::cuda_kernels() != nullptr) GTEST_SKIP() << "CUDA backend built; its table is tested by the GPU tests";
  EXPECT_EQ(backend_error([] { (void)backend::kernels(Backend::Cuda, "matmul"); }),
            "[matmul] the cuda backend is not built in this package");
}

TEST(BackendDispatch, MixedOperandsNameOpShapesAndBackends) {
  // A CPU-only build cannot make a cuda tensor, so the error kernels_for
  // throws for mixed operands is checked on its own.
  EXPECT_EQ(backend_error([] {
              backend::throw_mixed_backends("matmul", 0, Backend::Cpu, {4, 8}, 1, Backend::Cuda, {8, 3});
            }),
            "[matmul] operand 0 (4, 8) is on cpu but operand 1 (8, 3) is on cuda");
}

TEST(BackendDispatch, DeviceDataIsTheBufferAndWritesBumpTheVersion) {
  Tensor t = Tensor::zeros({4});
  const std::uint64_t before = t.version();
  EXPECT_EQ(std::as_const(t).device_data(), std::as_const(t).data());
  EXPECT_EQ(t.version(), before);  // reading leaves the version alone
  EXPECT_EQ(t.device_data(), std::as_const(t).data());
  EXPECT_EQ(t.version(), before + 1);  // a pointer for writing bumps it, as data() does
  EXPECT_THROW((void)Tensor().device_data(), ValueError);
}

TEST(BackendKernels, SumAllIsTheSerialDoubleSum) {
  const Tensor x = iota({3, 5}, -7.25F);
  double expected = 0.0;
  for (const float v : x.values()) expected += v;
  EXPECT_EQ(backend::cpu_kernels().sum_all(x), expected);
}

TEST(BackendKernels, AllFiniteFindsNanAndInf) {
  const backend::Kernels& k = backend::cpu_kernels();
  std::vector<float> v{1.0F, -2.0F, 0.0F};
  EXPECT_TRUE(k.all_finite(v));
  v[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(k.all_finite(v));
  v[1] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(k.all_finite(v));
  EXPECT_TRUE(k.all_finite({}));
}

TEST(BackendKernels, TakeColumnsCopiesTheRange) {
  const Tensor x = iota({2, 3, 6});
  const Tensor c = backend::cpu_kernels().take_columns(x, 2, 3);
  ASSERT_EQ(c.shape(), (Shape{2, 3, 3}));
  for (std::int64_t r = 0; r < 6; ++r) {
    for (std::int64_t j = 0; j < 3; ++j) EXPECT_EQ(c.values()[r * 3 + j], x.values()[r * 6 + 2 + j]);
  }
}

TEST(BackendKernels, CacheWriteFillsOneRowPerHead) {
  Tensor cache = Tensor::zeros({2, 4, 3});  // (G, capacity, D)
  const Tensor rows = iota({2, 1, 3}, 1.0F);
  backend::cpu_kernels().cache_write(cache, rows, 2);
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t p = 0; p < 4; ++p) {
      for (std::int64_t d = 0; d < 3; ++d) {
        const float expected = p == 2 ? rows.at({h, 0, d}) : 0.0F;
        EXPECT_EQ(cache.at({h, p, d}), expected) << "head " << h << " row " << p;
      }
    }
  }
}
