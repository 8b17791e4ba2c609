// A DecodeSession's K/V caches grow as positions fill them (128 rows, then
// twice as many, up to the context) instead of holding the whole context from
// the first token: a session for a 1 M-token context took 531 MiB to
// generate 2 tokens. The logits stay those of the full forward across every
// growth, on both attention kinds and with grouped K/V heads.
#include <gtest/gtest.h>

#include <cmath>

#include "model_fixtures.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/memory.hpp"

using namespace riftco_transformer;

TEST(DecodeCacheGrowth, ASessionHoldsWhatItsPositionsNeedNotTheWholeContext) {
  TransformerDimensions d = rt_test::tiny_dims(2);
  d.context_length = std::int64_t{1} << 20;
  Random init(1);
  const DecoderOnlyTransformer model(d, init);
  const ThreadMemoryMeter meter;
  DecodeSession session(model);
  EXPECT_EQ(session.capacity(), d.context_length);
  for (std::int32_t t = 0; t < 3; ++t) (void)session.decode_token(t);
  // 2 layers × K and V × 2 heads × 128 rows × 8 wide × 4 bytes = 32 KiB,
  // where the whole context is 256 MiB.
  const std::int64_t whole = 2 * 2 * d.kv_heads() * d.context_length * d.head_width() * 4;
  EXPECT_LT(meter.peak_bytes(), whole / 1000) << meter.peak_bytes();
}

TEST(DecodeCacheGrowth, LogitsEqualTheFullForwardAcrossEveryGrowth) {
  // G = 2 K/V heads and G = 1 (grouped): with one head the permutes in the
  // growth move nothing, so a wrong permute shows only with two (review).
  for (const std::int64_t kv_heads : {0, 1}) {
    for (const auto attention : {FullSequenceAttentionKind::Flash, FullSequenceAttentionKind::Materialized}) {
      TransformerDimensions d = rt_test::tiny_dims(2);
      d.context_length = 300;  // grows at 128 and 256, then stops at 300
      d.key_value_heads = kv_heads;
      Random init(2);
      const DecoderOnlyTransformer model(d, init, 1.0e-5F, attention);
      const rt_test::Batch b = rt_test::random_batch(1, d.context_length, d.vocab_size, 3);
      const Tensor full = model.forward(b.tokens, 1).value();  // (1, T, V)
      DecodeSession session(model);
      float worst = 0.0F;
      for (std::int64_t p = 0; p < d.context_length; ++p) {
        const Tensor logits = session.decode_token(b.tokens[static_cast<std::size_t>(p)]);
        for (std::int64_t v = 0; v < d.vocab_size; ++v) {
          worst = std::max(worst, std::abs(logits.values()[static_cast<std::size_t>(v)] -
                                           full.values()[static_cast<std::size_t>(p * d.vocab_size + v)]));
        }
      }
      EXPECT_LT(worst, 1e-4F);
      EXPECT_THROW(session.decode_token(0), ValueError);  // the context is full, as before
      session.reset();
      const Tensor again = session.decode_token(b.tokens[0]);
      for (std::int64_t v = 0; v < d.vocab_size; ++v) {
        EXPECT_NEAR(again.values()[static_cast<std::size_t>(v)], full.values()[static_cast<std::size_t>(v)], 1e-4F);
      }
    }
  }
}
