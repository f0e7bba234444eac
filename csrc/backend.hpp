// The backend contract: what the executor needs from a device. A backend is created by name
// from the registry (make_backend); one that was not built answers with a clear error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plan.hpp"

namespace luminal {

using KernelHandle = void *; // backend-defined; e.g. a function pointer on CPU

// Evaluated launch geometry of one Launch step.
struct LaunchGeom {
  int64_t grid[3], block[3], shared_mem;
};

// A prepared library call (e.g. GEMM). Created once per executor from the step's named
// descriptor; bound again whenever dims change; then run with the step's buffer pointers.
class LibCallOp {
public:
  virtual ~LibCallOp() = default;
  // `vals` holds every plan expression's value; `buf_bytes` every buffer's size. Must throw
  // Error when the call would read or write outside its buffers.
  virtual void bind(const int64_t *vals, const int64_t *buf_bytes) = 0;
  virtual void run(void *const *args) = 0;
};

class Backend {
public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when host pointers (numpy arrays, mapped weights) may be passed to kernels as they
  // are; otherwise the executor stages inputs, outputs and weights through alloc/copy_*.
  virtual bool host_visible() const = 0;

  virtual void *alloc(size_t bytes) = 0; // device memory, 64-byte aligned, contents undefined
  // Device memory over `bytes` read-only host bytes the caller keeps mapped, without a copy
  // (unified memory); freed with free(). nullptr with `why` set when this backend cannot: the
  // caller copies into alloc() memory.
  virtual void *map_host(const void * /*host*/, size_t /*bytes*/, std::string *why) {
    *why = "this backend copies weights";
    return nullptr;
  }
  virtual void free(void *p) = 0;
  virtual void copy(void *dst, const void *src, size_t n) = 0; // device to device
  virtual void copy_in(void *dst, const void *host, size_t n) = 0;
  virtual void copy_out(void *host, const void *src, size_t n) = 0;

  // Compiles or loads every kernel of the plan once; result[i] is kernel i's handle.
  // Throws Error (with the compiler's log) on failure.
  virtual std::vector<KernelHandle> load_kernels(const Plan &plan) = 0;
  // Throws Error when the backend cannot run a launch of this geometry; `what` names it.
  virtual void check_launch(const LaunchGeom &g, const std::string &what) = 0;
  // Enqueues (or runs) one launch. `args` are the launch's buffer pointers, `dims` the
  // bound values of all plan dims.
  virtual void launch(KernelHandle k, const LaunchGeom &g, void *const *args,
                      const int64_t *dims) = 0;
  // Validates and prepares LibCall step `step`; throws PlanError on an unknown function,
  // unknown descriptor field or unsupported dtype.
  virtual std::unique_ptr<LibCallOp> make_libcall(const Plan &plan, size_t step) = 0;
  virtual void sync() = 0; // waits until all enqueued work is done
  // Calls `steps`, which enqueues every step of one run. `binding` changes whenever dims or
  // buffer pointers do, so a backend may record the steps once per binding and replay them
  // (CUDA graphs); the default just calls them.
  virtual void run_steps(uint64_t /*binding*/, const std::function<void()> &steps) { steps(); }
};

// "cpu" (always built) and "cpu-staged" (the CPU backend driven as if it were a device with
// its own memory; it exists to test the executor's staging path). Others throw Error.
std::unique_ptr<Backend> make_backend(const std::string &name);
std::vector<std::string> available_backends();

} // namespace luminal
