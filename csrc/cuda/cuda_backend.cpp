// The CUDA backend: cubin kernels loaded with the driver API, one stream, device memory.
// Kernels take their buffers, then every plan dim (int64) by value; see codegen/cuda.py.
#include "cuda_backend.hpp"

#include <cstdlib>
#include <cstring>
#include <map>

#include "../backend.hpp"
#include "cuda_api.hpp"

namespace luminal {
namespace cuda {

DeviceInfo device_info(int ordinal) {
  const Driver &d = driver();
  int count = 0;
  LM_CU(cuDeviceGetCount, &count);
  if (ordinal < 0 || ordinal >= count)
    throw Error("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                std::to_string(count) + " visible)");
  DeviceInfo info;
  CUdevice dev = 0;
  LM_CU(cuDeviceGet, &dev, ordinal);
  char name[256] = {};
  LM_CU(cuDeviceGetName, name, int(sizeof name) - 1, dev);
  info.name = name;
  LM_CU(cuDeviceGetAttribute, &info.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  LM_CU(cuDeviceGetAttribute, &info.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  LM_CU(cuDeviceGetAttribute, &info.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  LM_CU(cuDeviceTotalMem, &info.memory, dev);
  LM_CU(cuDriverGetVersion, &info.driver_version);
  (void)d;
  return info;
}

int device_ordinal() {
  const char *s = std::getenv("LUMINAL_CUDA_DEVICE");
  return s && *s ? std::atoi(s) : 0;
}

} // namespace cuda

namespace {

using namespace cuda;

// One loaded kernel: its function and how many buffer arguments its launches pass.
struct KernelRec {
  CUfunction fn = nullptr;
  size_t nargs = 0;
  int64_t smem_optin = 0; // dynamic shared memory the function was opened up to
};

class CudaBackend final : public Backend {
public:
  CudaBackend() {
    driver(); // throws "CUDA unavailable: ..." first
    ordinal_ = device_ordinal();
    info_ = device_info(ordinal_);
    LM_CU(cuDeviceGet, &dev_, ordinal_);
    // The primary context is the one the CUDA runtime (and so PyTorch) uses: pointers mix.
    LM_CU(cuDevicePrimaryCtxRetain, &ctx_, dev_);
    make_current();
    LM_CU(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
    auto attr = [&](CUdevice_attribute a) {
      int v = 0;
      LM_CU(cuDeviceGetAttribute, &v, a, dev_);
      return int64_t(v);
    };
    max_threads_ = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    max_block_[0] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
    max_block_[1] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
    max_block_[2] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    max_grid_[0] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    max_grid_[1] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    max_grid_[2] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
    max_smem_ = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  }

  ~CudaBackend() override {
    // Destructors must not throw: errors here (e.g. after a device fault) are ignored.
    const Driver &d = driver();
    d.cuCtxSetCurrent(ctx_);
    if (stream_) d.cuStreamSynchronize(stream_);
    for (CUmodule m : modules_) d.cuModuleUnload(m);
    if (stream_) d.cuStreamDestroy(stream_);
    d.cuDevicePrimaryCtxRelease(dev_);
  }

  std::string name() const override { return "cuda"; }
  bool host_visible() const override { return false; }

  void *alloc(size_t bytes) override {
    make_current();
    CUdeviceptr p = 0;
    LM_CU(cuMemAlloc, &p, std::max<size_t>(bytes, kAlign)); // 256-byte aligned
    return reinterpret_cast<void *>(p);
  }
  void free(void *p) override {
    if (!p) return;
    make_current();
    LM_CU(cuMemFree, reinterpret_cast<CUdeviceptr>(p));
  }
  void copy(void *dst, const void *src, size_t n) override {
    make_current();
    LM_CU(cuMemcpyDtoDAsync, dptr(dst), dptr(src), n, stream_);
  }
  void copy_in(void *dst, const void *host, size_t n) override {
    // Stream-ordered after earlier work; from pageable memory it returns once `host` is read.
    make_current();
    LM_CU(cuMemcpyHtoDAsync, dptr(dst), host, n, stream_);
  }
  void copy_out(void *host, const void *src, size_t n) override {
    make_current();
    LM_CU(cuMemcpyDtoHAsync, host, dptr(src), n, stream_);
    LM_CU(cuStreamSynchronize, stream_);
  }

  std::vector<KernelHandle> load_kernels(const Plan &plan) override {
    make_current();
    std::vector<KernelHandle> handles(plan.kernels.size(), nullptr);
    std::map<uint32_t, size_t> nargs; // only launched kernels are loaded
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const Step &s = plan.steps[i];
      if (s.kind != StepKind::launch) continue;
      auto [it, fresh] = nargs.emplace(s.kernel, s.args.size());
      if (!fresh && it->second != s.args.size())
        throw PlanError("step " + std::to_string(i) + ": kernel '" + plan.kernels[s.kernel].name +
                        "' is launched with " + std::to_string(s.args.size()) +
                        " buffers here and " + std::to_string(it->second) + " elsewhere");
    }
    for (auto [id, n] : nargs) {
      const Kernel &k = plan.kernels[id];
      if (k.format != KernelFormat::cubin && k.format != KernelFormat::ptx)
        throw Error("the cuda backend cannot run kernel '" + k.name + "' of format " +
                    kernel_format_name(k.format) +
                    " (it loads cubin and ptx; compile the graph with backend=\"cuda\")");
      CUmodule mod = nullptr;
      // PTX is text and must end in NUL; std::string keeps one after its bytes.
      CUresult r = driver().cuModuleLoadData(&mod, k.code.c_str());
      if (r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_IMAGE ||
          r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION || r == CUDA_ERROR_INVALID_PTX)
        throw Error("kernel '" + k.name + "' was built for " +
                    (plan.arch.empty() ? std::string("another GPU") : plan.arch) +
                    " and does not load on " + info_.name + " (" + info_.arch() +
                    "); recompile the plan there, or with LUMINAL_CUDA_ARCH=" + info_.arch() +
                    " (cuModuleLoadData: error " + std::to_string(r) + ")");
      check(r, "cuModuleLoadData");
      modules_.push_back(mod);
      auto rec = std::make_unique<KernelRec>();
      CUresult fr = driver().cuModuleGetFunction(&rec->fn, mod, k.entry.c_str());
      if (fr != CUDA_SUCCESS)
        throw PlanError("kernel '" + k.name + "': its module has no entry point '" + k.entry + "'");
      rec->nargs = n;
      handles[id] = rec.get();
      kernels_.push_back(std::move(rec));
    }
    n_dims_ = plan.dims.size();
    return handles;
  }

  void check_launch(const LaunchGeom &g, const std::string &what) override {
    int64_t threads = 1;
    for (int i = 0; i < 3; ++i) {
      if (g.grid[i] < 0 || g.grid[i] > max_grid_[i])
        throw PlanError(what + ": grid[" + std::to_string(i) + "] = " + std::to_string(g.grid[i]) +
                        " is outside [0, " + std::to_string(max_grid_[i]) + "]");
      if (g.block[i] < 1 || g.block[i] > max_block_[i])
        throw PlanError(what + ": block[" + std::to_string(i) +
                        "] = " + std::to_string(g.block[i]) + " is outside [1, " +
                        std::to_string(max_block_[i]) + "]");
      threads *= g.block[i];
    }
    if (threads > max_threads_)
      throw PlanError(what + ": " + std::to_string(threads) + " threads per block (at most " +
                      std::to_string(max_threads_) + ")");
    if (g.shared_mem < 0 || g.shared_mem > max_smem_)
      throw PlanError(what + ": " + std::to_string(g.shared_mem) +
                      " bytes of shared memory (at most " + std::to_string(max_smem_) + ")");
  }

  void launch(KernelHandle k, const LaunchGeom &g, void *const *args,
              const int64_t *dims) override {
    auto *rec = static_cast<KernelRec *>(k);
    if (g.grid[0] == 0 || g.grid[1] == 0 || g.grid[2] == 0) return; // empty output
    make_current();
    if (g.shared_mem > 48 * 1024 && g.shared_mem > rec->smem_optin) {
      LM_CU(cuFuncSetAttribute, rec->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            int(g.shared_mem));
      rec->smem_optin = g.shared_mem;
    }
    // cuLaunchKernel copies each parameter from the address given: buffers, then dims.
    params_.resize(rec->nargs + n_dims_);
    for (size_t i = 0; i < rec->nargs; ++i) params_[i] = const_cast<void **>(&args[i]);
    for (size_t i = 0; i < n_dims_; ++i) params_[rec->nargs + i] = const_cast<int64_t *>(&dims[i]);
    LM_CU(cuLaunchKernel, rec->fn, unsigned(g.grid[0]), unsigned(g.grid[1]), unsigned(g.grid[2]),
          unsigned(g.block[0]), unsigned(g.block[1]), unsigned(g.block[2]), unsigned(g.shared_mem),
          stream_, params_.data(), nullptr);
  }

  std::unique_ptr<LibCallOp> make_libcall(const Plan &plan, size_t step) override {
    throw PlanError("step " + std::to_string(step) +
                    ": the cuda backend has no library functions yet (asked for '" +
                    plan.steps[step].func + "')");
  }

  void sync() override {
    make_current();
    LM_CU(cuStreamSynchronize, stream_);
  }

private:
  static CUdeviceptr dptr(const void *p) { return reinterpret_cast<CUdeviceptr>(p); }

  // Driver calls act on the calling thread's current context; runs may come from any thread.
  void make_current() {
    thread_local CUcontext current = nullptr;
    if (current != ctx_) {
      LM_CU(cuCtxSetCurrent, ctx_);
      current = ctx_;
    }
  }

  int ordinal_ = 0;
  DeviceInfo info_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  std::vector<CUmodule> modules_;
  std::vector<std::unique_ptr<KernelRec>> kernels_;
  std::vector<void *> params_;
  size_t n_dims_ = 0;
  int64_t max_threads_ = 0, max_block_[3] = {}, max_grid_[3] = {}, max_smem_ = 0;
};

} // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  return std::make_unique<CudaBackend>();
}

} // namespace luminal
