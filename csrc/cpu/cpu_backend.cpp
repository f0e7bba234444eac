// The CPU backend: C kernels compiled by the system compiler, a thread pool, OpenBLAS GEMM.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>

#include "../backend.hpp"
#include "../gemm_desc.hpp"
#include "compiler.hpp"
#include "pgemm.hpp"
#include "qdot.hpp"
#include "thread_pool.hpp"

extern "C" { // scipy-openblas32 prefixes every symbol with "scipy_"
void scipy_cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                       int lda, const float *b, int ldb, float beta, float *c, int ldc);
void scipy_cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha,
                       const double *a, int lda, const double *b, int ldb, double beta, double *c,
                       int ldc);
void scipy_openblas_set_num_threads(int n);
}

namespace luminal {
namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// GEMM over row-major matrices: C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for each
// of `batch` matrices; strides and offsets are in elements. Args: A, B, C: all f32, all f64, or
// A and B both f16 or both bf16 with C f32 (widened to f32 on each run: this OpenBLAS has no
// half gemm; a product of two halves is exact in f32, so sgemm sums what a half gemm would).
class Gemm final : public LibCallOp {
  using enum GemmDesc::Index;

public:
  Gemm(const Plan &plan, size_t step, cpu::ThreadPool &pool)
      : gemm_(plan.steps[step], "step " + std::to_string(step) + " (gemm)"), pool_(pool) {
    const Step &s = plan.steps[step];
    const DType a = plan.buffers[s.args[0]].dtype, b = plan.buffers[s.args[1]].dtype,
                c = plan.buffers[s.args[2]].dtype;
    half_ = a == b && (a == DType::f16 || a == DType::bf16) && c == DType::f32;
    if (!half_ && !(a == b && b == c && (a == DType::f32 || a == DType::f64)))
      throw PlanError("step " + std::to_string(step) +
                      " (gemm): takes f32 x f32 -> f32, f64 x f64 -> f64 or bf16/f16 x the same "
                      "-> f32, not " +
                      dtype_name(a) + " x " + dtype_name(b) + " -> " + dtype_name(c));
    half_type_ = a;
    f64_ = a == DType::f64;
    for (int i = 0; i < 3; ++i) elem_[i] = dtype_nbytes(plan.buffers[s.args[i]].dtype, 1);
    args_ = s.args;
  }

  void bind(const int64_t *vals, const int64_t *buf_bytes) override {
    const int64_t elems[3] = {buf_bytes[args_[0]] / elem_[0], buf_bytes[args_[1]] / elem_[1],
                              buf_bytes[args_[2]] / elem_[2]};
    GemmDesc::Bound b = gemm_.bind(vals, elems);
    b.merge_shared_b();
    std::memcpy(v_, b.v, sizeof v_);
    alpha_ = b.alpha;
    beta_ = b.beta;
    if (!half_) return;
    const int64_t *v = v_;
    span(v[kTransA] ? v[kK] : v[kM], v[kTransA] ? v[kM] : v[kK], v[kLda], v[kStrideA], v[kOffA],
         wide_[0]);
    span(v[kTransB] ? v[kN] : v[kK], v[kTransB] ? v[kK] : v[kN], v[kLdb], v[kStrideB], v[kOffB],
         wide_[1]);
  }

  // The gemm runs on our pool, OpenBLAS single-threaded inside each part: OpenBLAS's own
  // threads spin after a call, and on a machine with as many threads as cores they then fight
  // the next generated kernel's workers (measured: a 256x1536x384 gemm between two kernels
  // took 100+ ms instead of 1 ms).
  void run(void *const *args) override {
    if (v_[kM] == 0 || v_[kN] == 0) return;
    // each part a block of C's rows (or columns, when C has few rows), 16-aligned
    int64_t batch = v_[kBatch], m = v_[kM], n = v_[kN];
    split_rows_ = m > n; // each part packs all of the other operand: duplicate the smaller
    int64_t extent = split_rows_ ? m : n;
    int64_t want = std::min<int64_t>(pool_.size(), (extent + 15) / 16);
    const bool small = 2 * m * n * v_[kK] < (int64_t(1) << 18); // not worth a handoff
    if (small) want = 1;
    part_ = (extent + want - 1) / want;
    part_ = (part_ + 15) / 16 * 16;
    parts_ = (extent + part_ - 1) / part_;
    void *targs[4] = {this, args[0], args[1], args[2]};
    if (half_ && batch > 0) {
      for (int i = 0; i < 2; ++i) wide_[i].src = static_cast<const char *>(args[i]);
      const int64_t chunks = (wide_[0].len + kWidenChunk - 1) / kWidenChunk +
                             (wide_[1].len + kWidenChunk - 1) / kWidenChunk;
      if (small || chunks == 1)
        widen_task(targs, nullptr, 0, chunks);
      else
        pool_.run(&Gemm::widen_task, targs, nullptr, chunks, 1);
      targs[1] = wide_[0].buf.data();
      targs[2] = wide_[1].buf.data();
    }
    if (batch * parts_ == 1)
      task(targs, nullptr, 0, 1);
    else
      pool_.run(&Gemm::task, targs, nullptr, batch * parts_, 1);
  }

  static void task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    const Gemm &g = *static_cast<const Gemm *>(targs[0]);
    for (int64_t t = begin; t < end; ++t) g.part(targs + 1, t / g.parts_, t % g.parts_);
  }

  void part(void *const *args, int64_t i, int64_t p) const {
    const int64_t *v = v_;
    int64_t lo = p * part_, m = v[kM], n = v[kN];
    // a widened operand's copy starts at the first element its descriptor reads
    int64_t oa = v[kOffA] + i * v[kStrideA] - wide_[0].first,
            ob = v[kOffB] + i * v[kStrideB] - wide_[1].first, oc = v[kOffC] + i * v[kStrideC];
    if (split_rows_) { // rows lo.. of C and of op(A)
      m = std::min(part_, v[kM] - lo);
      oa += v[kTransA] ? lo : lo * v[kLda];
      oc += lo * v[kLdc];
    } else { // columns lo.. of C and of op(B)
      n = std::min(part_, v[kN] - lo);
      ob += v[kTransB] ? lo * v[kLdb] : lo;
      oc += lo;
    }
    int ta = v[kTransA] ? kTrans : kNoTrans, tb = v[kTransB] ? kTrans : kNoTrans;
    if (f64_)
      scipy_cblas_dgemm(kRowMajor, ta, tb, int(m), int(n), int(v[kK]), alpha_,
                        static_cast<const double *>(args[0]) + oa, int(v[kLda]),
                        static_cast<const double *>(args[1]) + ob, int(v[kLdb]), beta_,
                        static_cast<double *>(args[2]) + oc, int(v[kLdc]));
    else
      scipy_cblas_sgemm(kRowMajor, ta, tb, int(m), int(n), int(v[kK]), float(alpha_),
                        static_cast<const float *>(args[0]) + oa, int(v[kLda]),
                        static_cast<const float *>(args[1]) + ob, int(v[kLdb]), float(beta_),
                        static_cast<float *>(args[2]) + oc, int(v[kLdc]));
  }

private:
  static constexpr int64_t kWidenChunk = int64_t(1) << 16;

  // A half operand and its f32 copy: elements [first, first + len) of its buffer, the span
  // that its descriptor reads (gaps between rows and matrices included).
  struct Widened {
    int64_t first = 0, len = 0;
    const char *src = nullptr; // the buffer, set by run
    std::vector<float> buf;
  };

  // The span of `batch` matrices of rows x cols (leading dimension ld) `stride` apart from off.
  void span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t off, Widened &w) const {
    const int64_t reach = (v_[kBatch] - 1) * stride;
    const bool empty = rows == 0 || cols == 0 || v_[kBatch] == 0 || v_[kM] == 0 || v_[kN] == 0;
    w.first = empty ? 0 : off + std::min<int64_t>(reach, 0);
    w.len = empty ? 0 : off + std::max<int64_t>(reach, 0) + (rows - 1) * ld + cols - w.first;
    w.buf.resize(size_t(w.len)); // kept across runs: only grows
  }

  // Chunks of kWidenChunk elements of A's span, then of B's.
  static void widen_task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    Gemm &g = *static_cast<Gemm *>(targs[0]);
    const int64_t a_chunks = (g.wide_[0].len + kWidenChunk - 1) / kWidenChunk;
    for (int64_t t = begin; t < end; ++t) {
      Widened &w = g.wide_[t < a_chunks ? 0 : 1];
      const int64_t lo = (t < a_chunks ? t : t - a_chunks) * kWidenChunk;
      widen_to_f32(g.half_type_, w.src + (w.first + lo) * 2, w.buf.data() + lo,
                   std::min(kWidenChunk, w.len - lo));
    }
  }

  GemmDesc gemm_;
  cpu::ThreadPool &pool_;
  bool f64_ = false, half_ = false;
  DType half_type_ = DType::f32;
  int64_t elem_[3] = {4, 4, 4}; // bytes per element of A, B, C
  std::vector<uint32_t> args_;
  int64_t v_[GemmDesc::kNum] = {};
  double alpha_ = 1.0, beta_ = 0.0;
  Widened wide_[2]; // A, B when they are half
  // the current run's partition (set by run before the parts start)
  bool split_rows_ = true;
  int64_t part_ = 1, parts_ = 1;
};

bool is_identifier(const std::string &s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(bool staged) : staged_(staged), pool_(cpu::ThreadPool::global()) {
    // parallel gemm comes from our pool (Gemm::run); OpenBLAS's own threads would spin
    static bool blas_threads = (scipy_openblas_set_num_threads(1), true);
    (void)blas_threads;
  }
  std::string name() const override { return staged_ ? "cpu-staged" : "cpu"; }
  bool host_visible() const override { return !staged_; }

  void *alloc(size_t bytes) override {
    void *p = host_alloc(bytes, kAlign);
    if (!p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free(void *p) override { std::free(p); }
  void copy(void *dst, const void *src, size_t n) override { std::memmove(dst, src, n); }
  void copy_in(void *dst, const void *host, size_t n) override { std::memcpy(dst, host, n); }
  void copy_out(void *host, const void *src, size_t n) override { std::memcpy(host, src, n); }

  std::vector<KernelHandle> load_kernels(const Plan &plan) override {
    // Each C source is a library of its own, cached by its text: a kernel that the search
    // compiled to measure it, or that another plan holds (a model's decode and prefill
    // programs, the plan they merge into), is loaded, not compiled again.
    std::map<std::string, size_t> entries;
    std::vector<size_t> c_kernels;
    std::vector<std::string> sources, symbols;
    for (size_t i = 0; i < plan.kernels.size(); ++i) {
      const Kernel &k = plan.kernels[i];
      if (!is_identifier(k.entry))
        throw PlanError("kernel '" + k.name + "': entry point '" + k.entry +
                        "' is not a C identifier");
      if (k.format == KernelFormat::c_source) {
        if (!entries.emplace(k.entry, i).second)
          throw PlanError("two c_source kernels define entry point '" + k.entry + "'");
        c_kernels.push_back(i);
        auto unit = cpu::kernel_unit(k.entry, k.code); // may be a fixed name shared by plans
        sources.push_back(std::move(unit.source));
        symbols.push_back(std::move(unit.symbol));
      } else if (k.format != KernelFormat::shared_object) {
        throw Error("the cpu backend cannot run kernel '" + k.name + "' of format " +
                    kernel_format_name(k.format));
      }
    }
    std::vector<KernelHandle> handles(plan.kernels.size());
    auto c_libs = cpu::compile_each(sources);
    for (size_t j = 0; j < c_kernels.size(); ++j) {
      handles[c_kernels[j]] = c_libs[j]->symbol(symbols[j]);
      libs_.push_back(c_libs[j]);
    }
    for (size_t i = 0; i < plan.kernels.size(); ++i) {
      const Kernel &k = plan.kernels[i];
      if (k.format == KernelFormat::shared_object) {
        libs_.push_back(cpu::load_shared_object(k.code));
        handles[i] = libs_.back()->symbol(k.entry);
      }
    }
    return handles;
  }

  void check_launch(const LaunchGeom &g, const std::string &what) override {
    if (g.grid[0] < 0 || g.grid[1] != 1 || g.grid[2] != 1 || g.block[0] < 1 || g.block[1] != 1 ||
        g.block[2] != 1)
      throw PlanError(what +
                      ": on cpu, grid must be (tasks >= 0, 1, 1) and block (hint >= 1, 1, 1)");
  }

  void launch(KernelHandle k, const LaunchGeom &g, void *const *args,
              const int64_t *dims) override {
    auto fn = reinterpret_cast<cpu::KernelFn>(k);
    pool_.run(fn, args, dims, g.grid[0], g.block[0]);
  }

  std::unique_ptr<LibCallOp> make_libcall(const Plan &plan, size_t step) override {
    const std::string &f = plan.steps[step].func;
    if (f == "gemm") return std::make_unique<Gemm>(plan, step, pool_);
    if (f == "pgemm") return make_pgemm(plan, step, pool_);
    if (f == "qdot") return make_qdot(plan, step, pool_);
    throw PlanError("step " + std::to_string(step) + ": the cpu backend has no library function '" +
                    f + "' (it has: gemm, pgemm, qdot)");
  }

  void sync() override {} // launches are synchronous on CPU

private:
  bool staged_;
  cpu::ThreadPool &pool_;
  std::vector<std::shared_ptr<cpu::SharedLib>> libs_;
};

} // namespace

std::unique_ptr<Backend> make_cpu_backend(bool staged) {
  return std::make_unique<CpuBackend>(staged);
}

} // namespace luminal
