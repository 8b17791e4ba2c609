// The shared training loop. Deterministic: the data generator, the dropout
// generator and the evaluation batches all derive from the seed, and a
// training checkpoint stores every state the next step depends on.
#include "stage_loop.hpp"

#include <chrono>
#include <fstream>
#include <limits>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/plot.hpp"
#include "training_checkpoint.hpp"

namespace riftco_transformer::stage {
namespace {

constexpr std::uint64_t kEvalSeedOffset = 0x9E3779B97F4A7C15ULL;

float evaluate(StageRun& r) {
  const StageSettings& s = *r.settings;
  const bool was_training = r.model->training();
  r.model->set_training(false);
  NoGradGuard no_graph;
  Random eval_random(s.seed ^ kEvalSeedOffset);  // the same batches at every evaluation
  double total = 0.0;
  for (std::int64_t i = 0; i < s.eval_batches; ++i) {
    const TokenBatch b = r.sample(eval_random, Split::Validation);
    total += r.model->loss(b.tokens, b.targets, b.batch).value().item();
  }
  r.model->set_training(was_training);
  return static_cast<float>(total / static_cast<double>(s.eval_batches));
}

/// metrics.jsonl rows with step <= `keep` (a resumed run continues the log).
std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path, std::int64_t keep) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.contains("step")) continue;
    if (row["loss"].is_null()) row["loss"] = std::numeric_limits<double>::quiet_NaN();  // NaN is written as null
    if (row["step"].get<std::int64_t>() <= keep) rows.push_back(std::move(row));
  }
  return rows;
}

void write_plots(const std::filesystem::path& dir, const std::vector<nlohmann::json>& rows, const std::string& title) {
  CurveSeries train{"train loss", {}, 0x1F77B4};
  CurveSeries validation{"validation loss", {}, 0xD62728};
  for (const nlohmann::json& row : rows) {
    const auto step = static_cast<double>(row["step"].get<std::int64_t>());
    const auto number = [](const nlohmann::json& v) {
      return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
    };
    train.points.emplace_back(step, number(row["loss"]));
    if (row.contains("validation_loss")) validation.points.emplace_back(step, number(row["validation_loss"]));
  }
  std::vector<CurveSeries> series{train};
  if (!validation.points.empty()) series.push_back(validation);
  write_loss_curve_png(dir / "loss_curve.png", series, title);
  write_loss_curve_svg(dir / "loss_curve.svg", series, title);
}

}  // namespace

RunResult run(StageRun& r, const ProgressCallback& progress) {
  const StageSettings& s = *r.settings;
  DecoderOnlyTransformer& model = *r.model;
  const std::filesystem::path dir = s.output_dir;
  const std::filesystem::path checkpoint_path = dir / kTrainingCheckpointFile;
  const std::filesystem::path metrics_path = dir / "metrics.jsonl";
  if (s.resume && !std::filesystem::exists(checkpoint_path) && std::filesystem::exists(dir / "metadata.json")) {
    throw ValueError("[resume] " + dir.string() +
                     " holds a completed run and no training checkpoint: nothing to resume (use a new output "
                     "directory, or drop resume to train it again)");
  }
  std::filesystem::create_directories(dir);
  write_file_atomically(dir / ".write_probe", "");  // an unwritable directory fails now, not after training
  std::filesystem::remove(dir / ".write_probe");

  model.set_attention_kind(s.attention);
  model.set_activation_checkpointing_kind(s.activation_checkpointing);
  model.set_checkpoint_segment_blocks(s.checkpoint_segment_blocks);
  model.set_dropout(s.dropout, s.seed + 1);
  model.set_training(true);

  std::vector<Variable> params;
  for (const NamedParameter& p : r.trainable) params.push_back(p.variable);
  AdamOptions options;
  options.learning_rate = s.learning_rate;
  options.beta1 = s.beta1;
  options.beta2 = s.beta2;
  options.weight_decay = s.weight_decay;
  options.max_grad_norm = s.max_grad_norm;
  Adam adam(params, options);

  TrainingState state;
  Random data_random(s.seed);
  state.data_random = data_random.state();
  state.dropout_random = model.dropout_random().state();
  RunResult result;
  result.output_dir = dir;
  if (s.resume && std::filesystem::exists(checkpoint_path)) {
    load_training_checkpoint(checkpoint_path, r.trainable, adam, state, r.config);
    data_random.set_state(state.data_random);
    model.dropout_random().set_state(state.dropout_random);
    result.resumed_from_step = state.step;
  }
  std::vector<nlohmann::json> rows = read_metrics(metrics_path, state.step);
  {
    std::ofstream out(metrics_path, std::ios::trunc);
    for (const nlohmann::json& row : rows) out << row.dump() << '\n';
  }
  std::ofstream metrics(metrics_path, std::ios::app);
  if (!metrics) throw Error("[pipeline] cannot write " + metrics_path.string());

  reset_peak_memory();
  const auto start = std::chrono::steady_clock::now();
  std::int64_t tokens_seen = 0;
  float last_loss = rows.empty() ? 0.0F : rows.back()["loss"].get<float>();
  float last_validation = 0.0F;
  for (std::int64_t step = state.step; step < s.steps; ++step) {
    adam.set_learning_rate(s.learning_rate_at(step));
    const TokenBatch batch = r.sample(data_random, Split::Train);
    Variable loss = model.loss(batch.tokens, batch.targets, batch.batch);
    last_loss = loss.value().item();
    loss.backward();
    loss = Variable();  // release the graph before the update
    const float grad_norm = adam.step();
    adam.zero_grad();
    tokens_seen += batch.batch * batch.seq_len;

    StepReport report;
    report.step = step + 1;
    report.total_steps = s.steps;
    report.loss = last_loss;
    report.learning_rate = s.learning_rate_at(step);
    report.grad_norm = grad_norm;
    report.elapsed_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.tokens_per_second = report.elapsed_seconds > 0 ? static_cast<double>(tokens_seen) / report.elapsed_seconds : 0;
    const std::int64_t done_here = step + 1 - result.resumed_from_step;
    report.eta_seconds = report.elapsed_seconds / static_cast<double>(done_here) * static_cast<double>(s.steps - step - 1);
    report.peak_bytes = memory_stats().peak_bytes;
    const bool last = step + 1 == s.steps;
    if ((s.eval_interval > 0 && (step + 1) % s.eval_interval == 0) || last) {
      last_validation = evaluate(r);
      report.validation_loss = last_validation;
    }
    nlohmann::json row = {{"step", report.step},
                          {"loss", report.loss},
                          {"learning_rate", report.learning_rate},
                          {"grad_norm", report.grad_norm},
                          {"tokens_per_second", report.tokens_per_second},
                          {"elapsed_seconds", report.elapsed_seconds},
                          {"peak_bytes", report.peak_bytes}};
    if (report.validation_loss) row["validation_loss"] = *report.validation_loss;
    metrics << row.dump() << '\n' << std::flush;
    if (!metrics) throw Error("[pipeline] cannot write " + metrics_path.string());
    rows.push_back(std::move(row));
    if (s.checkpoint_interval > 0 && (step + 1) % s.checkpoint_interval == 0 && !last) {
      state.step = step + 1;
      state.data_random = data_random.state();
      state.dropout_random = model.dropout_random().state();
      save_training_checkpoint(checkpoint_path, r.trainable, adam, state, r.config);
    }
    result.steps = step + 1;
    result.final_train_loss = last_loss;
    result.tokens_per_second = report.tokens_per_second;
    result.peak_bytes = report.peak_bytes;
    if (progress && !progress(report)) return result;  // interrupted: no final files
  }
  result.steps = s.steps;
  result.completed = true;
  result.final_validation_loss = last_validation;
  result.weights = r.save_weights(dir);
  nlohmann::json metadata = {
      {"stage", r.stage},
      {"config", r.config},
      {"results",
       {{"steps", result.steps},
        {"resumed_from_step", result.resumed_from_step},
        {"final_train_loss", result.final_train_loss},
        {"final_validation_loss", result.final_validation_loss},
        {"tokens_per_second", result.tokens_per_second},
        {"peak_memory_bytes", result.peak_bytes}}},
      {"facts", r.facts},
      {"files",
       {{"weights", result.weights.filename().string()},
        {"metrics", "metrics.jsonl"},
        {"loss_curve", "loss_curve.png"}}}};
  write_file_atomically(dir / "metadata.json", metadata.dump(2) + "\n");
  write_plots(dir, rows, r.stage + " loss");
  std::filesystem::remove(checkpoint_path);  // the run is complete
  return result;
}

}  // namespace riftco_transformer::stage
