// Versions live with the bytes: every handle on a buffer (a reshape view, a
// second leaf on the same value, a raw Tensor handle) shares one counter, so
// an in-place write through any of them makes every graph that read the
// buffer stale. Also: optimizer and model state cached per parameter never
// reads a parameter whose shape changed, and commits from several threads.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>
#include <utility>

#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {

Tensor ramp(const Shape& shape, float start = 1.0F) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = start + static_cast<float>(i);
  return t;
}

/// Expects `loss.backward()` to throw StaleGraphError whose message contains
/// every string in `parts`, and `watched` to keep its gradient.
void expect_stale(const Variable& loss, const Variable& watched, std::initializer_list<const char*> parts) {
  const Tensor before = watched.has_grad() ? watched.grad().clone() : Tensor();
  try {
    loss.backward();
    ADD_FAILURE() << "expected StaleGraphError";
  } catch (const StaleGraphError& e) {
    for (const char* part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  EXPECT_EQ(watched.has_grad(), before.defined());
  if (before.defined()) EXPECT_TRUE(bit_equal(watched.grad(), before));
}

}  // namespace

TEST(StorageVersions, NoGradViewOfAParameterSeesAdamSteps) {  // the example
  Variable w(Tensor::from_data({2, 2}, {1, 2, 3, 4}), true, "w");
  Variable x(Tensor::from_data({4}, {1, 1, 1, 1}), true, "x");
  Variable view;
  {
    NoGradGuard g;
    view = reshape(w, {4});
  }
  EXPECT_TRUE(view.is_leaf());
  EXPECT_TRUE(view.value().shares_storage(w.value()));
  const Variable loss = sum(mul(x, view));
  sum(mul(w, w)).backward();
  Adam({w}).step();
  expect_stale(loss, x, {"stale graph", "Adam::step", "mul"});
}

TEST(StorageVersions, EveryHandleOnTheBufferSharesOneCounter) {
  // (a) a reshape of a constant, written through the constant
  {
    Variable c(ramp({2, 3}), false, "table");
    Variable x(ramp({6}), true, "x");
    const Variable loss = sum(mul(x, reshape(c, {6})));
    c.mutable_value().fill(7.0F);
    expect_stale(loss, x, {"stale graph"});
  }
  // (b) a second leaf built on the same buffer, Variable(w.value())
  {
    Variable w(ramp({3}), true, "w");
    Variable alias(w.value(), false, "alias");
    Variable x(ramp({3}), true, "x");
    const Variable loss = sum(mul(x, alias));
    w.mutable_value().data()[1] = -1.0F;
    expect_stale(loss, x, {"'alias' (leaf)", "stale graph"});
  }
  // (c) the other way round: written through the alias, read through w
  {
    Variable w(ramp({3}), true, "w");
    Variable alias(w.value(), false, "alias");
    const Variable loss = sum(mul(w, w));
    alias.mutable_value().fill(0.0F);
    expect_stale(loss, w, {"'w' (leaf)"});
  }
  // (d) raw Tensor handles: fill, copy_from, a data() pointer
  for (int how = 0; how < 3; ++how) {
    Variable w(ramp({4}), true, "w");
    const Variable loss = sum(mul(w, w));
    Tensor handle = w.value();
    if (how == 0) handle.fill(2.0F);
    if (how == 1) handle.copy_from(Tensor::zeros({4}));
    if (how == 2) handle.data()[3] = 9.0F;
    expect_stale(loss, w, {"'w' (leaf)", "its buffer was"});
  }
  // (e) a view made with grad (a non-leaf sharing the parameter's buffer)
  {
    Variable w(ramp({2, 2}), true, "w");
    Variable x(ramp({4}), true, "x");
    const Variable loss = sum(mul(x, reshape(w, {4})));
    Adam({w}, AdamOptions{}).step();  // no gradient yet: nothing changes
    loss.backward();                  // still valid
    Adam({w}).step();
    expect_stale(loss, x, {"Adam::step"});
  }
}

TEST(StorageVersions, WritingIntoAnIntermediateValueIsStaleToo) {
  // An op's own output is saved for its backward (silu, softmax): writing into
  // it through a handle is caught even when the node is the root.
  for (int how = 0; how < 3; ++how) {
    Variable x(ramp({2, 3}, -2.0F), true, "x");
    const Variable y = how == 0 ? silu(x) : how == 1 ? softmax(x) : reshape(scale(x, 2.0F), {6});
    const Variable loss = how == 2 ? sum(y) : y;
    Tensor handle = y.value();
    handle.fill(0.25F);
    if (how == 2) {
      expect_stale(loss, x, {"stale graph"});
    } else {
      const Tensor seed = Tensor::ones(y.shape());
      EXPECT_THROW(y.backward(seed), StaleGraphError);
      EXPECT_FALSE(x.has_grad());
    }
  }
}

TEST(StorageVersions, ReadingNeverMakesAGraphStale) {
  Variable w(ramp({2, 3}), true, "w");
  const Variable loss = sum(mul(w, reshape(reshape(w, {6}), {2, 3})));
  const std::uint64_t v = w.version();
  Tensor handle = w.value();
  float total = 0.0F;
  for (const float f : handle.values()) total += f;
  total += std::as_const(handle).data()[0] + handle.at({1, 2}) + w.value().clone().at({0, 0});
  EXPECT_GT(total, 0.0F);
  EXPECT_EQ(w.version(), v);
  loss.backward();
  loss.backward();  // twice: the same gradients
  EXPECT_FLOAT_EQ(w.grad().at({1, 2}), 12.0F);
}

TEST(StorageVersions, VersionNeverRepeatsWhenTheValueIsReplaced) {
  Variable w(ramp({3}), true, "w");
  Variable x(ramp({3}), true, "x");
  const Variable loss = sum(mul(x, w));
  const std::uint64_t v0 = w.version();
  // A replacement buffer whose own counter is far along must not bring the
  // combined version back to a value an edge recorded.
  Tensor busy = ramp({3});
  for (int i = 0; i < 50; ++i) busy.fill(1.0F);
  w.set_value(busy);
  EXPECT_EQ(w.version(), v0 + 1);
  Tensor fresh = Tensor::zeros({3});
  w.set_value(fresh);
  EXPECT_EQ(w.version(), v0 + 2);
  expect_stale(loss, x, {"value replaced"});
  // requires_grad moves version() but not value_version().
  const std::uint64_t vv = w.value_version();
  w.set_requires_grad(false);
  EXPECT_EQ(w.value_version(), vv);
  EXPECT_EQ(w.version(), v0 + 3);
  w.mutable_value().fill(0.5F);
  EXPECT_GT(w.value_version(), vv);
}

TEST(AdamShapes, ParameterGivenANewShapeIsAShapeErrorNotACorruption) {
  const std::vector<Shape> shapes = {{3, 3}, {1}, {4}, {2, 2, 1}};  // larger, smaller, same count other shape
  for (const Shape& next : shapes) {
    Variable w(ramp({2, 2}), true, "w");
    Variable keep(ramp({3}), true, "keep");
    Adam adam({w, keep});
    sum(add(mul(w, w), Variable(Tensor::scalar(0)))).backward();
    sum(mul(keep, keep)).backward();
    adam.step();
    w.set_value(ramp(next, 0.5F));
    sum(mul(w, w)).backward();  // a gradient of the new shape
    sum(mul(keep, keep)).backward();
    const Tensor w_before = w.value().clone();
    const Tensor keep_before = keep.value().clone();
    const Adam::State state_before = adam.state();
    try {
      adam.step();
      ADD_FAILURE() << "expected ShapeError for " << shape_string(next);
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(shape_string(next)), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bit_equal(w.value(), w_before));
    EXPECT_TRUE(bit_equal(keep.value(), keep_before));  // nothing half-applied
    EXPECT_EQ(adam.step_count(), state_before.steps);
    EXPECT_TRUE(bit_equal(adam.state().first_moment[1], state_before.first_moment[1]));
  }
}

TEST(ModelParameterShapes, EveryReaderRefusesAParameterOfTheWrongShape) {
  Random random(3);
  DecoderOnlyTransformer model(tiny_dims(2), random);
  const auto b = random_batch(1, 6, 32, 4);
  for (const std::string name : {"blocks.1.mlp.up.weight", "final_norm.weight", "token_embedding.weight"}) {
    Variable p = model.parameter(name);
    const Tensor original = p.value();
    p.set_value(Tensor::zeros({5, 3}));
    auto names_it = [&](const auto& call) {
      try {
        call();
        ADD_FAILURE() << "expected ShapeError for " << name;
      } catch (const ShapeError& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    };
    names_it([&] { model.forward(b.tokens, 1); });
    names_it([&] { model.validate_parameters(); });
    names_it([&] { DecodeSession session(model); });
    const auto file = std::filesystem::temp_directory_path() / ("rt_wrong_shape_" + std::to_string(::getpid()) + ".safetensors");
    std::filesystem::remove(file);
    names_it([&] { save_model_state(model, file); });
    EXPECT_FALSE(std::filesystem::exists(file));
    p.set_value(original);
    EXPECT_NO_THROW(model.forward(b.tokens, 1));
  }
}

TEST(ModelParameterShapes, DecodeSessionResetKeepsItsStateOnError) {
  Random random(5);
  DecoderOnlyTransformer model(tiny_dims(1), random);
  DecodeSession session(model);
  session.decode_token(3);
  Variable p = model.parameter("lm_head.weight");
  const Tensor original = p.value();
  p.set_value(Tensor::zeros({2, 2}));
  EXPECT_THROW(session.reset(), ShapeError);
  EXPECT_EQ(session.position(), 1);
  EXPECT_THROW(session.decode_token(4), StaleGraphError);
  p.set_value(original);
  session.reset();
  EXPECT_NO_THROW(session.decode_token(4));
}

TEST(ModelParameterShapes, MergeLoraRefusesAnAdapterOfTheWrongShape) {
  Random random(6);
  DecoderOnlyTransformer model(tiny_dims(1), random);
  LoraConfig config;
  config.rank = 2;
  config.targets = {LoraTarget::Query};
  model.add_lora(config, random);
  Variable a = model.lora_parameters()[0].variable;
  a.set_value(Tensor::ones({2, 40}));  // (r, in) with in too large: the product would write past the weight
  const Tensor query_before = model.blocks()[0].query.value().clone();
  EXPECT_THROW(model.merge_lora(), ShapeError);
  EXPECT_TRUE(model.has_lora());
  EXPECT_TRUE(bit_equal(model.blocks()[0].query.value(), query_before));
}

TEST(DecodeVersions, FreezingOrUnfreezingDoesNotStaleASession) {
  Random random(7);
  DecoderOnlyTransformer model(tiny_dims(1), random);
  LoraConfig config;
  config.rank = 2;
  config.targets = {LoraTarget::Query, LoraTarget::Down};
  model.add_lora(config, random);
  DecodeSession session(model);
  const Tensor first = session.decode_token(1).clone();
  model.set_base_trainable(false);
  EXPECT_NO_THROW(session.decode_token(2));
  model.set_base_trainable(true);
  Variable a = model.lora_parameters()[0].variable;
  a.set_requires_grad(false);
  EXPECT_NO_THROW(session.decode_token(3));
  // A value change still does.
  a.mutable_value().fill(0.25F);
  EXPECT_THROW(session.decode_token(4), StaleGraphError);
  // And a fresh session after freezing gives the same logits as before.
  DecodeSession again(model);
  a.set_requires_grad(true);
  EXPECT_EQ(again.decode_token(1).numel(), first.numel());
}

TEST(ThreadedBackward, GraphsOnTwoThreadsShareParameterLeaves) {
  for (const auto policy : {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock}) {
    Random random(8);
    DecoderOnlyTransformer model(tiny_dims(2), random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
    const auto b0 = random_batch(1, 8, 32, 10);
    const auto b1 = random_batch(1, 8, 32, 11);
    std::vector<Tensor> expected[2];
    for (int k = 0; k < 2; ++k) {
      const auto& b = k == 0 ? b0 : b1;
      model.loss(b.tokens, b.targets, 1).backward();
      for (const NamedParameter& p : model.parameters()) expected[k].push_back(p.variable.grad().clone());
    }
    auto worker = [&model](const rt_test::Batch& b) {
      for (int i = 0; i < 12; ++i) {
        model.loss(b.tokens, b.targets, 1).backward();
        if (i % 5 == 0) {
          Variable head = model.lm_head();
          head.clear_grad();
        }
      }
    };
    std::thread t0(worker, std::cref(b0));
    std::thread t1(worker, std::cref(b1));
    t0.join();
    t1.join();
    // Every leaf holds the gradients of one whole pass (the last commit won
    // for all of them at once), never a mix of the two.
    const auto params = model.parameters();
    const int winner = bit_equal(params[0].variable.grad(), expected[0][0]) ? 0 : 1;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor& g = params[i].variable.grad();
      ASSERT_TRUE(g.defined()) << params[i].name;
      EXPECT_TRUE(bit_equal(g, expected[winner][i])) << params[i].name;
    }
  }
}
