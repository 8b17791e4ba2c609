// run_post_training: LoRA or full fine-tuning of a saved model on chat data.
#include <algorithm>
#include <limits>

#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/model_state.hpp"
#include "memory_budget.hpp"
#include "rank_shards.hpp"
#include "stage_loop.hpp"

namespace riftco_transformer {

namespace {

/// A split where no example has a response token within sequence_length
/// would train (or validate) on nothing: loss 0, reported as a success.
void check_some_loss(const ChatDataset& dataset, Split split, std::int64_t sequence_length,
                     const std::filesystem::path& data) {
  const std::vector<ChatExample>& examples = dataset.examples(split);
  if (examples.empty()) return;
  std::int64_t shortest = std::numeric_limits<std::int64_t>::max();
  for (const ChatExample& ex : examples) {
    const std::size_t n = std::min(ex.targets.size(), static_cast<std::size_t>(sequence_length));
    if (std::any_of(ex.targets.begin(), ex.targets.begin() + static_cast<std::ptrdiff_t>(n),
                    [](std::int32_t t) { return t != kIgnoreTarget; })) {
      return;
    }
    shortest = std::min(shortest, ex.prompt_tokens);
  }
  throw DataError("[data] " + data.string() + ": no " + (split == Split::Train ? "train" : "validation") +
                  " example has a response token within sequence_length " + std::to_string(sequence_length) +
                  " (the shortest prompt is " + std::to_string(shortest) +
                  " tokens): the loss would be 0; raise sequence_length or shorten the prompts");
}

}  // namespace

const char* fine_tuning_method_name(FineTuningMethod method) {
  return method == FineTuningMethod::Full ? "full" : "lora";
}

FineTuningMethod parse_fine_tuning_method(const std::string& name, const char* op) {
  if (name == "lora") return FineTuningMethod::Lora;
  if (name == "full") return FineTuningMethod::Full;
  throw ValueError(std::string("[") + op + "] unknown fine-tuning method '" + name + "' (expected 'lora' or 'full')");
}

void PostTrainingConfig::validate() const {
  if (base_model.empty()) throw ValueError("[PostTrainingConfig] base_model must name a model-state file");
  if (data.empty()) throw ValueError("[PostTrainingConfig] data must name a JSON Lines file of prompt/response pairs");
  if (fine_tuning_method != FineTuningMethod::Lora && fine_tuning_method != FineTuningMethod::Full) {
    throw ValueError("[PostTrainingConfig] unknown fine-tuning method " +
                     std::to_string(static_cast<int>(fine_tuning_method)));
  }
  if (fine_tuning_method == FineTuningMethod::Lora) lora.validate();
  // The run writes model.safetensors (or adapter.safetensors), metadata.json
  // and its logs into output_dir: never over the base model or its run.
  const std::filesystem::path base_dir = base_model.has_parent_path() ? base_model.parent_path() : ".";
  if (same_file(output_dir, base_dir) || same_file(output_dir, base_model) ||
      same_file(output_dir / "model.safetensors", base_model)) {
    throw ValueError("[PostTrainingConfig] output_dir " + output_dir.string() + " holds the base model " +
                     base_model.string() + ": the run would replace it and its metadata; choose another output_dir");
  }
  stage::check_paths_are_text(
      {{"output_dir", output_dir}, {"base_model", base_model}, {"data", data}, {"tokenizer", tokenizer}},
      "PostTrainingConfig");
  stage::check_inputs_are_not_outputs(output_dir, {{"base_model", base_model}, {"data", data}, {"tokenizer", tokenizer}},
                                      "PostTrainingConfig");
}

void PostTrainingConfig::validate_for(const TransformerDimensions& base) const {
  validate();
  stage::validate_settings(*this, base.context_length, "PostTrainingConfig");
  if (tokenizer.empty() && base.vocab_size != ByteTokenizer::kVocabSize) {
    throw ValueError("[PostTrainingConfig] the base model's vocabulary is " + std::to_string(base.vocab_size) +
                     "; it must match the tokenizer, and the byte tokenizer has 256 (set tokenizer to the base "
                     "model's)");
  }
  if (fine_tuning_method == FineTuningMethod::Lora) lora.validate_for(base, "PostTrainingConfig");
}

RunResult run_post_training(const PostTrainingConfig& config, const ProgressCallback& progress,
                            const NoticeCallback& notice) {
  config.check_device("post_training");  // before the communicator: world_for(cuda) may start NCCL
  return run_post_training(config, Communicator::world_for(config.device), progress, notice);
}

RunResult run_post_training(const PostTrainingConfig& config, Communicator& communicator,
                            const ProgressCallback& progress, const NoticeCallback& notice) {
  config.validate();
  config.check_device("post_training");
  stage::check_world(config, communicator, "post_training");
  // The base model's recorded tokenizer must be the one given (or none).
  const Tokenizer tokenizer = tokenizer_for_model(config.base_model, config.tokenizer, false);
  const ChatDataset dataset = ChatDataset::load(config.data, tokenizer);
  if (dataset.size(Split::Validation) == 0) {
    throw DataError("[data] " + config.data.string() + ": " + std::to_string(dataset.size(Split::Train)) +
                    " examples; at least 10 are needed so that every 10th can be held out for validation");
  }
  // From the base's header alone (no weights read yet): the settings against
  // its dimensions, and whether the run fits this machine.
  const TransformerDimensions dims = read_model_dimensions(config.base_model);
  config.validate_for(dims);
  check_some_loss(dataset, Split::Train, config.sequence_length, config.data);
  check_some_loss(dataset, Split::Validation, config.sequence_length, config.data);
  const bool lora = config.fine_tuning_method == FineTuningMethod::Lora;
  const std::int64_t adapter_parameters = lora ? config.lora.parameter_count(dims) : 0;
  stage::check_memory_budget(
      stage::estimate_training_memory(dims, lora ? adapter_parameters : dims.parameter_count(), adapter_parameters,
                                      config),
      "post_training");
  LoadOptions load;
  load.allow_non_finite = config.allow_non_finite;
  std::unique_ptr<DecoderOnlyTransformer> model =
      load_model(config.base_model, config.attention, config.activation_checkpointing, load);

  stage::StageRun run;
  run.stage = "post_training";
  run.settings = &config;
  run.model = model.get();
  if (lora) {
    Random adapter_init(config.seed);
    model->add_lora(config.lora, adapter_init);
    model->set_base_trainable(false);
    run.trainable = model->lora_parameters();
  } else {
    run.trainable = model->parameters();
  }
  run.sample = [&](Random& random, Split split) {
    return dataset.sample_batch(random, config.batch, config.sequence_length, split);
  };
  run.config = stage::settings_json(config);
  run.config["base_model"] = config.base_model.string();
  run.config["base_model_fingerprint"] = stage::fingerprint(stage::read_bytes(config.base_model));
  run.config["tokenizer_checksum"] = tokenizer.checksum();
  run.config["allow_non_finite"] = config.allow_non_finite;
  run.config["data_fingerprint"] = stage::fingerprint(stage::read_bytes(config.data));
  run.config["fine_tuning_method"] = fine_tuning_method_name(config.fine_tuning_method);
  if (lora) {
    run.config["lora"] = {{"rank", config.lora.rank},
                          {"alpha", stage::json_number(config.lora.alpha)},
                          {"targets", lora_targets_string(config.lora.targets)}};
  }
  std::int64_t trainable = 0;
  for (const NamedParameter& p : run.trainable) trainable += p.variable.value().numel();
  run.facts = {{"base_parameters", model->parameter_count()},
               {"trainable_parameters", trainable},
               {"train_examples", dataset.size(Split::Train)},
               {"validation_examples", dataset.size(Split::Validation)},
               {"tokenizer", tokenizer.description()}};
  DecoderOnlyTransformer* m = model.get();
  const TokenizerRecord record{tokenizer.path().string(), tokenizer.checksum()};
  run.weights_file = lora ? "adapter.safetensors" : "model.safetensors";
  run.save_weights = [m, lora, record](const std::filesystem::path& path) {
    if (lora) {
      save_adapter_state(*m, path);
    } else {
      save_model_state(*m, path, record);
    }
  };

  run.comm = &communicator;
  return stage::run(run, progress, notice);
}

}  // namespace riftco_transformer
