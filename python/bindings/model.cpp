// TransformerConfig, LoraConfig and DecoderOnlyTransformer (transformer.hpp, lora.hpp).
#include <nanobind/operators.h>

#include "common.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/memory_plan.hpp"
#include "config_fields.hpp"
#include "riftco_transformer/attention.hpp"
#include "riftco_transformer/lora.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_python {
namespace {

rt::BlockRecompute parse_block_recompute(const std::string& name) {
  for (const rt::BlockRecompute r : {rt::BlockRecompute::Nothing, rt::BlockRecompute::Attention,
                                     rt::BlockRecompute::Mlp, rt::BlockRecompute::Whole}) {
    if (name == rt::block_recompute_name(r)) return r;
  }
  throw rt::ValueError("[activation_checkpointing_plan] unknown recompute '" + name +
                       "' (expected 'keep', 'attention', 'mlp' or 'block')");
}

using rt::DecoderOnlyTransformer;

std::vector<rt::NamedParameter> all_parameters(const DecoderOnlyTransformer& model) {
  std::vector<rt::NamedParameter> out = model.parameters();
  for (rt::NamedParameter& p : model.lora_parameters()) out.push_back(std::move(p));
  return out;
}

rt::Variable run_forward(const DecoderOnlyTransformer& model, nb::handle tokens) {
  const TokenArray t = tokens_from_python(tokens, "forward", model.dimensions().context_length);
  ComputeWithoutGil release;
  return model.forward(t.ids, t.batch());
}

}  // namespace

/// add_lora(config=None, *, rank, alpha, targets, seed): the LoraConfig from
/// `config` or from the keywords (through LoraConfig's own field conversions,
/// so rank=True is the same TypeError as LoraConfig(rank=True)); `seed` from
/// its keyword. Both a config and rank/alpha/targets is a TypeError naming them.
rt::LoraConfig lora_config_from(nb::handle config, nb::kwargs keywords, std::uint64_t& seed);

void init_model(nb::module_& m) {
  // add_lora reads its keywords from **kwargs (to know which were given); the signature shows them with
  // their defaults.
  static const std::string add_lora_signature =
      "def add_lora(self, config: LoraConfig | None = None, *, rank: int = " + std::to_string(rt::LoraConfig{}.rank) +
      ", alpha: float = " + nb::cast<std::string>(nb::repr(nb::float_(short_double(rt::LoraConfig{}.alpha)))) +
      ", targets: str | list[str] | None = None, seed: int = 0) -> None";
  nb::list attention, checkpointing;
  for (auto k : {rt::FullSequenceAttentionKind::Materialized, rt::FullSequenceAttentionKind::Flash})
    attention.append(rt::attention_kind_name(k));
  for (auto k : rt::activation_checkpointing_kinds()) checkpointing.append(rt::activation_checkpointing_name(k));
  m.attr("ATTENTION_KINDS") = nb::tuple(attention);
  m.attr("ACTIVATION_CHECKPOINTING_KINDS") = nb::tuple(checkpointing);

  using Dims = rt::TransformerDimensions;
  ConfigClass<Dims>(m, "TransformerConfig", "Model architecture of a decoder-only transformer: six sizes, grouped-query attention, RoPE base, tied embeddings.")
      .field("vocab_size", &Dims::vocab_size, "int")
      .field("context_length", &Dims::context_length, "int")
      .field("model_width", &Dims::model_width, "int")
      .field("heads", &Dims::heads, "int")
      .field("layers", &Dims::layers, "int")
      .field("feed_forward_width", &Dims::feed_forward_width, "int")
      .field("key_value_heads", &Dims::key_value_heads, "int",
             "key/value heads (grouped-query attention); 0 = heads (ordinary multi-head attention)")
      .real("rope_base", &Dims::rope_base, "RoPE base (theta)")
      .field("tie_embeddings", &Dims::tie_embeddings, "bool", "the LM head is the token embedding")
      .finish()
      .def("validate", &Dims::validate, "ValueError naming the bad field.")
      // Derived sizes of a valid config only: heads = 0 divided by zero (the
      // interpreter died of SIGFPE) and huge sizes overflowed int64.
      .def_prop_ro("head_width",
                   [](const Dims& d) {
                     d.validate();
                     return d.head_width();
                   },
                   "model_width / heads (ValueError naming the field for an invalid config).")
      .def_prop_ro("kv_heads", &Dims::kv_heads, "The effective key/value head count (key_value_heads or heads).")
      .def("parameter_count",
           [](const Dims& d) {
             d.validate();
             return d.parameter_count();
           },
           "Parameters of a model of these dimensions (no adapters; ValueError naming the field for an invalid "
           "config).")
      .def(nb::self == nb::self);

  using Lora = rt::LoraConfig;
  ConfigClass<Lora>(m, "LoraConfig", "LoRA adapters: rank, alpha (scale alpha/rank) and target projections.")
      .field("rank", &Lora::rank, "int")
      .real("alpha", &Lora::alpha)
      .custom(
          "targets", "str | list[str]",
          [](const Lora& c) {
            nb::list out;
            for (const rt::LoraTarget t : c.targets) out.append(rt::lora_target_name(t));
            return nb::object(out);
          },
          [](Lora& c, nb::handle v) {
            std::string list;
            if (nb::isinstance<nb::str>(v)) {
              list = choice_of(v, "[LoraConfig.targets]");
            } else {
              if (!nb::isinstance<nb::iterable>(v)) throw nb::cast_error();
              for (nb::handle t : v) {
                if (!nb::isinstance<nb::str>(t)) throw nb::cast_error();
                list += (list.empty() ? "" : ",") + choice_of(t, "[LoraConfig.targets]");
              }
            }
            c.targets = rt::parse_lora_targets(list, "LoraConfig.targets");
          },
          "Projections to adapt: names from query, key, value, output, gate, up, down, or 'attention', 'mlp', "
          "'all'; a comma list or a list of names.")
      .finish()
      .def("validate", &Lora::validate)
      .def_prop_ro("scale", &Lora::scale);

  nb::class_<DecoderOnlyTransformer>(m, "DecoderOnlyTransformer",
                                     "A decoder-only transformer (RMSNorm, RoPE attention, SwiGLU MLP, untied head).")
      .def(
          "__init__",
          [](DecoderOnlyTransformer* self, const Dims& config, nb::str attention, nb::str activation_checkpointing,
             const IntArg<std::uint64_t>& seed, RealArg<float> norm_epsilon, bool activation_offload) {
            const auto kind = rt::parse_attention_kind(choice_of(attention, "[attention] kind"));
            const std::string checkpointing_name = choice_of(activation_checkpointing, "[activation_checkpointing] kind");
            const auto checkpointing = rt::parse_activation_checkpointing(checkpointing_name);
            rt::Random random(seed.get("[DecoderOnlyTransformer] seed"));
            new (self) DecoderOnlyTransformer(config, random, norm_epsilon.value, kind, checkpointing);
            self->set_activation_offload(activation_offload);
          },
          "config"_a = Dims{}, nb::kw_only(), "attention"_a = "materialized", "activation_checkpointing"_a = "disabled",
          "seed"_a = 0, "norm_epsilon"_a = 1.0e-5F, "activation_offload"_a = false,
          "Weights drawn from a generator seeded with `seed`. attention: 'materialized' | 'flash';\n"
          "activation_checkpointing: 'disabled' | 'block' | 'segments' | 'attention' | 'mlp' (execution policy, not architecture);\n"
          "activation_offload: see the property (cuda models; nothing moves on the CPU).")
      .def_prop_ro("config", [](const DecoderOnlyTransformer& model) { return model.dimensions(); })
      .def_prop_ro("norm_epsilon", [](const DecoderOnlyTransformer& model) { return short_double(model.norm_epsilon()); })
      .def_prop_rw(
          "attention", [](const DecoderOnlyTransformer& model) { return rt::attention_kind_name(model.attention_kind()); },
          [](DecoderOnlyTransformer& model, nb::str kind) {
            model.set_attention_kind(rt::parse_attention_kind(choice_of(kind, "[attention] kind")));
          })
      .def("set_attention", [](DecoderOnlyTransformer& model, nb::str kind) {
        model.set_attention_kind(rt::parse_attention_kind(choice_of(kind, "[attention] kind")));
      }, "kind"_a)
      .def_prop_rw(
          "activation_checkpointing",
          [](const DecoderOnlyTransformer& model) {
            return rt::activation_checkpointing_name(model.activation_checkpointing_kind());
          },
          [](DecoderOnlyTransformer& model, nb::str kind) {
            model.set_activation_checkpointing_kind(
                rt::parse_activation_checkpointing(choice_of(kind, "[activation_checkpointing] kind")));
          },
          "'disabled' | 'block' | 'segments' | 'attention' | 'mlp' ('planned' while a plan is set: read only). "
          "Safe to change at any time; affects later forwards only.")
      .def_prop_rw(
          "activation_checkpointing_plan",
          [](const DecoderOnlyTransformer& model) {
            nb::list out;
            for (const rt::CheckpointGroup& g : model.activation_checkpointing_plan()) {
              out.append(nb::make_tuple(g.blocks, rt::block_recompute_name(g.recompute)));
            }
            return out;
          },
          [](DecoderOnlyTransformer& model, const nb::handle& groups) {
            rt::ActivationCheckpointingPlan plan;
            for (nb::handle item : nb::iter(groups)) {
              // (blocks, kind): a wrong shape or type names the group (was
              // the anonymous "an argument has the wrong type").
              const std::string where = "[activation_checkpointing_plan] group " + std::to_string(plan.size());
              if (!nb::isinstance<nb::tuple>(item) && !nb::isinstance<nb::list>(item)) {
                throw nb::type_error((where + " must be a (blocks, kind) pair, got " +
                                      nb::cast<std::string>(nb::str(item.type().attr("__name__"))))
                                         .c_str());
              }
              if (nb::len(item) != 2 || !nb::isinstance<nb::str>(item[1])) {
                throw nb::type_error((where + " must be a (blocks, kind) pair with kind 'keep', 'attention', "
                                      "'mlp' or 'block'")
                                         .c_str());
              }
              std::int64_t blocks = 0;
              try {
                blocks = int_of<std::int64_t>(item[0], where + " blocks");
              } catch (const nb::cast_error&) {
                throw nb::type_error((where + " blocks must be an int").c_str());
              }
              plan.push_back({blocks, parse_block_recompute(choice_of(item[1], where))});
            }
            model.set_activation_checkpointing_plan(plan);
          },
          "Per-block plan as [(blocks, 'keep' | 'attention' | 'mlp' | 'block'), ...] covering every block "
          "(blocks > 1 only for 'block': a segment). Setting it makes activation_checkpointing 'planned'.")
      .def(
          "plan_activation_memory",
          [](DecoderOnlyTransformer& model, nb::handle budget, const IntArg<std::int64_t>& batch_arg,
             const IntArg<std::int64_t>& sequence_length_arg, bool apply) {
            const std::int64_t batch = batch_arg.get("[plan_activation_memory] batch");
            const std::int64_t sequence_length = sequence_length_arg.get("[plan_activation_memory] sequence_length");
            std::int64_t bytes = 0;
            if (nb::isinstance<nb::str>(budget)) {
              bytes = rt::parse_byte_size(choice_of(budget, "[plan_activation_memory] budget"), "plan_activation_memory");
            } else {
              try {
                bytes = int_of<std::int64_t>(budget, "[plan_activation_memory] budget");
              } catch (const nb::cast_error&) {
                throw nb::type_error(("[plan_activation_memory] budget must be an int or a str such as '256MiB', got " +
                                      nb::cast<std::string>(nb::str(budget.type().attr("__name__"))))
                                         .c_str());
              }
            }
            rt::ActivationMemoryProfile profile;
            {
              ComputeWithoutGil release;
              profile = rt::profile_activation_memory(model, batch, sequence_length);
            }
            const rt::ActivationMemoryPlan plan = rt::plan_activation_memory(profile, bytes);
            if (apply) model.set_activation_checkpointing_plan(plan.plan);
            nb::list groups;
            for (const rt::CheckpointGroup& g : plan.plan) {
              groups.append(nb::make_tuple(g.blocks, rt::block_recompute_name(g.recompute)));
            }
            nb::dict out;
            out["plan"] = groups;
            out["budget_bytes"] = plan.budget_bytes;
            out["predicted_peak_bytes"] = plan.predicted_peak_bytes;
            out["disabled_peak_bytes"] = plan.disabled_peak_bytes;
            out["pinned_host_bytes"] = plan.pinned_host_bytes;
            out["smallest_feasible_bytes"] = plan.smallest_feasible_bytes;
            out["recompute_flops"] = plan.recompute_flops;
            out["forward_flops"] = profile.forward_flops;
            out["description"] = rt::describe_activation_memory_plan(profile, plan);
            return out;
          },
          "budget"_a, "batch"_a, "sequence_length"_a, "apply"_a = true,
          "Profiles 1- to 3-layer copies of this model at (batch, sequence_length), backward freeing the graph as the trainer does, and returns the least-recompute "
          "plan whose predicted activation peak fits `budget` (bytes or '256MiB'); apply=True sets it. ValueError "
          "naming the smallest feasible budget when none fits (docs/checkpointing.md).")
      .def("set_activation_checkpointing", [](DecoderOnlyTransformer& model, nb::str kind) {
        model.set_activation_checkpointing_kind(
            rt::parse_activation_checkpointing(choice_of(kind, "[activation_checkpointing] kind")));
      }, "kind"_a)
      .def_prop_rw("checkpoint_segment_blocks", &DecoderOnlyTransformer::checkpoint_segment_blocks,
                   [](DecoderOnlyTransformer& model, const IntArg<std::int64_t>& blocks) {
                     model.set_checkpoint_segment_blocks(blocks.get("[checkpoint_segment_blocks]"));
                   },
                   "Blocks per segment for 'segments' (set 0 for round(sqrt(layers))).")
      .def_prop_rw("activation_offload", &DecoderOnlyTransformer::activation_offload,
                   &DecoderOnlyTransformer::set_activation_offload,
                   "Keep checkpointed groups' block-boundary inputs in pinned host memory, copied back one group "
                   "ahead of each replay (cuda models; nothing moves on the CPU; same gradients).")
      .def("set_dropout", [](DecoderOnlyTransformer& model, RealArg<float> p, const IntArg<std::uint64_t>& seed) {
        model.set_dropout(p.value, seed.get("[set_dropout] seed"));
      }, "p"_a, "seed"_a = 0)
      .def_prop_ro("dropout", [](const DecoderOnlyTransformer& model) { return short_double(model.dropout()); })
      .def_prop_rw("training", &DecoderOnlyTransformer::training, &DecoderOnlyTransformer::set_training)
      .def(
          "to",
          [](DecoderOnlyTransformer& model, nb::str backend) -> DecoderOnlyTransformer& {
            const rt::Backend b = backend_for(choice_of(backend, "[to] backend"), "to");
            const ExclusiveChange change("to");
            model.to(b);
            return model;
          },
          "backend"_a, nb::rv_policy::reference,
          "Moves every parameter (base and adapters, with their gradients) to `backend` and returns the model. "
          "Earlier graphs and decode sessions become stale (StaleGraphError). BackendError for a backend this build "
          "lacks or has no device for; nothing moves then.")
      .def_prop_ro(
          "backend", [](const DecoderOnlyTransformer& model) { return std::string(rt::backend_name(model.backend())); },
          "'cpu' or 'cuda': where the parameters live.")
      .def("parameters", [](const DecoderOnlyTransformer& model) {
        std::vector<rt::Variable> out;
        for (rt::NamedParameter& p : all_parameters(model)) out.push_back(p.variable);
        return out;
      }, "Every parameter: base weights, then LoRA adapters.")
      .def("named_parameters", [](const DecoderOnlyTransformer& model) {
        std::vector<std::pair<std::string, rt::Variable>> out;
        for (rt::NamedParameter& p : all_parameters(model)) out.emplace_back(p.name, p.variable);
        return out;
      }, "(name, Variable) pairs: base weights, then LoRA adapters.")
      .def("trainable_parameters", [](const DecoderOnlyTransformer& model) {
        std::vector<rt::Variable> out;
        for (rt::NamedParameter& p : all_parameters(model))
          if (p.variable.requires_grad()) out.push_back(p.variable);
        return out;
      }, "The parameters that require grad (what Adam takes).")
      .def("parameter",
           [](const DecoderOnlyTransformer& model, nb::str name) {
             return model.parameter(utf8_of(name, "[parameter] name"));
           },
           "name"_a)
      .def("parameter_count", &DecoderOnlyTransformer::parameter_count)
      .def("validate_parameters", &DecoderOnlyTransformer::validate_parameters,
           "ShapeError naming the first parameter whose shape or backend no longer fits.")
      .def("block_dependencies", [](const DecoderOnlyTransformer& model, const IntArg<std::size_t>& index) {
        return model.block_dependencies(index.get("[block_dependencies] index"));
      }, "index"_a)
      .def("forward", &run_forward, "tokens"_a, "Logits (B, T, V) for (B, T) token ids. Releases the GIL.")
      .def("__call__", &run_forward, "tokens"_a)
      .def(
          "loss",
          [](const DecoderOnlyTransformer& model, nb::handle tokens, nb::handle targets,
             const IntArg<std::int32_t>& ignore_index_arg) {
            const std::int32_t ignore_index = ignore_index_arg.get("[loss] ignore_index");
            const TokenArray t = tokens_from_python(tokens, "loss", model.dimensions().context_length);
            const TokenArray y = tokens_from_python(targets, "loss", model.dimensions().context_length);
            if (t.shape != y.shape) {
              throw rt::ShapeError("[loss] tokens " + rt::shape_string(t.shape) + " and targets " +
                                   rt::shape_string(y.shape) + " differ");
            }
            ComputeWithoutGil release;
            return model.loss(t.ids, y.ids, t.batch(), ignore_index);
          },
          "tokens"_a, "targets"_a, "ignore_index"_a = -100,
          "Mean cross-entropy (a scalar Variable) of forward(tokens) against targets (same shape). Releases the GIL.")
      // ---- LoRA
      .def(
          "add_lora",
          [](DecoderOnlyTransformer& model, nb::handle config, nb::kwargs keywords) {
            std::uint64_t seed = 0;
            const rt::LoraConfig lora = lora_config_from(config, keywords, seed);
            rt::Random random(seed);
            const ExclusiveChange change("add_lora");
            model.add_lora(lora, random);
          },
          "config"_a = nb::none(), "keywords"_a, nb::sig(add_lora_signature.c_str()),
          "Adds LoRA adapters (a LoraConfig, or rank/alpha/targets keywords, not both: a TypeError names the\n"
          "keywords given beside a config); they start active. A bool for rank or seed is a TypeError.")
      .def("remove_lora",
           [](DecoderOnlyTransformer& model) {
             const ExclusiveChange change("remove_lora");
             model.remove_lora();
           })
      .def(
          "merge_lora",
          [](DecoderOnlyTransformer& model) {
            const ExclusiveChange change("merge_lora");
            model.merge_lora();
          },
          "W += (alpha/r)·B·A for every adapter, then removes them.")
      .def_prop_ro("has_lora", &DecoderOnlyTransformer::has_lora)
      .def_prop_ro("lora_config", &DecoderOnlyTransformer::lora_config)
      .def_prop_rw("lora_active", &DecoderOnlyTransformer::lora_active,
                   [](DecoderOnlyTransformer& model, bool active) {
                     const ExclusiveChange change("lora_active");
                     model.set_lora_active(active);
                   })
      .def("lora_parameters", [](const DecoderOnlyTransformer& model) {
        std::vector<std::pair<std::string, rt::Variable>> out;
        for (rt::NamedParameter& p : model.lora_parameters()) out.emplace_back(p.name, p.variable);
        return out;
      }, "(name, Variable) pairs of the adapters.")
      .def(
          "set_base_trainable",
          [](DecoderOnlyTransformer& model, bool trainable) {
            const ExclusiveChange change("set_base_trainable");
            model.set_base_trainable(trainable);
          },
          "trainable"_a)
      .def("__repr__", [](const DecoderOnlyTransformer& model) {
        return "DecoderOnlyTransformer(" + nb::cast<std::string>(nb::repr(nb::cast(model.dimensions()))) +
               ", attention='" + rt::attention_kind_name(model.attention_kind()) + "', activation_checkpointing='" +
               rt::activation_checkpointing_name(model.activation_checkpointing_kind()) + "'" +
               (model.has_lora() ? ", lora=" + nb::cast<std::string>(nb::repr(nb::cast(model.lora_config()))) : "") +
               ")";
      });
}

rt::LoraConfig lora_config_from(nb::handle config, nb::kwargs keywords, std::uint64_t& seed) {
  std::vector<std::pair<nb::handle, nb::handle>> fields;  // rank, alpha, targets as given
  std::string given;
  for (auto [key, value] : keywords) {
    const std::string name = nb::cast<std::string>(key);
    if (name == "seed") {
      try {
        seed = int_of<std::uint64_t>(value, "[add_lora] seed");
      } catch (const nb::cast_error&) {
        throw nb::type_error(("add_lora() seed expects int, got " +
                              nb::cast<std::string>(nb::str(value.type().attr("__name__"))))
                                 .c_str());
      }
    } else if (name == "rank" || name == "alpha" || name == "targets") {
      if (name == "targets" && value.is_none()) continue;  // the documented default
      fields.emplace_back(key, value);
      given += (given.empty() ? "" : ", ") + name + "=" + nb::cast<std::string>(nb::repr(value));
    } else {
      throw nb::type_error(("add_lora() got an unexpected keyword argument '" + name +
                            "' (config, rank, alpha, targets, seed)")
                               .c_str());
    }
  }
  if (!config.is_none()) {
    if (!nb::isinstance<rt::LoraConfig>(config)) {
      throw nb::type_error(("add_lora() config expects a LoraConfig or None, got " +
                            nb::cast<std::string>(nb::str(config.type().attr("__name__"))))
                               .c_str());
    }
    if (!given.empty()) {  // was: the keywords silently ignored
      throw nb::type_error(("add_lora() got a LoraConfig and the keywords " + given +
                            ": give one or the other (set the fields on the LoraConfig, or pass only keywords)")
                               .c_str());
    }
    return nb::cast<rt::LoraConfig>(config);
  }
  // LoraConfig's own conversions: rank=True is the TypeError LoraConfig(rank=True) gives.
  nb::object built = nb::borrow(nb::type<rt::LoraConfig>())();
  for (const auto& [key, value] : fields) nb::setattr(built, key, value);
  return nb::cast<rt::LoraConfig>(built);
}

}  // namespace riftco_python
