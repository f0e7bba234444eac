// The `pgemm` library call: the `gemm` product (gemm_desc.hpp: C[i] = alpha * op(A[i]) @ op(B[i])
// + beta * C[i]) by luminal's own register-blocked kernel instead of OpenBLAS, its schedule in
// descriptor fields that the search measures (targets/cpu.py offers the variants):
//   mr    rows of C per micro-tile, 1..14: the tile's mr x 32 sums live in 2 * mr registers
//   mc    rows of C per task, rounded up to a multiple of mr (0 or absent: all of M)
//   kc    depth of one pass over a task's tiles (0 or absent: all of K): a panel of B that
//         deep is read from L1 by every tile of the task (bf16 pairs: rounded up to even)
//   pack  1: B holds the same values on every run (a plan weight): packed on the first run
//         from each source buffer and kept; 0 or absent: packed on every run
//   pack_a 0: A's rows read in place (needs trans_a 0); 1 or absent: A packed on every run
//   swap  1: run the product transposed, C^T = op(B)^T @ op(A)^T: A takes B's part (panels,
//         `pack` 1 when A is the weight) and B A's (tiles, `pack_a` 0 when B's rows are in
//         place), C stored transposed. For a weight on the left (a convolution's W @ patches):
//         its panels are packed once and a few columns of C (pixels) fill whole tile rows,
//         where the plain form packs the patches per run into panels mostly of zeros.
//   conv_* B read through a convolution's geometry from the image (gemm_desc.hpp): packed per
//         run straight from the image into B's panels, or with `swap` into A's tiles
//         (pgemm_conv.inc); f32, `pack` 0 (plain) or `pack_a` 1 (swapped)
//   epi   a fused epilogue of `epi` instructions `e0`.. with real constants `ec0`..: each tile
//         of C, once its last depth pass is stored, is replaced by the program's value of it
//         (targets/pgemm_epilogue.py writes it: a bias and an activation in the renderer's
//         forms); `vec_axis` 1 or 2 reads a 4th buffer at C's row or column plus `vec_off`.
// B is packed into panels of 32 columns (row p of a panel: B's 32 values at depth p, zero past
// n) and A into micro-tiles of up to mr rows (row p: the tile's values at depth p), so the
// micro-kernel reads both sequentially whatever the operands' strides and transposes; read in
// place, A costs no copy (a pass over all of A, 8% of a 2048-row product's time) but mr
// streams of its rows.
//
// Operands: A and B f32, or both bf16 or both f16; C f32, sums in f32. bf16 on a CPU with
// AVX512_BF16 keeps bf16 in its packed copies: a panel row and a tile row hold a depth pair
// (2q, 2q+1) as one 32-bit word (zero past an odd K), multiplied by vdpbf16ps, which adds both
// products of a pair into an f32 lane (twice the multiply-adds of an f32 FMA per instruction).
// That instruction treats subnormal bf16 inputs and subnormal results as zero. Otherwise (f16,
// or bf16 without AVX512_BF16 or with LUMINAL_PGEMM_ISA=portable) the operands are widened to
// f32 while packing and the f32 kernel runs; such an A is always packed (pack_a 0 is taken as
// 1), since the kernel reads f32.
#include <algorithm>
#include <array>
#include <cstdint>
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
// Half values widened per step of a packing loop (a stack buffer).
constexpr int64_t kWidenChunk = 256;

// ---- half -> f32

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t bits;
  if (e == 0x1f)
    bits = sign | 0x7f800000u | (m << 13);
  else if (e != 0)
    bits = sign | ((e + 112) << 23) | (m << 13);
  else if (m == 0)
    bits = sign;
  else { // subnormal: m * 2^-24, a normal f32
    const float f = float(m) * 0x1p-24f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

using WidenFn = void (*)(const void *src, float *dst, int64_t n);

void widen_f16_portable(const void *src, float *dst, int64_t n) {
  const auto *s = static_cast<const uint16_t *>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}

void widen_bf16_portable(const void *src, float *dst, int64_t n) {
  const auto *s = static_cast<const uint16_t *>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f")
// (the maskz forms: GCC 12 warns that the plain ones' _mm512_undefined may be uninitialized)
void widen_f16_avx512(const void *src, float *dst, int64_t n) {
  const auto *s = static_cast<const uint16_t *>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i));
    _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(__mmask16(0xffff), h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}

void widen_bf16_avx512(const void *src, float *dst, int64_t n) { // vectorized by the compiler
  const auto *s = static_cast<const uint16_t *>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}
#pragma GCC pop_options

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}

WidenFn pick_widen(DType t, bool wide) {
  if (t == DType::f16)
    return wide && __builtin_cpu_supports("f16c") ? widen_f16_avx512 : widen_f16_portable;
  return wide ? widen_bf16_avx512 : widen_bf16_portable;
}

// ---- packed buffers

struct FreeDeleter {
  void operator()(void *p) const { pack_free(p); }
};

// 64-byte aligned 32-bit words (a panel row is one cache line): f32 values, or bf16 pairs.
class WordBuf {
public:
  template <class T = float> T *data() const { return static_cast<T *>(p_.get()); }
  size_t size() const { return n_; }
  void reserve(size_t n) {
    if (n <= n_) return;
    size_t bytes = (n * 4 + 63) / 64 * 64;
    p_.reset(pack_alloc(bytes));
    if (!p_) throw Error("out of memory packing a gemm operand (" + std::to_string(bytes) + " B)");
    n_ = n;
  }

private:
  std::unique_ptr<void, FreeDeleter> p_;
  size_t n_ = 0;
};

#include "pgemm_pack.inc"

#include "pgemm_conv.inc"

#include "pgemm_epilogue.inc"

// ---- micro-kernels

// One micro-tile: C[0..R, 0..cols) = alpha * (tile @ panel) + beta * C over depth kd; C is
// not read when beta is 0. f32: the tile's value at row r, depth p is ap[p * R + r] when A is
// packed (Direct false; lda unused), ap[r * lda + p] when A is read in place. bf16 pairs: the
// word of row r, pair q is ap[q * R + r] packed, the bf16 values at ap[r * lda + 2q] in place.
// With tc, C is stored transposed: row r, column j at c[j * ldc + r]. With ep, the epilogue's
// values of the tile are stored instead (beta 0; not in the portable kernel).
using MicroFn = void (*)(const void *ap, int64_t lda, const void *bp, int64_t kd, float *c,
                         int64_t ldc, int cols, float alpha, float beta, bool tc,
                         const EpiTile *ep);

template <int R, bool Direct>
void micro_portable(const void *a, int64_t lda, const void *b, int64_t kd, float *c, int64_t ldc,
                    int cols, float alpha, float beta, bool tc, const EpiTile *) {
  const float *ap = static_cast<const float *>(a), *bp = static_cast<const float *>(b);
  float acc[R][kNr] = {};
  for (int64_t p = 0; p < kd; ++p, bp += kNr)
    for (int r = 0; r < R; ++r) {
      const float av = Direct ? ap[r * lda + p] : ap[p * R + r];
      for (int j = 0; j < kNr; ++j) acc[r][j] += av * bp[j];
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < cols; ++j) {
      float v = alpha * acc[r][j];
      float &o = tc ? c[j * ldc + r] : c[r * ldc + j];
      o = beta != 0.f ? v + beta * o : v;
    }
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f")
// C's rows from a tile's sums: alpha * acc + beta * C, the first `cols` columns.
template <int R>
__attribute__((always_inline)) inline void store_tile(__m512 (&acc)[R][2], float *c, int64_t ldc,
                                                      int cols, float alpha, float beta, bool tc,
                                                      const EpiTile *ep) {
  if (ep) { // beta is 0: the epilogue's values of alpha * acc, stored as below
    __m512 v[2 * R];
    const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      v[2 * r] = _mm512_mul_ps(va, acc[r][0]);
      v[2 * r + 1] = _mm512_mul_ps(va, acc[r][1]);
    }
    ep->run(*ep, v, R);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r][0] = v[2 * r], acc[r][1] = v[2 * r + 1];
    alpha = 1.f;
  }
  if (tc) { // column j of the tile: R consecutive floats of C (once per tile and depth pass)
    alignas(64) float t[R][kNr];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(t[r], acc[r][0]);
      _mm512_store_ps(t[r] + 16, acc[r][1]);
    }
    for (int j = 0; j < cols; ++j) {
      float *col = c + j * ldc;
      for (int r = 0; r < R; ++r)
        col[r] = beta != 0.f ? alpha * t[r][j] + beta * col[r] : alpha * t[r][j];
    }
    return;
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

template <int R, bool Direct>
void micro_avx512(const void *a, int64_t lda, const void *b, int64_t kd, float *c, int64_t ldc,
                  int cols, float alpha, float beta, bool tc, const EpiTile *ep) {
  const float *ap = static_cast<const float *>(a), *bp = static_cast<const float *>(b);
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
  store_tile<R>(acc, c, ldc, cols, alpha, beta, tc, ep);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bf16")
template <int R, bool Direct>
void micro_bf16(const void *a, int64_t lda, const void *b, int64_t kd, float *c, int64_t ldc,
                int cols, float alpha, float beta, bool tc, const EpiTile *ep) {
  const auto *bp = static_cast<const uint32_t *>(b);
  __m512 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  // in place, a last odd depth is read alone (its pair would run past the row's end)
  const int64_t pairs = Direct ? kd / 2 : (kd + 1) / 2;
  auto step = [&](const uint32_t *words, int64_t q, auto word) {
    const __m512i b0 = _mm512_load_si512(words), b1 = _mm512_load_si512(words + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i av = _mm512_set1_epi32(int(word(r, q)));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)b0, (__m512bh)av);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)b1, (__m512bh)av);
    }
  };
  if constexpr (Direct) {
    const auto *ap = static_cast<const uint16_t *>(a);
    for (int64_t q = 0; q < pairs; ++q, bp += kNr)
      step(bp, q, [&](int r, int64_t qq) { return load_pair(ap + r * lda + 2 * qq); });
    if (kd % 2) step(bp, pairs, [&](int r, int64_t) { return uint32_t(ap[r * lda + kd - 1]); });
  } else {
    const auto *ap = static_cast<const uint32_t *>(a);
    for (int64_t q = 0; q < pairs; ++q, bp += kNr)
      step(bp, q, [&](int r, int64_t qq) { return ap[qq * R + r]; });
  }
  store_tile<R>(acc, c, ldc, cols, alpha, beta, tc, ep);
}
#pragma GCC pop_options

using MicroTable = std::array<MicroFn, kMaxMr + 1>; // by rows; [0] unused

enum class Kernel { portable, avx512, bf16 };

template <Kernel K, bool Direct, int... R>
constexpr MicroTable table(std::integer_sequence<int, R...>) {
  if constexpr (K == Kernel::bf16)
    return {nullptr, &micro_bf16<R + 1, Direct>...};
  else if constexpr (K == Kernel::avx512)
    return {nullptr, &micro_avx512<R + 1, Direct>...};
  else
    return {nullptr, &micro_portable<R + 1, Direct>...};
}

// Tables for packed A ([0]) and A read in place ([1]).
template <Kernel K> const MicroTable *tables() {
  using Rows = std::make_integer_sequence<int, kMaxMr>;
  static const MicroTable t[2] = {table<K, false>(Rows{}), table<K, true>(Rows{})};
  return t;
}

// A packed B kept across runs (pack = 1): the buffer and layout it came from, a fingerprint of
// its bytes, the panels of every batch matrix.
struct PackedB {
  const void *src = nullptr;
  int64_t shape[6] = {}; // k, n, ldb, trans_b, batch, stride_b
  uint64_t hash = 0;
  WordBuf data;
};

class PGemm final : public LibCallOp {
  using enum GemmDesc::Index;

public:
  PGemm(const Plan &plan, size_t step, cpu::ThreadPool &pool)
      : at_("step " + std::to_string(step) + " (pgemm)"),
        gemm_(plan.steps[step], at_, own_fields(plan.steps[step]),
              plan.steps[step].args.size() == 4 ? 1 : 0, true),
        pool_(pool), epi_(at_) {
    const Step &s = plan.steps[step];
    const DType ta = plan.buffers[s.args[0]].dtype, tb = plan.buffers[s.args[1]].dtype,
                tc = plan.buffers[s.args[2]].dtype;
    const bool half = ta == DType::f16 || ta == DType::bf16;
    if (ta != tb || tc != DType::f32 || (ta != DType::f32 && !half))
      throw PlanError(at_ + ": takes f32 x f32 -> f32 or bf16/f16 x the same -> f32, not " +
                      dtype_name(ta) + " x " + dtype_name(tb) + " -> " + dtype_name(tc));
    elem_ = half ? 2 : 4;
    // LUMINAL_PGEMM_ISA=portable forces the plain loops (tests compare)
    const char *force = std::getenv("LUMINAL_PGEMM_ISA");
    const bool wide = has_avx512() && !(force && std::string(force) == "portable");
    if (wide && ta == DType::bf16 && __builtin_cpu_supports("avx512bf16")) {
      micro_ = tables<Kernel::bf16>();
      dpw_ = 2;
    } else {
      micro_ = wide ? tables<Kernel::avx512>() : tables<Kernel::portable>();
      portable_ = !wide;
      if (half) widen_ = pick_widen(ta, wide);
    }
    for (const Field &f : s.fields) {
      int i = f.name == "mr"       ? 0
              : f.name == "mc"     ? 1
              : f.name == "kc"     ? 2
              : f.name == "pack"   ? 3
              : f.name == "pack_a" ? 4
              : f.name == "swap"   ? 5
                                   : -1;
      if (i < 0) {
        epi_.field(f);
        continue;
      }
      if (f.is_real)
        throw PlanError(at_ + ": field '" + f.name + "' must be an integer expression");
      sched_expr_[i] = f.expr;
      sched_set_[i] = true;
    }
    args_ = s.args;
    for (int i = 0; i < 2; ++i) is_weight_[i] = plan.buffers[args_[i]].role == Role::weight;
    epi_.check(plan, s);
  }

  void bind(const int64_t *vals, const int64_t *buf_bytes) override {
    const int64_t elems[3] = {buf_bytes[args_[0]] / elem_, buf_bytes[args_[1]] / elem_,
                              buf_bytes[args_[2]] / 4};
    GemmDesc::Bound b = gemm_.bind(vals, elems);
    epi_.bind(vals, buf_bytes, b[kM], b[kN], b.beta);
    int64_t s[6] = {8, 0, 0, 0, 1, 0};
    for (int i = 0; i < 6; ++i)
      if (sched_set_[i]) s[i] = vals[sched_expr_[i]];
    if (s[5] != 0 && s[5] != 1) throw Error(at_ + ": 'swap' must be 0 or 1");
    swap_ = s[5] == 1;
    if (swap_)
      transpose(b);
    else
      b.merge_shared_b();
    std::memcpy(v_, b.v, sizeof v_);
    alpha_ = float(b.alpha);
    beta_ = float(b.beta);
    b_is_weight_ = is_weight_[swap_ ? 0 : 1];
    conv_a_ = b.conv && swap_;
    conv_b_ = b.conv && !swap_;
    if (b.conv) {
      if (elem_ != 4) throw Error(at_ + ": an implicit convolution takes f32 operands");
      if (!swap_ && s[3] != 0) throw Error(at_ + ": an implicit convolution's B needs 'pack' 0");
      if (swap_ && s[4] != 1)
        throw Error(at_ + ": an implicit convolution with 'swap' 1 needs 'pack_a' 1");
      const int64_t *v = b.v;
      conv_ = {v[kConvC],  v[kConvKh], v[kConvKw], v[kConvOw], v[kConvSh], v[kConvSw],
               v[kConvPh], v[kConvPw], v[kConvIh], v[kConvIw], v[kConvCs], v[kConvRs]};
    }
    if (s[0] < 1 || s[0] > kMaxMr)
      throw Error(at_ + ": 'mr' must be 1.." + std::to_string(kMaxMr) + ", not " +
                  std::to_string(s[0]));
    if (s[1] < 0 || s[2] < 0) throw Error(at_ + ": 'mc' and 'kc' must be >= 0");
    if (s[3] != 0 && s[3] != 1) throw Error(at_ + ": 'pack' must be 0 or 1");
    if (s[4] != 0 && s[4] != 1) throw Error(at_ + ": 'pack_a' must be 0 or 1");
    if (s[4] == 0 && v_[kTransA])
      throw Error(at_ + (swap_ ? ": 'pack_a' 0 with 'swap' 1 needs trans_b 1"
                               : ": 'pack_a' 0 needs trans_a 0"));
    mr_ = s[0];
    const int64_t m = v_[kM], k = v_[kK];
    mc_ = s[1] == 0 || s[1] >= m ? std::max<int64_t>(m, 1) : (s[1] + mr_ - 1) / mr_ * mr_;
    // a pass starts on a pair
    kc_ = s[2] == 0 || s[2] >= k ? std::max<int64_t>(k, 1) : (s[2] + dpw_ - 1) / dpw_ * dpw_;
    keep_b_ = s[3] == 1;
    direct_a_ = s[4] == 0 && !widen_;
  }

  void run(void *const *args) override {
    const int64_t m = v_[kM], n = v_[kN], k = v_[kK], batch = v_[kBatch];
    c_ = static_cast<float *>(args[2]) + v_[kOffC];
    epi_.start(args);
    if (m == 0 || n == 0 || batch == 0) return;
    if (k == 0) { // an empty sum: C = beta * C
      for (int64_t i = 0; i < batch; ++i)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j) {
            float &o = c_[i * v_[kStrideC] + (swap_ ? j * v_[kLdc] + r : r * v_[kLdc] + j)];
            o = beta_ != 0.f ? beta_ * o : 0.f;
          }
      if (!epi_.empty()) // the program's value of a zero product
        for (int64_t i = 0; i < batch; ++i)
          for (int64_t r = 0; r < m; r += mr_)
            for (int64_t p = 0; p * kNr < n; ++p) {
              float *c = c_ + i * v_[kStrideC] + p * kNr * (swap_ ? v_[kLdc] : 1);
              epi_.rect(c + r * (swap_ ? 1 : v_[kLdc]), v_[kLdc], r, std::min(mr_, m - r), p,
                        int(std::min<int64_t>(kNr, n - p * kNr)), swap_);
            }
      return;
    }
    a_ = static_cast<const char *>(args[swap_ ? 1 : 0]) + v_[kOffA] * elem_;
    b_ = static_cast<const char *>(args[swap_ ? 0 : 1]) + v_[kOffB] * elem_;
    kb_ = (k + dpw_ - 1) / dpw_;
    panels_ = (n + kNr - 1) / kNr;
    tiles_ = (m + mr_ - 1) / mr_;
    mblocks_ = (m + mc_ - 1) / mc_;
    parallel_ = m * n * k * batch >= kParallelWork;
    if (keep_b_) {
      bp_ = packed_b();
    } else {
      b_pack_.reserve(size_t(batch * panels_ * kb_ * kNr));
      bp_ = bdst_ = b_pack_.data<uint32_t>();
      launch(&PGemm::pack_b_task, batch * panels_);
    }
    if (!direct_a_) {
      a_pack_.reserve(size_t(batch * m * kb_));
      launch(&PGemm::pack_a_task, batch * tiles_);
    }
    launch(&PGemm::task, batch * mblocks_ * panels_);
  }

private:
  // The bound descriptor of C^T = op(B)^T @ op(A)^T (C read and written transposed by the
  // tiles). One A (now B) shared by a batch whose C columns continue from matrix to matrix is
  // one product of batch * n rows, as merge_shared_b does for the plain form.
  static void transpose(GemmDesc::Bound &b) {
    int64_t *v = b.v;
    std::swap(v[kM], v[kN]);
    std::swap(v[kLda], v[kLdb]);
    std::swap(v[kStrideA], v[kStrideB]);
    std::swap(v[kOffA], v[kOffB]);
    const int64_t ta = v[kTransA];
    v[kTransA] = !v[kTransB];
    v[kTransB] = !ta;
    if (!b.conv && v[kBatch] > 1 && v[kStrideB] == 0 && !v[kTransA] &&
        v[kStrideA] == v[kM] * v[kLda] && v[kStrideC] == v[kM] && v[kBatch] * v[kM] <= INT32_MAX) {
      v[kM] *= v[kBatch];
      v[kBatch] = 1;
    }
  }

  void launch(cpu::KernelFn fn, int64_t tasks) {
    void *targs[1] = {this};
    if (parallel_ && tasks > 1)
      pool_.run(fn, targs, nullptr, tasks, 1);
    else
      fn(targs, nullptr, 0, tasks);
  }

  const uint32_t *packed_b() {
    const int64_t shape[6] = {v_[kK], v_[kN], v_[kLdb], v_[kTransB], v_[kBatch], v_[kStrideB]};
    auto same = [&](const PackedB &p) {
      return p.src == b_ && std::equal(shape, shape + 6, p.shape);
    };
    if (cur_ && same(*cur_)) return cur_->data.data<uint32_t>();
    for (auto &p : copies_)
      if (same(*p)) return (cur_ = p.get())->data.data<uint32_t>();
    // each source buffer gets a copy of its own, copied from one of the same bytes if any: the
    // search times runs over a ring of identical inputs, and a run must read its packed B
    // as cold as its source, as a model's run does
    // (the bytes every batch matrix reads; a negative batch stride reaches back from b_)
    const int64_t rows = v_[kTransB] ? v_[kN] : v_[kK], cols = v_[kTransB] ? v_[kK] : v_[kN];
    const int64_t reach = (v_[kBatch] - 1) * v_[kStrideB];
    const int64_t span = std::abs(reach) + (rows - 1) * v_[kLdb] + cols;
    const char *first = b_ + std::min<int64_t>(reach, 0) * elem_;
    const size_t span_bytes = size_t(span) * size_t(elem_);
    const uint64_t h = cpu::sample_hash(first, span_bytes, 0x5eed);
    auto fresh = std::make_unique<PackedB>();
    fresh->src = b_;
    std::copy(shape, shape + 6, fresh->shape);
    fresh->hash = h;
    const size_t count = size_t(v_[kBatch] * panels_ * kb_ * kNr);
    fresh->data.reserve(count);
    const PackedB *twin = nullptr;
    for (auto &p : copies_)
      if (p->hash == h && std::equal(shape, shape + 6, p->shape)) twin = p.get();
    if (twin) {
      std::memcpy(fresh->data.data<uint32_t>(), twin->data.data<uint32_t>(), count * 4);
    } else {
      bdst_ = fresh->data.data<uint32_t>();
      launch(&PGemm::pack_b_task, v_[kBatch] * panels_);
    }
    if (b_is_weight_) release_source(first, span_bytes);
    copies_.push_back(std::move(fresh));
    cur_ = copies_.back().get();
    size_t bytes = 0;
    for (auto &p : copies_) bytes += p->data.size() * 4;
    while (copies_.size() > 1 && bytes > kMaxCopyBytes) {
      bytes -= copies_.front()->data.size() * 4;
      copies_.erase(copies_.begin());
    }
    return cur_->data.data<uint32_t>();
  }

  // A plan weight's pages are not read by this call again: let the kernel reclaim them, so a
  // packed weight is not resident twice (SmolLM2's f32 prefill weights: 415 MB). MADV_PAGEOUT
  // only reclaims: a mapped file's pages come back from the file if another step reads them,
  // anonymous memory without swap stays as it is.
  static void release_source(const char *src, size_t bytes) {
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
      const char *src = g.b_ + i * v[kStrideB] * g.elem_;
      uint32_t *dst = g.bdst_ + i * g.panels_ * g.kb_ * kNr;
      const auto *half = reinterpret_cast<const uint16_t *>(src);
      auto *f = reinterpret_cast<float *>(dst);
      if (g.conv_b_)
        (g.portable_ ? pack_conv : pack_conv_avx512)(
            reinterpret_cast<const float *>(src), g.conv_, p * kNr,
            std::min<int64_t>(kNr, v[kN] - p * kNr), v[kK], f + p * v[kK] * kNr, kNr);
      else if (g.dpw_ == 2)
        pack_b_pairs(half, v[kLdb], v[kTransB], v[kK], v[kN], p, p + 1, dst);
      else if (g.widen_)
        pack_b_widen(half, v[kLdb], v[kTransB], v[kK], v[kN], p, p + 1, f, g.widen_);
      else
        pack_b(reinterpret_cast<const float *>(src), v[kLdb], v[kTransB], v[kK], v[kN], p, p + 1,
               f);
    }
  }

  static void pack_a_task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    PGemm &g = *static_cast<PGemm *>(targs[0]);
    const int64_t *v = g.v_;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / g.tiles_, tile = t % g.tiles_;
      const char *src = g.a_ + i * v[kStrideA] * g.elem_;
      uint32_t *dst = g.a_pack_.data<uint32_t>() + i * v[kM] * g.kb_;
      const auto *half = reinterpret_cast<const uint16_t *>(src);
      auto *f = reinterpret_cast<float *>(dst);
      const int64_t r0 = tile * g.mr_;
      if (g.conv_a_)
        (g.portable_ ? pack_conv : pack_conv_avx512)(reinterpret_cast<const float *>(src), g.conv_,
                                                     r0, std::min(g.mr_, v[kM] - r0), v[kK],
                                                     f + r0 * v[kK], std::min(g.mr_, v[kM] - r0));
      else if (g.dpw_ == 2)
        pack_a_pairs(half, v[kLda], v[kTransA], v[kM], v[kK], g.mr_, tile, tile + 1, dst);
      else if (g.widen_)
        pack_a_widen(half, v[kLda], v[kTransA], v[kM], v[kK], g.mr_, tile, tile + 1, f, g.widen_);
      else
        pack_a(reinterpret_cast<const float *>(src), v[kLda], v[kTransA], v[kM], v[kK], g.mr_, tile,
               tile + 1, f);
    }
  }

  // Task t: batch matrix i, rows [mb * mc, ...) of C, panel p. Offsets into packed operands are
  // in 32-bit words (a word: one depth of f32, or a bf16 pair; dpw_ depths per word).
  static void task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    const PGemm &g = *static_cast<const PGemm *>(targs[0]);
    const int64_t *v = g.v_;
    const int64_t m = v[kM], n = v[kN], k = v[kK], kb = g.kb_, per = g.mblocks_ * g.panels_;
    const MicroFn *micro = g.micro_[g.direct_a_].data();
    Epilogue::Scratch et; // a tile's epilogue
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / per, mb = t % per / g.panels_, p = t % g.panels_;
      const char *ad = g.a_ + i * v[kStrideA] * g.elem_; // A in place
      const uint32_t *ap = g.a_pack_.data<uint32_t>() + i * m * kb;
      const uint32_t *bp = g.bp_ + (i * g.panels_ + p) * kb * kNr;
      const int64_t ldc = v[kLdc], rs = g.swap_ ? 1 : ldc; // C's step from row to row
      float *c = g.c_ + i * v[kStrideC] + p * kNr * (g.swap_ ? ldc : 1);
      const int cols = int(std::min<int64_t>(kNr, n - p * kNr));
      const int64_t r0 = mb * g.mc_, r1 = std::min(m, r0 + g.mc_);
      for (int64_t k0 = 0; k0 < k; k0 += g.kc_) {
        const int64_t kd = std::min(g.kc_, k - k0), w0 = k0 / g.dpw_;
        const float beta = k0 == 0 ? g.beta_ : 1.f;
        for (int64_t r = r0; r < r1; r += g.mr_) {
          const int64_t rr = std::min(g.mr_, m - r);
          const void *at = g.direct_a_
                               ? static_cast<const void *>(ad + (r * v[kLda] + k0) * g.elem_)
                               : static_cast<const void *>(ap + r * kb + w0 * rr);
          const bool last = !g.epi_.empty() && k0 + kd >= k;
          const EpiTile *ep =
              last && !g.portable_ ? g.epi_.tile(et, r, rr, p, cols, g.swap_) : nullptr;
          micro[rr](at, v[kLda], bp + w0 * kNr, kd, c + r * rs, ldc, cols, g.alpha_, beta, g.swap_,
                    ep);
          if (last && g.portable_) g.epi_.rect(c + r * rs, ldc, r, rr, p, cols, g.swap_);
        }
      }
    }
  }

  // The descriptor fields this call reads beyond the gemm's: its schedule and epilogue.
  static std::vector<std::string> own_fields(const Step &s) {
    std::vector<std::string> out = {"mr", "mc", "kc", "pack", "pack_a", "swap"};
    for (const Field &f : s.fields)
      if (Epilogue::is_field(f.name)) out.push_back(f.name);
    return out;
  }

  std::string at_;
  GemmDesc gemm_;
  cpu::ThreadPool &pool_;
  const MicroTable *micro_ = nullptr; // [packed A, A in place]
  WidenFn widen_ = nullptr;           // half operands run by the f32 kernel
  int64_t elem_ = 4;                  // bytes of an A or B element
  int64_t dpw_ = 1;                   // depths per packed word: 2 for bf16 pairs
  std::vector<uint32_t> args_;
  uint32_t sched_expr_[6] = {};
  bool sched_set_[6] = {};
  int64_t v_[GemmDesc::kNum] = {};
  float alpha_ = 1.f, beta_ = 0.f;
  int64_t mr_ = 8, mc_ = 1, kc_ = 1;
  bool keep_b_ = false, parallel_ = false, direct_a_ = false, b_is_weight_ = false;
  bool swap_ = false;                    // the transposed product (see transpose)
  bool conv_a_ = false, conv_b_ = false; // the operand read through conv_ (pgemm_conv.inc)
  ConvGeom conv_ = {};
  bool is_weight_[2] = {}; // the step's A and B are plan weights
  Epilogue epi_;
  bool portable_ = false; // the plain-loop micro-kernels (no epilogue in their store)
  // the current run's operands and partition (set by run before the tasks start)
  const char *a_ = nullptr, *b_ = nullptr;
  const uint32_t *bp_ = nullptr;
  float *c_ = nullptr;
  uint32_t *bdst_ = nullptr; // where pack_b_task writes
  int64_t kb_ = 0, panels_ = 0, tiles_ = 0, mblocks_ = 0;
  WordBuf a_pack_, b_pack_;
  std::vector<std::unique_ptr<PackedB>> copies_; // oldest first
  PackedB *cur_ = nullptr;
};

} // namespace

void widen_to_f32(DType t, const void *src, float *dst, int64_t n) {
  static const WidenFn f16 = pick_widen(DType::f16, has_avx512());
  static const WidenFn bf16 = pick_widen(DType::bf16, has_avx512());
  (t == DType::f16 ? f16 : bf16)(src, dst, n);
}

std::unique_ptr<LibCallOp> make_pgemm(const Plan &plan, size_t step, cpu::ThreadPool &pool) {
  return std::make_unique<PGemm>(plan, step, pool);
}

} // namespace luminal
