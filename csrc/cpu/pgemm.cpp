// The `pgemm` library call: the `gemm` product (gemm_desc.hpp: C[i] = alpha * op(A[i]) @ op(B[i])
// + beta * C[i], f32) by luminal's own register-blocked kernel instead of OpenBLAS, its schedule
// in descriptor fields that the search measures (targets/cpu.py offers the variants):
//   mr    rows of C per micro-tile, 1..14: the tile's mr x 32 sums live in 2 * mr registers
//   mc    rows of C per task, rounded up to a multiple of mr (0 or absent: all of M)
//   kc    depth of one pass over a task's tiles (0 or absent: all of K): a panel of B that
//         deep is read from L1 by every tile of the task
//   pack  1: B holds the same values on every run (a plan weight): packed on the first run
//         from each source buffer and kept; 0 or absent: packed on every run
//   pack_a 0: A's rows read in place (needs trans_a 0); 1 or absent: A packed on every run
// B is packed into panels of 32 columns (row p of a panel: B's 32 values at depth p, zero past
// n) and A into micro-tiles of up to mr rows (row p: the tile's values at depth p), so the
// micro-kernel reads both sequentially whatever the operands' strides and transposes; read in
// place, A costs no copy (a pass over all of A, 8% of a 2048-row product's time) but mr
// streams of its rows.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../backend.hpp"
#include "../gemm_desc.hpp"
#include "fingerprint.hpp"
#include "pgemm.hpp"

namespace luminal {
namespace {

constexpr int kNr = 32; // columns of a B panel: two AVX-512 registers
constexpr int kMaxMr = 14;
// Products of fewer multiply-adds run on the calling thread: a handoff to the pool costs
// more than the second thread saves (the gemm call's threshold, cpu_backend.cpp).
constexpr int64_t kParallelWork = int64_t(1) << 17;
// Packed copies of B kept across runs (one per source buffer, see PGemm::packed_b); beyond
// this many bytes the oldest are dropped (the search's rings hold at most 96 MB of inputs,
// RING_MAX_BYTES in targets/cpu.py).
constexpr size_t kMaxCopyBytes = size_t(256) << 20;

struct FreeDeleter {
  void operator()(float *p) const { pack_free(p); }
};

// 64-byte aligned floats (a panel row is one cache line).
class FloatBuf {
public:
  float *data() const { return p_.get(); }
  size_t size() const { return n_; }
  void reserve(size_t n) {
    if (n <= n_) return;
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    p_.reset(static_cast<float *>(pack_alloc(bytes)));
    if (!p_) throw Error("out of memory packing a gemm operand (" + std::to_string(bytes) + " B)");
    n_ = n;
  }

private:
  std::unique_ptr<float, FreeDeleter> p_;
  size_t n_ = 0;
};

// Panels [p0, p1) of op(B) (k x n) into dst, each k * kNr floats.
void pack_b(const float *b, int64_t ldb, bool tb, int64_t k, int64_t n, int64_t p0, int64_t p1,
            float *dst) {
  for (int64_t p = p0; p < p1; ++p) {
    float *d = dst + p * k * kNr;
    const int64_t c0 = p * kNr, cols = std::min<int64_t>(kNr, n - c0);
    if (!tb) {
      for (int64_t kk = 0; kk < k; ++kk) {
        std::memcpy(d + kk * kNr, b + kk * ldb + c0, size_t(cols) * sizeof(float));
        std::fill(d + kk * kNr + cols, d + (kk + 1) * kNr, 0.f);
      }
      continue;
    }
    if (cols < kNr) std::fill(d, d + k * kNr, 0.f);
    for (int64_t j = 0; j < cols; ++j) {
      const float *s = b + (c0 + j) * ldb;
      for (int64_t kk = 0; kk < k; ++kk) d[kk * kNr + j] = s[kk];
    }
  }
}

// Micro-tiles [t0, t1) of mr rows of op(A) (m x k) into dst: tile t starts at dst + t * mr * k
// and holds its rr = min(mr, m - t * mr) rows interleaved (depth p at p * rr).
void pack_a(const float *a, int64_t lda, bool ta, int64_t m, int64_t k, int64_t mr, int64_t t0,
            int64_t t1, float *dst) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t r0 = t * mr, rr = std::min(mr, m - r0);
    float *d = dst + r0 * k;
    if (ta) {
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t r = 0; r < rr; ++r) d[kk * rr + r] = a[kk * lda + r0 + r];
    } else {
      for (int64_t r = 0; r < rr; ++r) {
        const float *s = a + (r0 + r) * lda;
        for (int64_t kk = 0; kk < k; ++kk) d[kk * rr + r] = s[kk];
      }
    }
  }
}

// One micro-tile: C[0..R, 0..cols) = alpha * (tile @ panel) + beta * C over depth kd; C is
// not read when beta is 0. The tile's value at row r, depth p is ap[p * R + r] when A is
// packed (Direct false; lda unused), ap[r * lda + p] when A is read in place.
using MicroFn = void (*)(const float *ap, int64_t lda, const float *bp, int64_t kd, float *c,
                         int64_t ldc, int cols, float alpha, float beta);

template <int R, bool Direct>
void micro_portable(const float *ap, int64_t lda, const float *bp, int64_t kd, float *c,
                    int64_t ldc, int cols, float alpha, float beta) {
  float acc[R][kNr] = {};
  for (int64_t p = 0; p < kd; ++p, bp += kNr)
    for (int r = 0; r < R; ++r) {
      const float a = Direct ? ap[r * lda + p] : ap[p * R + r];
      for (int j = 0; j < kNr; ++j) acc[r][j] += a * bp[j];
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < cols; ++j) {
      float v = alpha * acc[r][j];
      c[r * ldc + j] = beta != 0.f ? v + beta * c[r * ldc + j] : v;
    }
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f")
template <int R, bool Direct>
void micro_avx512(const float *ap, int64_t lda, const float *bp, int64_t kd, float *c, int64_t ldc,
                  int cols, float alpha, float beta) {
  __m512 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kd; ++p, bp += kNr) {
    const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(Direct ? ap[r * lda + p] : ap[p * R + r]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32   ? __mmask16(0xffff)
                       : cols <= 16 ? __mmask16(0)
                                    : __mmask16((1u << (cols - 16)) - 1);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float *row = c + r * ldc;
    __m512 v0 = _mm512_mul_ps(va, acc[r][0]), v1 = _mm512_mul_ps(va, acc[r][1]);
    if (beta != 0.f) {
      v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), v0);
      v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), v1);
    }
    _mm512_mask_storeu_ps(row, m0, v0);
    _mm512_mask_storeu_ps(row + 16, m1, v1);
  }
}
#pragma GCC pop_options

using MicroTable = std::array<MicroFn, kMaxMr + 1>; // by rows; [0] unused

template <bool Direct, int... R>
constexpr MicroTable table(bool wide, std::integer_sequence<int, R...>) {
  return {nullptr, (wide ? &micro_avx512<R + 1, Direct> : &micro_portable<R + 1, Direct>)...};
}

// By the CPU's features, for packed A ([0]) and A read in place ([1]); LUMINAL_PGEMM_ISA=portable
// forces the plain loops (tests compare).
const MicroTable *pick_micro() {
  using Rows = std::make_integer_sequence<int, kMaxMr>;
  static const MicroTable wide[2] = {table<false>(true, Rows{}), table<true>(true, Rows{})};
  static const MicroTable portable[2] = {table<false>(false, Rows{}), table<true>(false, Rows{})};
  const char *force = std::getenv("LUMINAL_PGEMM_ISA");
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  if (!avx512 || (force && std::string(force) == "portable")) return portable;
  return wide;
}

// A packed B kept across runs (pack = 1): the buffer and layout it came from, a fingerprint of
// its bytes, the panels of every batch matrix.
struct PackedB {
  const float *src = nullptr;
  int64_t shape[6] = {}; // k, n, ldb, trans_b, batch, stride_b
  uint64_t hash = 0;
  FloatBuf data;
};

class PGemm final : public LibCallOp {
  using enum GemmDesc::Index;

public:
  PGemm(const Plan &plan, size_t step, cpu::ThreadPool &pool)
      : at_("step " + std::to_string(step) + " (pgemm)"),
        gemm_(plan.steps[step], at_, {"mr", "mc", "kc", "pack", "pack_a"}), pool_(pool),
        micro_(pick_micro()) {
    const Step &s = plan.steps[step];
    for (uint32_t a : s.args)
      if (plan.buffers[a].dtype != DType::f32)
        throw PlanError(at_ + ": A, B and C must all be f32");
    for (const Field &f : s.fields) {
      int i = f.name == "mr"       ? 0
              : f.name == "mc"     ? 1
              : f.name == "kc"     ? 2
              : f.name == "pack"   ? 3
              : f.name == "pack_a" ? 4
                                   : -1;
      if (i < 0) continue;
      if (f.is_real)
        throw PlanError(at_ + ": field '" + f.name + "' must be an integer expression");
      sched_expr_[i] = f.expr;
      sched_set_[i] = true;
    }
    args_ = s.args;
    b_is_weight_ = plan.buffers[args_[1]].role == Role::weight;
  }

  void bind(const int64_t *vals, const int64_t *buf_bytes) override {
    const int64_t elems[3] = {buf_bytes[args_[0]] / 4, buf_bytes[args_[1]] / 4,
                              buf_bytes[args_[2]] / 4};
    GemmDesc::Bound b = gemm_.bind(vals, elems);
    b.merge_shared_b();
    std::memcpy(v_, b.v, sizeof v_);
    alpha_ = float(b.alpha);
    beta_ = float(b.beta);
    int64_t s[5] = {8, 0, 0, 0, 1};
    for (int i = 0; i < 5; ++i)
      if (sched_set_[i]) s[i] = vals[sched_expr_[i]];
    if (s[0] < 1 || s[0] > kMaxMr)
      throw Error(at_ + ": 'mr' must be 1.." + std::to_string(kMaxMr) + ", not " +
                  std::to_string(s[0]));
    if (s[1] < 0 || s[2] < 0) throw Error(at_ + ": 'mc' and 'kc' must be >= 0");
    if (s[3] != 0 && s[3] != 1) throw Error(at_ + ": 'pack' must be 0 or 1");
    if (s[4] != 0 && s[4] != 1) throw Error(at_ + ": 'pack_a' must be 0 or 1");
    if (s[4] == 0 && v_[kTransA]) throw Error(at_ + ": 'pack_a' 0 needs trans_a 0");
    mr_ = s[0];
    const int64_t m = v_[kM], k = v_[kK];
    mc_ = s[1] == 0 || s[1] >= m ? std::max<int64_t>(m, 1) : (s[1] + mr_ - 1) / mr_ * mr_;
    kc_ = s[2] == 0 || s[2] >= k ? std::max<int64_t>(k, 1) : s[2];
    keep_b_ = s[3] == 1;
    direct_a_ = s[4] == 0;
  }

  void run(void *const *args) override {
    const int64_t m = v_[kM], n = v_[kN], k = v_[kK], batch = v_[kBatch];
    c_ = static_cast<float *>(args[2]) + v_[kOffC];
    if (m == 0 || n == 0 || batch == 0) return;
    if (k == 0) { // an empty sum: C = beta * C
      for (int64_t i = 0; i < batch; ++i)
        for (int64_t r = 0; r < m; ++r) {
          float *row = c_ + i * v_[kStrideC] + r * v_[kLdc];
          for (int64_t j = 0; j < n; ++j) row[j] = beta_ != 0.f ? beta_ * row[j] : 0.f;
        }
      return;
    }
    a_ = static_cast<const float *>(args[0]) + v_[kOffA];
    b_ = static_cast<const float *>(args[1]) + v_[kOffB];
    panels_ = (n + kNr - 1) / kNr;
    tiles_ = (m + mr_ - 1) / mr_;
    mblocks_ = (m + mc_ - 1) / mc_;
    parallel_ = m * n * k * batch >= kParallelWork;
    if (keep_b_) {
      bp_ = packed_b();
    } else {
      b_pack_.reserve(size_t(batch * panels_ * k * kNr));
      bp_ = bdst_ = b_pack_.data();
      launch(&PGemm::pack_b_task, batch * panels_);
    }
    if (!direct_a_) {
      a_pack_.reserve(size_t(batch * m * k));
      launch(&PGemm::pack_a_task, batch * tiles_);
    }
    launch(&PGemm::task, batch * mblocks_ * panels_);
  }

private:
  void launch(cpu::KernelFn fn, int64_t tasks) {
    void *targs[1] = {this};
    if (parallel_ && tasks > 1)
      pool_.run(fn, targs, nullptr, tasks, 1);
    else
      fn(targs, nullptr, 0, tasks);
  }

  const float *packed_b() {
    const int64_t shape[6] = {v_[kK], v_[kN], v_[kLdb], v_[kTransB], v_[kBatch], v_[kStrideB]};
    auto same = [&](const PackedB &p) {
      return p.src == b_ && std::equal(shape, shape + 6, p.shape);
    };
    if (cur_ && same(*cur_)) return cur_->data.data();
    for (auto &p : copies_)
      if (same(*p)) return (cur_ = p.get())->data.data();
    // each source buffer gets a copy of its own, copied from one of the same bytes if any: the
    // search times runs over a ring of identical inputs, and a run must read its packed B
    // as cold as its source, as a model's run does
    // (the bytes every batch matrix reads; a negative batch stride reaches back from b_)
    const int64_t rows = v_[kTransB] ? v_[kN] : v_[kK], cols = v_[kTransB] ? v_[kK] : v_[kN];
    const int64_t reach = (v_[kBatch] - 1) * v_[kStrideB];
    const int64_t span = std::abs(reach) + (rows - 1) * v_[kLdb] + cols;
    const float *first = b_ + std::min<int64_t>(reach, 0);
    const uint64_t h = cpu::sample_hash(first, size_t(span) * sizeof(float), 0x5eed);
    auto fresh = std::make_unique<PackedB>();
    fresh->src = b_;
    std::copy(shape, shape + 6, fresh->shape);
    fresh->hash = h;
    const size_t count = size_t(v_[kBatch] * panels_ * v_[kK] * kNr);
    fresh->data.reserve(count);
    const PackedB *twin = nullptr;
    for (auto &p : copies_)
      if (p->hash == h && std::equal(shape, shape + 6, p->shape)) twin = p.get();
    if (twin) {
      std::memcpy(fresh->data.data(), twin->data.data(), count * sizeof(float));
    } else {
      bdst_ = fresh->data.data();
      launch(&PGemm::pack_b_task, v_[kBatch] * panels_);
    }
    if (b_is_weight_) release_source(first, size_t(span) * sizeof(float));
    copies_.push_back(std::move(fresh));
    cur_ = copies_.back().get();
    size_t bytes = 0;
    for (auto &p : copies_) bytes += p->data.size() * sizeof(float);
    while (copies_.size() > 1 && bytes > kMaxCopyBytes) {
      bytes -= copies_.front()->data.size() * sizeof(float);
      copies_.erase(copies_.begin());
    }
    return cur_->data.data();
  }

  // A plan weight's pages are not read by this call again: let the kernel reclaim them, so a
  // packed weight is not resident twice (SmolLM2's f32 prefill weights: 415 MB). MADV_PAGEOUT
  // only reclaims: a mapped file's pages come back from the file if another step reads them,
  // anonymous memory without swap stays as it is.
  static void release_source(const float *src, size_t bytes) {
#ifdef MADV_PAGEOUT
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t lo = (uintptr_t(src) + page - 1) / page * page;
    const uintptr_t hi = (uintptr_t(src) + bytes) / page * page;
    if (hi > lo) ::madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_PAGEOUT);
#else
    (void)src;
    (void)bytes;
#endif
  }

  static void pack_b_task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    const PGemm &g = *static_cast<const PGemm *>(targs[0]);
    const int64_t *v = g.v_;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / g.panels_, p = t % g.panels_;
      pack_b(g.b_ + i * v[kStrideB], v[kLdb], v[kTransB], v[kK], v[kN], p, p + 1,
             g.bdst_ + i * g.panels_ * v[kK] * kNr);
    }
  }

  static void pack_a_task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    PGemm &g = *static_cast<PGemm *>(targs[0]);
    const int64_t *v = g.v_;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / g.tiles_, tile = t % g.tiles_;
      pack_a(g.a_ + i * v[kStrideA], v[kLda], v[kTransA], v[kM], v[kK], g.mr_, tile, tile + 1,
             g.a_pack_.data() + i * v[kM] * v[kK]);
    }
  }

  // Task t: batch matrix i, rows [mb * mc, ...) of C, panel p.
  static void task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    const PGemm &g = *static_cast<const PGemm *>(targs[0]);
    const int64_t *v = g.v_;
    const int64_t m = v[kM], n = v[kN], k = v[kK], per = g.mblocks_ * g.panels_;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / per, mb = t % per / g.panels_, p = t % g.panels_;
      const float *ap = g.direct_a_ ? g.a_ + i * v[kStrideA] : g.a_pack_.data() + i * m * k;
      const MicroFn *micro = g.micro_[g.direct_a_].data();
      const float *bp = g.bp_ + (i * g.panels_ + p) * k * kNr;
      float *c = g.c_ + i * v[kStrideC] + p * kNr;
      const int cols = int(std::min<int64_t>(kNr, n - p * kNr));
      const int64_t r0 = mb * g.mc_, r1 = std::min(m, r0 + g.mc_);
      for (int64_t k0 = 0; k0 < k; k0 += g.kc_) {
        const int64_t kd = std::min(g.kc_, k - k0);
        const float beta = k0 == 0 ? g.beta_ : 1.f;
        for (int64_t r = r0; r < r1; r += g.mr_) {
          const int64_t rr = std::min(g.mr_, m - r);
          const float *at = g.direct_a_ ? ap + r * v[kLda] + k0 : ap + r * k + k0 * rr;
          micro[rr](at, v[kLda], bp + k0 * kNr, kd, c + r * v[kLdc], v[kLdc], cols, g.alpha_, beta);
        }
      }
    }
  }

  std::string at_;
  GemmDesc gemm_;
  cpu::ThreadPool &pool_;
  const MicroTable *micro_; // [packed A, A in place]
  std::vector<uint32_t> args_;
  uint32_t sched_expr_[5] = {};
  bool sched_set_[5] = {};
  int64_t v_[GemmDesc::kNum] = {};
  float alpha_ = 1.f, beta_ = 0.f;
  int64_t mr_ = 8, mc_ = 1, kc_ = 1;
  bool keep_b_ = false, parallel_ = false, direct_a_ = false, b_is_weight_ = false;
  // the current run's operands and partition (set by run before the tasks start)
  const float *a_ = nullptr, *b_ = nullptr, *bp_ = nullptr;
  float *c_ = nullptr, *bdst_ = nullptr; // bdst_: where pack_b_task writes
  int64_t panels_ = 0, tiles_ = 0, mblocks_ = 0;
  FloatBuf a_pack_, b_pack_;
  std::vector<std::unique_ptr<PackedB>> copies_; // oldest first
  PackedB *cur_ = nullptr;
};

} // namespace

std::unique_ptr<LibCallOp> make_pgemm(const Plan &plan, size_t step, cpu::ThreadPool &pool) {
  return std::make_unique<PGemm>(plan, step, pool);
}

} // namespace luminal
