// SentencePiece tokenizers: training, determinism, round trips, hostile
// model files, evaluation (bits per byte) and the pipelines' tokenizer rules.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "message_of.hpp"
#include "scratch.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/evaluation.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return rt_test::fresh_dir("tok", name); }
using rt_test::read_file;

void write_file(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// ~60 KB of varied English-like text with some non-ASCII characters.
std::string sample_text() {
  static const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "while",
                                "riftco", "trains", "small", "models", "on", "two", "cores", "naïve", "café"};
  std::string text;
  std::uint64_t x = 12345;
  for (int line = 0; line < 1500; ++line) {
    for (int w = 0; w < 7; ++w) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      text += words[(x >> 33) % std::size(words)];
      text += w == 6 ? ".\n" : " ";
    }
    if (line % 10 == 9) text += "\n";
  }
  return text;
}

using rt_test::message_of;

}  // namespace

TEST(Tokenizer, BytesIsTheDefault) {
  const Tokenizer t;
  EXPECT_TRUE(t.is_bytes());
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.checksum(), "");
  const std::vector<std::int32_t> ids = t.encode("héllo");
  EXPECT_EQ(ids, ByteTokenizer{}.encode("héllo"));
  EXPECT_EQ(t.byte_length(ids), 6);
  EXPECT_EQ(t.decode(ids), "héllo");
}

TEST(Tokenizer, TrainingIsDeterministicAndRoundTrips) {
  const fs::path dir = fresh_dir("train");
  const std::string text = sample_text();
  for (const TokenizerModelType type : {TokenizerModelType::Bpe, TokenizerModelType::Unigram}) {
    SCOPED_TRACE(tokenizer_model_type_name(type));
    TokenizerTrainingOptions options;
    options.vocab_size = 320;  // unigram allows at most 323 on this text
    options.model_type = type;
    const Tokenizer a = train_tokenizer(text, options, dir / "a.model");
    const Tokenizer b = train_tokenizer(text, options, dir / "b.model");
    EXPECT_EQ(read_file(dir / "a.model"), read_file(dir / "b.model"));  // same bytes
    EXPECT_EQ(a.checksum(), b.checksum());
    EXPECT_EQ(a.checksum().size(), 16U);
    EXPECT_EQ(a.vocab_size(), 320);
    EXPECT_FALSE(a.is_bytes());
    const Tokenizer loaded = Tokenizer::load(dir / "a.model");
    EXPECT_EQ(loaded.checksum(), a.checksum());
    EXPECT_EQ(loaded.path(), dir / "a.model");

    const std::vector<std::int32_t> ids = loaded.encode(text);
    EXPECT_LT(ids.size() * 10, text.size() * 7);  // subwords, not bytes
    EXPECT_EQ(loaded.decode(ids), text);
    EXPECT_EQ(loaded.byte_length(ids), static_cast<std::int64_t>(text.size()));
    // Unseen characters (and spaces, newlines) survive through byte fallback.
    const std::string odd = "  Zürich\t→ 🦊\n\nQ";
    const std::vector<std::int32_t> odd_ids = loaded.encode(odd);
    EXPECT_EQ(loaded.decode(odd_ids), odd);
    EXPECT_EQ(loaded.byte_length(odd_ids), static_cast<std::int64_t>(odd.size()));
    EXPECT_NE(message_of<ValueError>([&] { (void)loaded.decode(std::vector<std::int32_t>{1, 1000}); })
                  .find("id 1000 at position 1"),
              std::string::npos);
  }
  // The output's folder is created.
  const Tokenizer d = train_tokenizer(text, TokenizerTrainingOptions{320, TokenizerModelType::Bpe}, dir / "new" / "d.model");
  EXPECT_EQ(Tokenizer::load(dir / "new" / "d.model").checksum(), d.checksum());
  // Another vocabulary size gives another model.
  TokenizerTrainingOptions other;
  other.vocab_size = 310;
  EXPECT_NE(train_tokenizer(text, other, dir / "c.model").checksum(), Tokenizer::load(dir / "b.model").checksum());
  fs::remove_all(dir);
}

TEST(Tokenizer, BadOptionsAndTextAreTypedErrors) {
  const fs::path dir = fresh_dir("bad_options");
  TokenizerTrainingOptions small;
  small.vocab_size = 10;
  EXPECT_NE(message_of<ValueError>([&] { train_tokenizer(sample_text(), small, dir / "t.model"); })
                .find("vocab_size must be in [260, 1048576]"),
            std::string::npos);
  TokenizerTrainingOptions huge;
  huge.vocab_size = 100000;  // far more pieces than this text has
  huge.model_type = TokenizerModelType::Unigram;
  const std::string unigram = message_of<ValueError>([&] { train_tokenizer("a b c\nd e f\n", huge, dir / "t.model"); });
  EXPECT_NE(unigram.find("SentencePiece"), std::string::npos) << unigram;
  TokenizerTrainingOptions ok;
  ok.vocab_size = 300;
  // SentencePiece's "Please set it to a value <= 258" was passed on: below
  // the 260 a tokenizer needs. The message now says what can be done.
  const std::string tiny = message_of<ValueError>([&] { train_tokenizer("ab ab ab\nab\n", ok, dir / "t.model"); });
  EXPECT_NE(tiny.find("too small for vocab_size 300: SentencePiece can make at most"), std::string::npos) << tiny;
  EXPECT_NE(message_of<DataError>([&] { train_tokenizer(" \n\n", ok, dir / "t.model"); }).find("empty"),
            std::string::npos);
  // One 160 000-byte line: SentencePiece skipped it and failed with
  // "Internal: ... [!sentences_.empty()]" (a ValueError saying nothing).
  std::string long_line;
  for (int i = 0; i < 20000; ++i) long_line += "abc def ";
  EXPECT_NE(message_of<DataError>([&] { train_tokenizer(long_line, ok, dir / "t.model"); })
                .find("every non-blank line of the training text is longer than 65536 bytes"),
            std::string::npos);
  EXPECT_THROW(parse_tokenizer_model_type("wordpiece"), ValueError);
  EXPECT_FALSE(fs::exists(dir / "t.model"));  // nothing written on failure
  fs::remove_all(dir);
}

TEST(Tokenizer, HostileModelFilesAreDataErrors) {
  const fs::path dir = fresh_dir("hostile");
  TokenizerTrainingOptions options;
  options.vocab_size = 300;
  train_tokenizer(sample_text(), options, dir / "good.model");
  const std::string good = read_file(dir / "good.model");

  EXPECT_NE(message_of<DataError>([&] { Tokenizer::load(dir / "missing.model"); }).find("[tokenizer]"),
            std::string::npos);
  EXPECT_THROW(Tokenizer::load(dir), DataError);  // a directory
  write_file(dir / "empty.model", "");
  EXPECT_THROW(Tokenizer::load(dir / "empty.model"), DataError);
  write_file(dir / "text.model", "this is not a protobuf at all \xff\xfe");
  EXPECT_THROW(Tokenizer::load(dir / "text.model"), DataError);
  // Truncations and bit flips: a typed error or a valid model, never a crash.
  std::int64_t refused = 0;
  for (std::size_t cut = 1; cut < good.size(); cut += good.size() / 97 + 1) {
    try {
      (void)Tokenizer::from_serialized(std::string_view(good).substr(0, cut), "cut.model");
    } catch (const DataError&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  // Found by fuzz_tokenizer: a unigram model with an empty piece makes
  // SentencePiece's trie builder throw; it is a DataError like the rest.
  const std::string empty_piece = message_of<DataError>(
      [&] { Tokenizer::load(fs::path(RIFTCO_SOURCE_DIR) / "tests/cpp/data/tokenizer_empty_piece.model"); });
  EXPECT_NE(empty_piece.find("not a valid SentencePiece model"), std::string::npos) << empty_piece;
  for (std::size_t i = 0; i < good.size(); i += good.size() / 211 + 1) {
    std::string flipped = good;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5A);
    try {
      const Tokenizer t = Tokenizer::from_serialized(flipped, "flipped.model");
      const std::vector<std::int32_t> ids = t.encode("the quick brown fox");
      (void)t.decode(ids);
      (void)t.byte_length(ids);
    } catch (const DataError&) {
    } catch (const ValueError&) {
    }
  }
  fs::remove_all(dir);
}

TEST(Evaluation, ByteLevelBitsPerByteIsLossOverLn2Exactly) {
  Random init(3);
  DecoderOnlyTransformer model({256, 16, 16, 2, 1, 24}, init);
  const std::string text = sample_text().substr(0, 500);
  EvaluationOptions options;
  options.batch = 3;
  const EvaluationResult r = evaluate(model, text, Tokenizer{}, options);
  EXPECT_EQ(r.tokens, 499);
  EXPECT_EQ(r.bytes, 499);
  EXPECT_EQ(r.bits_per_byte, r.loss / std::numbers::ln2);
  EXPECT_DOUBLE_EQ(r.perplexity, std::exp(r.loss));
  EXPECT_NEAR(r.loss, std::log(256.0), 0.5);  // an untrained model is near uniform
  // The batch size does not change the windows, only how many run at once.
  options.batch = 1;
  EXPECT_NEAR(evaluate(model, text, Tokenizer{}, options).loss, r.loss, 1e-5);
  // The windows by hand: 500 ids, windows of 16 over the 499 targets.
  double total = 0.0;
  {
    NoGradGuard no_graph;
    const std::vector<std::int32_t> ids = Tokenizer{}.encode(text);
    for (std::size_t s = 0; s + 1 < ids.size(); s += 16) {
      const std::size_t n = std::min<std::size_t>(16, ids.size() - 1 - s);
      const std::vector<std::int32_t> in(ids.begin() + s, ids.begin() + s + n);
      const std::vector<std::int32_t> tg(ids.begin() + s + 1, ids.begin() + s + n + 1);
      total += model.loss(in, tg, 1).value().item() * static_cast<double>(n);
    }
  }
  EXPECT_NEAR(r.loss, total / 499.0, 1e-5);
  EXPECT_THROW(evaluate(model, "a", Tokenizer{}), DataError);
  options.sequence_length = 17;
  EXPECT_THROW(evaluate(model, text, Tokenizer{}, options), ValueError);
}

TEST(Evaluation, DropoutIsOffForTheEvaluatingThreadOnlyAndTheTrainingFlagNeverMoves) {
  // evaluate() used to flip the model's shared training flag: a training
  // forward on another thread ran without dropout while it ran (275 of 300
  // losses in the review's script), and two concurrent evaluations could
  // leave the model in eval mode for good.
  Random init(9);
  DecoderOnlyTransformer model({256, 32, 16, 2, 1, 24}, init);
  model.set_dropout(0.5F, 1);
  model.set_training(true);
  const std::vector<std::int32_t> x = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::int32_t> y = {2, 3, 4, 5, 6, 7, 8, 9};
  NoGradGuard no_graph;
  float without_dropout = 0.0F;
  {
    const DecoderOnlyTransformer::EvaluationGuard evaluating;
    EXPECT_TRUE(DecoderOnlyTransformer::EvaluationGuard::active());
    EXPECT_TRUE(model.training());  // the flag is the model's, untouched
    without_dropout = model.loss(x, y, 1).value().item();
    // Another thread's forward in the same span keeps its dropout.
    float other = 0.0F;
    std::thread([&] { other = model.loss(x, y, 1).value().item(); }).join();
    EXPECT_NE(other, without_dropout);
  }
  EXPECT_FALSE(DecoderOnlyTransformer::EvaluationGuard::active());
  model.set_training(false);
  const float eval_mode = model.loss(x, y, 1).value().item();
  EXPECT_EQ(without_dropout, eval_mode);  // the guard is exactly eval mode
  model.set_training(true);
  // Concurrent evaluations: the flag reads true throughout and after.
  const std::string text = sample_text().substr(0, 600);
  std::atomic<bool> done{false};
  std::atomic<int> seen_false{0};
  std::vector<std::thread> evaluators;
  for (int i = 0; i < 2; ++i) {
    evaluators.emplace_back([&] {
      for (int k = 0; k < 3; ++k) (void)evaluate(model, text, Tokenizer{});
    });
  }
  std::thread watcher([&] {
    while (!done) seen_false += model.training() ? 0 : 1;
  });
  for (std::thread& t : evaluators) t.join();
  done = true;
  watcher.join();
  EXPECT_EQ(seen_false.load(), 0);
  EXPECT_TRUE(model.training());
}

TEST(Evaluation, SubwordBytesCoverTheTextAndVocabularyMustMatch) {
  const fs::path dir = fresh_dir("eval");
  TokenizerTrainingOptions options;
  options.vocab_size = 300;
  const Tokenizer tok = train_tokenizer(sample_text(), options, dir / "t.model");
  const std::string text = sample_text().substr(0, 2000);
  Random init(4);
  DecoderOnlyTransformer model({300, 32, 16, 2, 1, 24}, init);
  const EvaluationResult r = evaluate(model, text, tok);
  const std::vector<std::int32_t> ids = tok.encode(text);
  EXPECT_EQ(r.tokens, static_cast<std::int64_t>(ids.size()) - 1);
  EXPECT_EQ(r.bytes, static_cast<std::int64_t>(text.size()) - tok.byte_length(std::span(ids).first(1)));
  EXPECT_NEAR(r.bits_per_byte, r.loss * r.tokens / (r.bytes * std::numbers::ln2), 1e-12);
  EXPECT_LT(r.tokens, r.bytes);

  DecoderOnlyTransformer bytes_model({256, 32, 16, 2, 1, 24}, init);
  const std::string msg = message_of<ValueError>([&] { evaluate(bytes_model, text, tok); });
  EXPECT_NE(msg.find("vocabulary is 300"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the model's is 256"), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(Pipelines, PretrainingWithATokenizerRecordsItAndRefusesAnother) {
  const fs::path dir = fresh_dir("pipeline");
  const std::string text = sample_text();
  write_file(dir / "corpus.txt", text);
  TokenizerTrainingOptions options;
  options.vocab_size = 300;
  const Tokenizer tok = train_tokenizer(text, options, dir / "t.model");
  options.vocab_size = 310;
  const Tokenizer other = train_tokenizer(text, options, dir / "other.model");

  PretrainingConfig c;
  c.dimensions = {256, 32, 16, 2, 1, 32};  // vocab left at 256: taken from the tokenizer
  c.data = dir / "corpus.txt";
  c.tokenizer = dir / "t.model";
  c.steps = 4;
  c.batch = 2;
  c.sequence_length = 16;
  c.eval_interval = 2;
  c.eval_batches = 1;
  c.checkpoint_interval = 2;
  c.output_dir = dir / "run";
  ASSERT_TRUE(run_pretraining(c).completed);
  const fs::path model = c.output_dir / "model.safetensors";
  EXPECT_EQ(read_model_dimensions(model).vocab_size, 300);
  const TokenizerRecord record = read_model_tokenizer(model);
  EXPECT_EQ(record.checksum, tok.checksum());
  EXPECT_EQ(record.path, (dir / "t.model").string());
  const nlohmann::json meta = nlohmann::json::parse(read_file(c.output_dir / "metadata.json"));
  EXPECT_EQ(meta["config"]["tokenizer"], (dir / "t.model").string());
  EXPECT_EQ(meta["config"]["tokenizer_checksum"], tok.checksum());
  EXPECT_EQ(meta["config"]["dimensions"]["vocab_size"], 300);

  // The model's tokenizer: the recorded one, found; another is refused by checksum.
  EXPECT_EQ(tokenizer_for_model(model, "").checksum(), tok.checksum());
  EXPECT_EQ(tokenizer_for_model(model, dir / "t.model").checksum(), tok.checksum());
  std::string msg = message_of<ValueError>([&] { tokenizer_for_model(model, dir / "other.model"); });
  EXPECT_NE(msg.find(tok.checksum()), std::string::npos) << msg;
  EXPECT_NE(msg.find(other.checksum()), std::string::npos) << msg;
  EXPECT_THROW(tokenizer_for_model(model, "", false), ValueError);

  // A conflicting explicit vocabulary is refused; so is a byte-level vocabulary other than 256.
  PretrainingConfig conflict = c;
  conflict.dimensions.vocab_size = 512;
  conflict.output_dir = dir / "conflict";
  msg = message_of<ValueError>([&] { run_pretraining(conflict); });
  EXPECT_NE(msg.find("vocab_size must match the tokenizer"), std::string::npos) << msg;
  conflict.tokenizer.clear();
  EXPECT_THROW(conflict.validate(), ValueError);
  EXPECT_FALSE(fs::exists(dir / "conflict"));

  // Resume with another tokenizer is refused (the checkpoint records the checksum).
  PretrainingConfig interrupted = c;
  interrupted.output_dir = dir / "resume";
  run_pretraining(interrupted, [](const StepReport& s) { return s.step < 3; });
  interrupted.resume = true;
  interrupted.tokenizer = dir / "other.model";
  EXPECT_ANY_THROW(run_pretraining(interrupted));

  // Post-training: the base's tokenizer must be named; a byte-level base refuses a subword one.
  std::string chat;
  for (int i = 0; i < 12; ++i) chat += R"({"prompt": "the quick ", "response": "brown fox jumps"})" "\n";
  write_file(dir / "chat.jsonl", chat);
  PostTrainingConfig p;
  p.base_model = model;
  p.data = dir / "chat.jsonl";
  p.steps = 2;
  p.batch = 2;
  p.sequence_length = 16;
  p.eval_batches = 1;
  p.lora.rank = 2;
  p.output_dir = dir / "post";
  msg = message_of<ValueError>([&] { run_post_training(p); });
  EXPECT_NE(msg.find(tok.checksum()), std::string::npos) << msg;
  p.tokenizer = dir / "other.model";
  EXPECT_THROW(run_post_training(p), ValueError);
  EXPECT_FALSE(fs::exists(dir / "post"));
  p.tokenizer = dir / "t.model";
  p.fine_tuning_method = FineTuningMethod::Full;
  ASSERT_TRUE(run_post_training(p).completed);
  EXPECT_EQ(read_model_tokenizer(p.output_dir / "model.safetensors").checksum, tok.checksum());
  fs::remove_all(dir);
}

TEST(ModelStateTokenizer, ASubwordModelThatRecordsNoTokenizerTakesOneOfItsVocabularySize) {
  // Before: an HF import (vocab 300, nothing recorded) refused every
  // tokenizer ("was trained with the byte tokenizer"), so no rt-* tool could use it.
  const fs::path dir = fresh_dir("unrecorded");
  const std::string text = sample_text();
  TokenizerTrainingOptions options;
  options.vocab_size = 300;
  const Tokenizer tok = train_tokenizer(text, options, dir / "t.model");
  options.vocab_size = 310;
  train_tokenizer(text, options, dir / "other.model");
  Random random(3);
  const DecoderOnlyTransformer model(TransformerDimensions{300, 16, 16, 2, 1, 32}, random);
  save_model_state(model, dir / "m.safetensors");
  EXPECT_EQ(tokenizer_for_model(dir / "m.safetensors", dir / "t.model").checksum(), tok.checksum());
  const std::string msg = message_of<ValueError>([&] { tokenizer_for_model(dir / "m.safetensors", dir / "other.model"); });
  EXPECT_NE(msg.find("has a vocabulary of 300"), std::string::npos) << msg;
  EXPECT_THROW(tokenizer_for_model(dir / "m.safetensors", ""), ValueError);  // the byte tokenizer: 256
  // A byte-level model that records nothing still refuses a subword tokenizer.
  const DecoderOnlyTransformer bytes(TransformerDimensions{256, 16, 16, 2, 1, 32}, random);
  save_model_state(bytes, dir / "b.safetensors");
  EXPECT_THROW(tokenizer_for_model(dir / "b.safetensors", dir / "t.model"), ValueError);
  fs::remove_all(dir);
}

// docs/pipelines.md: the recorded path, else the same file name beside the
// model, whichever has the recorded checksum. Before, a recorded path that
// existed with another checksum was an error although the file beside matched.
TEST(ModelStateTokenizer, TheFirstCandidateWithTheRecordedChecksumIsTaken) {
  const fs::path dir = fresh_dir("candidates");
  fs::create_directories(dir / "toks");
  fs::create_directories(dir / "run");
  const std::string text = sample_text();
  TokenizerTrainingOptions options;
  options.vocab_size = 300;
  const Tokenizer tok = train_tokenizer(text, options, dir / "toks" / "t.model");
  options.vocab_size = 310;
  const Tokenizer other = train_tokenizer(text, options, dir / "other.model");
  Random random(3);
  const DecoderOnlyTransformer model(TransformerDimensions{300, 16, 16, 2, 1, 32}, random);
  const fs::path m = dir / "run" / "m.safetensors";
  save_model_state(model, m, {(dir / "toks" / "t.model").string(), tok.checksum()});
  fs::copy_file(dir / "toks" / "t.model", dir / "run" / "t.model");
  // Retrained in place: the recorded path now has another checksum, the file beside the model matches.
  fs::copy_file(dir / "other.model", dir / "toks" / "t.model", fs::copy_options::overwrite_existing);
  EXPECT_EQ(tokenizer_for_model(m, "").checksum(), tok.checksum());
  // Neither matches: every candidate is named with why it was passed over.
  fs::copy_file(dir / "other.model", dir / "run" / "t.model", fs::copy_options::overwrite_existing);
  std::string msg = message_of<ValueError>([&] { tokenizer_for_model(m, ""); });
  EXPECT_NE(msg.find((dir / "toks" / "t.model").string() + " has checksum " + other.checksum()), std::string::npos)
      << msg;
  EXPECT_NE(msg.find((dir / "run" / "t.model").string() + " has checksum " + other.checksum()), std::string::npos)
      << msg;
  fs::remove(dir / "toks" / "t.model");
  write_file(dir / "run" / "t.model", "not a tokenizer");
  msg = message_of<ValueError>([&] { tokenizer_for_model(m, ""); });
  EXPECT_NE(msg.find((dir / "toks" / "t.model").string() + " not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir / "run" / "t.model").string() + " cannot be loaded"), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(TextDataset, SubwordTokenizersHoldOutTheSameTextAsBytes) {
  const fs::path dir = fresh_dir("split");
  const std::string text = sample_text() + "é";
  TokenizerTrainingOptions options;
  options.vocab_size = 400;
  const Tokenizer tok = train_tokenizer(text, options, dir / "t.model");
  const TextDataset bytes(text, Tokenizer{}, 0.1);
  const TextDataset sub(text, tok, 0.1);
  const std::string_view held = split_text(text, Split::Validation, 0.1);
  EXPECT_EQ(tok.decode(sub.tokens(Split::Validation)), held);
  EXPECT_EQ(tok.decode(sub.tokens(Split::Train)), split_text(text, Split::Train, 0.1));
  EXPECT_EQ(held.size(), static_cast<std::size_t>(bytes.validation_tokens()));
  EXPECT_LT(sub.validation_tokens(), bytes.validation_tokens());
  // The cut moves forward to a character boundary: "é" is never split.
  EXPECT_EQ(split_text("abcé", Split::Validation, 0.2), "");
  EXPECT_EQ(split_text("abcdeé", Split::Validation, 0.3), "é");
  EXPECT_THROW(split_text(text, Split::Train, 1.0), ValueError);
  fs::remove_all(dir);
}

TEST(ModelStateTokenizer, ARecordThatCouldNotBeReadBackIsRefusedBeforeWriting) {
  // Before: save_model_state wrote any record; load_model then refused the
  // file (a checksum not of 16 hex digits), or a record with an empty path
  // loaded and sent tokenizer_for_model looking for the file "".
  const fs::path dir = fresh_dir("record");
  Random random(3);
  const DecoderOnlyTransformer model(TransformerDimensions{256, 16, 16, 2, 1, 32}, random);
  for (const TokenizerRecord& bad : {TokenizerRecord{"t.model", "XYZ"}, TokenizerRecord{"t.model", "0123456789ABCDEF"},
                                     TokenizerRecord{"", "0123456789abcdef"}}) {
    EXPECT_THROW(save_model_state(model, dir / "m.safetensors", bad), ValueError) << bad.path << " " << bad.checksum;
    EXPECT_FALSE(fs::exists(dir / "m.safetensors"));
  }
  save_model_state(model, dir / "m.safetensors", TokenizerRecord{"t.model", "0123456789abcdef"});
  EXPECT_EQ(read_model_tokenizer(dir / "m.safetensors").path, "t.model");
  fs::remove_all(dir);
}

// EvaluationOptions::interrupt runs before every batch's forward; what it
// throws stops the evaluation and reaches the caller with the model's
// training mode restored (Python's Ctrl-C goes through it).
TEST(Evaluation, InterruptRunsBeforeEveryBatchAndItsExceptionRestoresTheMode) {
  Random init(3);
  DecoderOnlyTransformer model({256, 16, 16, 2, 1, 24}, init);
  const std::string text = sample_text().substr(0, 500);  // 499 targets: 32 windows of 16
  EvaluationOptions options;
  options.batch = 3;
  int calls = 0;
  options.interrupt = [&] { ++calls; };
  const double loss = evaluate(model, text, Tokenizer{}, options).loss;
  EXPECT_EQ(calls, 11);  // ceil(32 / 3) batches
  options.interrupt = {};
  EXPECT_EQ(evaluate(model, text, Tokenizer{}, options).loss, loss);
  struct Stop {};
  calls = 0;
  options.interrupt = [&] {
    if (++calls == 4) throw Stop{};
  };
  model.set_training(true);
  EXPECT_THROW(evaluate(model, text, Tokenizer{}, options), Stop);
  EXPECT_TRUE(model.training());
  EXPECT_EQ(calls, 4);
}
