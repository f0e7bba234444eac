// Kernels of many plans loaded at once: the search compiles all candidates of one decision in
// parallel before measuring them one by one.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "../cpu/compiler.hpp"
#include "../executor.hpp"

namespace nb = nanobind;

void init_compiler(nb::module_ &m) {
  m.def(
      "prepare",
      [](const std::vector<std::shared_ptr<const luminal::Plan>> &plans, const std::string &backend,
         unsigned jobs) {
        nb::gil_scoped_release release;
        luminal::prepare(plans, backend, jobs);
      },
      nb::arg("plans"), nb::arg("backend") = "cpu", nb::arg("jobs") = 0,
      "Loads the kernels of every plan, jobs plans at a time (0: one per core), so that an "
      "Executor of each then finds its compiled kernels in the disk cache.");
  m.def(
      "precompile_prelude",
      [](const std::string &source) {
        nb::gil_scoped_release release;
        return luminal::cpu::precompile_prelude(source);
      },
      nb::arg("source"),
      "Precompiles the include-guarded prelude a C kernel source starts with (cpu; cached on "
      "disk); returns the header's path, or '' when there is none.");
}
