#include "cuda_api.hpp"

#include <dlfcn.h>
#include <mutex>

#include "../common.hpp"

namespace luminal::cuda {

namespace {

struct Loaded {
  Driver api{};
  std::string why; // empty when usable
};

// cuda.h maps several names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2, ...).
template <typename F> bool bind(void *lib, F &slot, const char *symbol, std::string &why) {
  slot = reinterpret_cast<F>(dlsym(lib, symbol));
  if (!slot && why.empty())
    why = std::string("libcuda.so.1 lacks ") + symbol + " (driver too old?)";
  return slot != nullptr;
}

Loaded load() {
  Loaded l;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    l.why = std::string("the NVIDIA driver library libcuda.so.1 cannot be loaded (") +
            (e ? e : "not found") + ")";
    return l;
  }
  Driver &d = l.api;
  std::string &w = l.why;
  bind(lib, d.cuGetErrorName, "cuGetErrorName", w);
  bind(lib, d.cuGetErrorString, "cuGetErrorString", w);
  bind(lib, d.cuInit, "cuInit", w);
  bind(lib, d.cuDriverGetVersion, "cuDriverGetVersion", w);
  bind(lib, d.cuDeviceGetCount, "cuDeviceGetCount", w);
  bind(lib, d.cuDeviceGet, "cuDeviceGet", w);
  bind(lib, d.cuDeviceGetName, "cuDeviceGetName", w);
  bind(lib, d.cuDeviceGetAttribute, "cuDeviceGetAttribute", w);
  bind(lib, d.cuDeviceTotalMem, "cuDeviceTotalMem_v2", w);
  bind(lib, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", w);
  bind(lib, d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", w);
  bind(lib, d.cuCtxSetCurrent, "cuCtxSetCurrent", w);
  bind(lib, d.cuStreamCreate, "cuStreamCreate", w);
  bind(lib, d.cuStreamDestroy, "cuStreamDestroy_v2", w);
  bind(lib, d.cuStreamSynchronize, "cuStreamSynchronize", w);
  bind(lib, d.cuMemAlloc, "cuMemAlloc_v2", w);
  bind(lib, d.cuMemFree, "cuMemFree_v2", w);
  bind(lib, d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", w);
  bind(lib, d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", w);
  bind(lib, d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", w);
  bind(lib, d.cuModuleLoadData, "cuModuleLoadData", w);
  bind(lib, d.cuModuleUnload, "cuModuleUnload", w);
  bind(lib, d.cuModuleGetFunction, "cuModuleGetFunction", w);
  bind(lib, d.cuFuncSetAttribute, "cuFuncSetAttribute", w);
  bind(lib, d.cuLaunchKernel, "cuLaunchKernel", w);
  bind(lib, d.cuStreamBeginCapture, "cuStreamBeginCapture_v2", w);
  bind(lib, d.cuStreamEndCapture, "cuStreamEndCapture", w);
  bind(lib, d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", w);
  bind(lib, d.cuGraphLaunch, "cuGraphLaunch", w);
  bind(lib, d.cuGraphExecDestroy, "cuGraphExecDestroy", w);
  bind(lib, d.cuGraphDestroy, "cuGraphDestroy", w);
  if (!w.empty()) return l;
  // The library stays loaded for the life of the process (the driver is not meant to unload).
  CUresult r = d.cuInit(0);
  int count = 0;
  if (r == CUDA_SUCCESS) r = d.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) {
    const char *name = nullptr;
    d.cuGetErrorName(r, &name);
    w = std::string("cuInit failed: ") + (name ? name : "unknown error") + " (" +
        std::to_string(r) + ")";
  } else if (count == 0) {
    w = "the NVIDIA driver is loaded but sees no GPU";
  }
  return l;
}

const Loaded &loaded() {
  static const Loaded l = load(); // thread-safe one-time initialization
  return l;
}

} // namespace

const Driver &driver() {
  const Loaded &l = loaded();
  if (!l.why.empty()) throw Error("CUDA unavailable: " + l.why);
  return l.api;
}

std::string unavailable_reason() {
  return loaded().why;
}

void check(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return;
  const Driver &d = loaded().api;
  const char *name = nullptr, *text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(r, &text);
  throw Error(std::string(call) + " failed: " + (name ? name : "CUDA error") + " (" +
              std::to_string(r) + ")" + (text ? std::string(": ") + text : ""));
}

} // namespace luminal::cuda
