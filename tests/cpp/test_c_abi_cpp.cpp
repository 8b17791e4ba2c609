// The C ABI from C++: the RAII header (rt.hpp) over rt.h, and the one map
// from C++ exception classes to rt_status codes (every class, message kept).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "../../src/c_api/c_api_common.hpp"
#include "riftco_transformer/rt.hpp"

namespace {

rt_transformer_config tiny() {
  rt_transformer_config c;
  rt::check(rt_transformer_config_default(&c));
  c.context_length = 16;
  c.model_width = 16;
  c.heads = 2;
  c.layers = 2;
  c.feed_forward_width = 24;
  return c;
}

}  // namespace

TEST(CAbiRaii, TrainsOneStepAndDecodesThroughHandles) {
  std::vector<int32_t> tokens(16), targets(16);
  for (int i = 0; i < 16; ++i) {
    tokens[static_cast<std::size_t>(i)] = (i * 7) % 256;
    targets[static_cast<std::size_t>(i)] = (i * 11 + 3) % 256;
  }
  rt::Model model(tiny(), 3, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);
  EXPECT_EQ(model.activation_checkpointing(), RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);
  rt::Adam adam(model);
  rt::Variable loss = model.loss(tokens, targets, 2);
  const float before = loss.item();
  loss.backward();
  EXPECT_GT(adam.step(), 0.0F);
  adam.zero_grad();
  EXPECT_LT(model.loss(tokens, targets, 2).item(), before);
  const std::vector<rt::Variable> leaves = loss.leaves();
  EXPECT_EQ(leaves.size(), 3U + 2U * 9U);
  EXPECT_EQ(leaves[0].name(), "lm_head.weight");  // discovery order from the loss: the head first
  EXPECT_EQ(model.parameter("lm_head.weight").shape(), (std::vector<int64_t>{256, 16}));
  rt::DecodeSession session(model);
  EXPECT_EQ(session.decode(5).size(), 256U);
  try {
    model.set_activation_checkpointing(static_cast<rt_activation_checkpointing>(9));
    ADD_FAILURE() << "expected rt::Error";
  } catch (const rt::Error& e) {
    EXPECT_EQ(e.status(), RT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("RT_ERROR_INVALID_ARGUMENT: [rt_model_set_activation_checkpointing]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(loss.backward(), rt::Error);  // stale: Adam stepped since

  rt_adam_options options;
  ASSERT_EQ(rt_adam_options_default(&options), RT_OK);
  options.weight_decay = 0.25F;
  const rt::Adam grouped(model, options, false);
  EXPECT_EQ(grouped.weight_decay("final_norm.weight"), 0.0F);
  EXPECT_EQ(grouped.weight_decay("token_embedding.weight"), 0.0F);
  EXPECT_EQ(grouped.weight_decay("blocks.0.mlp.gate.weight"), 0.25F);
  EXPECT_THROW(grouped.weight_decay("nothing"), rt::Error);
}

// rt::Model::loss checks what the C call cannot: targets as long as the
// tokens (the C call reads batch × length ids from each), and a batch that
// splits them, each an rt::Error with its own message (not the thread's
// older one). name() asks the size without a failure: the last error stays.
TEST(CAbiRaii, LossRefusesTargetsOfAnotherLengthAndNameKeepsTheLastError) {
  rt::Model model(tiny(), 3);
  const std::vector<int32_t> tokens(16, 5);
  const auto refusal = [&](const std::vector<int32_t>& targets, int64_t batch) -> std::string {
    try {
      model.loss(tokens, targets, batch);
    } catch (const rt::Error& e) {
      EXPECT_EQ(e.status(), RT_ERROR_INVALID_ARGUMENT);
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(refusal(std::vector<int32_t>(4, 1), 2).find("4 targets for 16 tokens"), std::string::npos);
  EXPECT_NE(refusal(std::vector<int32_t>(17, 1), 2).find("17 targets for 16 tokens"), std::string::npos);
  EXPECT_NE(refusal(tokens, 3).find("16 tokens do not split into batch 3"), std::string::npos);
  EXPECT_NE(refusal(tokens, 0).find("batch 0"), std::string::npos);
  EXPECT_NE(refusal(tokens, -2).find("batch -2"), std::string::npos);
  EXPECT_EQ(model.loss(tokens, tokens, 2).value().size(), 1U);

  EXPECT_NE(rt_model_set_dropout(model.get(), 7.0F, 1), RT_OK);
  const std::string failure = rt_last_error_message();
  EXPECT_EQ(model.parameter("lm_head.weight").name(), "lm_head.weight");
  EXPECT_EQ(rt_last_error_message(), failure);
}

TEST(CAbiRaii, BackwardWithoutRetainGraphFreesIt) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> targets = {2, 3, 4, 5, 6, 7, 8, 9};
  rt::Model model(tiny(), 3, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED);
  rt::Variable kept = model.loss(tokens, targets, 1);
  kept.backward(true);
  const std::vector<float> kept_grad = model.parameter("lm_head.weight").grad();
  kept.backward(true);  // the kept graph runs again
  rt::Variable released = model.loss(tokens, targets, 1);
  released.backward(false);
  EXPECT_EQ(model.parameter("lm_head.weight").grad(), kept_grad);
  try {
    released.backward(false);
    ADD_FAILURE() << "expected rt::Error";
  } catch (const rt::Error& e) {
    EXPECT_EQ(e.status(), RT_ERROR_BACKWARD) << e.what();
  }
}

TEST(CAbiRaii, BackwardAndStepGivesTheBitsOfBackwardThenStep) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> targets = {2, 3, 4, 5, 6, 7, 8, 9};
  rt_adam_options options;
  ASSERT_EQ(rt_adam_options_default(&options), RT_OK);
  options.max_grad_norm = 0.0F;
  rt::Model plain(tiny(), 3, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED);
  rt::Model fused(tiny(), 3, RT_ATTENTION_FLASH, RT_ACTIVATION_CHECKPOINTING_DISABLED);
  rt::Adam a(plain, options);
  rt::Adam b(fused, options);
  for (int step = 0; step < 2; ++step) {
    plain.loss(tokens, targets, 1).backward(false);
    const float norm = a.step();
    a.zero_grad();
    EXPECT_EQ(b.backward_and_step(fused.loss(tokens, targets, 1)), norm);
  }
  EXPECT_EQ(plain.parameter("blocks.0.mlp.down.weight").value(), fused.parameter("blocks.0.mlp.down.weight").value());
  EXPECT_EQ(plain.parameter("lm_head.weight").value(), fused.parameter("lm_head.weight").value());
  EXPECT_TRUE(fused.parameter("lm_head.weight").grad().empty());
  options.max_grad_norm = 1.0F;
  rt::Adam clipping(fused, options);
  try {
    clipping.backward_and_step(fused.loss(tokens, targets, 1));
    ADD_FAILURE() << "expected rt::Error";
  } catch (const rt::Error& e) {
    EXPECT_EQ(e.status(), RT_ERROR_VALUE) << e.what();
  }
}

TEST(CAbiStatus, EveryExceptionClassHasItsStatusAndKeepsItsMessage) {
  namespace r = riftco_transformer;
  using V = r::CheckpointContractError::Violation;
  const auto status_of = [](auto thrower) {
    return rt_c::guard("test", [&] { thrower(); });
  };
  EXPECT_EQ(status_of([] { throw rt_c::ArgumentError("[f] x is NULL"); }), RT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of([] { throw r::ValueError("[v] bad"); }), RT_ERROR_VALUE);
  EXPECT_EQ(status_of([] { throw r::ShapeError("[s] bad"); }), RT_ERROR_SHAPE);
  EXPECT_EQ(status_of([] { throw r::BackendError("[b] bad"); }), RT_ERROR_BACKEND);
  EXPECT_EQ(status_of([] { throw r::StaleGraphError("[g] bad"); }), RT_ERROR_STALE_GRAPH);
  EXPECT_EQ(status_of([] { throw r::CheckpointContractError(V::CapturedExternalNode, "[checkpoint] c"); }),
            RT_ERROR_CHECKPOINT_CONTRACT);
  EXPECT_STREQ(rt_last_error_message(), "[checkpoint] c");
  EXPECT_EQ(status_of([] { throw r::BackwardError("[w] bad"); }), RT_ERROR_BACKWARD);
  EXPECT_EQ(status_of([] { throw r::ModelStateError("[load] p: bad"); }), RT_ERROR_MODEL_STATE);
  EXPECT_EQ(status_of([] { throw r::DataError("[data] p: bad"); }), RT_ERROR_DATA);
  EXPECT_EQ(status_of([] { throw r::PartialStepError("[Adam::backward_and_step] failed after updating 1"); }),
            RT_ERROR_PARTIAL_STEP);
  EXPECT_STREQ(rt_last_error_message(), "[Adam::backward_and_step] failed after updating 1");
  EXPECT_EQ(status_of([] { throw r::Error("[pipeline] disk full"); }), RT_ERROR_RUNTIME);
  EXPECT_EQ(status_of([] {
              throw std::filesystem::filesystem_error("cannot create directories", std::make_error_code(std::errc::not_a_directory));
            }),
            RT_ERROR_MODEL_STATE);
  EXPECT_EQ(status_of([] { throw std::bad_alloc(); }), RT_ERROR_OUT_OF_MEMORY);
  EXPECT_STREQ(rt_last_error_message(), "[test] out of memory");
  EXPECT_EQ(status_of([] { throw std::logic_error("oops"); }), RT_ERROR_INTERNAL);
  EXPECT_EQ(status_of([] { throw 42; }), RT_ERROR_INTERNAL);
  EXPECT_EQ(status_of([] {}), RT_OK);
  EXPECT_STREQ(rt_last_error_message(), "[test] internal error: unknown exception");  // success keeps the last failure
}

TEST(CAbiRaii, GqaTiedModelConvertsToHfAndBack) {
  rt_transformer_config c = tiny();
  c.model_width = 32;
  c.heads = 4;
  c.key_value_heads = 1;
  c.tie_embeddings = 1;
  rt::Model model(c, 5);
  const std::string dir = ::testing::TempDir() + "riftco_raii_hf_" + std::to_string(::getpid());
  model.save(dir + ".safetensors");
  rt::convert_to_hf(dir + ".safetensors", dir);
  rt::convert_from_hf(dir, dir + ".back.safetensors");
  rt::Model back = rt::Model::load(dir + ".back.safetensors");
  EXPECT_EQ(back.parameter("blocks.1.attention.value.weight").shape(), (std::vector<int64_t>{8, 32}));
  try {
    rt::convert_from_hf(dir + ".missing", dir + ".x.safetensors");
    FAIL() << "a missing directory was accepted";
  } catch (const rt::Error& e) {
    EXPECT_EQ(e.status(), RT_ERROR_MODEL_STATE);
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove(dir + ".safetensors");
  std::filesystem::remove(dir + ".back.safetensors");
}
