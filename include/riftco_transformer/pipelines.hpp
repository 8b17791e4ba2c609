#pragma once
// Stage pipelines: pretraining and post-training (LoRA or full fine-tuning).
// One C++ implementation shared by the command line, C and Python.
//
// A run writes to its output directory:
//   model.safetensors | adapter.safetensors   the trained weights
//   metadata.json        the whole configuration (including the activation-
//                        checkpointing policy), final losses, tokens/s, peak bytes
//   metrics.jsonl        one JSON row per logged step
//   loss_curve.svg       train and validation loss against step (a PNG:
//                        `python -m riftco.plot RUN_DIR`, matplotlib)
//   training_checkpoint.safetensors  model, Adam state, step and RNG states,
//                        written atomically every checkpoint_interval steps;
//                        `resume` continues from it bit for bit.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/lora.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/tokenizer.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer {

/// Settings every stage shares.
struct StageSettings {
  FullSequenceAttentionKind attention = FullSequenceAttentionKind::Flash;
  /// Execution policy, not architecture: recorded in metadata.json only.
  ActivationCheckpointingKind activation_checkpointing = ActivationCheckpointingKind::Disabled;
  std::int64_t checkpoint_segment_blocks = 0;  // BlockSegments: 0 = round(sqrt(layers))
  /// Bytes (> 0): every micro-batch's activation peak (measure_activation_peak)
  /// must fit; the run profiles the model and chooses what each block
  /// recomputes (plan_activation_memory, memory_plan.hpp) before the first
  /// step, and refuses a budget no plan fits, naming the smallest. Needs
  /// activation_checkpointing left Disabled. 0: no budget.
  std::int64_t activation_memory_budget = 0;
  /// Execution policy (metadata.json only): DecoderOnlyTransformer::
  /// set_activation_offload. It moves inputs on a cuda run (`device`) and
  /// changes nothing on the CPU (no bytes move, the same bits).
  bool activation_offload = false;
  /// Data parallelism (docs/distributed.md), execution policy like the
  /// above: the same bits either way, so resume may change them.
  /// ZeRO stage: 0 plain Adam on every rank; 1 Adam's moments sharded across
  /// the ranks (ShardedAdam: each rank holds ~1/N of the state; the
  /// parameters are bit-identical to plain data-parallel Adam). With one
  /// process, 1 is accepted and is plain Adam (as PyTorch's
  /// ZeroRedundancyOptimizer at world size 1).
  std::int64_t zero_stage = 0;
  /// Gradient bucket capacity in MiB (PyTorch DDP's bucket_cap_mb), in
  /// [1, 65536]; only used with more than one rank.
  std::int64_t gradient_bucket_mib = 25;
  /// Where the run trains (docs/distributed.md, "The pipelines on CUDA"):
  /// the model is built (or loaded) on the host, then moved here after the
  /// communicator is chosen; the optimizer state, gradient sums and buckets
  /// follow it. Execution policy like the above: a resume may change it
  /// (the saved parameters and moments are loaded onto this device; the
  /// numbers continue within float tolerance, not bit for bit, across
  /// devices). cuda needs a build with RIFTCO_CUDA and a visible device
  /// (check_device).
  Backend device = Backend::Cpu;
  /// Execution policy like the above (metadata.json; a resume may change
  /// it): each optimizer step runs Adam::backward_and_step, updating every
  /// parameter as soon as its gradient is final and freeing that gradient,
  /// so a step never holds every gradient at once (torchtune's
  /// optimizer_in_bwd). The weights are bit-identical to backward() then
  /// step(). Needs max_grad_norm 0 (clipping needs every gradient first;
  /// the stages default to 1.0), gradient_accumulation_steps 1 and one
  /// process (data parallelism all-reduces the gradients before the step):
  /// otherwise a ValueError naming the field, before anything is read or
  /// written. A non-finite gradient found after some parameters moved ends
  /// the run with PartialStepError (no final model; the last training
  /// checkpoint is kept).
  bool optimizer_in_backward = false;
  float dropout = 0.0F;

  std::filesystem::path data;  // empty: the stage's default data
  /// A SentencePiece model file (train_tokenizer, `rt-train tokenizer`);
  /// empty: the byte tokenizer. The model's vocabulary must match it.
  std::filesystem::path tokenizer;
  std::int64_t steps = 200;  // optimizer steps
  /// Rows per micro-batch (Hugging Face's per_device_train_batch_size): one
  /// forward/backward pass. Each optimizer step sums the gradients of
  /// gradient_accumulation_steps micro-batches, so the effective batch is
  /// batch × gradient_accumulation_steps rows.
  std::int64_t batch = 8;
  /// K micro-batches per optimizer step (1: no accumulation). The gradient
  /// equals that of one K×batch batch: micro-batch k's mean loss is weighted
  /// by its share of the real (non-ignored) targets. Checkpoints are written
  /// only between optimizer steps; resume refuses a different K.
  std::int64_t gradient_accumulation_steps = 1;
  std::int64_t sequence_length = 64;

  float learning_rate = 3.0e-3F;  // peak, after linear warmup
  std::int64_t warmup_steps = 20;
  float min_learning_rate_ratio = 0.1F;  // cosine decay ends at lr · ratio
  float weight_decay = 0.01F;  // decoupled; never applied to norm weights (see default_parameter_groups)
  /// Decay the token embedding and the LM head too (nanoGPT and Hugging
  /// Face do: true). false puts them in the "no_decay" group.
  bool decay_embeddings = true;
  float max_grad_norm = 1.0F;  // 0 disables clipping
  float beta1 = 0.9F;
  float beta2 = 0.95F;

  std::uint64_t seed = 1234;
  std::int64_t eval_interval = 50;  // steps between validation losses (0: only at the end)
  std::int64_t eval_batches = 4;
  std::int64_t checkpoint_interval = 100;  // steps between training checkpoints (0: none)
  std::filesystem::path output_dir = "runs/run";
  /// Continue from output_dir/training_checkpoint.safetensors when present.
  bool resume = false;

  /// BackendError naming `op` when `device` cannot train in this process
  /// (a build without the CUDA backend, or no CUDA device visible); the
  /// pipelines call it before anything is read or written.
  void check_device(const char* op) const;

  /// Learning rate at `step` (0-based): linear warmup to learning_rate, then
  /// cosine decay to learning_rate · min_learning_rate_ratio at the last step.
  float learning_rate_at(std::int64_t step) const;
};

/// Adam's parameter groups for a stage, from the parameters' names:
/// "decay" (weight_decay) and "no_decay" (0), in that order, each keeping
/// the given order. no_decay holds every RMSNorm weight (a name containing
/// "norm"), plus token_embedding.weight and lm_head.weight when
/// decay_embeddings is false. LoRA adapters are decayed like any weight.
std::vector<ParameterGroup> default_parameter_groups(const std::vector<NamedParameter>& parameters,
                                                     float weight_decay, bool decay_embeddings);

struct PretrainingConfig : StageSettings {
  /// vocab_size must match the tokenizer; left at 256 with a subword
  /// tokenizer, the run takes the tokenizer's vocabulary size.
  TransformerDimensions dimensions{256, 128, 128, 4, 4, 344};
  float norm_epsilon = 1.0e-5F;
  /// `data` empty: the default corpus (Debian's fortunes); otherwise a UTF-8 text file.
  double validation_fraction = 0.1;
  /// ValueError naming the field (the vocabulary against the byte tokenizer
  /// when no tokenizer is set; a tokenizer file is checked when the run loads it).
  void validate() const;
  /// dimensions with the vocabulary resolved against `tokenizer` (see
  /// dimensions); ValueError naming both sizes when they conflict.
  TransformerDimensions dimensions_for(const Tokenizer& tokenizer) const;
};

enum class FineTuningMethod : std::uint8_t { Lora = 0, Full = 1 };
const char* fine_tuning_method_name(FineTuningMethod method);  // "lora" / "full"
FineTuningMethod parse_fine_tuning_method(const std::string& name, const char* op = "fine_tuning_method");

struct PostTrainingConfig : StageSettings {
  std::filesystem::path base_model;  // a model-state file
  /// Load a base model holding NaN or infinite weights (refused by default).
  bool allow_non_finite = false;
  FineTuningMethod fine_tuning_method = FineTuningMethod::Lora;
  LoraConfig lora;
  /// `data`: JSON Lines of {"prompt": ..., "response": ...} (required).
  PostTrainingConfig() {
    learning_rate = 1.0e-3F;
    weight_decay = 0.0F;
  }
  void validate() const;
  /// validate(), then the settings against the base model's dimensions
  /// (sequence length within its context, LoRA rank).
  void validate_for(const TransformerDimensions& base) const;
};

/// What the pipeline reports after every step.
struct StepReport {
  std::int64_t step = 0;  // 1-based: steps completed
  std::int64_t total_steps = 0;
  float loss = 0.0F;  // mean over the step's K micro-batches' real targets
  std::optional<float> validation_loss;  // on evaluation steps
  float learning_rate = 0.0F;
  float grad_norm = 0.0F;
  double tokens_per_second = 0.0;  // over this run's steps so far, every micro-batch counted
  double elapsed_seconds = 0.0;
  double eta_seconds = 0.0;
  /// Allocator peak so far in this run: the bytes live when the step loop
  /// started plus the most this run's thread has had allocated above them
  /// (a ThreadMemoryMeter: other threads' work does not show, and the
  /// process's peak, memory_stats(), is never reset by a run).
  std::int64_t peak_bytes = 0;
  /// The largest activation peak of any micro-batch so far (forward +
  /// backward above the bytes live before the forward).
  std::int64_t activation_peak_bytes = 0;
};
/// Return false to stop the run after this step (as an interruption would:
/// no final files are written; a resume continues from the last checkpoint).
using ProgressCallback = std::function<bool(const StepReport&)>;
/// Messages a run has before its first step (the activation memory plan).
using NoticeCallback = std::function<void(const std::string&)>;

struct RunResult {
  bool completed = false;  // false when the callback stopped the run
  std::int64_t steps = 0;  // steps completed, including resumed ones
  std::int64_t resumed_from_step = 0;
  /// The step the output directory's training checkpoint holds when the run
  /// ends (0: none, or the run completed and removed it): a stopped run's
  /// resume continues from there.
  std::int64_t checkpoint_step = 0;
  float final_train_loss = 0.0F;
  float final_validation_loss = 0.0F;
  double tokens_per_second = 0.0;
  std::int64_t peak_bytes = 0;
  std::int64_t activation_peak_bytes = 0;  // the largest of any micro-batch of this run
  /// describe_activation_memory_plan's text when activation_memory_budget is set.
  std::string activation_memory_plan;
  std::filesystem::path output_dir;
  std::filesystem::path weights;  // model.safetensors or adapter.safetensors
};

/// The tokenizer to use with a model-state file. `given` non-empty: that
/// file, which must be the one the model records (ValueError naming both
/// checksums otherwise, or naming the byte tokenizer when the model records
/// none). `given` empty: the byte tokenizer when the model records none;
/// otherwise, with use_recorded, the recorded file (its path as recorded, or
/// its name beside the model) when its checksum still matches, and a
/// ValueError naming the recorded path and checksum when it is missing,
/// differs, or use_recorded is false. The vocabulary must be the model's.
Tokenizer tokenizer_for_model(const std::filesystem::path& model, const std::filesystem::path& given,
                              bool use_recorded = true);

/// The pipelines run data-parallel over `communicator`'s ranks
/// (docs/distributed.md); the overloads without one use
/// Communicator::world_for(config.device): the MPI job (cpu) or the NCCL
/// job (cuda) under mpirun, one process otherwise. A given communicator
/// must reduce the device's tensors (a BackendError otherwise, before any
/// file is touched).
/// Every rank calls the same function with the same config. `batch` stays
/// the global micro-batch: each rank trains on its contiguous batch /
/// world_size rows of every micro-batch (a ValueError before anything is
/// written when batch is not a multiple of world_size), gradients are
/// averaged before clipping and Adam, and losses are the global ones.
/// Callbacks are called on every rank with the same report (the memory
/// figures are that rank's); the run stops when any rank's progress returns
/// false. Rank 0 alone writes files; the other ranks' RunResult::weights is
/// empty. Parameters are compared across ranks (a checksum) at every
/// training checkpoint and at the end: a mismatch is a CommunicationError
/// on every rank. A failure of one rank during training ends the job
/// (Communicator::abort, the message on standard error); one while rank 0
/// prepares or completes the output directory is its error on rank 0 and a
/// CommunicationError naming rank 0 on the others. Resume needs the same
/// number of ranks (a ModelStateError naming both otherwise).
RunResult run_pretraining(const PretrainingConfig& config, Communicator& communicator,
                          const ProgressCallback& progress = {}, const NoticeCallback& notice = {});
RunResult run_post_training(const PostTrainingConfig& config, Communicator& communicator,
                            const ProgressCallback& progress = {}, const NoticeCallback& notice = {});
RunResult run_pretraining(const PretrainingConfig& config, const ProgressCallback& progress = {},
                          const NoticeCallback& notice = {});
RunResult run_post_training(const PostTrainingConfig& config, const ProgressCallback& progress = {},
                            const NoticeCallback& notice = {});

/// The fingerprint a run records in metadata.json for its data file and its
/// base model ("data_fingerprint", "base_model_fingerprint"): FNV-1a 64 of
/// the file's bytes, 16 hex digits. A resume, and rt-train replaying a
/// metadata.json, compare it with the file they are given. DataError naming
/// the file when it cannot be read.
std::string file_fingerprint(const std::filesystem::path& path);

}  // namespace riftco_transformer
