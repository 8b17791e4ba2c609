// run_pretraining: a fresh model on a text corpus.
#include <cmath>

#include "memory_budget.hpp"
#include "riftco_transformer/model_state.hpp"
#include "rank_shards.hpp"
#include "stage_loop.hpp"

namespace riftco_transformer {

void PretrainingConfig::validate() const {
  dimensions.validate();
  if (tokenizer.empty() && dimensions.vocab_size != ByteTokenizer::kVocabSize) {
    throw ValueError("[PretrainingConfig] vocab_size must match the tokenizer: the byte tokenizer has 256, got " +
                     std::to_string(dimensions.vocab_size) + " (set tokenizer to train with a subword vocabulary)");
  }
  if (!is_valid_norm_epsilon(norm_epsilon)) {
    throw ValueError("[PretrainingConfig] norm_epsilon must be a finite number > 0, got " + float_text(norm_epsilon));
  }
  if (!(validation_fraction > 0.0 && validation_fraction < 1.0)) {
    throw ValueError("[PretrainingConfig] validation_fraction must be in (0, 1)");
  }
  stage::validate_settings(*this, dimensions.context_length, "PretrainingConfig");
  stage::check_paths_are_text({{"output_dir", output_dir}, {"data", data}, {"tokenizer", tokenizer}},
                              "PretrainingConfig");
  stage::check_inputs_are_not_outputs(output_dir, {{"data", data}, {"tokenizer", tokenizer}}, "PretrainingConfig");
}

TransformerDimensions PretrainingConfig::dimensions_for(const Tokenizer& t) const {
  TransformerDimensions d = dimensions;
  if (t.is_bytes() || d.vocab_size == t.vocab_size()) return d;
  if (d.vocab_size != ByteTokenizer::kVocabSize) {
    throw ValueError("[PretrainingConfig] vocab_size must match the tokenizer: " + t.description() + " has " +
                     std::to_string(t.vocab_size()) + ", got " + std::to_string(d.vocab_size) +
                     " (leave it at 256 to take the tokenizer's)");
  }
  d.vocab_size = t.vocab_size();
  d.validate();
  return d;
}

RunResult run_pretraining(const PretrainingConfig& config, const ProgressCallback& progress,
                          const NoticeCallback& notice) {
  config.check_device("pretraining");  // before the communicator: world_for(cuda) may start NCCL
  return run_pretraining(config, Communicator::world_for(config.device), progress, notice);
}

RunResult run_pretraining(const PretrainingConfig& config, Communicator& communicator,
                          const ProgressCallback& progress, const NoticeCallback& notice) {
  config.validate();
  config.check_device("pretraining");
  stage::check_world(config, communicator, "pretraining");
  // Everything that can fail on bad input happens before the output
  // directory is touched, a run too large for this machine included.
  const Tokenizer tokenizer = config.tokenizer.empty() ? Tokenizer{} : Tokenizer::load(config.tokenizer);
  const TransformerDimensions dims = config.dimensions_for(tokenizer);
  stage::check_memory_budget(stage::estimate_training_memory(dims, dims.parameter_count(), 0, config),
                             "pretraining");
  const std::string text = config.data.empty() ? load_default_corpus() : load_text_file(config.data);
  const TextDataset dataset(text, tokenizer, config.validation_fraction);
  for (const Split split : {Split::Train, Split::Validation}) {
    if (static_cast<std::int64_t>(dataset.tokens(split).size()) < config.sequence_length + 1) {
      throw DataError("[data] " + (config.data.empty() ? std::string("default corpus") : config.data.string()) +
                      ": the " + (split == Split::Train ? "train" : "validation") + " split has " +
                      std::to_string(dataset.tokens(split).size()) + " tokens, fewer than sequence_length + 1 = " +
                      std::to_string(config.sequence_length + 1));
    }
  }
  Random init(config.seed);
  DecoderOnlyTransformer model(dims, init, config.norm_epsilon, config.attention,
                               config.activation_checkpointing);

  stage::StageRun run;
  run.stage = "pretraining";
  run.settings = &config;
  run.model = &model;
  run.trainable = model.parameters();
  run.sample = [&](Random& random, Split split) {
    return dataset.sample_batch(random, config.batch, config.sequence_length, split);
  };
  run.config = stage::settings_json(config);
  run.config["data"] = config.data.empty() ? "default corpus (" + default_corpus_dir().string() + ")"
                                           : config.data.string();
  run.config["validation_fraction"] = config.validation_fraction;
  run.config["data_fingerprint"] = stage::fingerprint(text);  // resume refuses changed data
  run.config["tokenizer_checksum"] = tokenizer.checksum();  // resume refuses another tokenizer
  run.config["norm_epsilon"] = stage::json_number(config.norm_epsilon);
  const TransformerDimensions& d = dims;
  run.config["dimensions"] = {{"vocab_size", d.vocab_size},   {"context_length", d.context_length},
                              {"model_width", d.model_width}, {"heads", d.heads},
                              {"layers", d.layers},           {"feed_forward_width", d.feed_forward_width}};
  // Written only when not the defaults (runs of ordinary models keep their config and resume).
  if (d.kv_heads() != d.heads) run.config["dimensions"]["key_value_heads"] = d.kv_heads();
  if (d.rope_base != TransformerDimensions{}.rope_base) run.config["dimensions"]["rope_base"] = d.rope_base;
  if (d.tie_embeddings) run.config["dimensions"]["tie_embeddings"] = true;
  run.facts = {{"parameters", model.parameter_count()},
               {"train_tokens", dataset.train_tokens()},
               {"validation_tokens", dataset.validation_tokens()},
               {"tokenizer", tokenizer.description()}};
  const TokenizerRecord record{tokenizer.path().string(), tokenizer.checksum()};
  run.weights_file = "model.safetensors";
  run.save_weights = [&model, record](const std::filesystem::path& path) { save_model_state(model, path, record); };
  run.comm = &communicator;
  return stage::run(run, progress, notice);
}

}  // namespace riftco_transformer
