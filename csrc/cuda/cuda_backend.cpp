// The CUDA backend: cubin kernels loaded with the driver API, one stream, device memory,
// cuBLASLt for gemm library calls, and the steps of a plan captured into a CUDA graph once per
// binding (dims and pointers) and replayed. Kernels take their buffers, then every plan dim
// (int64) by value; see codegen/cuda.py.
#include "cuda_backend.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>

#include "../backend.hpp"
#include "../gemm_desc.hpp"
#include "cublaslt_api.hpp"
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

// What a library call needs from the backend: the stream, a cuBLASLt handle, device memory.
struct CudaContext {
  CUstream stream = nullptr;
  cublasLtHandle_t lt = nullptr; // created on the first gemm
  std::function<void *(size_t)> alloc;
  std::function<void(void *)> free;
};

// A row-major gemm (the descriptor of compiler/search/gemm.py, as on the CPU backend) through
// cublasLtMatmul. cuBLASLt is column-major, so C^T = op(B)^T op(A)^T is computed: B is
// cuBLASLt's first operand and the row-major matrices are read as their transposes.
class LtGemm final : public LibCallOp {
  using enum GemmDesc::Index;

public:
  LtGemm(const Plan &plan, size_t step, CudaContext &ctx)
      : gemm_(plan.steps[step], "step " + std::to_string(step) + " (gemm)"), ctx_(ctx) {
    const Step &s = plan.steps[step];
    std::string at = "step " + std::to_string(step) + " (gemm)";
    DType a = plan.buffers[s.args[0]].dtype, b = plan.buffers[s.args[1]].dtype,
          c = plan.buffers[s.args[2]].dtype;
    bool half = a == DType::f16 || a == DType::bf16;
    bool ok =
        a == b && ((a == DType::f32 && c == DType::f32) || (a == DType::f64 && c == DType::f64) ||
                   (half && (c == a || c == DType::f32)));
    if (!ok)
      throw PlanError(at + ": cuBLASLt gemm takes f32 x f32 -> f32, f64 x f64 -> f64 or " +
                      "f16/bf16 x same -> same or f32, not " + dtype_name(a) + " x " +
                      dtype_name(b) + " -> " + dtype_name(c));
    type_a_ = lt_type(a);
    type_c_ = lt_type(c);
    f64_ = a == DType::f64;
    elem_a_ = dtype_nbytes(a, 1);
    elem_c_ = dtype_nbytes(c, 1);
    args_ = s.args;
    if (!ctx_.lt) LM_CUBLAS(cublasLtCreate, &ctx_.lt); // "cuBLASLt unavailable: ..." first
  }

  ~LtGemm() override {
    release();
    if (workspace_) ctx_.free(workspace_);
  }

  void bind(const int64_t *vals, const int64_t *buf_bytes) override {
    const int64_t elems[3] = {buf_bytes[args_[0]] / elem_a_, buf_bytes[args_[1]] / elem_a_,
                              buf_bytes[args_[2]] / elem_c_};
    GemmDesc::Bound bd = gemm_.bind(vals, elems);
    const int64_t *v = bd.v;
    int64_t m = v[kM], n = v[kN], k = v[kK];
    // cuBLASLt's strided batches take no negative strides or offsets
    for (int i : {kStrideA, kStrideB, kStrideC, kOffA, kOffB, kOffC})
      if (v[i] < 0 || v[i] > INT32_MAX)
        throw Error("cuBLASLt gemm: negative or too large batch stride or offset");
    double alpha = bd.alpha, beta = bd.beta;
    std::memcpy(v_, v, sizeof v_);
    alpha_ = alpha;
    beta_ = beta;
    release();
    empty_ = bd.empty();
    if (empty_) return;
    if (k == 0) throw Error("cuBLASLt gemm with k = 0 (the generated gemm kernel handles it)");
    const CublasLt &lt = cublaslt();
    (void)lt;
    LM_CUBLAS(cublasLtMatmulDescCreate, &desc_, f64_ ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
              f64_ ? CUDA_R_64F : CUDA_R_32F);
    int32_t op_first = v[kTransB] ? CUBLAS_OP_T : CUBLAS_OP_N; // B is cuBLASLt's "A"
    int32_t op_second = v[kTransA] ? CUBLAS_OP_T : CUBLAS_OP_N;
    LM_CUBLAS(cublasLtMatmulDescSetAttribute, desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
              sizeof op_first);
    LM_CUBLAS(cublasLtMatmulDescSetAttribute, desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
              sizeof op_second);
    // column-major views: row-major (r x c, ld) is column-major (c x r, ld)
    layout(&lay_b_, type_a_, v[kTransB] ? k : n, v[kTransB] ? n : k, v[kLdb], v[kStrideB]);
    layout(&lay_a_, type_a_, v[kTransA] ? m : k, v[kTransA] ? k : m, v[kLda], v[kStrideA]);
    layout(&lay_c_, type_c_, n, m, v[kLdc], v[kStrideC]);
    LM_CUBLAS(cublasLtMatmulPreferenceCreate, &pref_);
    uint64_t ws_max = kWorkspaceMax;
    LM_CUBLAS(cublasLtMatmulPreferenceSetAttribute, pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
              &ws_max, sizeof ws_max);
    // buffers start 64-byte aligned; offsets and batch strides may lower that
    uint32_t al_a = align(v[kOffA] * elem_a_, v[kStrideA] * elem_a_),
             al_b = align(v[kOffB] * elem_a_, v[kStrideB] * elem_a_),
             al_c = align(v[kOffC] * elem_c_, v[kStrideC] * elem_c_);
    LM_CUBLAS(cublasLtMatmulPreferenceSetAttribute, pref_,
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b, sizeof al_b);
    LM_CUBLAS(cublasLtMatmulPreferenceSetAttribute, pref_,
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a, sizeof al_a);
    LM_CUBLAS(cublasLtMatmulPreferenceSetAttribute, pref_,
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
    LM_CUBLAS(cublasLtMatmulPreferenceSetAttribute, pref_,
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
    int found = 0;
    LM_CUBLAS(cublasLtMatmulAlgoGetHeuristic, ctx_.lt, desc_, lay_b_, lay_a_, lay_c_, lay_c_, pref_,
              1, &heur_, &found);
    if (found < 1)
      throw Error("cublasLtMatmulAlgoGetHeuristic found no algorithm for gemm m=" +
                  std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
    // bind runs outside any graph capture, so growing the workspace here is safe
    if (heur_.workspaceSize > workspace_bytes_) {
      if (workspace_) ctx_.free(workspace_);
      workspace_ = nullptr;
      workspace_bytes_ = 0;
      workspace_ = ctx_.alloc(heur_.workspaceSize);
      workspace_bytes_ = heur_.workspaceSize;
    }
  }

  void run(void *const *args) override {
    if (empty_) return;
    auto at = [](void *p, int64_t off, int64_t elem) {
      return static_cast<char *>(p) + off * elem;
    };
    const void *a = at(args[0], v_[kOffA], elem_a_), *b = at(args[1], v_[kOffB], elem_a_);
    void *c = at(args[2], v_[kOffC], elem_c_);
    float alpha32 = float(alpha_), beta32 = float(beta_);
    const void *alpha = f64_ ? static_cast<const void *>(&alpha_) : &alpha32;
    const void *beta = f64_ ? static_cast<const void *>(&beta_) : &beta32;
    LM_CUBLAS(cublasLtMatmul, ctx_.lt, desc_, alpha, b, lay_b_, a, lay_a_, beta, c, lay_c_, c,
              lay_c_, &heur_.algo, workspace_, workspace_bytes_, ctx_.stream);
  }

private:
  GemmDesc gemm_;
  static constexpr uint64_t kWorkspaceMax = 32ull << 20;

  static int lt_type(DType t) {
    switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_16BF;
    }
  }
  static uint32_t align(int64_t off_bytes, int64_t stride_bytes) {
    int64_t a = std::gcd(std::gcd(int64_t(kAlign), off_bytes), stride_bytes);
    return uint32_t(a ? a : kAlign);
  }
  void layout(cublasLtMatrixLayout_t *l, int type, int64_t rows, int64_t cols, int64_t ld,
              int64_t stride) {
    LM_CUBLAS(cublasLtMatrixLayoutCreate, l, type, uint64_t(rows), uint64_t(cols), ld);
    if (v_[kBatch] > 1) {
      int32_t count = int32_t(v_[kBatch]);
      LM_CUBLAS(cublasLtMatrixLayoutSetAttribute, *l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                sizeof count);
      LM_CUBLAS(cublasLtMatrixLayoutSetAttribute, *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &stride, sizeof stride);
    }
  }
  // Destroys the descriptors of the previous binding (errors ignored: nothing to do about them).
  void release() {
    if (desc_) cublaslt().cublasLtMatmulDescDestroy(desc_);
    for (cublasLtMatrixLayout_t *l : {&lay_a_, &lay_b_, &lay_c_})
      if (*l) cublaslt().cublasLtMatrixLayoutDestroy(*l);
    if (pref_) cublaslt().cublasLtMatmulPreferenceDestroy(pref_);
    desc_ = nullptr;
    lay_a_ = lay_b_ = lay_c_ = nullptr;
    pref_ = nullptr;
  }
  CudaContext &ctx_;
  int type_a_ = 0, type_c_ = 0;
  bool f64_ = false, empty_ = true;
  int64_t elem_a_ = 4, elem_c_ = 4;
  std::vector<const Field *> fields_;
  std::vector<uint32_t> args_;
  int64_t v_[kNum] = {};
  double alpha_ = 1.0, beta_ = 0.0;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t lay_a_ = nullptr, lay_b_ = nullptr, lay_c_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulHeuristicResult_t heur_{};
  void *workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// One warning per process when graph capture does not work here.
void warn_no_graphs(const std::string &why) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fprintf(stderr,
                 "luminal: CUDA graph capture failed (%s); running plan steps as "
                 "plain launches\n",
                 why.c_str());
}

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
    lib_.stream = stream_;
    lib_.alloc = [this](size_t n) { return alloc(n); };
    lib_.free = [this](void *p) { free(p); };
  }

  ~CudaBackend() override {
    // Destructors must not throw: errors here (e.g. after a device fault) are ignored.
    const Driver &d = driver();
    d.cuCtxSetCurrent(ctx_);
    if (stream_) d.cuStreamSynchronize(stream_);
    if (graph_) d.cuGraphExecDestroy(graph_);
    if (lib_.lt) cublaslt().cublasLtDestroy(lib_.lt);
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
    const std::string &f = plan.steps[step].func;
    make_current();
    if (f == "gemm") return std::make_unique<LtGemm>(plan, step, lib_);
    throw PlanError("step " + std::to_string(step) +
                    ": the cuda backend has no library function '" + f + "' (it has: gemm)");
  }

  // The first run of a binding is captured into a CUDA graph and launched; later runs of the
  // same binding launch the graph (one call instead of one per step).
  void run_steps(uint64_t binding, const std::function<void()> &steps) override {
    make_current();
    if (!graphs_) return steps();
    const Driver &d = driver();
    if (graph_ && binding == graph_binding_) {
      LM_CU(cuGraphLaunch, graph_, stream_);
      return;
    }
    if (graph_) d.cuGraphExecDestroy(graph_);
    graph_ = nullptr;
    CUresult r = d.cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (r != CUDA_SUCCESS) return fall_back("cuStreamBeginCapture", r, steps);
    CUgraph g = nullptr;
    try {
      steps();
    } catch (const std::exception &e) {
      d.cuStreamEndCapture(stream_, &g); // leaves the stream usable again
      if (g) d.cuGraphDestroy(g);
      graphs_ = false;
      warn_no_graphs(e.what());
      return steps(); // a real error throws again, now outside the capture
    }
    r = d.cuStreamEndCapture(stream_, &g);
    if (r != CUDA_SUCCESS) return fall_back("cuStreamEndCapture", r, steps);
    CUgraphExec exec = nullptr;
    r = d.cuGraphInstantiateWithFlags(&exec, g, 0);
    d.cuGraphDestroy(g); // the executable graph holds what it needs
    if (r != CUDA_SUCCESS) return fall_back("cuGraphInstantiateWithFlags", r, steps);
    graph_ = exec;
    graph_binding_ = binding;
    LM_CU(cuGraphLaunch, graph_, stream_);
  }

  void sync() override {
    make_current();
    LM_CU(cuStreamSynchronize, stream_);
  }

private:
  static CUdeviceptr dptr(const void *p) { return reinterpret_cast<CUdeviceptr>(p); }

  void fall_back(const char *call, CUresult r, const std::function<void()> &steps) {
    graphs_ = false;
    try {
      check(r, call);
    } catch (const Error &e) {
      warn_no_graphs(e.what());
    }
    steps();
  }

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
  CudaContext lib_;
  bool graphs_ = true;
  CUgraphExec graph_ = nullptr;
  uint64_t graph_binding_ = 0;
  int64_t max_threads_ = 0, max_block_[3] = {}, max_grid_[3] = {}, max_smem_ = 0;
};

} // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  return std::make_unique<CudaBackend>();
}

} // namespace luminal
