// One table of ops: every op has a forward check against a direct
// computation, a finite-difference gradient check (gradcheck.hpp states the
// tolerances) and an error check that names the op and the shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gradcheck.hpp"
#include "riftco_transformer/ops.hpp"

using namespace riftco_transformer;
using rt_test::gradcheck;

namespace {

Tensor randn(const Shape& shape, std::uint64_t seed) {
  Random r(seed);
  return Tensor::normal(shape, r);
}

template <typename F>
void expect_error_mentions(F&& f, const std::string& a, const std::string& b = "") {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << a;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(a), std::string::npos) << e.what();
    if (!b.empty()) EXPECT_NE(std::string(e.what()).find(b), std::string::npos) << e.what();
  }
}

const std::vector<std::int32_t> kIds = {3, 1, 3, 0, 4, 1};

}  // namespace

struct OpCase {
  const char* name;
  std::function<Variable(const std::vector<Variable>&)> f;
  std::vector<Shape> shapes;
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

class OpGradient : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpGradient, FiniteDifferences) {
  const OpCase& c = GetParam();
  std::vector<Tensor> inputs;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) inputs.push_back(randn(c.shapes[i], 100 + i));
  EXPECT_EQ(gradcheck(c.f, inputs), 0) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, OpGradient,
    ::testing::Values(
        OpCase{"matmul", [](auto& v) { return matmul(v[0], v[1]); }, {{3, 4}, {4, 5}}},
        OpCase{"matmul_batched", [](auto& v) { return matmul(v[0], v[1]); }, {{2, 3, 4}, {2, 4, 5}}},
        OpCase{"matmul_shared_rhs", [](auto& v) { return matmul(v[0], v[1]); }, {{2, 3, 4}, {4, 5}}},
        OpCase{"matmul_ta", [](auto& v) { return matmul(v[0], v[1], true, false); }, {{2, 4, 3}, {2, 4, 5}}},
        OpCase{"matmul_tb", [](auto& v) { return matmul(v[0], v[1], false, true); }, {{2, 3, 4}, {2, 5, 4}}},
        OpCase{"matmul_ta_tb", [](auto& v) { return matmul(v[0], v[1], true, true); }, {{2, 4, 3}, {2, 5, 4}}},
        OpCase{"matmul_shared_ta", [](auto& v) { return matmul(v[0], v[1], true, false); }, {{2, 4, 3}, {4, 5}}},
        OpCase{"matmul_shared_ta_tb", [](auto& v) { return matmul(v[0], v[1], true, true); }, {{2, 4, 3}, {5, 4}}},
        OpCase{"linear", [](auto& v) { return linear(v[0], v[1]); }, {{2, 3, 4}, {6, 4}}},
        OpCase{"add", [](auto& v) { return add(v[0], v[1]); }, {{2, 3}, {2, 3}}},
        OpCase{"add_bcast_row", [](auto& v) { return add(v[0], v[1]); }, {{2, 3, 4}, {4}}},
        OpCase{"add_bcast_general", [](auto& v) { return add(v[0], v[1]); }, {{2, 1, 4}, {3, 1}}},
        OpCase{"sub_bcast", [](auto& v) { return sub(v[0], v[1]); }, {{2, 3}, {1, 3}}},
        OpCase{"mul_bcast", [](auto& v) { return mul(v[0], v[1]); }, {{2, 3, 4}, {3, 1}}},
        OpCase{"scale", [](auto& v) { return scale(v[0], -1.5F); }, {{5}}},
        OpCase{"sum", [](auto& v) { return sum(v[0]); }, {{3, 2}}},
        OpCase{"mean", [](auto& v) { return mean(v[0]); }, {{3, 2}}},
        OpCase{"reshape", [](auto& v) { return reshape(v[0], {3, 4}); }, {{2, 6}}},
        OpCase{"transpose", [](auto& v) { return transpose(v[0], 0, -1); }, {{2, 3, 4}}},
        OpCase{"permute_heads", [](auto& v) { return permute(v[0], {0, 2, 1, 3}); }, {{2, 3, 2, 4}}},
        OpCase{"embedding", [](auto& v) { return embedding(v[0], kIds, {2, 3}); }, {{5, 4}}},
        OpCase{"rms_norm", [](auto& v) { return rms_norm(v[0], v[1], 1e-5F); }, {{2, 3, 8}, {8}}},
        OpCase{"silu", [](auto& v) { return silu(v[0]); }, {{4, 5}}},
        OpCase{"gelu", [](auto& v) { return gelu(v[0]); }, {{4, 5}}},
        OpCase{"swiglu", [](auto& v) { return swiglu(v[0], v[1]); }, {{3, 4}, {3, 4}}},
        OpCase{"softmax", [](auto& v) { return softmax(v[0]); }, {{3, 5}}},
        OpCase{"causal_softmax", [](auto& v) { return softmax(causal_mask(v[0])); }, {{2, 4, 4}}},
        OpCase{"causal_offset", [](auto& v) { return softmax(causal_mask(v[0], 2)); }, {{2, 3, 5}}},
        OpCase{"rope", [](auto& v) { return rope(v[0], 3); }, {{2, 2, 5, 6}}},
        OpCase{"cross_entropy",
               [](auto& v) { return cross_entropy(v[0], std::vector<std::int32_t>{1, 0, 4, 2, 3, 3}); },
               {{2, 3, 5}}},
        OpCase{"repeat_heads", [](auto& v) { return repeat_heads(v[0], 3); }, {{2, 2, 4, 3}}},
        // The generator is reset for every evaluation: one fixed mask.
        OpCase{"dropout",
               [](auto& v) {
                 Random mask(77);
                 return dropout(v[0], 0.3F, mask);
               },
               {{3, 7}}},
        OpCase{"cross_entropy_ignore",
               [](auto& v) { return cross_entropy(v[0], std::vector<std::int32_t>{1, -100, 4, -100}); },
               {{4, 5}}}),
    [](const ::testing::TestParamInfo<OpCase>& info) { return std::string(info.param.name); });

TEST(OpForward, MatmulMatchesDirectSum) {
  const Tensor a = randn({2, 3, 4}, 1);
  const Tensor b = randn({2, 4, 5}, 2);
  const Tensor c = matmul(Variable(a), Variable(b)).value();
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) {
        double acc = 0;
        for (int k = 0; k < 4; ++k) acc += a.at({n, i, k}) * b.at({n, k, j});
        EXPECT_NEAR(c.at({n, i, j}), acc, 1e-5);
      }
}

TEST(OpForward, SoftmaxRowsSumToOneAndMaskedEntriesAreZero) {
  const Tensor y = softmax(causal_mask(Variable(randn({1, 4, 4}, 3)))).value();
  for (int i = 0; i < 4; ++i) {
    double total = 0;
    for (int j = 0; j < 4; ++j) {
      total += y.at({0, i, j});
      if (j > i) EXPECT_EQ(y.at({0, i, j}), 0.0F);
    }
    EXPECT_NEAR(total, 1.0, 1e-6);
  }
}

TEST(OpForward, RmsNormOfConstantRowIsWeight) {
  const Tensor x = Tensor::full({1, 4}, 3.0F);
  const Tensor w = Tensor::from_data({4}, {1, 2, 3, 4});
  const Tensor y = rms_norm(Variable(x), Variable(w), 1e-12F).value();
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(y.at({0, j}), w.at({j}), 1e-5);
}

TEST(OpForward, RopeAtPositionZeroIsIdentityAndPreservesNorm) {
  const Tensor x = randn({1, 3, 4}, 4);
  const Tensor y = rope(Variable(x)).value();
  for (int j = 0; j < 4; ++j) EXPECT_EQ(y.at({0, 0, j}), x.at({0, 0, j}));
  for (int t = 0; t < 3; ++t) {
    double nx = 0;
    double ny = 0;
    for (int j = 0; j < 4; ++j) {
      nx += x.at({0, t, j}) * x.at({0, t, j});
      ny += y.at({0, t, j}) * y.at({0, t, j});
    }
    EXPECT_NEAR(nx, ny, 1e-5);
  }
  // Offset p on one position equals position p of a longer sequence.
  const Tensor long_x = Tensor::normal({1, 5, 4}, *std::make_unique<Random>(9));
  const Tensor full = rope(Variable(long_x)).value();
  const Tensor last = rope(Variable(Tensor::from_data({1, 1, 4}, {long_x.at({0, 4, 0}), long_x.at({0, 4, 1}),
                                                                  long_x.at({0, 4, 2}), long_x.at({0, 4, 3})})),
                           4)
                          .value();
  for (int j = 0; j < 4; ++j) EXPECT_EQ(last.at({0, 0, j}), full.at({0, 4, j}));
}

// Positions past the shared tables (2^16) get rows made for the call, the
// same bits as the tables': a long sequence's rows equal short windows of it
// at their offsets, inside and past the tables. Positions at or past 2^20
// (and offsets whose sum with T overflows) are a ValueError, before any
// table is grown: such an offset built a table of every position up to it.
TEST(OpForward, RopeFarPositionsMatchTheTablesAndPastTheLimitIsAValueError) {
  const std::int64_t t = 70010;
  const Tensor x = Tensor::normal({1, t, 4}, *std::make_unique<Random>(11));
  const Tensor full = rope(Variable(x)).value();  // past the tables: made for the call
  for (const std::int64_t offset : {std::int64_t{100}, std::int64_t{65530}, std::int64_t{70000}}) {
    std::vector<float> rows(x.values().begin() + offset * 4, x.values().begin() + (offset + 10) * 4);
    const Tensor window = rope(Variable(Tensor::from_data({1, 10, 4}, rows)), offset).value();
    for (std::int64_t i = 0; i < 40; ++i) {
      EXPECT_EQ(window.values()[static_cast<std::size_t>(i)], full.values()[static_cast<std::size_t>(offset * 4 + i)])
          << offset << " " << i;
    }
  }
  const Variable small(randn({1, 3, 4}, 12));
  EXPECT_EQ(rope(small, (std::int64_t{1} << 20) - 3).shape(), small.shape());  // the last positions
  for (const std::int64_t offset : {(std::int64_t{1} << 20) - 2, std::int64_t{10000000},
                                    std::numeric_limits<std::int64_t>::max() - 1, std::int64_t{-1}}) {
    expect_error_mentions([&] { rope(small, offset); }, "[rope] position_offset " + std::to_string(offset));
  }
}

TEST(OpForward, CrossEntropyOfUniformLogitsIsLogV) {
  const Tensor logits = Tensor::zeros({3, 8});
  const float loss = cross_entropy(Variable(logits), std::vector<std::int32_t>{1, 2, -100}).value().item();
  EXPECT_NEAR(loss, std::log(8.0F), 1e-6);
  // All rows ignored: loss 0 and zero gradient (no division by zero).
  Variable l(Tensor::zeros({2, 3}), true);
  Variable all_ignored = cross_entropy(l, std::vector<std::int32_t>{-100, -100});
  all_ignored.backward();
  EXPECT_EQ(all_ignored.value().item(), 0.0F);
  EXPECT_EQ(l.grad().to_vector(), std::vector<float>(6, 0.0F));
}

TEST(OpForward, GeluAndSiluKnownValues) {
  const Tensor x = Tensor::from_data({3}, {-1.0F, 0.0F, 2.0F});
  const Tensor s = silu(Variable(x)).value();
  EXPECT_NEAR(s.at({0}), -1.0 / (1.0 + std::exp(1.0)), 1e-6);
  EXPECT_EQ(s.at({1}), 0.0F);
  const Tensor g = gelu(Variable(x)).value();
  EXPECT_NEAR(g.at({2}), 1.9545977, 1e-5);  // GPT-2 tanh GELU(2)
  // Below -88.72284 the sigmoid is 0, as exp(-x) overflows in float32
  // (PyTorch: 0); it floored at ~6e-39, so silu(-1e30) was -6e-9 and swiglu
  // of two such values 6e21. -88.5 keeps a tiny value (PyTorch: -3.3e-37).
  const Tensor far = Tensor::from_data({4}, {-1e30F, -1000.0F, -88.8F, -88.5F});
  const Tensor sf = silu(Variable(far)).value();
  for (std::int64_t i = 0; i < 3; ++i) EXPECT_EQ(sf.at({i}), 0.0F) << i;
  EXPECT_LT(sf.at({3}), 0.0F);
  EXPECT_EQ(swiglu(Variable(far), Variable(far)).value().at({0}), 0.0F);
  Variable v(far, true, "v");
  sum(silu(v)).backward();
  for (std::int64_t i = 0; i < 3; ++i) EXPECT_EQ(v.grad().at({i}), 0.0F) << i;
  EXPECT_TRUE(std::isnan(silu(Variable(Tensor::from_data({1}, {std::numeric_limits<float>::quiet_NaN()}))).value().at({0})));
}

// linear names itself, x and weight in its errors (they said matmul, lhs
// and rhs), and takes the documented 1-D x (in,) → (out,) (it was refused:
// matmul needs 2 dimensions), with the 2-D row's values and gradients.
TEST(OpForward, LinearNamesItsOperandsAndTakesAOneDimensionalX) {
  expect_error_mentions([] { linear(Variable(Tensor::zeros({2, 3})), Variable(Tensor::zeros({4, 5}))); },
                        "[linear] x (2, 3) and weight (4, 5)", "weight (out, in)");
  expect_error_mentions([] { linear(Variable(Tensor::zeros({2, 3})), Variable(Tensor::zeros({3}))); },
                        "[linear] x (2, 3) and weight (3,)");
  expect_error_mentions([] { linear(Variable(Tensor::scalar(1.0F)), Variable(Tensor::zeros({1, 1}))); },
                        "[linear] x () and weight (1, 1)");
  Variable w(randn({4, 3}, 51), true, "w");
  Variable x1(randn({3}, 52), true, "x");
  const Variable y1 = linear(x1, w);
  EXPECT_EQ(y1.shape(), (Shape{4}));
  sum(y1).backward();
  const Tensor gw = w.grad().clone(), gx = x1.grad().clone();
  Variable x2(Tensor::from_data({1, 3}, x1.value().to_vector()), true, "x2");
  const Variable y2 = linear(x2, w);
  EXPECT_EQ(y2.value().to_vector(), y1.value().to_vector());
  sum(y2).backward();
  EXPECT_EQ(w.grad().to_vector(), gw.to_vector());
  EXPECT_EQ(x2.grad().to_vector(), gx.to_vector());
}

TEST(OpForward, EmbeddingGradientScatterAddsRepeatedIds) {
  Variable w(Tensor::zeros({5, 2}), true, "wte");
  sum(embedding(w, kIds, {6})).backward();
  // id 3 and id 1 appear twice, 0 and 4 once, 2 never.
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{1, 1, 2, 2, 0, 0, 2, 2, 1, 1}));
}

TEST(OpErrors, NameTheOpAndTheShapes) {
  Variable a(Tensor::zeros({4, 8}), true);
  Variable b(Tensor::zeros({7, 3}), true);
  expect_error_mentions([&] { matmul(a, b); }, "[matmul] lhs (4, 8) and rhs (7, 3)", "inner dimensions differ");
  expect_error_mentions([&] { matmul(Variable(Tensor::zeros({2, 4, 8})), Variable(Tensor::zeros({3, 8, 2}))); },
                        "[matmul]", "batch dimensions differ");
  expect_error_mentions([&] { matmul(Variable(Tensor::zeros({4})), b); }, "[matmul]", "(4,)");
  expect_error_mentions([&] { add(a, b); }, "[add] lhs (4, 8) and rhs (7, 3)", "cannot be broadcast");
  expect_error_mentions([&] { mul(a, b); }, "[mul]");
  expect_error_mentions([&] { sub(a, b); }, "[sub]");
  expect_error_mentions([&] { reshape(a, {3, 3}); }, "[reshape]", "(4, 8)");
  expect_error_mentions([&] { transpose(a, 0, 2); }, "[transpose]", "(4, 8)");
  expect_error_mentions([&] { permute(a, {0, 0}); }, "[permute]", "repeated");
  expect_error_mentions([&] { rms_norm(a, Variable(Tensor::ones({7})), 1e-5F); }, "[rms_norm] input (4, 8)",
                        "weight (7,)");
  expect_error_mentions([&] { swiglu(a, b); }, "[swiglu] gate (4, 8)", "up (7, 3)");
  expect_error_mentions([&] { rope(Variable(Tensor::zeros({2, 3}))); }, "[rope] input (2, 3)");
  expect_error_mentions([&] { causal_mask(Variable(Tensor::zeros({3}))); }, "[causal_mask] scores (3,)");
  expect_error_mentions([&] { embedding(a, std::vector<std::int32_t>{9}, {1}); }, "[embedding] id 9",
                        "weight (4, 8)");
  expect_error_mentions([&] { embedding(a, std::vector<std::int32_t>{1, 2}, {3}); }, "[embedding] ids shape (3,)");
  expect_error_mentions([&] { cross_entropy(a, std::vector<std::int32_t>{1, 2}); }, "[cross_entropy] logits (4, 8)",
                        "2 targets");
  expect_error_mentions([&] { cross_entropy(a, std::vector<std::int32_t>{1, 2, 3, 8}); }, "[cross_entropy] target 8");
  expect_error_mentions([&] { mean(Variable(Tensor::zeros({0}))); }, "[mean]", "(0,)");
  expect_error_mentions([&] { add(a, Variable()); }, "[add] rhs is an undefined variable");
}

TEST(OpDeterminism, SameInputsSameBits) {
  const Tensor x = randn({64, 128}, 5);
  const Tensor w = randn({128, 96}, 6);
  auto run = [&] {
    Variable xv(x, true);
    Variable wv(w, true);
    Variable loss = mean(swiglu(matmul(xv, wv), matmul(xv, wv)));
    loss.backward();
    return std::make_pair(wv.grad().clone(), loss.value().clone());
  };
  const auto a = run();
  const auto b = run();
  EXPECT_TRUE(bit_equal(a.first, b.first));
  EXPECT_TRUE(bit_equal(a.second, b.second));
}

// A broadcast operand's gradient sums the output gradient over the
// broadcast rows. It was summed in a float: 2^22 rows of 0.1 came to about
// 10% off (past 2^19 an added 0.1 rounds to 0.125); now each sum is a double,
// rounded once, on both the row (suffix) and the general path.
TEST(OpBackward, ABroadcastOperandsGradientIsSummedWithoutLosingTheRowCount) {
  const std::int64_t rows = std::int64_t{1} << 22;
  const double expected = static_cast<double>(0.1F) * static_cast<double>(rows);
  Variable b(Tensor::zeros({2}), true, "b");  // (2,) against (rows, 2): the suffix path
  sum(scale(add(Variable(Tensor::zeros({rows, 2})), b), 0.1F)).backward();
  for (std::int64_t j = 0; j < 2; ++j) EXPECT_NEAR(b.grad().at({j}), expected, expected * 1e-6) << j;
  Variable c(Tensor::zeros({2, 1}), true, "c");  // (2, 1) against (2, rows): the general path
  sum(scale(add(Variable(Tensor::zeros({2, rows})), c), 0.1F)).backward();
  for (std::int64_t j = 0; j < 2; ++j) EXPECT_NEAR(c.grad().at({j, 0}), expected, expected * 1e-6) << j;
}
