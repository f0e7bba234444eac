// The executor: shapes for a set of dims, and run() with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "../executor.hpp"

namespace nb = nanobind;
using luminal::Executor;
using Array = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

namespace {

// Input and output buffer ids in plan order (the order of Plan.io).
std::vector<uint32_t> io_ids(const luminal::Plan &p) {
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b < p.buffers.size(); ++b)
    if (p.buffers[b].role == luminal::Role::input || p.buffers[b].role == luminal::Role::output)
      ids.push_back(b);
  return ids;
}

struct PyExecutor {
  PyExecutor(std::shared_ptr<const luminal::Plan> plan, const std::string &backend)
      : ex(std::move(plan), backend), ids(io_ids(ex.plan())), n_buffers(ex.plan().buffers.size()) {}

  std::vector<nb::tuple> shapes(const std::vector<int64_t> &dims) {
    std::vector<int64_t> vals = ex.evaluate(dims);
    std::vector<nb::tuple> out;
    for (uint32_t b : ids) {
      nb::list l;
      for (int64_t d : ex.shape(vals, b)) l.append(d);
      out.push_back(nb::tuple(l));
    }
    return out;
  }

  void run(const std::vector<int64_t> &dims, const std::vector<Array> &arrays) {
    if (arrays.size() != ids.size())
      throw luminal::InputError("expected " + std::to_string(ids.size()) + " arrays");
    std::vector<void *> ptrs(n_buffers, nullptr);
    std::vector<size_t> sizes(n_buffers, 0);
    for (size_t i = 0; i < ids.size(); ++i) {
      ptrs[ids[i]] = const_cast<void *>(arrays[i].data());
      sizes[ids[i]] = arrays[i].nbytes();
    }
    nb::gil_scoped_release release;
    ex.run(dims, ptrs.data(), sizes.data());
  }

  // Addresses instead of arrays, sizes unchecked: for callers that hold other libraries'
  // tensors (the torch backend), whose shapes they have checked for these dims.
  void run_addresses(const std::vector<int64_t> &dims, const std::vector<uintptr_t> &addresses) {
    if (addresses.size() != ids.size())
      throw luminal::InputError("expected " + std::to_string(ids.size()) + " addresses");
    std::vector<void *> ptrs(n_buffers, nullptr);
    for (size_t i = 0; i < ids.size(); ++i) ptrs[ids[i]] = reinterpret_cast<void *>(addresses[i]);
    nb::gil_scoped_release release;
    ex.run(dims, ptrs.data());
  }

  Executor ex;
  std::vector<uint32_t> ids;
  size_t n_buffers;
};

} // namespace

void init_executor(nb::module_ &m) {
  nb::class_<PyExecutor>(m, "Executor", "Runs one plan on one backend (private).")
      .def(nb::init<std::shared_ptr<const luminal::Plan>, const std::string &>(), nb::arg("plan"),
           nb::arg("backend") = "cpu", "Loads kernels (compiling C once, cached) and weights.")
      .def("shapes", &PyExecutor::shapes, nb::arg("dims"),
           "Shapes of the inputs and outputs (Plan.io order) for dims in plan order.")
      .def("run", &PyExecutor::run, nb::arg("dims"), nb::arg("arrays"),
           "Runs the plan; arrays are C-contiguous, in Plan.io order, outputs writable.")
      .def("run_addresses", &PyExecutor::run_addresses, nb::arg("dims"), nb::arg("addresses"),
           "Runs the plan on C-contiguous memory at these addresses (Plan.io order); the "
           "caller guarantees each holds its buffer's bytes for these dims.")
      .def(
          "set_profiling", [](PyExecutor &e, bool on) { e.ex.set_profiling(on); }, nb::arg("on"),
          "Times every step of later runs (per-step wall time, device synced).")
      .def(
          "profile", [](const PyExecutor &e) { return e.ex.profile(); },
          "Per step: (total nanoseconds, calls) since profiling was turned on.")
      .def_prop_ro("arena_bytes", [](const PyExecutor &e) { return e.ex.arena_bytes(); })
      .def_prop_ro("backend", [](const PyExecutor &e) { return e.ex.backend().name(); });
  m.def("backends", &luminal::available_backends, "Names of the backends built in.");
}
