// luminal._rt: the private native module behind python/luminal/runtime.py.
#include <cstring>

#include <nanobind/nanobind.h>

#include "../common.hpp"
#include "../plan.hpp"

namespace nb = nanobind;

void init_plan(nb::module_ &m);
void init_executor(nb::module_ &m);
void init_cuda(nb::module_ &m);
void init_compiler(nb::module_ &m);

NB_MODULE(_rt, m) {
  m.doc() = "luminal's native runtime (private; use luminal.runtime).";
  m.attr("FORMAT_VERSION") = luminal::kFormatVersion;

  // PlanError lives in luminal.plan (pure Python) so plan tooling works without this module.
  nb::register_exception_translator([](const std::exception_ptr &p, void *) {
    // Messages may quote bytes from a corrupt file: decode them leniently.
    auto set = [](PyObject *type, const char *msg) {
      PyObject *s = PyUnicode_DecodeUTF8(msg, Py_ssize_t(std::strlen(msg)), "replace");
      PyErr_SetObject(type, s);
      Py_XDECREF(s);
    };
    try {
      std::rethrow_exception(p);
    } catch (const luminal::PlanError &e) {
      nb::object cls = nb::module_::import_("luminal.plan").attr("PlanError");
      set(cls.ptr(), e.what());
    } catch (const luminal::InputError &e) {
      set(PyExc_ValueError, e.what());
    } catch (const luminal::Error &e) {
      set(PyExc_RuntimeError, e.what());
    }
  });

  init_plan(m);
  init_executor(m);
  init_cuda(m);
  init_compiler(m);
}
