// Stage pipelines (pipelines.hpp): configs, progress reports, results, and
// run_pretraining / run_post_training with a Python progress callback.
// The run releases the GIL; the callback takes it, first checks for a
// pending signal (Ctrl-C): a KeyboardInterrupt, or any exception the
// callback raises, stops the run after the current step (as a False return
// does: no final files, resumable) and is raised once the run has stopped.
#include <optional>

#include "common.hpp"
#include "config_fields.hpp"
#include "riftco_transformer/memory_plan.hpp"
#include "riftco_transformer/pipelines.hpp"

namespace riftco_python {
namespace {

using rt::StageSettings;

template <class C>
ConfigClass<C>& stage_fields(ConfigClass<C>& c) {
  return c
      .choice("attention", &StageSettings::attention, &rt::parse_attention_kind, &rt::attention_kind_name,
              "'flash' | 'materialized'")
      .choice("activation_checkpointing", &StageSettings::activation_checkpointing, &rt::parse_activation_checkpointing,
              &rt::activation_checkpointing_name, "'disabled' | 'block' | 'segments' | 'attention' | 'mlp' (recorded in metadata.json)")
      .field("checkpoint_segment_blocks", &StageSettings::checkpoint_segment_blocks, "int",
             "'segments': blocks per segment (0: round(sqrt(layers)))")
      .custom(
          "activation_memory_budget", "int | str",
          [](const C& c) { return nb::cast(c.activation_memory_budget); },
          [](C& c, nb::handle v) {
            if (nb::isinstance<nb::str>(v)) {
              const std::string text = choice_of(v, "[activation_memory_budget]");
              c.activation_memory_budget = text == "0" ? 0 : rt::parse_byte_size(text, "activation_memory_budget");
            } else if (nb::isinstance<nb::int_>(v) && !nb::isinstance<nb::bool_>(v)) {
              const std::int64_t bytes = nb::cast<std::int64_t>(v);
              if (bytes < 0) throw rt::ValueError("[activation_memory_budget] must be >= 0 bytes, got " + std::to_string(bytes));
              c.activation_memory_budget = bytes;
            } else {
              throw nb::cast_error();  // "...activation_memory_budget expects int | str, got ..."
            }
          },
          "bytes (or '256MiB', '1.5GiB') every step's activation peak must fit; the run chooses what each block "
          "recomputes (activation_checkpointing stays 'disabled'); 0: none")
      .field("activation_offload", &StageSettings::activation_offload, "bool",
             "keep checkpointed groups' block-boundary inputs in pinned host memory (device 'cuda'; on the "
             "CPU it is recorded in metadata.json and moves nothing)")
      .field("zero_stage", &StageSettings::zero_stage, "int",
             "under mpirun: 0 plain Adam on every rank, 1 ZeRO-1 (Adam state sharded across the ranks, the same "
             "bits); one process: plain Adam")
      .field("gradient_bucket_mib", &StageSettings::gradient_bucket_mib, "int",
             "gradient all-reduce bucket size in MiB under mpirun, in [1, 65536] (PyTorch DDP's bucket_cap_mb)")
      .choice("device", &StageSettings::device, &rt::parse_backend, &rt::backend_name,
              "'cpu' | 'cuda': where the run trains (the model, gradients and Adam state); 'cuda' without a "
              "CUDA build or device is a BackendError before any file is written")
      .field("optimizer_in_backward", &StageSettings::optimizer_in_backward, "bool",
             "update each parameter inside the backward pass as soon as its gradient is final, then free it "
             "(Adam.backward_and_step; the same bits); needs max_grad_norm=0, gradient_accumulation_steps=1 and "
             "one process (recorded in metadata.json)")
      .real("dropout", &StageSettings::dropout)
      .path("data", &StageSettings::data, "None: the stage's default data")
      .path("tokenizer", &StageSettings::tokenizer, "None: bytes; a SentencePiece model file (train_tokenizer)")
      .field("steps", &StageSettings::steps, "int")
      .field("batch", &StageSettings::batch, "int",
             "rows per micro-batch; the effective batch is batch * gradient_accumulation_steps")
      .field("gradient_accumulation_steps", &StageSettings::gradient_accumulation_steps, "int",
             "micro-batches per optimizer step (gradients summed as one larger batch)")
      .field("sequence_length", &StageSettings::sequence_length, "int")
      .real("learning_rate", &StageSettings::learning_rate, "peak, after linear warmup")
      .field("warmup_steps", &StageSettings::warmup_steps, "int")
      .real("min_learning_rate_ratio", &StageSettings::min_learning_rate_ratio, "cosine decay ends at lr * ratio")
      .real("weight_decay", &StageSettings::weight_decay, "decoupled; never applied to norm weights")
      .field("decay_embeddings", &StageSettings::decay_embeddings, "bool",
             "weight-decay the token embedding and LM head too")
      .real("max_grad_norm", &StageSettings::max_grad_norm, "0 disables clipping")
      .real("beta1", &StageSettings::beta1)
      .real("beta2", &StageSettings::beta2)
      .field("seed", &StageSettings::seed, "int")
      .field("eval_interval", &StageSettings::eval_interval, "int", "steps between validation losses (0: only at the end)")
      .field("eval_batches", &StageSettings::eval_batches, "int")
      .field("checkpoint_interval", &StageSettings::checkpoint_interval, "int",
             "steps between training checkpoints (0: none)")
      .path("output_dir", &StageSettings::output_dir)
      .field("resume", &StageSettings::resume, "bool",
             "continue from output_dir/training_checkpoint.safetensors when present");
}

template <class Run>
rt::RunResult run_stage(nb::object progress, Run run) {
  // Before the run: a progress that is not callable was found after step 1,
  // with the run's files written.
  if (!progress.is_none() && PyCallable_Check(progress.ptr()) == 0) {
    throw nb::type_error(("progress must be a callable (report -> bool | None) or None, got " +
                          std::string(nb::type_name(progress.type()).c_str()))
                             .c_str());
  }
  std::optional<nb::python_error> failure;
  const rt::ProgressCallback callback = [&](const rt::StepReport& report) -> bool {
    nb::gil_scoped_acquire gil;
    try {
      if (PyErr_CheckSignals() != 0) throw nb::python_error();  // Ctrl-C while the step ran
      if (progress.is_none()) return true;
      nb::object answer = progress(nb::cast(report, nb::rv_policy::copy));
      if (answer.is_none()) return true;
      const int keep_going = PyObject_IsTrue(answer.ptr());  // -1: no truth value (a numpy array)
      if (keep_going < 0) throw nb::python_error();           // the answer's own exception, e.g. ValueError
      return keep_going == 1;
    } catch (nb::python_error& e) {
      failure.emplace(std::move(e));
      return false;
    }
  };
  rt::RunResult result;
  {
    nb::gil_scoped_release release;
    result = run(callback);
  }
  if (failure) throw std::move(*failure);
  return result;
}

nb::dict run_files(const rt::RunResult& r) {
  nb::dict files;
  auto add = [&](const char* key, const std::filesystem::path& p) {
    if (!p.empty() && std::filesystem::exists(p)) files[key] = nb::cast(p);
  };
  add("weights", r.weights);
  add("metadata", r.output_dir / "metadata.json");
  add("metrics", r.output_dir / "metrics.jsonl");
  add("loss_curve_svg", r.output_dir / "loss_curve.svg");
  add("loss_curve_png", r.output_dir / "loss_curve.png");
  add("training_checkpoint", r.output_dir / "training_checkpoint.safetensors");
  return files;
}

}  // namespace

void init_pipelines(nb::module_& m) {
  nb::list methods;
  for (auto k : {rt::FineTuningMethod::Lora, rt::FineTuningMethod::Full}) methods.append(rt::fine_tuning_method_name(k));
  m.attr("FINE_TUNING_METHODS") = nb::tuple(methods);

  using Pre = rt::PretrainingConfig;
  ConfigClass<Pre> pre(m, "PretrainingConfig",
                       "Pretraining a new model on text (default: Debian's fortunes). Every field a keyword.");
  pre.field("model", &Pre::dimensions, "TransformerConfig", "the architecture")
      .real("norm_epsilon", &Pre::norm_epsilon)
      .field("validation_fraction", &Pre::validation_fraction, "float");
  stage_fields(pre).finish().def("validate", &Pre::validate, "ValueError naming the bad field.")
      .def("learning_rate_at", &Pre::learning_rate_at, "step"_a);

  using Post = rt::PostTrainingConfig;
  ConfigClass<Post> post(m, "PostTrainingConfig",
                         "Post-training (LoRA or full fine-tuning) of a saved model on prompt/response JSON Lines.");
  post.path("base_model", &Post::base_model, "a model-state file")
      .field("allow_non_finite", &Post::allow_non_finite, "bool", "load a base model holding NaN/inf weights")
      .choice("fine_tuning_method", &Post::fine_tuning_method, &rt::parse_fine_tuning_method,
              &rt::fine_tuning_method_name, "'lora' | 'full'")
      .field("lora", &Post::lora, "LoraConfig");
  stage_fields(post).finish().def("validate", &Post::validate, "ValueError naming the bad field.")
      .def("learning_rate_at", &Post::learning_rate_at, "step"_a);

  nb::class_<rt::StepReport>(m, "StepReport", "What a pipeline reports after every step.")
      .def_ro("step", &rt::StepReport::step, "1-based: steps completed")
      .def_ro("total_steps", &rt::StepReport::total_steps)
      .def_ro("loss", &rt::StepReport::loss)
      .def_ro("validation_loss", &rt::StepReport::validation_loss, "on evaluation steps, else None")
      .def_ro("learning_rate", &rt::StepReport::learning_rate)
      .def_ro("grad_norm", &rt::StepReport::grad_norm)
      .def_ro("tokens_per_second", &rt::StepReport::tokens_per_second)
      .def_ro("elapsed_seconds", &rt::StepReport::elapsed_seconds)
      .def_ro("eta_seconds", &rt::StepReport::eta_seconds)
      .def_ro("peak_bytes", &rt::StepReport::peak_bytes)
      .def_ro("activation_peak_bytes", &rt::StepReport::activation_peak_bytes,
              "the largest activation peak of any micro-batch so far (forward + backward)")
      .def("__repr__", [](const rt::StepReport& s) {
        return "StepReport(step=" + std::to_string(s.step) + "/" + std::to_string(s.total_steps) +
               ", loss=" + std::to_string(s.loss) + ")";
      });

  nb::class_<rt::RunResult>(m, "RunResult", "A finished (or stopped) run: results and the files it wrote.")
      .def_ro("completed", &rt::RunResult::completed, "False when the progress callback stopped the run")
      .def_ro("steps", &rt::RunResult::steps)
      .def_ro("resumed_from_step", &rt::RunResult::resumed_from_step)
      .def_ro("checkpoint_step", &rt::RunResult::checkpoint_step,
              "the step the output directory's training checkpoint holds (0: none, or the run completed): a "
              "stopped run's resume continues from there")
      .def_ro("final_train_loss", &rt::RunResult::final_train_loss)
      .def_ro("final_validation_loss", &rt::RunResult::final_validation_loss)
      .def_ro("tokens_per_second", &rt::RunResult::tokens_per_second)
      .def_ro("peak_bytes", &rt::RunResult::peak_bytes)
      .def_ro("activation_peak_bytes", &rt::RunResult::activation_peak_bytes)
      .def_ro("activation_memory_plan", &rt::RunResult::activation_memory_plan,
              "the plan chosen for activation_memory_budget, as rt-train prints it ('' without a budget)")
      .def_ro("output_dir", &rt::RunResult::output_dir)
      .def_ro("weights", &rt::RunResult::weights)
      .def_prop_ro("files", &run_files,
                   "The run's files that exist, by role: weights, metadata, metrics, loss_curve_svg, "
                   "loss_curve_png, training_checkpoint.")
      .def("__repr__", [](const rt::RunResult& r) {
        return str_of_bytes(std::string("RunResult(completed=") + (r.completed ? "True" : "False") +
               ", steps=" + std::to_string(r.steps) + ", final_train_loss=" + std::to_string(r.final_train_loss) +
               ", final_validation_loss=" + std::to_string(r.final_validation_loss) + ", output_dir='" +
               r.output_dir.string() + "')");
      });

  m.def("run_pretraining",
        [](const Pre& live, nb::object progress) {
          // A copy: the run must not read the caller's object while the GIL is
          // released (a progress callback or a thread setting cfg.steps = 40
          // made a 2-step run train 40 steps while metadata.json said 2).
          const Pre config = live;
          return run_stage(std::move(progress), [&](const rt::ProgressCallback& cb) { return rt::run_pretraining(config, cb); });
        },
        "config"_a, "progress"_a = nb::none(),
        "The pretraining pipeline (riftco.pretrain adds the PNG loss curve). progress(StepReport) -> bool | None.");
  m.def("run_post_training",
        [](const Post& live, nb::object progress) {
          const Post config = live;  // as above
          return run_stage(std::move(progress), [&](const rt::ProgressCallback& cb) { return rt::run_post_training(config, cb); });
        },
        "config"_a, "progress"_a = nb::none(), "The post-training pipeline (riftco.post_train adds the PNG loss curve).");
}

}  // namespace riftco_python
