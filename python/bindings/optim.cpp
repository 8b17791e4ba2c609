// Adam (adam.hpp): bias-corrected, decoupled weight decay, optional clipping.
#include "common.hpp"
#include "riftco_transformer/adam.hpp"

namespace riftco_python {

void init_optim(nb::module_& m) {
  const rt::AdamOptions d{};
  nb::class_<rt::Adam>(m, "Adam", "AdamW over leaves that require grad. step() bumps their versions.")
      .def(
          "__init__",
          [](rt::Adam* self, nb::iterable parameters, float learning_rate, float beta1, float beta2, float epsilon,
             float weight_decay, float max_grad_norm) {
            std::vector<rt::Variable> params;
            for (nb::handle p : parameters) params.push_back(nb::cast<rt::Variable>(p));
            new (self) rt::Adam(std::move(params), rt::AdamOptions{learning_rate, beta1, beta2, epsilon,
                                                                   weight_decay, max_grad_norm});
          },
          "parameters"_a, nb::kw_only(), "learning_rate"_a = d.learning_rate, "beta1"_a = d.beta1,
          "beta2"_a = d.beta2, "epsilon"_a = d.epsilon, "weight_decay"_a = d.weight_decay,
          "max_grad_norm"_a = d.max_grad_norm,
          "parameters: Variables that require grad (model.trainable_parameters()). max_grad_norm 0: no clipping.")
      .def(
          "step",
          [](rt::Adam& adam) {
            nb::gil_scoped_release release;
            return adam.step();
          },
          "One update of every parameter that has a gradient; returns the gradient norm before clipping.\n"
          "Releases the GIL.")
      .def("zero_grad", &rt::Adam::zero_grad, "Drops every parameter's gradient.")
      .def_prop_rw("learning_rate", [](const rt::Adam& a) { return short_double(a.options().learning_rate); },
                   &rt::Adam::set_learning_rate)
      .def_prop_ro("step_count", &rt::Adam::step_count)
      .def_prop_ro("parameters", &rt::Adam::parameters)
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
