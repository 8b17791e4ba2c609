#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>


#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/tensor.hpp"
#include "riftco_transformer/variable.hpp"

using namespace riftco_transformer;

TEST(Memory, AllocationAndFreeMoveCountersExactly) {
  const MemoryStats before = memory_stats(Backend::Cpu);
  {
    Tensor a = Tensor::zeros({10, 10});  // 400 bytes
    MemoryStats mid = memory_stats(Backend::Cpu);
    EXPECT_EQ(mid.live_bytes - before.live_bytes, 400);
    EXPECT_EQ(mid.allocation_count - before.allocation_count, 1);
    Tensor b = a;  // shares the buffer: no allocation
    EXPECT_EQ(memory_stats().allocation_count, mid.allocation_count);
    Tensor c = a.clone();  // copies: 400 more
    EXPECT_EQ(memory_stats().live_bytes - before.live_bytes, 800);
  }
  const MemoryStats after = memory_stats(Backend::Cpu);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(after.free_count - before.free_count, 2);
}

TEST(Memory, PeakTracksMaximumAndResets) {
  reset_peak_memory();
  const std::int64_t base = memory_stats().live_bytes;
  EXPECT_EQ(memory_stats().peak_bytes, base);
  { Tensor big = Tensor::zeros({1000}); }  // 4000 bytes, freed
  EXPECT_EQ(memory_stats().peak_bytes, base + 4000);
  EXPECT_EQ(memory_stats().live_bytes, base);
  reset_peak_memory();
  EXPECT_EQ(memory_stats().peak_bytes, base);
}

TEST(Memory, CudaStatsExistAndCudaTensorsFailClearly) {
  EXPECT_EQ(memory_stats(Backend::Cuda).live_bytes, 0);
  if (backend_available(Backend::Cuda)) GTEST_SKIP() << "CUDA backend built; covered by the GPU tests";
  try {
    Tensor::zeros({2}, Backend::Cuda);
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    // Not built, or built with no device present: either way the message says which.
    const std::string what = e.what();
    EXPECT_TRUE(what.find("cuda backend is not built") != std::string::npos ||
                what.find("no CUDA device") != std::string::npos)
        << what;
  }
  EXPECT_THROW(Tensor::zeros({2}).to(Backend::Cuda), BackendError);
}

TEST(Random, SameSeedSameStreamAndKnownValues) {
  Random a(42);
  Random b(42);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.next_u32(), b.next_u32());
  // Golden values: PCG32 is integer-only, so these hold on every machine.
  Random c(42);
  EXPECT_EQ(c.next_u32(), 1898997482U);
  EXPECT_EQ(c.next_u32(), 1014631766U);
  EXPECT_EQ(c.uniform(), 0.953676283F);
  EXPECT_NEAR(c.normal(), -0.187246308F, 1e-7);  // Box–Muller goes through libm
  Random e(43);
  EXPECT_NE(e.next_u32(), 1898997482U);
}

TEST(Random, StateRoundTripReproducesStream) {
  Random r(7);
  r.normal();  // leaves a spare normal in the state
  const Random::State s = r.state();
  const float x1 = r.normal();
  const float x2 = r.uniform();
  r.set_state(s);
  EXPECT_EQ(r.normal(), x1);
  EXPECT_EQ(r.uniform(), x2);
}

TEST(Random, NormalHasRoughlyUnitMoments) {
  Random r(1);
  const Tensor t = Tensor::normal({20000}, r);
  double mean = 0;
  double var = 0;
  for (float v : t.values()) mean += v;
  mean /= 20000;
  for (float v : t.values()) var += (v - mean) * (v - mean);
  var /= 20000;
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(var, 1.0, 0.05);
  for (int i = 0; i < 1000; ++i) {
    const std::uint32_t k = r.below(7);
    EXPECT_LT(k, 7U);
  }
}

TEST(Tensor, CreationReshapeAndAccess) {
  Tensor t = Tensor::from_data({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.at({1, 2}), 6.0F);
  Tensor r = t.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_TRUE(r.shares_storage(t));
  EXPECT_EQ(r.at({2, 1}), 6.0F);
  EXPECT_THROW(t.reshape({4, 2}), ShapeError);
  EXPECT_THROW(t.at({2, 0}), ShapeError);
  EXPECT_THROW(Tensor::from_data({2, 2}, {1, 2, 3}), ShapeError);
  EXPECT_EQ(Tensor::full({2}, 3.5F).at({1}), 3.5F);
  EXPECT_EQ(Tensor::ones({3}).to_vector(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(Tensor::scalar(2.0F).item(), 2.0F);
  EXPECT_THROW(t.item(), ShapeError);
}

TEST(Tensor, ItemReadsTheOneElementWithoutWriting) {
  Tensor t = Tensor::from_data({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor one = Tensor::full({1, 1, 1}, -2.5F);
  const std::uint64_t version = one.version();
  EXPECT_EQ(one.item(), -2.5F);
  EXPECT_EQ(one.reshape({}).item(), -2.5F);  // a view of the same storage
  EXPECT_EQ(one.version(), version);         // a read: no version bump
  for (const Tensor& bad : {t, Tensor::zeros({0}), Tensor()}) {
    try {
      (void)bad.item();
      FAIL() << "item() of " << shape_string(bad.shape());
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("[item] needs one element, shape is " + shape_string(bad.shape())),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Tensor, ErrorMessagesCarryShapes) {
  try {
    Tensor::from_data({2, 3}, {1, 2}).numel();
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[from_data] shape (2, 3)"), std::string::npos) << e.what();
  }
}

// A Backend value outside the enum (a cast from a bad int) is a ValueError
// naming it, not "cuda is not built" (and not an index past the counters);
// random fills refuse parameters that give no distribution.
TEST(Tensor, AnUnknownBackendAndImpossibleRandomParametersAreValueErrors) {
  const auto bad = static_cast<Backend>(9);
  for (const std::function<void()>& call : std::vector<std::function<void()>>{
           [&] { (void)Tensor::zeros({2}, bad); }, [&] { (void)memory_stats(bad); },
           [&] { reset_peak_memory(bad); }, [&] { (void)release_cached_memory(bad); }}) {
    try {
      call();
      ADD_FAILURE() << "backend 9 was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("unknown backend 9"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(backend_available(bad));
  Random r(1);
  EXPECT_THROW((void)Tensor::normal({2}, r, 0.0F, std::nanf("")), ValueError);
  EXPECT_THROW((void)Tensor::normal({2}, r, 0.0F, -1.0F), ValueError);
  EXPECT_THROW((void)Tensor::normal({2}, r, std::numeric_limits<float>::infinity(), 1.0F), ValueError);
  EXPECT_THROW((void)Tensor::uniform({2}, r, 1.0F, 0.0F), ValueError);
  EXPECT_THROW((void)Tensor::uniform({2}, r, 0.0F, std::numeric_limits<float>::infinity()), ValueError);
  EXPECT_EQ(Tensor::normal({2}, r, 3.0F, 0.0F).to_vector(), (std::vector<float>{3.0F, 3.0F}));
  EXPECT_EQ(Tensor::uniform({1}, r, 2.0F, 2.0F).to_vector(), (std::vector<float>{2.0F}));
}

TEST(TensorShape, AnEmptyShapeWhoseOtherDimensionsOverflowIsRefusedInAnyOrder) {
  // The nonzero dimensions bound every stride: (0, 6, 2^62) was accepted
  // (its strides overflowed) while (2^62, 0) was refused.
  const std::int64_t huge = std::int64_t{1} << 62;
  for (const Shape& shape : {Shape{0, 6, huge}, Shape{huge, 0}, Shape{6, 0, huge}, Shape{huge, 6, 0}}) {
    EXPECT_THROW((void)Tensor::zeros(shape), ShapeError) << shape_string(shape);
    EXPECT_THROW((void)reshape(Variable(Tensor::zeros({0, 4})), shape), ShapeError) << shape_string(shape);
  }
  for (const Shape& shape : {Shape{huge, 6, -1}, Shape{-1, huge, 6}, Shape{0, huge, 8, -1}}) {  // -1 inferred
    EXPECT_THROW((void)reshape(Variable(Tensor::zeros({0, 4})), shape), ShapeError) << shape_string(shape);
  }
  EXPECT_EQ(Tensor::zeros({0, 6, std::int64_t{1} << 40}).numel(), 0);  // large but representable: fine
  EXPECT_EQ(Tensor::zeros({2, 6}).reshape({-1, 3}).shape(), (Shape{4, 3}));
}
