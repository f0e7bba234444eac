// CUDA facts for luminal.cuda: whether a device is usable, and which.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "../common.hpp"

#ifdef LUMINAL_WITH_CUDA
#include "../cuda/cuda_api.hpp"
#include "../cuda/cuda_backend.hpp"
#endif

namespace nb = nanobind;

void init_cuda(nb::module_ &m) {
  m.def(
      "cuda_unavailable_reason",
      []() -> std::string {
#ifdef LUMINAL_WITH_CUDA
        return luminal::cuda::unavailable_reason();
#else
        return "luminal was built without CUDA support";
#endif
      },
      "'' when a CUDA device can be used, else why not.");
  m.def(
      "cuda_device",
      [](int ordinal) {
#ifdef LUMINAL_WITH_CUDA
        luminal::cuda::DeviceInfo d =
            luminal::cuda::device_info(ordinal < 0 ? luminal::cuda::device_ordinal() : ordinal);
        return nb::make_tuple(d.name, d.arch(), d.sms, d.memory, d.driver_version);
#else
        (void)ordinal;
        throw luminal::Error("luminal was built without CUDA support");
        return nb::tuple();
#endif
      },
      nb::arg("ordinal") = -1,
      "(name, arch, SM count, memory bytes, driver version) of a device (-1: the one the "
      "backend uses).");
}
