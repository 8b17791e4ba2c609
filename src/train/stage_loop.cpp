// The shared training loop. Deterministic: the data generator, the dropout
// generator and the evaluation batches all derive from the seed, and a
// training checkpoint stores every state the next step depends on. Under
// data parallelism (docs/distributed.md) each rank trains on its rows of
// every batch and rank 0 alone writes the output directory.
#include "stage_loop.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <unordered_map>

#include "memory_budget.hpp"
#include "rank_shards.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/memory_plan.hpp"
#include "riftco_transformer/model_state.hpp"
#include "run_directory.hpp"
#include "stage_optimizer.hpp"
#include "training_checkpoint.hpp"

namespace riftco_transformer::stage {
namespace {

constexpr std::uint64_t kEvalSeedOffset = 0x9E3779B97F4A7C15ULL;

/// metadata.json's record of an activation memory plan.
nlohmann::json plan_json(const ActivationMemoryProfile& profile, const ActivationMemoryPlan& plan) {
  nlohmann::json groups = nlohmann::json::array();
  for (const CheckpointGroup& g : plan.plan) {
    groups.push_back({{"blocks", g.blocks}, {"recompute", block_recompute_name(g.recompute)}});
  }
  nlohmann::json kept = nlohmann::json::object();
  for (const BlockRecompute option :
       {BlockRecompute::Nothing, BlockRecompute::Attention, BlockRecompute::Mlp, BlockRecompute::Whole}) {
    kept[block_recompute_name(option)] = profile.kept_bytes(option);
  }
  return {{"budget_bytes", plan.budget_bytes},
          {"summary", describe_plan(plan.plan)},
          {"groups", groups},
          {"predicted_peak_bytes", plan.predicted_peak_bytes},
          {"disabled_peak_bytes", plan.disabled_peak_bytes},
          {"smallest_feasible_bytes", plan.smallest_feasible_bytes},
          {"recompute_flops_per_step", plan.recompute_flops},
          {"forward_flops_per_step", profile.forward_flops},
          {"kept_bytes_per_block", kept},
          {"block_gradient_bytes", profile.block_gradient_bytes}};
}

float evaluate(StageRun& r) {
  const StageSettings& s = *r.settings;
  const DecoderOnlyTransformer::EvaluationGuard evaluating;  // no dropout, on this thread only
  NoGradGuard no_graph;
  Random eval_random(s.seed ^ kEvalSeedOffset);  // the same batches at every evaluation
  if (r.comm->world_size() > 1) {  // each rank its rows of every batch
    std::vector<TokenBatch> batches;
    for (std::int64_t i = 0; i < s.eval_batches; ++i) batches.push_back(r.sample(eval_random, Split::Validation));
    return data_parallel_loss(*r.comm, *r.model, batches);
  }
  // The mean over every real target of the batches (each batch's mean
  // weighted by its targets): a batch whose rows hold no target (prompts
  // longer than the sequence) adds nothing, instead of a loss of 0.
  double total = 0.0;
  std::int64_t targets = 0;
  for (std::int64_t i = 0; i < s.eval_batches; ++i) {
    const TokenBatch b = r.sample(eval_random, Split::Validation);
    const std::int64_t n = real_targets(b.targets);
    if (n == 0) continue;
    total += static_cast<double>(n) * r.model->loss(b.tokens, b.targets, b.batch).value().item();
    targets += n;
  }
  if (targets == 0) throw no_validation_targets(s.eval_batches);
  return static_cast<float>(total / static_cast<double>(targets));
}

/// `trainable` reordered as adam.parameters() (the groups' order).
std::vector<NamedParameter> in_adam_order(const std::vector<NamedParameter>& trainable, const StageOptimizer& adam) {
  std::unordered_map<const Node*, const NamedParameter*> by_node;
  for (const NamedParameter& p : trainable) by_node[p.variable.node()] = &p;
  std::vector<NamedParameter> ordered;
  for (const Variable& v : adam.parameters()) ordered.push_back(*by_node.at(v.node()));
  return ordered;
}

/// metadata.json's record of Adam's groups: each group's weight decay and
/// sizes; the names of the parameters that are not decayed.
nlohmann::json groups_json(const std::vector<NamedParameter>& ordered, const StageOptimizer& adam) {
  nlohmann::json groups = nlohmann::json::array();
  for (const Adam::GroupInfo& g : adam.groups()) {
    std::int64_t elements = 0;
    nlohmann::json names = nlohmann::json::array();
    for (std::size_t i = g.begin; i < g.end; ++i) {
      elements += ordered[i].variable.value().numel();
      if (g.weight_decay == 0.0F) names.push_back(ordered[i].name);
    }
    nlohmann::json row = {{"name", g.name},
                          {"weight_decay", json_number(g.weight_decay)},
                          {"parameters", g.end - g.begin},
                          {"elements", elements}};
    if (g.weight_decay == 0.0F) row["parameter_names"] = names;
    groups.push_back(row);
  }
  return groups;
}

}  // namespace

RunResult run(StageRun& r, const ProgressCallback& progress, const NoticeCallback& notice) {
  const StageSettings& s = *r.settings;
  DecoderOnlyTransformer& model = *r.model;
  Communicator& comm = *r.comm;
  const int world = comm.world_size();
  const int rank = comm.rank();
  const bool writer = rank == 0;  // rank 0 alone writes files
  const std::filesystem::path dir = s.output_dir;
  const std::filesystem::path checkpoint_path = dir / kTrainingCheckpointFile;
  const std::filesystem::path metrics_path = dir / "metrics.jsonl";
  const std::filesystem::path partial_path = dir / kPartialMetricsFile;
  const std::filesystem::path metadata_path = dir / "metadata.json";
  // Before anything else, and before any collective whose size depends on
  // the settings: ranks started with different settings or data would hang
  // or train wrongly (docs/distributed.md, "Every rank runs the same run").
  check_same_config(comm, agreed_config(r.config, r.stage, s.resume), r.stage);
  check_world(s, comm, r.stage.c_str());
  if (s.resume && !file_exists(checkpoint_path) && file_exists(metadata_path)) {
    throw ValueError("[resume] " + dir.string() +
                     " holds a completed run and no training checkpoint: nothing to resume (use a new output "
                     "directory, or drop resume to train it again)");
  }
  model.set_attention_kind(s.attention);
  model.set_activation_checkpointing_kind(s.activation_checkpointing);
  model.set_checkpoint_segment_blocks(s.checkpoint_segment_blocks);
  model.set_activation_offload(s.activation_offload);
  model.set_dropout(s.dropout, rank_dropout_seed(s.seed, rank));
  model.set_training(true);
  // The communicator was chosen for the device before this (the nccl one
  // selects the rank's device); the optimizer, the accumulator and the
  // buckets below follow the parameters.
  const Backend backend = s.device;
  model.to(backend);
  RunResult result;
  if (s.activation_memory_budget > 0) {  // planned before any file is touched: an infeasible budget changes nothing
    // Each rank's passes hold batch / world_size rows.
    const ActivationMemoryProfile profile = profile_activation_memory(model, s.batch / world, s.sequence_length);
    const ActivationMemoryPlan plan = plan_activation_memory(profile, s.activation_memory_budget);
    model.set_activation_checkpointing_plan(plan.plan);
    r.facts["activation_memory_plan"] = plan_json(profile, plan);
    result.activation_memory_plan = describe_activation_memory_plan(profile, plan);
    if (notice) notice(result.activation_memory_plan);
  }

  AdamOptions options;
  options.learning_rate = s.learning_rate;
  options.beta1 = s.beta1;
  options.beta2 = s.beta2;
  options.weight_decay = s.weight_decay;
  options.max_grad_norm = s.max_grad_norm;
  // ZeRO-1 under data parallelism: each rank holds its shard of the moments.
  const std::int64_t live_before_optimizer = memory_stats(backend).live_bytes;
  StageOptimizer adam(comm, default_parameter_groups(r.trainable, s.weight_decay, s.decay_embeddings), options,
                      s.zero_stage == 1);
  // Measured with the allocator: the moments are allocated here.
  r.facts["optimizer_state_bytes_per_rank"] = memory_stats(backend).live_bytes - live_before_optimizer;
  r.facts["zero_sharded"] = adam.sharded();
  r.facts["communicator"] = std::string(comm.kind());  // "single-process", "mpi" or "nccl"
  // Adam holds the groups' order; checkpoints pair moments with names in it.
  r.trainable = in_adam_order(r.trainable, adam);
  r.facts["parameter_groups"] = groups_json(r.trainable, adam);
  r.facts["effective_batch"] = s.batch * s.gradient_accumulation_steps;  // rows per optimizer step, all ranks
  GradientAccumulator accumulator(adam.parameters());
  const std::int64_t micro_batches = s.gradient_accumulation_steps;
  // Data parallelism reduces gradients in buckets (DDP's 25 MiB) during the
  // last micro-batch's backward (docs/distributed.md).
  std::optional<GradientBucketer> buckets;
  if (world > 1) {
    BucketOptions bucket_options;
    bucket_options.bucket_mib = static_cast<double>(s.gradient_bucket_mib);
    buckets.emplace(comm, adam.parameters(), bucket_options);
  }

  TrainingState state;
  Random data_random(s.seed);  // the same on every rank: every rank draws the whole global batch
  state.data_random = data_random.state();
  state.dropout_random = model.dropout_random().state();
  state.world_size = world;
  result.output_dir = dir;
  std::vector<nlohmann::json> rows;
  MetricsAppender metrics;
  // Setup: rank 0 prepares the directory; every rank reads the checkpoint.
  // A failure on one rank alone ends every rank (agree), never a wait.
  std::exception_ptr setup_error;
  std::optional<RunLock> lock;  // held until the final files are written
  try {
    if (writer) {
      make_directory(dir);
      lock.emplace(dir);  // before anything here changes
      check_output_targets(r);  // a final file that could not be replaced fails now, not after training
      write_file_atomically(dir / ".write_probe", "");  // an unwritable directory fails now, not after training
      remove_file(dir / ".write_probe");
      remove_stale_temporaries(dir, kRunFileNames);  // left by a process killed inside a save (ours only)
    }
    if (s.resume && file_exists(checkpoint_path)) {
      load_training_checkpoint(
          checkpoint_path, r.trainable, [&adam](const Adam::State& moments) { adam.set_state(moments); }, state,
          r.config, world, rank);
      data_random.set_state(state.data_random);
      model.dropout_random().set_state(state.dropout_random);
      result.resumed_from_step = state.step;
      result.checkpoint_step = state.step;
      // The in-progress log. Without one, metrics.jsonl: a directory written
      // by an older build kept the log there while in progress, and a kill
      // between completion's last two removals leaves it complete there.
      // Neither: the rows of the checkpoint's steps are gone (an Error
      // naming the in-progress log).
      if (writer) {
        rows = read_metrics(file_exists(partial_path) || !file_exists(metrics_path) ? partial_path : metrics_path,
                            state.step);
      }
    } else if (writer) {
      // A fresh start: an interrupted earlier run here is abandoned; a
      // completed one stays whole until this run completes.
      remove_file(checkpoint_path);
      remove_file(partial_path);
    }
    if (writer) {
      std::string kept;
      for (const nlohmann::json& row : rows) kept += row.dump() + '\n';
      write_file_atomically(partial_path, kept);
      metrics.open(partial_path);
    }
  } catch (...) {
    setup_error = std::current_exception();
  }
  agree(comm, setup_error, r.stage, "preparing the run (output directory or training checkpoint)");
  if (world > 1) {
    // Every rank must start from the same step and the same parameters (a
    // checkpoint only some ranks can see would otherwise drift silently).
    const std::vector<std::uint64_t> steps = gather_counts(comm, static_cast<std::uint64_t>(state.step));
    for (std::size_t q = 1; q < steps.size(); ++q) {
      if (steps[q] == steps[0]) continue;
      throw CommunicationError("[" + r.stage + "] rank 0 starts at step " + std::to_string(steps[0]) + ", rank " +
                               std::to_string(q) + " at step " + std::to_string(steps[q]) + ": every rank must see " +
                               checkpoint_path.string() +
                               " to resume (the output directory must be on a file system all ranks share)");
    }
    check_parameters_identical(comm, adam.parameters(), state.step, r.stage);
  }

  // The memory figures are the training device's allocator's, counted by
  // meters of this thread's allocations: another thread's work (another
  // model training in the same process) neither shows in them nor has its
  // own peak reset by them (reset_peak_memory is the process's).
  // run_peak: the bytes live at the start plus the run's own peak above them.
  // Each micro-batch's forward + backward is measured on its own (the
  // activation peak the budget bounds).
  const std::int64_t live_at_start = memory_stats(backend).live_bytes;
  const ThreadMemoryMeter run_meter(backend);
  ThreadMemoryMeter pass_meter(backend);
  std::int64_t activation_peak = 0;
  std::int64_t live_before_pass = 0;
  const auto run_peak = [&] { return live_at_start + run_meter.peak_bytes(); };
  const std::function<void()> start_pass = [&] {
    live_before_pass = pass_meter.live_bytes();
    pass_meter.reset_peak();
  };
  const std::function<void()> end_pass = [&] {
    activation_peak = std::max(activation_peak, pass_meter.peak_bytes() - live_before_pass);
  };
  const auto start = std::chrono::steady_clock::now();
  // The run's clock continues across a resume: the checkpoint's time, or
  // (a checkpoint from before it recorded one) the last kept row's.
  double elapsed_before = state.elapsed_seconds.value_or(0.0);
  if (!state.elapsed_seconds && !rows.empty() && rows.back().contains("elapsed_seconds") &&
      rows.back()["elapsed_seconds"].is_number() && std::isfinite(rows.back()["elapsed_seconds"].get<double>())) {
    elapsed_before = std::max(0.0, rows.back()["elapsed_seconds"].get<double>());
  }
  std::int64_t tokens_seen = 0;
  float last_loss = rows.empty() ? 0.0F : rows.back()["loss"].get<float>();
  float last_validation = 0.0F;
  // Under data parallelism an error that every rank raises alike (a
  // divergence seen through the all-reduced loss, a checksum mismatch) is
  // thrown on every rank; any other failure of one rank ends the job
  // (Communicator::abort) instead of leaving the others in a collective.
  bool raised_by_every_rank = false;
  std::int64_t step = state.step;
  // Which steps ran at which world size (a resume may change it).
  const nlohmann::json history_before = state.world_size_history;
  const std::int64_t first_step = state.step + 1;
  try {
    for (; step < s.steps; ++step) {
      adam.set_learning_rate(s.learning_rate_at(step));
      // The step's K micro-batches first: each one's weight is its share of
      // the real targets of all K (post-training masks prompts and padding).
      std::vector<TokenBatch> batches;
      std::vector<std::int64_t> counts;
      std::int64_t real_targets = 0;
      for (std::int64_t k = 0; k < micro_batches; ++k) {
        batches.push_back(r.sample(data_random, Split::Train));
        counts.push_back(stage::real_targets(batches.back().targets));
        real_targets += counts.back();
      }
      // A non-finite loss or gradient ends the run before the weights change.
      const std::function<Error(const std::string&)> diverged = [&](const std::string& what) {
        raised_by_every_rank = true;
        return Error("[" + r.stage + "] step " + std::to_string(step + 1) + ": " + what +
                     "; stopped before updating the weights (no final model is written; the last training "
                     "checkpoint, if any, is kept). Try a lower learning rate or gradient clipping.");
      };
      // optimizer_in_backward: a non-finite gradient found after some
      // parameters were updated.
      const std::function<PartialStepError(const std::string&)> partly_updated = [&](const std::string& what) {
        raised_by_every_rank = true;
        return PartialStepError("[" + r.stage + "] step " + std::to_string(step + 1) + ": " + what +
                                "; the weights were partly updated (optimizer_in_backward), so no final model is "
                                "written; the last training checkpoint, if any, is kept (resume from it). Try a "
                                "lower learning rate.");
      };
      float grad_norm = 0.0F;
      if (world > 1) {
        const ShardedStep done =
            data_parallel_step(comm, model, adam, accumulator, *buckets, batches, start_pass,
                               end_pass, diverged);
        last_loss = done.loss;
        grad_norm = done.grad_norm;
      } else if (micro_batches == 1) {
        const TokenBatch& batch = batches.front();
        start_pass();
        Variable loss = model.loss(batch.tokens, batch.targets, batch.batch);
        last_loss = loss.value().item();  // one float read back from the run's device
        if (!std::isfinite(last_loss)) throw diverged("the training loss is " + std::to_string(last_loss));
        if (!s.optimizer_in_backward) {
          loss.backward(GraphAfterBackward::Release);  // frees activations as it goes
          end_pass();
          loss = Variable();  // release the graph before the update
        }
        try {
          // optimizer_in_backward: each parameter is updated (and its
          // gradient freed) inside the pass; a non-finite gradient before
          // the first update changes nothing (ValueError), one after it is
          // a PartialStepError.
          grad_norm = s.optimizer_in_backward ? adam.backward_and_step(loss)
                                              : adam.step();  // refuses a non-finite gradient before any change
        } catch (const PartialStepError& e) {
          throw partly_updated(e.what());
        } catch (const ValueError& e) {
          throw diverged(e.what());
        }
        if (s.optimizer_in_backward) end_pass();
      } else {
        double loss_sum = 0.0;
        for (std::int64_t k = 0; k < micro_batches; ++k) {
          const auto ks = static_cast<std::size_t>(k);
          if (counts[ks] == 0 && real_targets > 0) continue;  // weight 0: nothing to add
          const TokenBatch& batch = batches[ks];
          start_pass();
          Variable loss = model.loss(batch.tokens, batch.targets, batch.batch);
          const float value = loss.value().item();
          if (!std::isfinite(value)) {
            throw diverged("the training loss of micro-batch " + std::to_string(k + 1) + " of " +
                           std::to_string(micro_batches) + " is " + float_text(value));
          }
          loss.backward(GraphAfterBackward::Release);
          end_pass();
          loss = Variable();
          const double weight = real_targets > 0
                                    ? static_cast<double>(counts[ks]) / static_cast<double>(real_targets)
                                    : 1.0 / static_cast<double>(micro_batches);
          accumulator.add(static_cast<float>(weight));
          adam.zero_grad();
          loss_sum += weight * static_cast<double>(value);
        }
        last_loss = static_cast<float>(loss_sum);
        try {
          grad_norm = adam.step(accumulator);  // clipping and the norm see the summed gradient
        } catch (const ValueError& e) {
          accumulator.clear();
          throw diverged(e.what());
        }
        accumulator.clear();
      }
      adam.zero_grad();
      for (const TokenBatch& batch : batches) tokens_seen += batch.batch * batch.seq_len;  // every rank's rows

      StepReport report;
      report.step = step + 1;
      report.total_steps = s.steps;
      report.loss = last_loss;
      report.learning_rate = s.learning_rate_at(step);
      report.grad_norm = grad_norm;
      // Rate and ETA from this process's steps; elapsed on the run's clock.
      const double here = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      report.elapsed_seconds = elapsed_before + here;
      report.tokens_per_second = here > 0 ? static_cast<double>(tokens_seen) / here : 0;
      const std::int64_t done_here = step + 1 - result.resumed_from_step;
      report.eta_seconds = here / static_cast<double>(done_here) * static_cast<double>(s.steps - step - 1);
      report.peak_bytes = run_peak();
      report.activation_peak_bytes = activation_peak;
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
                            {"peak_bytes", report.peak_bytes},
                            {"activation_peak_bytes", report.activation_peak_bytes}};
      if (report.validation_loss) row["validation_loss"] = *report.validation_loss;
      if (writer) metrics.append(row.dump());  // whole or not at all
      rows.push_back(std::move(row));
      if (s.checkpoint_interval > 0 && (step + 1) % s.checkpoint_interval == 0 && !last) {
        if (world > 1) {
          raised_by_every_rank = true;  // a mismatch is seen by every rank
          check_parameters_identical(comm, adam.parameters(), step + 1, r.stage);
          raised_by_every_rank = false;
        }
        state.step = step + 1;
        result.checkpoint_step = state.step;  // once saved below (a failed save ends the run)
        state.data_random = data_random.state();
        const std::vector<Random::State> dropout = gather_random_states(comm, model.dropout_random().state());
        state.dropout_random = dropout.front();
        state.other_ranks_dropout_random.assign(dropout.begin() + 1, dropout.end());
        state.world_size = world;
        state.elapsed_seconds = report.elapsed_seconds;
        state.world_size_history = extend_world_size_history(history_before, world, first_step, step + 1);
        // ZeRO-1 gathers the full moments: collective, every rank takes part.
        // Plain Adam's copy is only needed where it is written.
        if (writer || adam.sharded()) {
          const Adam::State moments = adam.state();
          if (writer) save_training_checkpoint(checkpoint_path, r.trainable, moments, state, r.config);
        }
      }
      result.steps = step + 1;
      result.final_train_loss = last_loss;
      result.tokens_per_second = report.tokens_per_second;
      result.peak_bytes = report.peak_bytes;
      result.activation_peak_bytes = report.activation_peak_bytes;
      bool go_on = !progress || progress(report);
      if (world > 1) {  // every rank stops when any callback asks to
        float stop = go_on ? 0.0F : 1.0F;
        comm.all_reduce_sum(std::span<float>(&stop, 1));
        go_on = stop == 0.0F;
      }
      if (!go_on) return result;  // interrupted: no final files
    }
    if (world > 1) {
      raised_by_every_rank = true;
      check_parameters_identical(comm, adam.parameters(), s.steps, r.stage);
    }
  } catch (...) {
    if (world > 1 && !raised_by_every_rank) {
      std::string what = "an exception of a non-standard type";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      comm.abort("[" + r.stage + "] step " + std::to_string(step + 1) + " failed on rank " + std::to_string(rank) +
                 " of " + std::to_string(world) + ": " + what + "; ending every rank");
    }
    throw;
  }
  metrics.close();
  result.steps = s.steps;
  result.completed = true;
  result.checkpoint_step = 0;  // the final files replace it
  result.final_validation_loss = last_validation;
  std::exception_ptr final_error;
  if (writer) {
    try {
      result.weights = write_final_files(r, result, rows, comm.world_size(),
                                         extend_world_size_history(history_before, world, first_step, s.steps));
    } catch (...) {
      final_error = std::current_exception();
    }
  }
  agree(comm, final_error, r.stage, "writing the final files");
  return result;
}

}  // namespace riftco_transformer::stage
