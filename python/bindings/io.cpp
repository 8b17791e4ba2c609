// Model-state and adapter files (model_state.hpp, adapter_state.hpp).
#include <nanobind/stl/unique_ptr.h>

#include "common.hpp"
#include "riftco_transformer/adapter_state.hpp"
#include "riftco_transformer/hf_llama.hpp"
#include "riftco_transformer/model_state.hpp"

namespace riftco_python {

void init_io(nb::module_& m) {
  using rt::DecoderOnlyTransformer;
  using std::filesystem::path;
  nb::class_<rt::LoadOptions>(m, "LoadOptions", "What a loader may accept that it refuses by default.")
      .def(nb::init<>())
      .def("__init__", [](rt::LoadOptions* self, bool allow_non_finite, bool allow_base_mismatch) {
        new (self) rt::LoadOptions{allow_non_finite, allow_base_mismatch};
      }, nb::kw_only(), "allow_non_finite"_a = false, "allow_base_mismatch"_a = false)
      .def_rw("allow_non_finite", &rt::LoadOptions::allow_non_finite, "Accept NaN or infinite weights.")
      .def_rw("allow_base_mismatch", &rt::LoadOptions::allow_base_mismatch,
              "Adapters: accept a file trained on another base of the same dimensions.")
      .def("__repr__", [](const rt::LoadOptions& o) {
        return std::string("LoadOptions(allow_non_finite=") + (o.allow_non_finite ? "True" : "False") +
               ", allow_base_mismatch=" + (o.allow_base_mismatch ? "True" : "False") + ")";
      });

  m.def("model_fingerprint", &rt::model_fingerprint, "model"_a,
        "A hash of the base weights (16 hex digits); adapter files record their base's.");
  m.def("read_model_config", &rt::read_model_dimensions, "path"_a, "The TransformerConfig a model-state file records.");
  m.def(
      "load_model",
      [](const path& file, nb::str attention_text, nb::str policy_text, bool allow_non_finite) {
        const rt::FullSequenceAttentionKind attention =
            rt::parse_attention_kind(choice_of(attention_text, "[load_model] attention"));
        const rt::ActivationCheckpointingKind policy =
            rt::parse_activation_checkpointing(choice_of(policy_text, "[load_model] activation_checkpointing"));
        nb::gil_scoped_release release;
        return rt::load_model(file, attention, policy, rt::LoadOptions{allow_non_finite, false});
      },
      "path"_a, nb::kw_only(), "attention"_a = "materialized", "activation_checkpointing"_a = "disabled",
      "allow_non_finite"_a = false,
      "A model of the file's dimensions with its weights; the policies are yours (the file has none).");

  m.def(
      "convert_from_hf",
      [](const path& directory, const path& output, bool allow_non_finite) {
        nb::gil_scoped_release release;
        rt::convert_from_hf(directory, output, rt::LoadOptions{allow_non_finite, false});
      },
      "directory"_a, "output"_a, nb::kw_only(), "allow_non_finite"_a = false,
      "A transformers LlamaForCausalLM checkpoint directory (config.json + safetensors, single or sharded) → a "
      "model-state file. ModelStateError names any config.json field this model cannot represent.");
  m.def(
      "convert_to_hf",
      [](const path& model_state, const path& directory, bool allow_non_finite) {
        nb::gil_scoped_release release;
        rt::convert_to_hf(model_state, directory, rt::LoadOptions{allow_non_finite, false});
      },
      "model_state"_a, "directory"_a, nb::kw_only(), "allow_non_finite"_a = false,
      "A model-state file → a transformers checkpoint directory (config.json, model.safetensors).");
  m.def(
      "load_hf_llama",
      [](const path& directory, nb::str attention_text, nb::str policy_text, bool allow_non_finite) {
        const rt::FullSequenceAttentionKind attention =
            rt::parse_attention_kind(choice_of(attention_text, "[load_hf_llama] attention"));
        const rt::ActivationCheckpointingKind policy =
            rt::parse_activation_checkpointing(choice_of(policy_text, "[load_hf_llama] activation_checkpointing"));
        nb::gil_scoped_release release;
        return rt::load_hf_llama(directory, attention, policy, rt::LoadOptions{allow_non_finite, false});
      },
      "directory"_a, nb::kw_only(), "attention"_a = "materialized", "activation_checkpointing"_a = "disabled",
      "allow_non_finite"_a = false, "A model read from a transformers Llama checkpoint directory.");

  nb::handle cls = nb::type<DecoderOnlyTransformer>();
  auto method = [&](const char* name, auto f, auto... extra) {
    cls.attr(name) = nb::cpp_function(std::move(f), nb::scope(cls), nb::is_method(), nb::name(name), extra...);
  };
  method("fingerprint", [](const DecoderOnlyTransformer& model) { return rt::model_fingerprint(model); },
         "model_fingerprint(self): a hash of the base weights.");
  method("save", [](const DecoderOnlyTransformer& model, const path& file) {
    ComputeWithoutGil release;
    rt::save_model_state(model, file);
  }, "path"_a, "Writes the weights and dimensions (safetensors; atomic).");
  method("save_hf", [](const DecoderOnlyTransformer& model, const path& directory) {
    ComputeWithoutGil release;
    rt::save_hf_llama(model, directory);
  }, "directory"_a, "Writes a transformers Llama checkpoint (config.json, model.safetensors; atomic files).");
  method("load_state", [](DecoderOnlyTransformer& model, const path& file, bool allow_non_finite) {
    refuse_inside_computation("load_state");
    // The file is read and checked with the GIL released, beside other
    // threads' readers; the weights are set holding the GIL, no reader running.
    const rt::ModelStateValues values = [&] {
      const ComputeWithoutGil release;
      return rt::read_model_state_for(model, file, rt::LoadOptions{allow_non_finite, false});
    }();
    const ExclusiveChange change("load_state");
    rt::apply_model_state_values(model, values);
  }, "path"_a, nb::kw_only(), "allow_non_finite"_a = false,
     "Validates the whole file against this model, then sets every weight. On error the model is untouched.");
  method("save_adapter", [](const DecoderOnlyTransformer& model, const path& file) {
    ComputeWithoutGil release;
    rt::save_adapter_state(model, file);
  }, "path"_a, "Writes the LoRA adapters alone (ValueError without adapters).");
  method("load_adapter", [](DecoderOnlyTransformer& model, const path& file, bool allow_non_finite,
                            bool allow_base_mismatch) {
    refuse_inside_computation("load_adapter");
    const rt::AdapterStateValues values = [&] {  // read as load_state reads
      const ComputeWithoutGil release;
      return rt::read_adapter_state_for(model, file, rt::LoadOptions{allow_non_finite, allow_base_mismatch});
    }();
    const ExclusiveChange change("load_adapter");
    rt::apply_adapter_state_values(model, values);
  }, "path"_a, nb::kw_only(), "allow_non_finite"_a = false, "allow_base_mismatch"_a = false,
     "Adds the file's adapters (active). The file's base fingerprint must match unless allowed.");
}

}  // namespace riftco_python
