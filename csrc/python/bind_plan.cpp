// Plan loading and the facts runtime.py needs about inputs and outputs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "../plan.hpp"

namespace nb = nanobind;
using luminal::Plan;

void init_plan(nb::module_ &m) {
  nb::class_<Plan>(m, "Plan", "A validated plan, loaded by the C++ runtime.")
      .def_static("load", &Plan::load, nb::arg("path"),
                  "Maps and validates a .lmp file; raises luminal.plan.PlanError.")
      .def_static(
          "from_bytes",
          [](nb::bytes data, const std::string &base_dir) {
            return Plan::from_bytes(data.c_str(), data.size(), base_dir);
          },
          nb::arg("data"), nb::arg("base_dir") = ".",
          "Validates plan bytes; external weight paths resolve against base_dir.")
      .def_static(
          "from_parts",
          [](nb::list parts, const std::string &base_dir) {
            // buffers held for the copy only; Plan::from_parts copies each once
            struct View {
              Py_buffer b{};
              bool held = false;
              ~View() {
                if (held) PyBuffer_Release(&b);
              }
            };
            std::vector<View> views(parts.size());
            std::vector<std::pair<const void *, size_t>> spans;
            for (size_t i = 0; i < parts.size(); ++i) {
              if (PyObject_GetBuffer(parts[i].ptr(), &views[i].b, PyBUF_C_CONTIGUOUS) != 0)
                throw nb::python_error();
              views[i].held = true;
              spans.emplace_back(views[i].b.buf, size_t(views[i].b.len));
            }
            return Plan::from_parts(spans, base_dir);
          },
          nb::arg("parts"), nb::arg("base_dir") = ".",
          "from_bytes for plan bytes given as a list of buffers (concatenated once, in C++).")
      .def(
          "weight_view",
          [](std::shared_ptr<const Plan> p, size_t i) -> nb::object {
            if (i >= p->weights.size())
              throw nb::index_error(
                  ("weight " + std::to_string(i) + " of " + std::to_string(p->weights.size()))
                      .c_str());
            const luminal::WeightSource &w = p->weights[i];
            if (w.external) return nb::none();
            // the array keeps the plan (and so its bytes) alive
            auto *hold = new std::shared_ptr<const Plan>(p);
            nb::capsule owner(hold, [](void *q) noexcept {
              delete static_cast<std::shared_ptr<const Plan> *>(q);
            });
            size_t shape[1] = {size_t(w.nbytes)};
            nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>> arr(p->blob + w.offset, 1, shape,
                                                                   owner);
            return nb::cast(arr);
          },
          nb::arg("i"),
          "Inline weight i's bytes in the plan's memory, as a read-only uint8 array (None for "
          "a weight kept in an external file).")
      .def_ro("backend", &Plan::backend)
      .def_ro("arch", &Plan::arch)
      .def_ro("metadata", &Plan::metadata)
      .def_prop_ro("num_steps", [](const Plan &p) { return p.steps.size(); })
      .def_prop_ro("num_kernels", [](const Plan &p) { return p.kernels.size(); })
      .def_prop_ro(
          "step_names",
          [](const Plan &p) {
            // what each step runs: the kernel name, the library function, or "copy"
            std::vector<std::string> out;
            for (const auto &s : p.steps)
              out.push_back(s.kind == luminal::StepKind::launch    ? p.kernels[s.kernel].name
                            : s.kind == luminal::StepKind::libcall ? "libcall:" + s.func
                                                                   : std::string("copy"));
            return out;
          },
          "Per step: kernel name, 'libcall:FUNC' or 'copy'.")
      .def_prop_ro(
          "dims",
          [](const Plan &p) {
            std::vector<std::tuple<std::string, int64_t, int64_t>> out;
            for (const auto &d : p.dims) out.emplace_back(d.name, d.min, d.max);
            return out;
          },
          "[(name, min, max)] in plan order.")
      .def_prop_ro(
          "io",
          [](const Plan &p) {
            // (buffer id, name, role, dtype, per shape entry: dim index if a bare dim else -1,
            //  the input buffer id an output updates in place or -1)
            std::vector<std::tuple<uint32_t, std::string, int, int, std::vector<int64_t>, int64_t>>
                out;
            for (uint32_t b = 0; b < p.buffers.size(); ++b) {
              const auto &buf = p.buffers[b];
              if (buf.role != luminal::Role::input && buf.role != luminal::Role::output) continue;
              std::vector<int64_t> bare;
              for (uint32_t e : buf.shape) {
                const auto &prog = p.exprs[e];
                bare.push_back(prog.size() == 1 && prog[0].op == luminal::Op::Dim ? prog[0].arg
                                                                                  : -1);
              }
              int64_t alias = buf.alias == luminal::kNone ? -1 : int64_t(buf.alias);
              out.emplace_back(b, buf.name, int(buf.role), int(buf.dtype), bare, alias);
            }
            return out;
          },
          "[(buffer id, name, role, dtype code, bare-dim index per shape entry or -1, "
          "input buffer id updated in place or -1)].");
}
