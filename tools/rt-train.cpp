// rt-train: the stage pipelines from the command line.
//   rt-train pretrain  [options]   train a model from scratch on text
//   rt-train post-train [options]  fine-tune a saved model on prompt/response pairs
//   rt-train tokenizer [options]   train a SentencePiece subword tokenizer
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <type_traits>

#include "cli.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/memory_plan.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;

namespace {

/// Options whose C++ type is not what CLI11 binds (paths, enums), kept as
/// text until the run's settings are assembled.
struct StageText {
  std::string attention, activation_checkpointing, checkpoint_segment_blocks = "sqrt", data, output, tokenizer;
  std::string activation_memory_budget = "0";
  std::string device = "cpu";
  bool quiet = false;
  std::int64_t stop_after = 0;  // --stop-after: not a setting of the run (not in metadata.json)
};

template <typename T>
CLI::Option* add_number(CLI::App& app, const std::string& name, T& value, const std::string& help) {
  CLI::Option* o = app.add_option(name, value, help);
  if constexpr (std::is_floating_point_v<T>) {
    o->check(rt_cli::kFiniteFloat)->type_name("FLOAT");
  } else if constexpr (std::is_unsigned_v<T>) {
    static_assert(sizeof(T) == 8, "an unsigned option is a 64-bit seed");
    o->check(rt_cli::kUnsigned64)->type_name("INT");
  } else {
    o->type_name("INT");
  }
  return o;
}

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const ActivationCheckpointingKind k : activation_checkpointing_kinds()) {
    names.emplace_back(activation_checkpointing_name(k));
  }
  return names;
}

void add_stage_options(CLI::App& app, StageSettings& s, StageText& t) {
  t.attention = attention_kind_name(s.attention);
  t.activation_checkpointing = activation_checkpointing_name(s.activation_checkpointing);
  t.output = s.output_dir.string();
  const std::string policy = "Execution policy";
  app.add_option("--attention", t.attention, "full-sequence attention kernel (docs/checkpointing.md)")
      ->type_name("KIND")
      ->check(CLI::IsMember({"materialized", "flash"}))
      ->group(policy);
  app.add_option("--activation-checkpointing", t.activation_checkpointing,
                 "what a training forward keeps (docs/checkpointing.md)")
      ->type_name("POLICY")
      ->check(CLI::IsMember(policy_names()))
      ->group(policy);
  app.add_option("--checkpoint-segment-blocks", t.checkpoint_segment_blocks,
                 "blocks per segment for 'segments' (sqrt or 0: round(sqrt(layers)))")
      ->type_name("N|sqrt")
      ->check(CLI::IsMember({"sqrt"}) | rt_cli::integer_at_least(0))
      ->group(policy);
  app.add_option("--activation-memory-budget", t.activation_memory_budget,
                 "fit every step's activation peak in SIZE (e.g. 256MiB, 1.5GiB, bytes; 0: none): chooses what "
                 "each block recomputes and prints the plan (docs/checkpointing.md)")
      ->type_name("SIZE")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            if (text == "0") return "";
            try {
              (void)parse_byte_size(text, "--activation-memory-budget");
            } catch (const std::exception& e) {
              return e.what();
            }
            return "";
          },
          "SIZE"))
      ->group(policy);
  app.add_flag("--activation-offload", s.activation_offload,
               "keep checkpointed groups' block-boundary inputs in pinned host memory (--device cuda; on the "
               "CPU it is recorded and moves nothing; docs/checkpointing.md)")
      ->group(policy);
  app.add_flag("--optimizer-in-backward", s.optimizer_in_backward,
               "update each parameter inside the backward pass as soon as its gradient is final, then free it "
               "(the same bits; needs --max-grad-norm 0, no gradient accumulation, one process; docs/pipelines.md)")
      ->group(policy);
  add_number(app, "--zero,--zero-stage", s.zero_stage,
             "ZeRO stage under mpirun: 0 plain Adam on every rank, 1 Adam state sharded across the ranks "
             "(the same bits; one process: plain Adam; docs/distributed.md)")
      ->type_name("0|1")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1}).description(""))
      ->group(policy);
  add_number(app, "--bucket-mib,--gradient-bucket-mib", s.gradient_bucket_mib,
             "gradient all-reduce bucket size in MiB under mpirun (PyTorch DDP's bucket_cap_mb)")
      ->type_name("N")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{65536}).description(""))
      ->group(policy);
  app.add_option("--device", t.device,
                 "train on this device: the model, gradients and Adam state live there; under mpirun cuda uses "
                 "the nccl communicator, one GPU per rank (docs/distributed.md)")
      ->type_name("DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->group(policy);
  add_number(app, "--dropout", s.dropout, "residual dropout probability")->group(policy);
  const std::string training = "Training";
  app.add_option("--data", t.data, "training data file")->type_name("PATH")->group(training);
  app.add_option("--tokenizer", t.tokenizer,
                 "SentencePiece model from 'rt-train tokenizer' (default: bytes); the vocabulary follows it")
      ->type_name("PATH")
      ->group(training);
  add_number(app, "--steps", s.steps, "optimizer steps")->check(rt_cli::integer_at_least(1))->group(training);
  add_number(app, "--batch", s.batch, "sequences per micro-batch (effective batch: batch x K)")
      ->check(rt_cli::integer_at_least(1))
      ->group(training);
  add_number(app, "--gradient-accumulation-steps", s.gradient_accumulation_steps,
             "K micro-batches per optimizer step, gradients summed as one K-times-larger batch")
      ->type_name("K")
      ->check(rt_cli::integer_at_least(1))
      ->group(training);
  add_number(app, "--sequence-length", s.sequence_length, "tokens per sequence")
      ->check(rt_cli::integer_at_least(1))
      ->group(training);
  add_number(app, "--learning-rate", s.learning_rate, "peak learning rate")->group(training);
  add_number(app, "--warmup-steps", s.warmup_steps, "linear warmup steps")
      ->check(rt_cli::integer_at_least(0))
      ->group(training);
  add_number(app, "--min-learning-rate-ratio", s.min_learning_rate_ratio, "cosine decay ends at lr*R")
      ->group(training);
  add_number(app, "--weight-decay", s.weight_decay, "decoupled weight decay (never on norm weights)")->group(training);
  app.add_option("--decay-embeddings", s.decay_embeddings, "weight-decay the token embedding and LM head too")
      ->type_name("true|false")
      ->check(CLI::IsMember({"true", "false"}))
      ->default_str(s.decay_embeddings ? "true" : "false")
      ->group(training);
  add_number(app, "--max-grad-norm", s.max_grad_norm, "global gradient-norm clip (0: off)")->group(training);
  add_number(app, "--beta1", s.beta1, "Adam beta1")->group(training);
  add_number(app, "--beta2", s.beta2, "Adam beta2")->group(training);
  add_number(app, "--seed", s.seed, "seed for initialization, batches and dropout")->group(training);
  add_number(app, "--eval-interval", s.eval_interval, "steps between validation losses (0: end only)")
      ->check(rt_cli::integer_at_least(0))
      ->group(training);
  add_number(app, "--eval-batches", s.eval_batches, "batches per validation loss")
      ->check(rt_cli::integer_at_least(1))
      ->group(training);
  add_number(app, "--checkpoint-interval", s.checkpoint_interval,
             "steps between resumable training checkpoints (0: none)")
      ->check(rt_cli::integer_at_least(0))
      ->group(training);
  app.add_option("--output", t.output, "output directory")->type_name("DIR")->group(training);
  app.add_flag("--resume", s.resume, "continue from DIR/training_checkpoint.safetensors if present")
      ->group(training);
  app.add_flag("--quiet", t.quiet, "no progress line")->group(training);
  add_number(app, "--stop-after", t.stop_after,
             "stop once step N is done, as if interrupted there: no final files; the last training checkpoint "
             "(--checkpoint-interval) and the partial metrics stay for --resume (0, or N >= --steps: no stop)")
      ->type_name("N")
      ->check(rt_cli::integer_at_least(0))
      ->group(training);
  rt_cli::add_config_option(app);
}

/// A replayed metadata.json (--config) records fingerprints of what its run
/// read: a file the replay takes from it (not from the command line) that
/// changed since would train another run silently, so it is a usage error.
/// `option` is the file's option ("data"), `fact` its recorded fact.
void check_replayed_file(const std::string& option, const std::filesystem::path& path, const std::string& fact) {
  const rt_cli::ConfigFileUse& use = rt_cli::config_file_use();
  const auto recorded = use.facts.find(fact);
  if (path.empty() || !use.from_file(option) || recorded == use.facts.end()) return;
  const std::string now = fact == "tokenizer-checksum" ? Tokenizer::load(path).checksum() : file_fingerprint(path);
  if (now == recorded->second) return;
  std::string key = fact;
  std::replace(key.begin(), key.end(), '-', '_');
  throw rt_cli::UsageError("--config: the replayed run recorded " + key + " " + recorded->second + " for --" + option +
                           " " + path.string() + ", which now gives " + now +
                           " (the file changed since): the replay would not be that run. Give --" + option +
                           " on the command line to train on it anyway");
}

/// The text options into the settings (after parsing).
void apply_stage_text(const CLI::App& app, const StageText& t, StageSettings& s) {
  s.attention = parse_attention_kind(t.attention, "--attention");
  s.activation_checkpointing = parse_activation_checkpointing(t.activation_checkpointing, "--activation-checkpointing");
  s.device = parse_backend(t.device, "--device");
  s.checkpoint_segment_blocks = t.checkpoint_segment_blocks == "sqrt" ? 0 : std::stoll(t.checkpoint_segment_blocks);
  s.activation_memory_budget =
      t.activation_memory_budget == "0" ? 0 : parse_byte_size(t.activation_memory_budget, "--activation-memory-budget");
  if (s.activation_memory_budget > 0 && s.activation_checkpointing != ActivationCheckpointingKind::Disabled) {
    throw rt_cli::UsageError("--activation-memory-budget chooses the checkpointing itself: leave out "
                             "--activation-checkpointing " + t.activation_checkpointing);
  }
  if (app.count("--data") > 0) {
    if (t.data.empty()) throw rt_cli::UsageError("option '--data' must name a file (leave it out for the default)");
    s.data = t.data;
  }
  s.tokenizer = t.tokenizer;  // "" (a replayed byte-level run's metadata): bytes
  s.output_dir = t.output;
  check_replayed_file("data", s.data, "data-fingerprint");
  check_replayed_file("tokenizer", s.tokenizer, "tokenizer-checksum");
}

/// A live progress line on a terminal; periodic plain lines otherwise. The
/// run goes on until step `stop_after` is done (0: to the end). A stop at or
/// past the last step is the whole run: stopping there would only throw away
/// the final files (and the steps since the last checkpoint).
ProgressCallback progress_printer(const std::string& stage, bool quiet, std::int64_t stop_after) {
  const bool tty = isatty(STDERR_FILENO) != 0;
  return [stage, quiet, tty, stop_after](const StepReport& r) {
    const bool go_on = stop_after == 0 || r.step < stop_after || r.step >= r.total_steps;
    if (quiet) return go_on;
    const std::int64_t every = std::max<std::int64_t>(1, r.total_steps / 20);
    const bool last = r.step == r.total_steps || !go_on;
    if (!tty && !last && !r.validation_loss && r.step % every != 0) return go_on;
    char line[256];
    std::snprintf(line, sizeof line, "[%s] step %lld/%lld  loss %.4f%s  lr %.2e  %.0f tok/s  ETA %s  peak %s",
                  stage.c_str(), static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss,
                  r.validation_loss ? ("  val " + std::to_string(*r.validation_loss).substr(0, 6)).c_str() : "",
                  r.learning_rate, r.tokens_per_second, rt_cli::duration(r.eta_seconds).c_str(),
                  rt_cli::mib(r.peak_bytes).c_str());
    if (tty) {
      std::cerr << "\r\033[2K" << line << (last || r.validation_loss ? "\n" : "") << std::flush;
    } else {
      std::cerr << line << "\n";
    }
    return go_on;
  };
}

/// Prints the activation memory plan (stdout: it is the run's result as much as the final line).
void print_notice(const std::string& text) {
  if (Communicator::world().rank() == 0) std::cout << text << std::flush;
}

/// Under mpirun rank 0 alone prints (and writes files); the others are silent
/// unless they fail.
bool printing_rank() { return Communicator::world().rank() == 0; }

/// " over 2 ranks (4 rows each)" under data parallelism, "" otherwise.
std::string ranks_text(const StageSettings& s) {
  const int world = Communicator::world().world_size();
  if (world == 1 || s.batch % world != 0) return "";  // the run refuses an uneven split
  return "; data-parallel over " + std::to_string(world) + " ranks (" +
         std::to_string(s.batch / world) + " of " + std::to_string(s.batch) +
         " rows each" + (s.zero_stage == 1 ? ", ZeRO-1" : "") + ")";
}

/// "; device cuda" when not training on the CPU; "; optimizer in backward" when set.
std::string execution_text(const StageSettings& s) {
  return (s.device == Backend::Cpu ? "" : std::string("; device ") + backend_name(s.device)) +
         (s.optimizer_in_backward ? "; optimizer in backward" : "");
}

/// "checkpointing block" or "activation memory budget 256.0 MiB".
std::string policy_text(const StageSettings& s) {
  if (s.activation_memory_budget > 0) {
    return "activation memory budget " + format_bytes(static_cast<double>(s.activation_memory_budget));
  }
  return std::string("checkpointing ") + activation_checkpointing_name(s.activation_checkpointing);
}

void print_result(const RunResult& r) {
  if (!r.completed) {  // --stop-after
    const bool resumable = std::filesystem::exists(r.output_dir / "training_checkpoint.safetensors");
    const std::int64_t saved = r.checkpoint_step;
    std::string resume = "no training checkpoint (--checkpoint-interval): --resume starts over";
    if (resumable) {
      // The last checkpoint may be before the stop: say which steps run again
      // (it printed only "--resume continues from ..." and redid them quietly).
      resume = "--resume continues from " + (r.output_dir / "training_checkpoint.safetensors").string() +
               " (step " + std::to_string(saved) + ")";
      if (saved < r.steps) {
        resume += (saved + 1 == r.steps ? "; step " + std::to_string(r.steps) + " runs"
                                        : "; steps " + std::to_string(saved + 1) + "-" + std::to_string(r.steps) + " run") +
                  " again";
      }
    }
    std::cout << "stopped after step " << r.steps << " (--stop-after), final train loss " << r.final_train_loss
              << "; no final files written; " << resume << "\n";
    return;
  }
  std::cout << "done: " << r.steps << " steps";
  if (r.resumed_from_step > 0) std::cout << " (resumed from step " << r.resumed_from_step << ")";
  std::cout << ", final train loss " << r.final_train_loss << ", validation loss " << r.final_validation_loss
            << ", " << static_cast<long long>(r.tokens_per_second) << " tok/s, peak " << rt_cli::mib(r.peak_bytes)
            << " (activations " << rt_cli::mib(r.activation_peak_bytes) << ")\nwrote " << r.weights.string() << ", " << (r.output_dir / "metadata.json").string() << ", "
            << (r.output_dir / "metrics.jsonl").string() << ", " << (r.output_dir / "loss_curve.svg").string()
            << "\n";
}

struct Commands {
  PretrainingConfig pretrain;
  StageText pretrain_text;
  PostTrainingConfig post;
  StageText post_text;
  std::string base_model, method = "lora", lora_targets;
};

void add_pretrain(CLI::App& app, Commands& c) {
  CLI::App* sub = app.add_subcommand(
      "pretrain",
      "Trains a decoder-only transformer from scratch on UTF-8 text (byte tokens, or subwords with "
      "--tokenizer). Without --data it uses the default corpus, Debian's fortunes (/usr/share/games/fortunes).");
  rt_cli::style(*sub);
  PretrainingConfig& p = c.pretrain;
  p.output_dir = "runs/pretrain";
  TransformerDimensions& d = p.dimensions;
  const std::string model = "Model";
  add_number(*sub, "--context-length", d.context_length, "maximum sequence length")
      ->check(rt_cli::integer_at_least(1))
      ->group(model);
  add_number(*sub, "--model-width", d.model_width, "residual width")->check(rt_cli::integer_at_least(1))->group(model);
  add_number(*sub, "--heads", d.heads, "attention heads")->check(rt_cli::integer_at_least(1))->group(model);
  add_number(*sub, "--layers", d.layers, "transformer blocks")->check(rt_cli::integer_at_least(1))->group(model);
  add_number(*sub, "--feed-forward-width", d.feed_forward_width, "SwiGLU hidden width")
      ->check(rt_cli::integer_at_least(1))
      ->group(model);
  add_number(*sub, "--key-value-heads", d.key_value_heads,
             "key/value heads for grouped-query attention (0 = --heads; must divide --heads)")
      ->check(rt_cli::integer_at_least(0))
      ->group(model);
  add_number(*sub, "--rope-base", d.rope_base, "RoPE base (theta)")->group(model);
  sub->add_flag("--tie-embeddings", d.tie_embeddings, "the LM head is the token embedding (one matrix)")->group(model);
  add_number(*sub, "--norm-epsilon", p.norm_epsilon, "RMSNorm epsilon")->group(model);
  add_number(*sub, "--validation-fraction", p.validation_fraction, "tail of the text held out")->group(model);
  add_stage_options(*sub, p, c.pretrain_text);
}

int pretrain(const CLI::App& sub, Commands& c, bool& running) {
  PretrainingConfig& p = c.pretrain;
  apply_stage_text(sub, c.pretrain_text, p);
  p.validate();
  p.check_device("pretrain");  // a build or machine without CUDA: before any file or output
  const TransformerDimensions& d = p.dimensions;
  const bool print = printing_rank();
  if (print) {
    std::cerr << "[pretrain] " << d.layers << " layers, width " << d.model_width << ", " << d.heads << " heads ("
              << d.kv_heads() << " key/value), context " << d.context_length << "; attention "
              << attention_kind_name(p.attention) << ", " << policy_text(p) << "; data "
              << (p.data.empty() ? "default corpus" : p.data.string()) << "; tokenizer "
              << (p.tokenizer.empty() ? std::string("bytes") : p.tokenizer.string()) << execution_text(p) << ranks_text(p)
              << " -> "
              << p.output_dir.string() << "\n";
  }
  running = true;
  const RunResult r = run_pretraining(
      p, progress_printer("pretrain", c.pretrain_text.quiet || !print, c.pretrain_text.stop_after), print_notice);
  if (print) print_result(r);
  return 0;
}

void add_post_train(CLI::App& app, Commands& c) {
  CLI::App* sub = app.add_subcommand(
      "post-train",
      "Fine-tunes a saved model on JSON Lines of {\"prompt\": ..., \"response\": ...} (loss on the response "
      "only), with LoRA adapters (default) or all weights.");
  rt_cli::style(*sub);
  PostTrainingConfig& p = c.post;
  p.output_dir = "runs/post-train";
  c.lora_targets = lora_targets_string(p.lora.targets);
  const std::string group = "Fine-tuning";
  sub->add_option("--base-model", c.base_model, "model-state file to start from (required)")
      ->type_name("PATH")
      ->group(group);
  sub->add_option("--method", c.method, "fine-tuning method")
      ->type_name("METHOD")
      ->check(CLI::IsMember({"lora", "full"}))
      ->group(group);
  add_number(*sub, "--lora-rank", p.lora.rank, "adapter rank")->check(rt_cli::integer_at_least(1))->group(group);
  add_number(*sub, "--lora-alpha", p.lora.alpha, "adapter scale numerator (scale = alpha/rank)")->group(group);
  sub->add_option("--lora-targets", c.lora_targets, "query,key,value,output,gate,up,down | attention | mlp | all")
      ->type_name("LIST")
      ->group(group);
  sub->add_flag("--allow-non-finite", p.allow_non_finite,
                "accept a base model holding NaN or infinite weights (refused by default)")
      ->group(group);
  add_stage_options(*sub, p, c.post_text);
}

int post_train(const CLI::App& sub, Commands& c, bool& running) {
  PostTrainingConfig& p = c.post;
  if (sub.count("--base-model") == 0) throw rt_cli::UsageError("--base-model PATH is required");
  if (sub.count("--data") == 0) {
    throw rt_cli::UsageError("--data FILE.jsonl is required (example: data/chat_example.jsonl)");
  }
  p.base_model = c.base_model;
  check_replayed_file("base-model", p.base_model, "base-model-fingerprint");
  p.fine_tuning_method = parse_fine_tuning_method(c.method, "--method");
  if (p.fine_tuning_method == FineTuningMethod::Lora) {
    p.lora.targets = parse_lora_targets(c.lora_targets, "--lora-targets");
  } else {
    // A replayed LoRA run's lora keys (--config) do not apply to --method full.
    const rt_cli::ConfigFileUse& use = rt_cli::config_file_use();
    for (const char* o : {"lora-rank", "lora-alpha", "lora-targets"}) {
      if (sub.count(std::string("--") + o) > 0 && !use.from_file(o)) {
        throw rt_cli::UsageError(std::string("--") + o + ": --lora-* options apply to --method lora only");
      }
    }
  }
  apply_stage_text(sub, c.post_text, p);
  p.check_device("post-train");  // a build or machine without CUDA: before any file or output
  // Settings against the base's dimensions (its header only) and its
  // recorded tokenizer before the run: a sequence longer than its context or
  // the wrong tokenizer is a usage error, not a failed run.
  (void)tokenizer_for_model(p.base_model, p.tokenizer, false);
  p.validate_for(read_model_dimensions(p.base_model));
  const bool print = printing_rank();
  if (print) {
    std::cerr << "[post-train] " << fine_tuning_method_name(p.fine_tuning_method) << " on " << p.base_model.string()
              << " with " << p.data.string() << "; " << policy_text(p) << execution_text(p) << ranks_text(p) << " -> "
              << p.output_dir.string() << "\n";
  }
  running = true;
  const RunResult r = run_post_training(
      p, progress_printer("post-train", c.post_text.quiet || !print, c.post_text.stop_after), print_notice);
  if (print) print_result(r);
  return 0;
}

struct TokenizerCommand {
  std::string data, output = "tokenizer.model", model_type = "bpe";
  double validation_fraction = 0.0;
  TokenizerTrainingOptions options;
};

void add_tokenizer(CLI::App& app, TokenizerCommand& c) {
  CLI::App* sub = app.add_subcommand(
      "tokenizer",
      "Trains a SentencePiece subword tokenizer (BPE or unigram; byte fallback, so every text round-trips) on "
      "UTF-8 text; --tokenizer on pretrain, post-train, rt-generate and rt-eval uses it. Deterministic: the same "
      "text and options give the same file.");
  rt_cli::style(*sub);
  sub->add_option("--data", c.data, "training text (default: the default corpus)")->type_name("PATH");
  add_number(*sub, "--vocab-size", c.options.vocab_size, "pieces, the 256 byte pieces and <unk> included")
      ->check(rt_cli::integer_at_least(260));
  sub->add_option("--model-type", c.model_type, "SentencePiece algorithm")
      ->type_name("TYPE")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  sub->add_option("--output", c.output, "model file to write (atomically)")->type_name("PATH");
  add_number(*sub, "--validation-fraction", c.validation_fraction,
             "train on the text before the tail a pretraining run with this fraction holds out (0: all)");
  rt_cli::add_config_option(*sub);
}

int train_tokenizer_command(const CLI::App& sub, TokenizerCommand& c, bool& running) {
  if (sub.count("--data") > 0 && c.data.empty()) {
    throw rt_cli::UsageError("option '--data' must name a file (leave it out for the default corpus)");
  }
  if (c.output.empty()) throw rt_cli::UsageError("option '--output' must name a file");
  if (!c.data.empty() && same_file(c.output, c.data)) {
    throw rt_cli::UsageError("option '--output' is the --data file " + c.data + ": it would replace the corpus");
  }
  if (Communicator::world().world_size() > 1) {
    throw rt_cli::UsageError("tokenizer training runs in one process: start it without mpirun");
  }
  c.options.model_type = parse_tokenizer_model_type(c.model_type, "--model-type");
  if (!(c.validation_fraction >= 0.0 && c.validation_fraction < 1.0)) {
    throw rt_cli::UsageError("option '--validation-fraction' must be in [0, 1)");
  }
  // train_tokenizer() refuses it too, but after `running` (exit 1).
  if (c.options.vocab_size > (1 << 20)) {
    throw rt_cli::UsageError("option '--vocab-size' must be in [260, 1048576], got " +
                             std::to_string(c.options.vocab_size));
  }
  const std::string all = c.data.empty() ? load_default_corpus() : load_text_file(c.data);
  const std::string text(split_text(all, Split::Train, c.validation_fraction));
  std::cerr << "[tokenizer] " << c.model_type << ", vocabulary " << c.options.vocab_size << ", on "
            << (c.data.empty() ? "the default corpus" : c.data) << " (" << text.size() << " bytes)\n";
  running = true;
  const Tokenizer t = train_tokenizer(text, c.options, c.output);
  const std::size_t tokens = t.encode(text).size();
  std::cout << "wrote " << c.output << ": " << t.vocab_size() << " pieces, checksum " << t.checksum() << "; "
            << tokens << " tokens for " << text.size() << " bytes (" << rt_cli::num(
                   std::round(100.0 * static_cast<double>(text.size()) / static_cast<double>(tokens)) / 100.0)
            << " bytes per token)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto known = [](const std::string& c) { return c == "pretrain" || c == "post-train" || c == "tokenizer"; };
  if (argc >= 2 && argv[1][0] != '-' && !known(argv[1])) {
    std::cerr << "rt-train: unknown command '" << argv[1] << "' (expected pretrain, post-train or tokenizer)\n"
              << "Try 'rt-train --help'.\n";
    return 2;
  }
  CLI::App app("Stage pipelines of riftco: pretrain a model, then post-train it (and train a subword tokenizer). "
               "'rt-train <command> --help' lists a command's options.",
               "rt-train");
  rt_cli::style(app);
  app.require_subcommand(1);
  auto commands = std::make_unique<Commands>();
  add_pretrain(app, *commands);
  add_post_train(app, *commands);
  auto tokenizer = std::make_unique<TokenizerCommand>();
  add_tokenizer(app, *tokenizer);
  return rt_cli::run_tool("rt-train", app, argc, argv, [&](bool& running) {
    const CLI::App* sub = app.get_subcommands().front();
    if (sub->get_name() == "pretrain") return pretrain(*sub, *commands, running);
    if (sub->get_name() == "tokenizer") return train_tokenizer_command(*sub, *tokenizer, running);
    return post_train(*sub, *commands, running);
  });
}
