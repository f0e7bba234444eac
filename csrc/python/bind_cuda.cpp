// CUDA facts for luminal.cuda: whether a device is usable, and which.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "../common.hpp"

#ifdef LUMINAL_WITH_CUDA
#include "../cuda/cublaslt_api.hpp"
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
  m.def(
      "cuda_set_cublaslt_path",
      [](const std::string &path) {
#ifdef LUMINAL_WITH_CUDA
        luminal::cuda::set_cublaslt_path(path);
#else
        (void)path;
#endif
      },
      "Where the CUDA backend loads libcublasLt from (before its first gemm).");
  m.def(
      "cuda_cublaslt_version",
      []() -> int64_t {
#ifdef LUMINAL_WITH_CUDA
        return int64_t(luminal::cuda::cublaslt().cublasLtGetVersion());
#else
        throw luminal::Error("luminal was built without CUDA support");
#endif
      },
      "Loads cuBLASLt (every entry point the backend uses) and returns its version; raises "
      "RuntimeError('cuBLASLt unavailable: ...') when it cannot. Needs no GPU.");
}
