// checkpoint(input, dependencies, fn): the core primitive with a Python
// callable. The callable runs again during backward() (which releases the
// GIL), so it is held GIL-safely and called with the GIL taken.
#include "common.hpp"
#include "riftco_transformer/checkpoint.hpp"

namespace riftco_python {

void init_checkpoint(nb::module_& m) {
  m.def(
      "checkpoint",
      [](const rt::Variable& input, std::vector<rt::Variable> dependencies, nb::callable fn,
         bool preserve_random_state, nb::str name_text) {
        std::string name = utf8_of(name_text, "[checkpoint] name");
        SharedPyObject callable = share_python(std::move(fn));
        rt::CheckpointOptions options;
        options.preserve_random_state = preserve_random_state;
        options.name = std::move(name);
        auto recompute = [callable](const rt::Variable& x) -> rt::Variable {
          nb::gil_scoped_acquire gil;
          nb::object out = (*callable)(x);
          if (!nb::isinstance<rt::Variable>(out)) {
            throw nb::type_error(("[checkpoint] the function must return a riftco.Variable, got " +
                                  nb::cast<std::string>(nb::str(out.type().attr("__name__"))))
                                     .c_str());
          }
          return nb::cast<rt::Variable>(out);
        };
        return rt::checkpoint(input, dependencies, recompute, options);
      },
      "input"_a, "dependencies"_a, "fn"_a, nb::kw_only(), "preserve_random_state"_a = true, "name"_a = "",
      "Runs fn(input), keeps only its output value and replays fn during backward().\n\n"
      "Every leaf fn uses must be listed once in `dependencies`; fn must be deterministic and\n"
      "replay-safe. A broken rule raises CheckpointContractError with .violation.");
  m.def("checkpoint_replay_count", &rt::checkpoint_replay_count, "Checkpoint replays since start or the last reset.");
  m.def("checkpoint_replaying", &rt::checkpoint_replaying,
        "True while the calling thread runs a checkpoint function as a replay (inside backward()).\n\n"
        "A replay's output value is never read (only its shape and graph), so a function may skip\n"
        "work whose only use is that value.");
  m.def("reset_checkpoint_replay_count", &rt::reset_checkpoint_replay_count);
}

}  // namespace riftco_python
