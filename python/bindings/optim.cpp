// Adam (adam.hpp): bias-corrected, decoupled weight decay, optional clipping.
#include "common.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"
#include "riftco_transformer/pipelines.hpp"

namespace riftco_python {

namespace {

rt::ParameterGroup group_from_dict(const nb::dict& d, std::size_t index) {
  const std::string where = "[Adam] parameter group " + std::to_string(index);
  rt::ParameterGroup g;
  g.name = "group " + std::to_string(index);
  for (auto [key, value] : d) {
    if (!nb::isinstance<nb::str>(key)) throw rt::ValueError(where + ": keys must be strings");
    const std::string k = nb::cast<std::string>(key);
    if (k == "params") {
      if (!nb::isinstance<nb::iterable>(value)) throw rt::ValueError(where + ": 'params' must be a list of Variables");
      for (nb::handle p : nb::borrow<nb::iterable>(value)) {
        if (!nb::isinstance<rt::Variable>(p)) throw rt::ValueError(where + ": 'params' must hold Variables");
        g.parameters.push_back(nb::cast<rt::Variable>(p));
      }
    } else if (k == "weight_decay") {
      // A bool is an int to Python: refused, as the config fields refuse it.
      float decay = 0.0F;
      if (is_bool_like(value.ptr()) || nb::isinstance<nb::str>(value) || !nb::try_cast<float>(value, decay)) {
        throw rt::ValueError(where + ": 'weight_decay' must be a number (not a bool) that fits a float32, got " +
                             nb::cast<std::string>(nb::str(value.type().attr("__name__"))));
      }
      g.weight_decay = decay;
    } else if (k == "name") {
      if (!nb::isinstance<nb::str>(value)) throw rt::ValueError(where + ": 'name' must be a string");
      g.name = utf8_of(value, where + ": 'name'");
    } else {
      throw rt::ValueError(where + ": unknown key '" + k + "' (expected 'params', 'weight_decay', 'name')");
    }
  }
  if (!d.contains("params")) throw rt::ValueError(where + ": 'params' is missing");
  return g;
}

}  // namespace

void init_optim(nb::module_& m) {
  nb::class_<rt::GradientAccumulator>(
      m, "GradientAccumulator",
      "Explicit gradient accumulation: backward() replaces gradients (no implicit += as in PyTorch), so\n"
      "after each micro-batch's backward() call add(weight), then Adam.step(accumulator), then clear().")
      .def(
          "__init__",
          [](rt::GradientAccumulator* self, nb::iterable parameters) {
            new (self) rt::GradientAccumulator(variables_from_python(parameters, "GradientAccumulator"));
          },
          "parameters"_a, "Use the Adam's own .parameters (the order must match).")
      .def(
          "add",
          // Keeps the GIL: the GIL is what serializes add() and clear() from
          // several Python threads (released, one freed the sums the other
          // was writing: segfault).
          [](rt::GradientAccumulator& a, RealArg<float> weight) { a.add(weight.value); },
          "weight"_a = 1.0F,
          "Adds weight * each parameter's current gradient to its sum, once per gradient: a parameter the\n"
          "last backward did not reach (its .grad an earlier pass's, already added) adds nothing.")
      .def_prop_ro("count", &rt::GradientAccumulator::count, "add() calls since the last clear()")
      .def_prop_ro(
          "gradients",
          [](const rt::GradientAccumulator& a) {
            nb::list out;
            for (const rt::Tensor& t : a.gradients()) {
              if (t.defined()) {
                out.append(to_numpy(t));
              } else {
                out.append(nb::none());
              }
            }
            return out;
          },
          "The sums as read-only numpy views (a later add() changes them), None where nothing was added.")
      .def("clear", &rt::GradientAccumulator::clear, "Drops every sum.");

  m.def(
      "default_parameter_groups",
      [](nb::iterable parameters, RealArg<float> weight_decay_arg, bool decay_embeddings) {
        const float weight_decay = weight_decay_arg.value;
        // (name, Variable) pairs (model.named_parameters(): the model's
        // structural names, whatever the Variables' labels) or Variables
        // (grouped by their labels).
        std::vector<rt::NamedParameter> named;
        for (nb::handle item : parameters) {
          if (nb::isinstance<nb::tuple>(item) && nb::len(item) == 2 && nb::isinstance<nb::str>(item[0]) &&
              nb::isinstance<rt::Variable>(item[1])) {
            named.push_back({utf8_of(item[0], "[default_parameter_groups] a parameter's name"),
                             nb::cast<rt::Variable>(item[1])});
          } else if (nb::isinstance<rt::Variable>(item)) {
            const rt::Variable v = nb::cast<rt::Variable>(item);
            named.push_back({v.name(), v});
          } else {
            throw nb::type_error(("[default_parameter_groups] parameter " + std::to_string(named.size()) +
                                  " must be a Variable or a (name, Variable) pair, got " +
                                  nb::cast<std::string>(nb::str(item.type().attr("__name__"))))
                                     .c_str());
          }
        }
        nb::list out;
        for (const rt::ParameterGroup& g : rt::default_parameter_groups(named, weight_decay, decay_embeddings)) {
          nb::dict d;
          d["name"] = g.name;
          d["params"] = g.parameters;
          d["weight_decay"] = short_double(*g.weight_decay);
          out.append(d);
        }
        return out;
      },
      "parameters"_a, "weight_decay"_a, nb::kw_only(), "decay_embeddings"_a = true,
      "The pipelines' two Adam groups from the parameters' names: 'decay' (weight_decay) and 'no_decay'\n"
      "(0: every norm weight, plus token_embedding.weight and lm_head.weight unless decay_embeddings).\n"
      "parameters: (name, Variable) pairs, e.g. model.named_parameters() (the model's own names), or\n"
      "Variables (grouped by their labels, Variable.name).");

  const rt::AdamOptions d{};
  nb::class_<rt::Adam>(m, "Adam", "AdamW over leaves that require grad. step() bumps their versions.")
      .def(
          "__init__",
          [](rt::Adam* self, nb::iterable parameters, RealArg<float> learning_rate, RealArg<float> beta1, RealArg<float> beta2,
             RealArg<float> epsilon, RealArg<float> weight_decay, RealArg<float> max_grad_norm) {
            const rt::AdamOptions options{learning_rate.value, beta1.value,  beta2.value,
                                          epsilon.value,       weight_decay.value, max_grad_norm.value};
            std::vector<rt::Variable> params;
            std::vector<rt::ParameterGroup> groups;
            for (nb::handle p : parameters) {
              if (nb::isinstance<nb::dict>(p)) {
                groups.push_back(group_from_dict(nb::borrow<nb::dict>(p), groups.size()));
              } else if (nb::isinstance<rt::Variable>(p)) {
                params.push_back(nb::cast<rt::Variable>(p));
              } else {
                throw nb::type_error(("[Adam] parameter " + std::to_string(params.size() + groups.size()) +
                                      " must be a Variable or a parameter-group dict, got " +
                                      nb::cast<std::string>(nb::str(p.type().attr("__name__"))))
                                         .c_str());
              }
            }
            if (!groups.empty() && !params.empty()) {
              throw rt::ValueError("[Adam] parameters: give Variables or parameter-group dicts, not both");
            }
            if (groups.empty()) {
              new (self) rt::Adam(std::move(params), options);
            } else {
              new (self) rt::Adam(std::move(groups), options);
            }
          },
          "parameters"_a, nb::kw_only(), "learning_rate"_a = d.learning_rate, "beta1"_a = d.beta1,
          "beta2"_a = d.beta2, "epsilon"_a = d.epsilon, "weight_decay"_a = d.weight_decay,
          "max_grad_norm"_a = d.max_grad_norm,
          "parameters: Variables that require grad (model.trainable_parameters()), or parameter groups as\n"
          "PyTorch takes them: dicts {'params': [...], 'weight_decay': float (optional), 'name': str (optional)}\n"
          "(riftco.default_parameter_groups builds the pipelines' split). max_grad_norm 0: no clipping.")
      .def(
          "step",
          [](rt::Adam& adam, const rt::GradientAccumulator* accumulated) {
            if (accumulated == nullptr) {
              StepWithoutGil release;
              return adam.step();
            }
            // A snapshot taken under the GIL holds the sums' buffers: another
            // thread's clear() while the GIL is released cannot free them.
            const rt::GradientAccumulator snapshot = *accumulated;
            StepWithoutGil release;
            return adam.step(snapshot);
          },
          "accumulated"_a = nb::none(),
          "One update of every parameter that has a gradient; returns the gradient norm before clipping.\n"
          "accumulated: a GradientAccumulator over this Adam's parameters (in .parameters order): step with\n"
          "its sums instead of the parameters' gradients. Releases the GIL.")
      .def(
          "backward_and_step",
          [](rt::Adam& adam, const rt::Variable& loss) {
            // A computation, not a StepWithoutGil: checkpoint functions run in
            // it, and one may wait for another thread's computation (which
            // an exclusive hold would keep out: a deadlock).
            ComputeWithoutGil release;
            return adam.backward_and_step(loss, rt::GraphAfterBackward::Release);
          },
          "loss"_a,
          "loss.backward() with the step fused into it (PyTorch's optimizer step in backward): each parameter\n"
          "is updated as soon as its gradient is final and the gradient is freed, so the pass never holds\n"
          "every gradient. The same weights to the bit as loss.backward(retain_graph=False) then step();\n"
          "afterwards the parameters have no .grad. Returns the gradient norm. ValueError (nothing changed)\n"
          "for max_grad_norm > 0 or a non-finite gradient before the first update; PartialStepError after it.\n"
          "Releases the GIL.")
      .def("zero_grad", &rt::Adam::zero_grad, "Drops every parameter's gradient.")
      .def_prop_rw("learning_rate", [](const rt::Adam& a) { return short_double(a.options().learning_rate); },
                   [](rt::Adam& a, RealArg<float> rate) { a.set_learning_rate(rate.value); })
      .def_prop_ro("step_count", &rt::Adam::step_count, "How many step()s updated at least one parameter.")
      .def_prop_ro(
          "parameter_step_counts",
          [](const rt::Adam& a) {
            std::vector<std::int64_t> counts;
            for (std::size_t i = 0; i < a.parameters().size(); ++i) counts.push_back(a.parameter_step_count(i));
            return counts;
          },
          "How many updates each parameter has had, in .parameters order (PyTorch's per-parameter\n"
          "state['step']): each is bias-corrected by its own count, so one without a gradient at some\n"
          "steps (a frozen branch, an inactive adapter) is not corrected as if it had moved at every one.")
      .def_prop_ro("parameters", &rt::Adam::parameters)
      .def_prop_ro(
          "groups",
          [](const rt::Adam& a) {
            nb::list out;
            for (const rt::Adam::GroupInfo& g : a.groups()) {
              nb::list params;
              for (std::size_t i = g.begin; i < g.end; ++i) params.append(a.parameters()[i]);
              nb::dict d;
              d["name"] = g.name;
              d["weight_decay"] = short_double(g.weight_decay);
              d["params"] = params;
              out.append(d);
            }
            return out;
          },
          "The parameter groups: dicts with 'name', 'weight_decay' and 'params'.")
      .def("__repr__", [](const rt::Adam& a) {
        const rt::AdamOptions& o = a.options();
        auto f = [](float v) { return nb::cast<std::string>(nb::repr(nb::float_(short_double(v)))); };
        return "Adam(" + std::to_string(a.parameters().size()) + " parameters, learning_rate=" + f(o.learning_rate) +
               ", beta1=" + f(o.beta1) + ", beta2=" + f(o.beta2) + ", epsilon=" + f(o.epsilon) +
               ", weight_decay=" + f(o.weight_decay) + ", max_grad_norm=" + f(o.max_grad_norm) +
               ", step_count=" + std::to_string(a.step_count()) + ")";
      });
}

}  // namespace riftco_python
