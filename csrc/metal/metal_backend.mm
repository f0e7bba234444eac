// The Metal backend: MSL kernels (codegen/metal/) compiled with newLibraryWithSource when the
// plan loads (all of a plan's kernels as one library), one pipeline state per kernel made once,
// the steps of a run encoded into one command buffer (one compute encoder; copies as blits),
// committed and waited for at sync. Buffers are MTLBuffers in shared storage (unified memory:
// the CPU copies in and out of `contents` directly); mapped weights can back buffers without a
// copy (map_host). Kernels take their buffers at [[buffer(0..n-1)]], then every plan dim
// (int64) in one constant buffer at [[buffer(n)]], set with setBytes. Gemm library calls run as
// MPSMatrixMultiplication. Every failing Metal call throws an Error naming the call. Built with
// ARC (-fobjc-arc).
#include "metal_backend.hpp"

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#import <MetalPerformanceShaders/MetalPerformanceShaders.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "../backend.hpp"
#include "host_map.hpp"

namespace luminal {
namespace {

std::string describe(NSError *err) {
  if (err == nil) return "no error description";
  const char *s = [[err localizedDescription] UTF8String];
  return s ? std::string(s) : std::string("no error description");
}

// A nil result of `call` (with its NSError, when it gives one) becomes an Error naming it.
template <typename T> T checked(T obj, const char *call, NSError *err = nil,
                                const std::string &what = "") {
  if (obj == nil)
    throw Error(std::string("Metal ") + call + " failed" + (what.empty() ? "" : " for " + what) +
                ": " + describe(err));
  return obj;
}

struct KernelRec {
  id<MTLComputePipelineState> pipeline = nil;
  std::string name;
  size_t nargs = 0;
};

// A buffer the backend allocated, found from any pointer into it (the executor passes
// pointers into its arena).
struct Allocation {
  id<MTLBuffer> buffer = nil;
  size_t bytes = 0;
};

class MetalBackend;

// A row-major gemm (the descriptor every backend reads) through MPSMatrixMultiplication.
class MpsGemm final : public LibCallOp {
public:
  MpsGemm(const Plan &plan, size_t step, MetalBackend &be);
  void bind(const int64_t *vals, const int64_t *buf_bytes) override;
  void run(void *const *args) override;

private:
  enum { kM, kN, kK, kLda, kLdb, kLdc, kBatch, kSA, kSB, kSC, kOA, kOB, kOC, kTA, kTB, kNum };
  MetalBackend &be_;
  std::vector<const Field *> fields_;
  std::vector<uint32_t> args_;
  MPSDataType type_a_ = MPSDataTypeFloat32, type_c_ = MPSDataTypeFloat32;
  int64_t elem_a_ = 4, elem_c_ = 4;
  int64_t v_[kNum] = {};
  double alpha_ = 1.0, beta_ = 0.0;
  MPSMatrixMultiplication *mm_ = nil;
};

class MetalBackend final : public Backend {
public:
  MetalBackend() {
    @autoreleasepool {
      device_ = MTLCreateSystemDefaultDevice();
      if (device_ == nil) throw Error("Metal unavailable: MTLCreateSystemDefaultDevice found no GPU");
      queue_ = checked([device_ newCommandQueue], "newCommandQueue");
    }
  }
  ~MetalBackend() override {
    try {
      sync();
    } catch (...) {
    }
  }

  std::string name() const override { return "metal"; }
  bool host_visible() const override { return false; } // kernels need MTLBuffers
  id<MTLDevice> device() const { return device_; }

  void *alloc(size_t bytes) override {
    @autoreleasepool {
      id<MTLBuffer> b = checked(
          [device_ newBufferWithLength:std::max<size_t>(bytes, 64) options:MTLResourceStorageModeShared],
          "newBufferWithLength", nil, std::to_string(bytes) + " bytes");
      void *p = [b contents];
      allocs_[reinterpret_cast<uintptr_t>(p)] = Allocation{b, bytes};
      return p;
    }
  }

  // The `bytes` read-only host bytes at `host` (weights the caller keeps mapped while this
  // backend lives) as a shared-storage buffer without a copy: returns `host`, which kernels
  // then take as any buffer pointer, and free(host) drops only the wrapper. nullptr, with
  // `why` set, when Metal cannot wrap them: the caller copies them into alloc() memory.
  void *map_host(const void *host, size_t bytes, std::string *why) override {
    auto at = reinterpret_cast<uintptr_t>(host);
    size_t len = metal::nocopy_length(at, bytes, size_t(getpagesize()), why);
    if (len == 0) return nullptr;
    @autoreleasepool {
      id<MTLBuffer> b = [device_ newBufferWithBytesNoCopy:const_cast<void *>(host)
                                                   length:len
                                                  options:MTLResourceStorageModeShared
                                              deallocator:nil];
      if (b == nil) {
        *why = "newBufferWithBytesNoCopy gave no buffer for " + std::to_string(len) + " bytes";
        return nullptr;
      }
      allocs_[at] = Allocation{b, bytes};
      return const_cast<void *>(host);
    }
  }

  void free(void *p) override {
    if (p == nullptr) return;
    sync(); // the GPU may still read it
    allocs_.erase(reinterpret_cast<uintptr_t>(p));
  }

  // Device-to-device copies are steps of a run: a blit in the command buffer, in order.
  void copy(void *dst, const void *src, size_t n) override {
    auto [db, doff] = find(dst, n, "copy destination");
    auto [sb, soff] = find(src, n, "copy source");
    end_compute();
    id<MTLBlitCommandEncoder> blit = checked([command_buffer() blitCommandEncoder],
                                             "blitCommandEncoder");
    [blit copyFromBuffer:sb sourceOffset:soff toBuffer:db destinationOffset:doff size:n];
    [blit endEncoding];
  }

  void copy_in(void *dst, const void *host, size_t n) override {
    sync();
    std::memcpy(dst, host, n);
  }

  void copy_out(void *host, const void *src, size_t n) override {
    sync();
    std::memcpy(host, src, n);
  }

  std::vector<KernelHandle> load_kernels(const Plan &plan) override {
    @autoreleasepool {
      ndims_ = plan.dims.size();
      recs_.clear();
      recs_.resize(plan.kernels.size());
      for (const Step &s : plan.steps)
        if (s.kind == StepKind::launch && s.kernel < recs_.size())
          recs_[s.kernel].nargs = std::max(recs_[s.kernel].nargs, s.args.size());
      for (const Kernel &k : plan.kernels)
        if (k.format != KernelFormat::msl)
          throw PlanError("kernel '" + k.name +
                          "': the metal backend runs MSL source kernels, not format " +
                          std::to_string(int(k.format)));
      id<MTLLibrary> lib = library(plan);
      std::vector<KernelHandle> out;
      for (size_t i = 0; i < plan.kernels.size(); ++i) {
        const Kernel &k = plan.kernels[i];
        NSString *entry = [NSString stringWithUTF8String:k.entry.c_str()];
        id<MTLFunction> fn = checked([lib newFunctionWithName:entry], "newFunctionWithName", nil,
                                     "kernel '" + k.name + "' (entry '" + k.entry + "')");
        NSError *err = nil;
        recs_[i].pipeline =
            checked([device_ newComputePipelineStateWithFunction:fn error:&err],
                    "newComputePipelineStateWithFunction", err, "kernel '" + k.name + "'");
        recs_[i].name = k.name;
        out.push_back(&recs_[i]);
      }
      return out;
    }
  }

  // One library for all of the plan's kernels: the sources share their prelude (it is
  // include-guarded) and the kernels' names are unique, so they compile as one translation
  // unit, once per backend. When that fails, each kernel alone finds the one to blame.
  id<MTLLibrary> library(const Plan &plan) {
    std::string all;
    for (const Kernel &k : plan.kernels) all += k.code + "\n";
    auto cached = libraries_.find(all);
    if (cached != libraries_.end()) return cached->second;
    MTLCompileOptions *opts = [[MTLCompileOptions alloc] init];
    // the kernels rely on IEEE NaN and infinity (max propagates NaN, -inf padding)
    opts.fastMathEnabled = NO;
    opts.languageVersion = MTLLanguageVersion2_4;
    auto compile = [&](const std::string &src, NSError **err) {
      NSString *text = checked([[NSString alloc] initWithBytes:src.data()
                                                        length:src.size()
                                                      encoding:NSUTF8StringEncoding],
                               "NSString initWithBytes");
      return [device_ newLibraryWithSource:text options:opts error:err];
    };
    NSError *err = nil;
    id<MTLLibrary> lib = compile(all, &err);
    if (lib == nil) {
      for (const Kernel &k : plan.kernels) {
        NSError *one = nil;
        if (compile(k.code, &one) == nil)
          checked(id<MTLLibrary>(nil), "newLibraryWithSource", one, "kernel '" + k.name + "'");
      }
      checked(lib, "newLibraryWithSource", err, "the plan's kernels together");
    }
    libraries_[all] = lib;
    return lib;
  }

  void check_launch(const LaunchGeom &g, const std::string &what) override {
    MTLSize most = [device_ maxThreadsPerThreadgroup];
    int64_t threads = g.block[0] * g.block[1] * g.block[2];
    if (g.block[0] < 1 || g.block[1] < 1 || g.block[2] < 1 || g.block[0] > int64_t(most.width) ||
        g.block[1] > int64_t(most.height) || g.block[2] > int64_t(most.depth) || threads > 1024)
      throw PlanError(what + ": threadgroup of " + std::to_string(g.block[0]) + "x" +
                      std::to_string(g.block[1]) + "x" + std::to_string(g.block[2]) +
                      " threads is more than this GPU allows");
    for (int k = 0; k < 3; ++k)
      if (g.grid[k] < 0 || g.grid[k] > int64_t(UINT32_MAX))
        throw PlanError(what + ": grid dimension " + std::to_string(k) + " of " +
                        std::to_string(g.grid[k]) + " threadgroups is out of range");
    if (g.shared_mem != 0)
      throw PlanError(what + ": Metal kernels declare their threadgroup memory (shared_mem must "
                             "be 0, not " + std::to_string(g.shared_mem) + ")");
  }

  void launch(KernelHandle h, const LaunchGeom &g, void *const *args,
              const int64_t *dims) override {
    auto *k = static_cast<KernelRec *>(h);
    if (g.grid[0] == 0 || g.grid[1] == 0 || g.grid[2] == 0) return;
    int64_t threads = g.block[0] * g.block[1] * g.block[2];
    if (threads > int64_t([k->pipeline maxTotalThreadsPerThreadgroup]))
      throw Error("kernel '" + k->name + "': " + std::to_string(threads) +
                  " threads per threadgroup, its pipeline allows " +
                  std::to_string([k->pipeline maxTotalThreadsPerThreadgroup]));
    id<MTLComputeCommandEncoder> enc = compute();
    [enc setComputePipelineState:k->pipeline];
    for (size_t i = 0; i < k->nargs; ++i) {
      auto [buf, off] = find(args[i], 0, "argument " + std::to_string(i) + " of " + k->name);
      [enc setBuffer:buf offset:off atIndex:i];
    }
    int64_t none = 0;
    [enc setBytes:(ndims_ ? static_cast<const void *>(dims) : &none)
           length:sizeof(int64_t) * std::max<size_t>(ndims_, 1)
          atIndex:k->nargs];
    [enc dispatchThreadgroups:MTLSizeMake(g.grid[0], g.grid[1], g.grid[2])
        threadsPerThreadgroup:MTLSizeMake(g.block[0], g.block[1], g.block[2])];
  }

  std::unique_ptr<LibCallOp> make_libcall(const Plan &plan, size_t step) override {
    const std::string &f = plan.steps[step].func;
    if (f == "gemm") return std::make_unique<MpsGemm>(plan, step, *this);
    throw PlanError("step " + std::to_string(step) +
                    ": the metal backend has no library function '" + f + "' (it has: gemm)");
  }

  void sync() override {
    if (cmd_ == nil) return;
    end_compute();
    id<MTLCommandBuffer> cb = cmd_;
    cmd_ = nil;
    [cb commit];
    [cb waitUntilCompleted];
    if ([cb status] == MTLCommandBufferStatusError)
      throw Error("Metal command buffer failed: " + describe([cb error]));
  }

  // The command buffer of this run (made on its first step).
  id<MTLCommandBuffer> command_buffer() {
    if (cmd_ == nil) cmd_ = checked([queue_ commandBuffer], "commandBuffer");
    return cmd_;
  }

  void end_compute() {
    if (enc_ != nil) [enc_ endEncoding];
    enc_ = nil;
  }

  // The buffer holding `p` and p's offset in it; `n` bytes from p must fit.
  std::pair<id<MTLBuffer>, size_t> find(const void *p, size_t n, const std::string &what) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = allocs_.upper_bound(a);
    if (it != allocs_.begin()) {
      --it;
      size_t off = a - it->first;
      if (off <= it->second.bytes && n <= it->second.bytes - off) return {it->second.buffer, off};
    }
    throw Error("metal backend: " + what + " is not in a buffer this backend allocated");
  }

private:
  id<MTLComputeCommandEncoder> compute() {
    if (enc_ == nil)
      enc_ = checked([command_buffer() computeCommandEncoder], "computeCommandEncoder");
    return enc_;
  }

  id<MTLDevice> device_ = nil;
  id<MTLCommandQueue> queue_ = nil;
  id<MTLCommandBuffer> cmd_ = nil;
  id<MTLComputeCommandEncoder> enc_ = nil;
  std::map<uintptr_t, Allocation> allocs_;
  std::map<std::string, id<MTLLibrary>> libraries_; // by the plan's joined sources
  std::vector<KernelRec> recs_;
  size_t ndims_ = 0;
};

const std::map<std::string, int> kGemmIndex = {
    {"m", 0},         {"n", 1},         {"k", 2},         {"lda", 3},       {"ldb", 4},
    {"ldc", 5},       {"batch", 6},     {"stride_a", 7},  {"stride_b", 8},  {"stride_c", 9},
    {"a_offset", 10}, {"b_offset", 11}, {"c_offset", 12}, {"trans_a", 13},  {"trans_b", 14},
    {"alpha", 100},   {"beta", 101}};

MPSDataType mps_type(DType t, const std::string &at) {
  if (t == DType::f32) return MPSDataTypeFloat32;
  if (t == DType::f16) return MPSDataTypeFloat16;
  throw PlanError(at + ": MPS gemm takes f32 or f16 matrices, not " + dtype_name(t));
}

MpsGemm::MpsGemm(const Plan &plan, size_t step, MetalBackend &be) : be_(be) {
  const Step &s = plan.steps[step];
  std::string at = "step " + std::to_string(step) + " (gemm)";
  if (s.args.size() != 3) throw PlanError(at + ": needs 3 buffers (A, B, C)");
  DType a = plan.buffers[s.args[0]].dtype, b = plan.buffers[s.args[1]].dtype,
        c = plan.buffers[s.args[2]].dtype;
  if (a != b) throw PlanError(at + ": operands " + dtype_name(a) + " x " + dtype_name(b));
  type_a_ = mps_type(a, at);
  type_c_ = mps_type(c, at);
  elem_a_ = dtype_nbytes(a, 1);
  elem_c_ = dtype_nbytes(c, 1);
  for (const Field &f : s.fields) {
    auto it = kGemmIndex.find(f.name);
    if (it == kGemmIndex.end()) throw PlanError(at + ": unknown descriptor field '" + f.name + "'");
    if (f.is_real && it->second < 100)
      throw PlanError(at + ": field '" + f.name + "' must be an integer expression");
    fields_.push_back(&f);
  }
  for (const char *req : {"m", "n", "k"}) {
    bool found = false;
    for (const Field *f : fields_) found |= f->name == req;
    if (!found) throw PlanError(at + ": descriptor lacks required field '" + req + "'");
  }
  args_ = s.args;
}

void MpsGemm::bind(const int64_t *vals, const int64_t *buf_bytes) {
  int64_t v[kNum] = {};
  v[kBatch] = 1;
  bool set[kNum] = {};
  double alpha = 1.0, beta = 0.0;
  for (const Field *f : fields_) {
    int i = kGemmIndex.at(f->name);
    double r = f->is_real ? f->real : double(vals[f->expr]);
    if (i == 100)
      alpha = r;
    else if (i == 101)
      beta = r;
    else
      v[i] = vals[f->expr], set[i] = true;
  }
  int64_t m = v[kM], n = v[kN], k = v[kK];
  if (!set[kLda]) v[kLda] = v[kTA] ? m : k;
  if (!set[kLdb]) v[kLdb] = v[kTB] ? k : n;
  if (!set[kLdc]) v[kLdc] = n;
  for (int i = 0; i < kNum; ++i)
    if (v[i] < 0) throw Error("gemm size, stride or offset is negative");
  if (v[kTA] > 1 || v[kTB] > 1) throw Error("gemm trans_a and trans_b must be 0 or 1");
  // the last element each matrix reaches must lie in its buffer
  auto last = [&](int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t off) {
    if (rows == 0 || cols == 0 || v[kBatch] == 0) return int64_t(0);
    return off + (v[kBatch] - 1) * stride + (rows - 1) * ld + cols;
  };
  int64_t ra = v[kTA] ? k : m, ca = v[kTA] ? m : k, rb = v[kTB] ? n : k, cb = v[kTB] ? k : n;
  if (last(ra, ca, v[kLda], v[kSA], v[kOA]) * elem_a_ > buf_bytes[args_[0]] ||
      last(rb, cb, v[kLdb], v[kSB], v[kOB]) * elem_a_ > buf_bytes[args_[1]] ||
      last(m, n, v[kLdc], v[kSC], v[kOC]) * elem_c_ > buf_bytes[args_[2]])
    throw Error("gemm reads or writes outside its buffers");
  std::memcpy(v_, v, sizeof v);
  alpha_ = alpha;
  beta_ = beta;
  mm_ = [[MPSMatrixMultiplication alloc] initWithDevice:be_.device()
                                          transposeLeft:(v[kTA] ? YES : NO)
                                         transposeRight:(v[kTB] ? YES : NO)
                                             resultRows:NSUInteger(m)
                                          resultColumns:NSUInteger(n)
                                        interiorColumns:NSUInteger(k)
                                                  alpha:alpha
                                                   beta:beta];
  checked(mm_, "MPSMatrixMultiplication initWithDevice");
}

void MpsGemm::run(void *const *args) {
  const int64_t *v = v_;
  if (v[kM] == 0 || v[kN] == 0 || v[kBatch] == 0) return;
  auto matrix = [&](void *p, int64_t off, int64_t elem, int64_t rows, int64_t cols, int64_t ld,
                    int64_t stride, MPSDataType t, const char *what) {
    auto [buf, base] = be_.find(p, 0, std::string("gemm ") + what);
    MPSMatrixDescriptor *d =
        [MPSMatrixDescriptor matrixDescriptorWithRows:NSUInteger(rows)
                                              columns:NSUInteger(cols)
                                             matrices:NSUInteger(v[kBatch])
                                             rowBytes:NSUInteger(ld * elem)
                                          matrixBytes:NSUInteger(v[kBatch] > 1 ? stride * elem
                                                                               : rows * ld * elem)
                                             dataType:t];
    return checked([[MPSMatrix alloc] initWithBuffer:buf
                                              offset:NSUInteger(base + off * elem)
                                          descriptor:d],
                   "MPSMatrix initWithBuffer", nil, std::string("gemm ") + what);
  };
  @autoreleasepool {
    MPSMatrix *A = matrix(args[0], v[kOA], elem_a_, v[kTA] ? v[kK] : v[kM], v[kTA] ? v[kM] : v[kK],
                          v[kLda], v[kSA], type_a_, "A");
    MPSMatrix *B = matrix(args[1], v[kOB], elem_a_, v[kTB] ? v[kN] : v[kK], v[kTB] ? v[kK] : v[kN],
                          v[kLdb], v[kSB], type_a_, "B");
    MPSMatrix *C = matrix(args[2], v[kOC], elem_c_, v[kM], v[kN], v[kLdc], v[kSC], type_c_, "C");
    be_.end_compute(); // MPS encodes its own commands into the run's command buffer
    [mm_ encodeToCommandBuffer:be_.command_buffer() leftMatrix:A rightMatrix:B resultMatrix:C];
  }
}

} // namespace

namespace metal {
std::string unavailable_reason() {
  @autoreleasepool {
    id<MTLDevice> d = MTLCreateSystemDefaultDevice();
    return d == nil ? "MTLCreateSystemDefaultDevice found no GPU" : "";
  }
}
} // namespace metal

std::unique_ptr<Backend> make_metal_backend() { return std::make_unique<MetalBackend>(); }

} // namespace luminal
