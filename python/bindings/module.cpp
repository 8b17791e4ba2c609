// riftco._core: the nanobind module. Each area binds itself in its own file
// (init_<area>), as short lambdas into the C++ core.
#include "common.hpp"

NB_MODULE(_core, m) {
  using namespace riftco_python;
  m.doc() = "riftco's C++ core (nanobind bindings); import the riftco package instead.";
  init_errors(m);
  init_memory(m);
  init_variable(m);
  init_ops(m);
  init_checkpoint(m);
  init_model(m);
  init_optim(m);
  init_decode(m);
  init_io(m);
  init_pipelines(m);
  init_tokenizer(m);
}
