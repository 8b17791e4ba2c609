// rt-train: the stage pipelines from the command line.
//   rt-train pretrain  [options]   train a model from scratch on text
//   rt-train post-train [options]  fine-tune a saved model on prompt/response pairs
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;

namespace {

bool g_running = false;  // errors before the run are usage errors (exit 2), during it failures (exit 1)

void add_stage_options(rt_cli::Parser& p, const StageSettings& d) {
  p.section("Execution policy");
  p.add("attention", "KIND", "materialized | flash", attention_kind_name(d.attention));
  p.add("activation-checkpointing", "POLICY", "disabled | block | segments",
        activation_checkpointing_name(d.activation_checkpointing));
  p.add("checkpoint-segment-blocks", "N|sqrt", "blocks per segment for 'segments'", "sqrt");
  p.add("dropout", "P", "residual dropout probability", rt_cli::num(d.dropout));
  p.section("Training");
  p.add("data", "PATH", "training data file");
  p.add("steps", "N", "optimizer steps", std::to_string(d.steps));
  p.add("batch", "N", "sequences per step", std::to_string(d.batch));
  p.add("sequence-length", "T", "tokens per sequence", std::to_string(d.sequence_length));
  p.add("learning-rate", "LR", "peak learning rate", rt_cli::num(d.learning_rate));
  p.add("warmup-steps", "N", "linear warmup steps", std::to_string(d.warmup_steps));
  p.add("min-learning-rate-ratio", "R", "cosine decay ends at lr*R", rt_cli::num(d.min_learning_rate_ratio));
  p.add("weight-decay", "W", "decoupled weight decay", rt_cli::num(d.weight_decay));
  p.add("max-grad-norm", "G", "global gradient-norm clip (0: off)", rt_cli::num(d.max_grad_norm));
  p.add("beta1", "B", "Adam beta1", rt_cli::num(d.beta1));
  p.add("beta2", "B", "Adam beta2", rt_cli::num(d.beta2));
  p.add("seed", "S", "seed for initialization, batches and dropout", std::to_string(d.seed));
  p.add("eval-interval", "N", "steps between validation losses (0: end only)", std::to_string(d.eval_interval));
  p.add("eval-batches", "N", "batches per validation loss", std::to_string(d.eval_batches));
  p.add("checkpoint-interval", "N", "steps between resumable training checkpoints (0: none)",
        std::to_string(d.checkpoint_interval));
  p.add("output", "DIR", "output directory", d.output_dir.string());
  p.add("resume", "", "continue from DIR/training_checkpoint.safetensors if present");
  p.add("quiet", "", "no progress line");
}

void read_stage_options(const rt_cli::Parser& p, StageSettings& s) {
  if (p.has("attention")) s.attention = parse_attention_kind(p.text("attention"), "--attention");
  if (p.has("activation-checkpointing")) {
    s.activation_checkpointing =
        parse_activation_checkpointing(p.text("activation-checkpointing"), "--activation-checkpointing");
  }
  if (p.text("checkpoint-segment-blocks") != "sqrt") {
    s.checkpoint_segment_blocks = p.integer("checkpoint-segment-blocks", s.checkpoint_segment_blocks);
  }
  s.dropout = static_cast<float>(p.number("dropout", s.dropout));
  if (p.has("data")) {
    s.data = p.text("data");
    if (s.data.empty()) throw rt_cli::UsageError("option '--data' must name a file (leave it out for the default)");
  }
  s.steps = p.integer("steps", s.steps);
  s.batch = p.integer("batch", s.batch);
  s.sequence_length = p.integer("sequence-length", s.sequence_length);
  s.learning_rate = static_cast<float>(p.number("learning-rate", s.learning_rate));
  s.warmup_steps = p.integer("warmup-steps", s.warmup_steps);
  s.min_learning_rate_ratio = static_cast<float>(p.number("min-learning-rate-ratio", s.min_learning_rate_ratio));
  s.weight_decay = static_cast<float>(p.number("weight-decay", s.weight_decay));
  s.max_grad_norm = static_cast<float>(p.number("max-grad-norm", s.max_grad_norm));
  s.beta1 = static_cast<float>(p.number("beta1", s.beta1));
  s.beta2 = static_cast<float>(p.number("beta2", s.beta2));
  const std::int64_t seed = p.integer("seed", static_cast<std::int64_t>(s.seed));
  if (seed < 0) throw rt_cli::UsageError("option '--seed' must be >= 0");
  s.seed = static_cast<std::uint64_t>(seed);
  s.eval_interval = p.integer("eval-interval", s.eval_interval);
  s.eval_batches = p.integer("eval-batches", s.eval_batches);
  s.checkpoint_interval = p.integer("checkpoint-interval", s.checkpoint_interval);
  if (p.has("output")) s.output_dir = p.text("output");
  s.resume = p.has("resume");
}

/// A live progress line on a terminal; periodic plain lines otherwise.
ProgressCallback progress_printer(const std::string& stage, bool quiet) {
  const bool tty = isatty(STDERR_FILENO) != 0;
  return [stage, quiet, tty](const StepReport& r) {
    if (quiet) return true;
    const std::int64_t every = std::max<std::int64_t>(1, r.total_steps / 20);
    const bool last = r.step == r.total_steps;
    if (!tty && !last && !r.validation_loss && r.step % every != 0) return true;
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
    return true;
  };
}

void print_result(const RunResult& r) {
  std::cout << "done: " << r.steps << " steps";
  if (r.resumed_from_step > 0) std::cout << " (resumed from step " << r.resumed_from_step << ")";
  std::cout << ", final train loss " << r.final_train_loss << ", validation loss " << r.final_validation_loss
            << ", " << static_cast<long long>(r.tokens_per_second) << " tok/s, peak " << rt_cli::mib(r.peak_bytes)
            << "\nwrote " << r.weights.string() << ", " << (r.output_dir / "metadata.json").string() << ", "
            << (r.output_dir / "metrics.jsonl").string() << ", " << (r.output_dir / "loss_curve.svg").string()
            << "\n";
}

int pretrain(int argc, char** argv) {
  PretrainingConfig c;
  c.output_dir = "runs/pretrain";
  rt_cli::Parser p("rt-train pretrain",
                   "Trains a decoder-only transformer from scratch on UTF-8 text (byte tokens). Without --data it "
                   "uses the default corpus, Debian's fortunes (/usr/share/games/fortunes).");
  p.section("Model");
  p.add("context-length", "T", "maximum sequence length", std::to_string(c.dimensions.context_length));
  p.add("model-width", "C", "residual width", std::to_string(c.dimensions.model_width));
  p.add("heads", "H", "attention heads", std::to_string(c.dimensions.heads));
  p.add("layers", "L", "transformer blocks", std::to_string(c.dimensions.layers));
  p.add("feed-forward-width", "F", "SwiGLU hidden width", std::to_string(c.dimensions.feed_forward_width));
  p.add("norm-epsilon", "E", "RMSNorm epsilon", "1e-05");
  p.add("validation-fraction", "F", "tail of the text held out", "0.1");
  add_stage_options(p, c);
  p.parse(argc, argv, 2);
  if (p.help()) {
    std::cout << p.usage("[options]");
    return 0;
  }
  TransformerDimensions& d = c.dimensions;
  d.context_length = p.integer("context-length", d.context_length);
  d.model_width = p.integer("model-width", d.model_width);
  d.heads = p.integer("heads", d.heads);
  d.layers = p.integer("layers", d.layers);
  d.feed_forward_width = p.integer("feed-forward-width", d.feed_forward_width);
  c.norm_epsilon = static_cast<float>(p.number("norm-epsilon", c.norm_epsilon));
  c.validation_fraction = p.number("validation-fraction", c.validation_fraction);
  read_stage_options(p, c);
  c.validate();
  std::cerr << "[pretrain] " << d.layers << " layers, width " << d.model_width << ", " << d.heads << " heads, context "
            << d.context_length << "; attention " << attention_kind_name(c.attention) << ", checkpointing "
            << activation_checkpointing_name(c.activation_checkpointing) << "; data "
            << (c.data.empty() ? "default corpus" : c.data.string()) << " -> " << c.output_dir.string() << "\n";
  g_running = true;
  print_result(run_pretraining(c, progress_printer("pretrain", p.has("quiet"))));
  return 0;
}

int post_train(int argc, char** argv) {
  PostTrainingConfig c;
  c.output_dir = "runs/post-train";
  c.sequence_length = 128;
  rt_cli::Parser p("rt-train post-train",
                   "Fine-tunes a saved model on JSON Lines of {\"prompt\": ..., \"response\": ...} (loss on the "
                   "response only), with LoRA adapters (default) or all weights.");
  p.section("Fine-tuning");
  p.add("base-model", "PATH", "model-state file to start from (required)");
  p.add("method", "lora|full", "fine-tuning method", "lora");
  p.add("lora-rank", "R", "adapter rank", std::to_string(c.lora.rank));
  p.add("lora-alpha", "A", "adapter scale numerator (scale = alpha/rank)", rt_cli::num(c.lora.alpha));
  p.add("lora-targets", "LIST", "query,key,value,output,gate,up,down | attention | mlp | all",
        lora_targets_string(c.lora.targets));
  p.add("allow-non-finite", "", "accept a base model holding NaN or infinite weights (refused by default)");
  add_stage_options(p, c);
  p.parse(argc, argv, 2);
  if (p.help()) {
    std::cout << p.usage("--base-model PATH --data FILE.jsonl [options]");
    return 0;
  }
  if (!p.has("base-model")) throw rt_cli::UsageError("--base-model PATH is required");
  if (!p.has("data")) throw rt_cli::UsageError("--data FILE.jsonl is required (example: data/chat_example.jsonl)");
  c.base_model = p.text("base-model");
  if (p.has("method")) c.fine_tuning_method = parse_fine_tuning_method(p.text("method"), "--method");
  if (c.fine_tuning_method == FineTuningMethod::Lora) {
    c.lora.rank = p.integer("lora-rank", c.lora.rank);
    c.lora.alpha = static_cast<float>(p.number("lora-alpha", c.lora.alpha));
    if (p.has("lora-targets")) c.lora.targets = parse_lora_targets(p.text("lora-targets"), "--lora-targets");
  } else if (p.has("lora-rank") || p.has("lora-alpha") || p.has("lora-targets")) {
    throw rt_cli::UsageError("--lora-* options apply to --method lora only");
  }
  c.allow_non_finite = p.has("allow-non-finite");
  read_stage_options(p, c);
  // Settings against the base's dimensions (its header only) before the run:
  // a sequence longer than its context is a usage error, not a failed run.
  c.validate_for(read_model_dimensions(c.base_model));
  std::cerr << "[post-train] " << fine_tuning_method_name(c.fine_tuning_method) << " on " << c.base_model.string()
            << " with " << c.data.string() << "; checkpointing "
            << activation_checkpointing_name(c.activation_checkpointing) << " -> " << c.output_dir.string() << "\n";
  g_running = true;
  print_result(run_post_training(c, progress_printer("post-train", p.has("quiet"))));
  return 0;
}

const char* kUsage =
    "usage: rt-train pretrain [options]\n"
    "       rt-train post-train --base-model PATH --data FILE.jsonl [options]\n"
    "\n"
    "Stage pipelines of riftco. 'rt-train pretrain --help' and 'rt-train post-train --help' list the options.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  try {
    if (command == "pretrain") return pretrain(argc, argv);
    if (command == "post-train") return post_train(argc, argv);
    throw rt_cli::UsageError("unknown command '" + command + "' (expected 'pretrain' or 'post-train')");
  } catch (const rt_cli::UsageError& e) {
    std::cerr << "rt-train: " << e.what() << "\nTry 'rt-train " << (command.rfind("-", 0) == 0 ? "" : command + " ")
              << "--help'.\n";
    return 2;
  } catch (const ValueError& e) {  // a bad option value (policy, attention, target names, ranges)
    if (g_running) {
      std::cerr << "\nrt-train: error: " << e.what() << "\n";
      return 1;
    }
    std::cerr << "rt-train: " << e.what() << "\nTry 'rt-train " << command << " --help'.\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "\nrt-train: error: out of memory (a smaller model, batch or sequence length needs less)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "\nrt-train: error: " << e.what() << "\n";
    return 1;
  }
}
