// Hostile input and faults (issue 11): deep or NUL-laden JSON, numbers out of
// range, FIFOs, allocation bombs, non-finite settings and weights, adapter
// fingerprints, checksummed training checkpoints, run directories.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <gtest/gtest.h>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "message_of.hpp"
#include "../../src/io/json_read.hpp"
#include "../../src/train/training_checkpoint.hpp"
#include "model_fixtures.hpp"
#include "scratch.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
using stage::kPartialMetricsFile;
using stage::kTrainingCheckpointFile;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("riftco_reliability_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A safetensors file whose header is `header` (padded) and whose data is
/// `data_bytes` zero bytes.
std::string safetensors_bytes(std::string header, std::size_t data_bytes = 0) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + std::string(data_bytes, '\0');
}

std::string deep_array(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

using rt_test::message_of;

PretrainingConfig tiny(const fs::path& dir, const std::string& run = "run") {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
  write_bytes(dir / "corpus.txt", text);
  PretrainingConfig c;
  c.dimensions = {256, 32, 16, 2, 2, 32};
  c.data = dir / "corpus.txt";
  c.steps = 6;
  c.batch = 2;
  c.sequence_length = 16;
  c.warmup_steps = 1;
  c.eval_interval = 3;
  c.eval_batches = 1;
  c.checkpoint_interval = 2;
  c.output_dir = dir / run;
  return c;
}

}  // namespace

// ---- 1, 2, 8: one bounded JSON reader -----------------------------------------

TEST(BoundedJson, DeepNestingNulBytesAndHugeNumbersAreRefusedWithoutCrashing) {
  using detail::JsonReadError;
  using detail::parse_untrusted_json;
  EXPECT_NO_THROW(parse_untrusted_json(deep_array(detail::kMaxJsonDepth)));
  for (const std::size_t depth : {std::size_t{65}, std::size_t{1000}, std::size_t{65000}, std::size_t{400000}}) {
    EXPECT_NE(message_of<JsonReadError>([&] { parse_untrusted_json(deep_array(depth)); }).find("nested deeper"),
              std::string::npos);
  }
  const std::string deep_object = [] {
    std::string s;
    for (int i = 0; i < 70000; ++i) s += "{\"a\":";
    s += "1";
    s += std::string(70000, '}');
    return s;
  }();
  EXPECT_THROW(parse_untrusted_json(deep_object), JsonReadError);
  EXPECT_NE(message_of<JsonReadError>([] { parse_untrusted_json(std::string("{\"a\": 1}\0garbage", 16)); })
                .find("NUL byte at offset 8"),
            std::string::npos);
  for (const char* number : {"1e999", "-1e999", "1e400"}) {
    EXPECT_THROW(parse_untrusted_json(std::string("{\"ignored\": ") + number + ", \"a\": 1}"), JsonReadError);
  }
  EXPECT_THROW(parse_untrusted_json("{\"a\": 1, \"a\": 2}"), JsonReadError);
  EXPECT_THROW(parse_untrusted_json("{\"a\": \"\xFF\"}"), JsonReadError);
  // Checked accessors never convert a float to an integer.
  const detail::Json row = parse_untrusted_json(R"({"step": 1e300, "n": 2.5, "s": 3, "big": 18446744073709551615})");
  EXPECT_THROW(detail::json_integer(row, "step", 0, 100), JsonReadError);
  EXPECT_THROW(detail::json_integer(row, "n", 0, 100), JsonReadError);
  EXPECT_THROW(detail::json_integer(row, "big", 0, std::numeric_limits<std::int64_t>::max()), JsonReadError);
  EXPECT_THROW(detail::json_integer(row, "s", 5, 100), JsonReadError);
  EXPECT_EQ(detail::json_integer(row, "s", 0, 100), 3);
  EXPECT_THROW(detail::json_string(row, "s"), JsonReadError);
  EXPECT_THROW(detail::json_string(row, "missing"), JsonReadError);
}

TEST(BoundedJson, EveryLoaderRefusesDeepAndNulHeadersWithAShortMessage) {
  const fs::path dir = fresh_dir("deep");
  const std::vector<std::pair<std::string, std::string>> headers = {
      {"deep array", "{\"a\":" + deep_array(65000) + "}"},
      {"deep metadata", "{\"__metadata__\":" + std::string(70000, '[') + std::string(70000, ']') + "}"},
      {"NUL padded", std::string("{}") + std::string(6, '\0')},
      {"NUL then garbage", std::string("{}\0{\"x\":", 8)},
  };
  for (const auto& [what, header] : headers) {
    const fs::path path = dir / "hostile.safetensors";
    write_bytes(path, safetensors_bytes(header));
    for (int loader = 0; loader < 3; ++loader) {
      const std::string message = message_of<ModelStateError>([&] {
        if (loader == 0) read_safetensors(path);
        if (loader == 1) load_model(path);
        if (loader == 2) read_model_dimensions(path);
      });
      EXPECT_EQ(message.rfind("[load] " + path.string() + ": header ", 0), 0U) << what << ": " << message;
      EXPECT_LT(message.size(), 400U) << what;
    }
  }
  // A 100 KB "dimensions" string is quoted, not echoed.
  Random random(1);
  DecoderOnlyTransformer model(rt_test::tiny_dims(1), random);
  const fs::path good = dir / "model.safetensors";
  save_model_state(model, good);
  TensorFile file = read_safetensors(good);
  file.metadata["dimensions"] = std::string(100000, 'x');
  write_safetensors(dir / "bad_dims.safetensors", file.tensors, file.metadata);
  const std::string message = message_of<ModelStateError>([&] { load_model(dir / "bad_dims.safetensors"); });
  EXPECT_LT(message.size(), 600U);
  EXPECT_NE(message.find("(100000 bytes)"), std::string::npos) << message;
  file.metadata["dimensions"] = "{\"vocab_size\": " + deep_array(5000) + "}";
  write_safetensors(dir / "deep_dims.safetensors", file.tensors, file.metadata);
  EXPECT_THROW(load_model(dir / "deep_dims.safetensors"), ModelStateError);
}

TEST(BoundedJson, ChatLinesNameTheFileAndLineForEveryJsonProblem) {
  const std::vector<std::pair<std::string, std::string>> lines = {
      {R"({"prompt": "p", "response": "r", "ignored": 1e999})", "invalid JSON"},
      {"{\"prompt\": " + deep_array(70000) + ", \"response\": \"r\"}", "nested deeper"},
      {std::string("{\"prompt\": \"p\", \"response\": \"r\"}\0trailing", 41), "NUL byte"},
      {R"({"prompt": "p", "prompt": "q", "response": "r"})", "has the key 'prompt' twice"},
      {R"({"prompt": ["p"], "response": "r"})", "\"prompt\" must be a string, got array"},
  };
  for (const auto& [line, needle] : lines) {
    const std::string text = std::string(R"({"prompt": "a", "response": "b"})") + "\n" + line + "\n";
    const std::string message =
        message_of<DataError>([&] { ChatDataset::parse(text, "chat.jsonl", ByteTokenizer{}); });
    EXPECT_EQ(message.rfind("[data] chat.jsonl: line 2: ", 0), 0U) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  }
}

TEST(BoundedJson, DamagedMetricsBlockResumeWithTheFileLineAndField) {
  const fs::path dir = fresh_dir("metrics");
  PretrainingConfig c = tiny(dir);
  run_pretraining(c, [](const StepReport& s) { return s.step < 3; });  // interrupted after a checkpoint at 2
  const fs::path partial = c.output_dir / kPartialMetricsFile;
  ASSERT_TRUE(fs::exists(partial));
  const std::string good = read_bytes(partial);
  c.resume = true;
  const std::vector<std::pair<std::string, std::string>> damage = {
      {R"({"step": "one", "loss": 1.0})", "\"step\" must be an integer"},
      {R"({"step": 1e300, "loss": 1.0})", "\"step\" must be an integer"},
      {R"({"step": 1, "loss": "x"})", "\"loss\" must be a number"},
      {R"({"loss": 1.0})", "missing key \"step\""},
      {"{\"step\": 1, \"loss\": " + deep_array(70000) + "}", "nested deeper"},
  };
  for (const auto& [line, needle] : damage) {
    write_bytes(partial, line + "\n" + good);
    const std::string message = message_of<Error>([&] { run_pretraining(c); });
    EXPECT_NE(message.find(partial.string() + ": line 1: "), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  }
  write_bytes(partial, good);
  EXPECT_TRUE(run_pretraining(c).completed);
}

// ---- 3: FIFOs never block ------------------------------------------------------

TEST(NonRegularFiles, AFifoIsRefusedAtOnceByEveryLoader) {
  const fs::path dir = fresh_dir("fifo");
  const fs::path fifo = dir / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Random random(2);
  const std::vector<std::function<void()>> loaders = {
      [&] { read_safetensors(fifo); },
      [&] { load_model(fifo); },
      [&] { read_model_dimensions(fifo); },
      [&] {
        DecoderOnlyTransformer model(rt_test::tiny_dims(1), random);
        load_adapter_state(model, fifo);
      },
      [&] { ChatDataset::load(fifo); },
      [&] { load_text_file(fifo); },
      [&] {
        std::string out;
        if (const auto why = read_regular_file(fifo, out)) throw DataError(*why);
      },
  };
  for (std::size_t i = 0; i < loaders.size(); ++i) {
    auto call = std::async(std::launch::async, [&, i] {
      try {
        loaders[i]();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    });
    if (call.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // unblock the reader, then fail
      if (writer >= 0) ::close(writer);
      call.wait();
      ADD_FAILURE() << "loader " << i << " blocked on a FIFO";
      continue;
    }
    EXPECT_NE(call.get().find("not a regular file"), std::string::npos) << "loader " << i;
  }
}

// ---- 4: allocation bombs are refused before anything is allocated --------------

TEST(MemoryBudget, RunsThatCannotFitAreRefusedNamingTheSizesAndTouchNothing) {
  const fs::path dir = fresh_dir("bombs");
  std::vector<PretrainingConfig> configs;
  configs.push_back(tiny(dir));
  configs.back().dimensions = {256, 32, 65536, 2, 4096, 65536};  // width x layers: petabytes of weights
  configs.push_back(tiny(dir));
  configs.back().batch = 1 << 20;  // batch x sequence x vocabulary logits
  configs.back().sequence_length = 32;
  configs.push_back(tiny(dir));  // a long context with materialized attention and no checkpointing:
  configs.back().dimensions = {256, 2048, 256, 16, 256, 1024};  // every layer keeps four (H, T, T) score tensors
  configs.back().attention = FullSequenceAttentionKind::Materialized;
  configs.back().batch = 1;
  configs.back().sequence_length = 2048;
  for (PretrainingConfig& c : configs) {
    const std::string message = message_of<ValueError>([&] { run_pretraining(c); });
    EXPECT_NE(message.find("this run needs at least"), std::string::npos) << message;
    EXPECT_NE(message.find("GiB"), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(c.output_dir)) << "the output directory was created";
  }
  // LoRA: a rank above min(out, in) is refused before anything is loaded.
  Random random(3);
  DecoderOnlyTransformer model(rt_test::tiny_dims(1), random);
  LoraConfig lora;
  lora.rank = 1000000000;
  EXPECT_NE(message_of<ValueError>([&] { model.add_lora(lora, random); }).find("larger than min(out, in)"),
            std::string::npos);
  EXPECT_FALSE(model.has_lora());
  save_model_state(model, dir / "base.safetensors");
  PostTrainingConfig post;
  post.base_model = dir / "base.safetensors";
  post.data = fs::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl";
  post.sequence_length = 8;
  post.lora.rank = 1000000000;
  post.output_dir = dir / "post";
  EXPECT_THROW(run_post_training(post), ValueError);
  EXPECT_FALSE(fs::exists(post.output_dir));
}

// ---- 5: non-finite settings, weights, losses, gradients -------------------------

TEST(NonFinite, SettingsAreRefusedByName) {
  const fs::path dir = fresh_dir("settings");
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    PretrainingConfig c = tiny(dir);
    c.norm_epsilon = bad;
    EXPECT_NE(message_of<ValueError>([&] { c.validate(); }).find("norm_epsilon must be a finite number"),
              std::string::npos);
    c = tiny(dir);
    c.learning_rate = bad;
    EXPECT_NE(message_of<ValueError>([&] { c.validate(); }).find("learning_rate must be a finite number"),
              std::string::npos);
    Random random(4);
    EXPECT_THROW(DecoderOnlyTransformer(rt_test::tiny_dims(1), random, bad), ValueError);
    for (float AdamOptions::*field : {&AdamOptions::learning_rate, &AdamOptions::epsilon, &AdamOptions::weight_decay,
                                      &AdamOptions::max_grad_norm}) {
      AdamOptions o;
      o.*field = bad;
      EXPECT_THROW(o.validate(), ValueError);
    }
  }
}

TEST(NonFinite, WeightsAreRefusedAtLoadUnlessAllowedAndNeverDecodeToGarbage) {
  const fs::path dir = fresh_dir("nan_weights");
  Random random(5);
  DecoderOnlyTransformer model(rt_test::tiny_dims(1), random);
  Variable w = model.parameter("blocks.0.mlp.up.weight");
  w.mutable_value().data()[7] = std::numeric_limits<float>::quiet_NaN();
  save_model_state(model, dir / "nan.safetensors");
  const std::string message = message_of<ModelStateError>([&] { load_model(dir / "nan.safetensors"); });
  EXPECT_NE(message.find("'blocks.0.mlp.up.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("element 7"), std::string::npos) << message;
  DecoderOnlyTransformer target(rt_test::tiny_dims(1), random);
  const Tensor before = target.parameter("lm_head.weight").value().clone();
  EXPECT_THROW(load_model_state(target, dir / "nan.safetensors"), ModelStateError);
  EXPECT_TRUE(bit_equal(target.parameter("lm_head.weight").value(), before));
  LoadOptions allow;
  allow.allow_non_finite = true;
  const auto loaded = load_model(dir / "nan.safetensors", FullSequenceAttentionKind::Materialized,
                                 ActivationCheckpointingKind::Disabled, allow);
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  EXPECT_NE(message_of<ValueError>([&] { generate(*loaded, prompt, GenerationOptions{}); }).find("not finite"),
            std::string::npos);
}

TEST(NonFinite, AdamRefusesANonFiniteGradientAndChangesNothing) {
  Variable a(Tensor::full({3}, 1.0F), true, "a");
  Variable b(Tensor::full({2}, 1.0F), true, "b");
  Adam adam({a, b});
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 3e38F}) {
    sum(mul(a, Variable(Tensor::full({3}, bad)))).backward();
    sum(mul(b, b)).backward();
    const Tensor a_before = a.value().clone();
    const Tensor b_before = b.value().clone();
    const std::string message = message_of<ValueError>([&] { adam.step(); });
    if (bad == 3e38F) {  // finite gradients whose norm overflows a float
      EXPECT_NE(message.find("not finite"), std::string::npos) << message;
    } else {
      EXPECT_NE(message.find("'a'"), std::string::npos) << message;
    }
    EXPECT_TRUE(bit_equal(a.value(), a_before));
    EXPECT_TRUE(bit_equal(b.value(), b_before));
    EXPECT_EQ(adam.step_count(), 0);
  }
}

TEST(NonFinite, ARunStopsAtTheFirstNonFiniteLossWithoutWritingAModel) {
  const fs::path dir = fresh_dir("diverge");
  PretrainingConfig c = tiny(dir);
  c.learning_rate = 1e30F;  // finite, absurd: the loss overflows within a few steps
  c.max_grad_norm = 0.0F;
  c.steps = 20;
  const std::string message = message_of<Error>([&] { run_pretraining(c); });
  EXPECT_NE(message.find("stopped before updating the weights"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(c.output_dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(c.output_dir / "metadata.json"));
}

TEST(MemoryBudget, AHugeEvaluationIsRefusedNotRun) {
  const fs::path dir = fresh_dir("eval");
  PretrainingConfig c = tiny(dir);
  c.eval_batches = 99999999999999;
  EXPECT_NE(message_of<ValueError>([&] { c.validate(); }).find("eval_batches must be in [1, 100000]"),
            std::string::npos);
}

// ---- saves never replace what is not a regular file -----------------------------

TEST(AtomicWrites, AFifoASymlinkOrADeviceIsNeverReplaced) {
  const fs::path dir = fresh_dir("targets");
  const fs::path fifo = dir / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  write_bytes(dir / "real.safetensors", "precious");
  fs::create_symlink(dir / "real.safetensors", dir / "link.safetensors");
  Random random(9);
  DecoderOnlyTransformer model(rt_test::tiny_dims(1), random);
  for (const fs::path& target : {fifo, dir / "link.safetensors", fs::path("/dev/null")}) {
    const std::string message = message_of<ModelStateError>([&] { save_model_state(model, target); });
    EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(dir / "link.safetensors"));
  EXPECT_EQ(read_bytes(dir / "real.safetensors"), "precious");
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  EXPECT_EQ(remove_stale_temporaries(dir), 0);  // and nothing was left behind
}

TEST(RunDirectory, FileSystemFailuresAreTypedErrorsNamingThePath) {
  const fs::path dir = fresh_dir("fs_errors");
  PretrainingConfig c = tiny(dir);
  write_bytes(dir / "a_file", "x");
  c.output_dir = dir / "a_file" / "run";  // a file where a directory should be
  const std::string message = message_of<ModelStateError>([&] { run_pretraining(c); });
  EXPECT_NE(message.find("cannot create the output directory"), std::string::npos) << message;
  c.output_dir = dir / "run";
  fs::create_directories(c.output_dir / kPartialMetricsFile / "not_empty");  // cannot be removed
  EXPECT_THROW(run_pretraining(c), ModelStateError);
}

// ---- 6: adapters know their base ----------------------------------------------

TEST(AdapterFingerprint, AnAdapterForAnotherBaseIsRefusedUnlessAllowed) {
  const fs::path dir = fresh_dir("fingerprint");
  Random r1(6);
  Random r2(7);
  DecoderOnlyTransformer base(rt_test::tiny_dims(1), r1);
  DecoderOnlyTransformer other(rt_test::tiny_dims(1), r2);  // same dimensions, other weights
  LoraConfig lora;
  lora.rank = 2;
  base.add_lora(lora, r1);
  save_adapter_state(base, dir / "adapter.safetensors");
  EXPECT_EQ(read_safetensors(dir / "adapter.safetensors").metadata.at("base_fingerprint"), model_fingerprint(base));
  const std::string message = message_of<ModelStateError>([&] { load_adapter_state(other, dir / "adapter.safetensors"); });
  EXPECT_NE(message.find("fingerprint"), std::string::npos) << message;
  EXPECT_FALSE(other.has_lora());
  LoadOptions allow;
  allow.allow_base_mismatch = true;
  EXPECT_NO_THROW(load_adapter_state(other, dir / "adapter.safetensors", allow));
  EXPECT_TRUE(other.has_lora());
  DecoderOnlyTransformer same(rt_test::tiny_dims(1), r1);
  load_model_state(same, [&] {
    base.remove_lora();
    save_model_state(base, dir / "base.safetensors");
    return dir / "base.safetensors";
  }());
  EXPECT_NO_THROW(load_adapter_state(same, dir / "adapter.safetensors"));
  // A schema-1 file (before fingerprints) still loads.
  TensorFile old = read_safetensors(dir / "adapter.safetensors");
  old.metadata.erase("base_fingerprint");
  old.metadata["schema_version"] = "1";
  write_safetensors(dir / "old.safetensors", old.tensors, old.metadata);
  DecoderOnlyTransformer third(rt_test::tiny_dims(1), r2);
  EXPECT_NO_THROW(load_adapter_state(third, dir / "old.safetensors"));
  // One changed weight changes the fingerprint.
  const std::string fp = model_fingerprint(same);
  Variable w = same.parameter("final_norm.weight");
  w.mutable_value().data()[0] += 1e-3F;
  EXPECT_NE(model_fingerprint(same), fp);
}

// ---- 7: training checkpoints are checksummed and parsed strictly --------------

TEST(TrainingCheckpoint, BitFlipsEditsAndLooseNumbersAreRefused) {
  const fs::path dir = fresh_dir("checksum");
  PretrainingConfig c = tiny(dir);
  run_pretraining(c, [](const StepReport& s) { return s.step < 3; });
  const fs::path ckpt = c.output_dir / kTrainingCheckpointFile;
  const std::string good = read_bytes(ckpt);
  c.resume = true;
  // A one-bit flip anywhere in the data section.
  for (const double where : {0.5, 0.75, 0.999}) {
    std::string flipped = good;
    const auto at = static_cast<std::size_t>(static_cast<double>(good.size()) * where);
    flipped[at] = static_cast<char>(flipped[at] ^ 0x10);
    write_bytes(ckpt, flipped);
    EXPECT_NE(message_of<ModelStateError>([&] { run_pretraining(c); }).find("checksum mismatch"),
              std::string::npos);
  }
  // An edited step, with the old checksum.
  TensorFile f = read_safetensors([&] {
    write_bytes(ckpt, good);
    return ckpt;
  }());
  f.metadata["step"] = "4";
  write_safetensors(ckpt, f.tensors, f.metadata);
  EXPECT_NE(message_of<ModelStateError>([&] { run_pretraining(c); }).find("checksum mismatch"), std::string::npos);
  // Loose numbers with a matching checksum: the parser itself refuses them.
  for (const char* state : {"-1:-1:0:0", " 7: 9:0:0", "+7:9:0:0", "7:9:2:0", "7:9:0", "7:9:0:0:1", "7::0:0"}) {
    TensorFile g = read_safetensors([&] {
      write_bytes(ckpt, good);
      return ckpt;
    }());
    g.metadata["data_random"] = state;
    g.metadata["checksum"] = stage::checkpoint_checksum(g.metadata, g.tensors);  // as a writer would
    write_safetensors(ckpt, g.tensors, g.metadata);
    EXPECT_NE(message_of<ModelStateError>([&] { run_pretraining(c); }).find("bad random state"), std::string::npos)
        << state;
  }
  write_bytes(ckpt, good);
  EXPECT_TRUE(run_pretraining(c).completed);
}

// ---- 9: run directories are the old run, the new one, or a resumable one -------

TEST(RunDirectory, AKillBetweenCompletionsLastTwoRemovalsResumesToTheSameRun) {
  // Completion removes the partial log, then the checkpoint: a kill between
  // the two leaves metadata.json, metrics.jsonl and the weights beside the
  // last checkpoint. Resume finishes the run again to the same files.
  const fs::path dir = fresh_dir("last_removals");
  PretrainingConfig c = tiny(dir);
  ASSERT_FALSE(run_pretraining(c, [](const StepReport& s) { return s.step < 3; }).completed);
  const std::string checkpoint = read_bytes(c.output_dir / kTrainingCheckpointFile);
  c.resume = true;
  ASSERT_TRUE(run_pretraining(c).completed);
  const std::string model = read_bytes(c.output_dir / "model.safetensors");
  const std::string metrics = read_bytes(c.output_dir / "metrics.jsonl");
  write_bytes(c.output_dir / kTrainingCheckpointFile, checkpoint);  // the state after the kill
  ASSERT_FALSE(fs::exists(c.output_dir / kPartialMetricsFile));
  const RunResult again = run_pretraining(c);
  EXPECT_TRUE(again.completed);
  EXPECT_EQ(again.resumed_from_step, 2);
  EXPECT_EQ(read_bytes(c.output_dir / "model.safetensors"), model);
  // The same rows (steps and losses; timings differ).
  const auto losses = [](const std::string& log) {
    std::vector<std::pair<std::int64_t, double>> rows;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json row = nlohmann::json::parse(line);
      rows.emplace_back(row["step"].get<std::int64_t>(), row["loss"].get<double>());
    }
    return rows;
  };
  EXPECT_EQ(losses(read_bytes(c.output_dir / "metrics.jsonl")), losses(metrics));
  EXPECT_EQ(losses(metrics).size(), 6U);
  EXPECT_FALSE(fs::exists(c.output_dir / kTrainingCheckpointFile));
  EXPECT_FALSE(fs::exists(c.output_dir / kPartialMetricsFile));
}

TEST(RunDirectory, AFailedFreshRunLeavesTheOldCompleteRunWhole) {
  const fs::path dir = fresh_dir("rundir");
  PretrainingConfig c = tiny(dir);
  ASSERT_TRUE(run_pretraining(c).completed);
  std::map<std::string, std::string> before;
  for (const char* name : {"model.safetensors", "metadata.json", "metrics.jsonl", "loss_curve.svg"}) {
    before[name] = read_bytes(c.output_dir / name);
  }
  // A new run in the same directory that stops half way, then one that fails
  // at its last file: the old run stays complete and readable throughout.
  PretrainingConfig again = c;
  again.seed = 99;
  EXPECT_FALSE(run_pretraining(again, [](const StepReport& s) { return s.step < 3; }).completed);
  for (const auto& [name, bytes] : before) EXPECT_EQ(read_bytes(c.output_dir / name), bytes) << name;
  EXPECT_TRUE(fs::exists(c.output_dir / kTrainingCheckpointFile));  // the new run is resumable
  fs::remove(c.output_dir / "loss_curve.svg");
  again.resume = true;
  // The last plot cannot be written: a directory appears in its place after
  // setup (which refuses one already there, before step 1).
  const auto block_the_plot = [&](const StepReport&) {
    std::error_code ec;
    fs::create_directory(c.output_dir / "loss_curve.svg", ec);
    return true;
  };
  EXPECT_THROW(run_pretraining(again, block_the_plot), Error);
  EXPECT_FALSE(fs::exists(c.output_dir / "metadata.json")) << "a failed completion must not claim completion";
  EXPECT_TRUE(fs::exists(c.output_dir / kTrainingCheckpointFile));
  fs::remove(c.output_dir / "loss_curve.svg");
  const RunResult done = run_pretraining(again);  // --resume finishes it
  EXPECT_TRUE(done.completed);
  EXPECT_TRUE(fs::exists(c.output_dir / "metadata.json"));
  EXPECT_FALSE(fs::exists(c.output_dir / kTrainingCheckpointFile));
  EXPECT_FALSE(fs::exists(c.output_dir / kPartialMetricsFile));
}

TEST(RunDirectory, StaleTemporariesOfDeadProcessesAreRemovedAtTheNextStart) {
  const fs::path dir = fresh_dir("stale");
  PretrainingConfig c = tiny(dir);
  fs::create_directories(c.output_dir);
  // A pid that cannot be running (above pid_max), and our own live one.
  write_bytes(c.output_dir / ".training_checkpoint.safetensors.tmp.2147483646.0", "partial copy");
  write_bytes(c.output_dir / ".model.safetensors.tmp.2147483646.12", "partial copy");
  const std::string live = ".metadata.json.tmp." + std::to_string(::getpid()) + ".999";
  write_bytes(c.output_dir / live, "in use");
  write_bytes(c.output_dir / "notes.tmp.1.2", "not ours");  // no leading dot: not a temporary of ours
  EXPECT_EQ(remove_stale_temporaries(c.output_dir), 2);
  EXPECT_TRUE(fs::exists(c.output_dir / live));
  EXPECT_TRUE(fs::exists(c.output_dir / "notes.tmp.1.2"));
  write_bytes(c.output_dir / ".metrics.jsonl.tmp.2147483646.3", "x");
  // What a run did not write is not its to remove, though it has the shape
  // (the output directory may be any directory, even "."): a user's file of
  // another name, a directory, a symlink and a FIFO all stayed deleted before.
  write_bytes(c.output_dir / ".notes.txt.tmp.2147483646.0", "the user's");
  fs::create_directory(c.output_dir / ".model.safetensors.tmp.2147483646.5");
  fs::create_symlink("metadata.json", c.output_dir / ".metadata.json.tmp.2147483646.6");
  ASSERT_EQ(::mkfifo((c.output_dir / ".metrics.jsonl.tmp.2147483646.7").c_str(), 0600), 0);
  ASSERT_TRUE(run_pretraining(c).completed);
  EXPECT_FALSE(fs::exists(c.output_dir / ".metrics.jsonl.tmp.2147483646.3"));
  EXPECT_EQ(rt_test::read_file(c.output_dir / ".notes.txt.tmp.2147483646.0"), "the user's");
  EXPECT_TRUE(fs::is_directory(c.output_dir / ".model.safetensors.tmp.2147483646.5"));
  EXPECT_TRUE(fs::is_symlink(c.output_dir / ".metadata.json.tmp.2147483646.6"));
  EXPECT_TRUE(fs::is_fifo(c.output_dir / ".metrics.jsonl.tmp.2147483646.7"));
}

// A NUL in an error's text (a user's name, path or enum string) cut the
// message short wherever it is read as a C string (the C ABI's last error,
// Python's exception): it is written as \0.
TEST(Reliability, ErrorMessagesHoldNoNulByte) {
  const std::string text = std::string("[attention] unknown attention kind \"flash") + '\0' + "x\" (expected ...)";
  const ValueError e(text);
  EXPECT_EQ(std::string(e.what()), "[attention] unknown attention kind \"flash\\0x\" (expected ...)");
  try {
    (void)parse_attention_kind(std::string("flash") + '\0' + "x");
    ADD_FAILURE() << "accepted";
  } catch (const ValueError& error) {
    EXPECT_NE(std::string(error.what()).find("expected"), std::string::npos) << error.what();
  }
}
