// The `qdot` library call: C = A @ W^T for a block-quantized W, with integer dot products where
// A's blocks of 32 are int8 codes times one f32 scale (docs/quantization.md, "Int8
// activations"). Args: A (f32, m x k, row stride lda), the weight's buffers, C (f32, m x n,
// contiguous). Weight layouts (block b = row * k/32 + column / 32, one byte or code per value):
//   q4_0: Q u8 [16 per block: element e < 16 is the low nibble of byte e, e >= 16 the high
//         nibble of byte e - 16], D f32 [per block];      w = (code - 8) * D
//   q4_1: Q as q4_0, S f32 [per half block], M f32 [per block];
//         w = code * S[h] * (h ? 16 : 1) + M            (the compile-time folded Q4_1 form)
//   q8_0: Q i8 [q_stride bytes per block from q_offset], D f32 [per block]; w = code * D
// Each block of A is checked to be exactly codes times a scale; a block that is not (any f32
// input) is summed in f32, so the call computes A @ W^T for every input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <immintrin.h>

#include "../backend.hpp"
#include "fingerprint.hpp"
#include "qdot.hpp"

namespace luminal {
namespace {

enum class QFmt { q4_0, q4_1, q8_0 };
constexpr int kBlock = 32;

// Activation rows quantized per block of 32: codes, scale, scale * code sum; exact == 0
// where the block is not codes times a scale (its f32 values are summed instead).
struct QRows {
  std::vector<int8_t> codes;
  std::vector<float> scale, scaled_sum;
  std::vector<uint8_t> exact;
  std::vector<int64_t> inexact; // row * nb + block of every block that is not codes
};

void quantize_rows(const float *a, int64_t lda, int64_t m, int64_t k, QRows &q) {
  int64_t nb = k / kBlock;
  q.codes.resize(size_t(m * k));
  q.scale.resize(size_t(m * nb));
  q.scaled_sum.resize(size_t(m * nb));
  q.exact.resize(size_t(m * nb));
  q.inexact.clear();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float *v = a + r * lda + b * kBlock;
      float amax = 0.f;
      for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
      // for values that are codes times an f16 scale d (what the graph's q8 quantization
      // gives), amax is 127 d exactly, so s is d and every check below holds
      float s = amax / 127.f, inv = s != 0.f ? 1.f / s : 0.f;
      int8_t *c = &q.codes[size_t(r * k + b * kBlock)];
      int32_t sum = 0;
      bool exact = std::isfinite(s);
      for (int j = 0; j < kBlock; ++j) {
        float y = std::min(127.f, std::max(-127.f, std::round(v[j] * inv)));
        c[j] = int8_t(y);
        sum += c[j];
        exact &= y * s == v[j];
      }
      size_t i = size_t(r * nb + b);
      // an inexact block's scale is 0: the packed path's integer sums then add nothing and
      // its f32 sum is added apart
      q.scale[i] = exact ? s : 0.f;
      q.scaled_sum[i] = exact ? s * float(sum) : 0.f;
      q.exact[i] = exact;
      if (!exact) q.inexact.push_back(int64_t(i));
    }
}

struct Weights {
  QFmt fmt;
  const uint8_t *q; // block b's codes start at q + b * q_stride
  int64_t q_stride;
  const float *s, *m; // q4_1: S (2 per block) and M; else D in s
};

float weight_value(const Weights &w, int64_t b, int j) {
  const uint8_t *q = w.q + b * w.q_stride;
  switch (w.fmt) {
  case QFmt::q4_0: return float((j < 16 ? q[j] & 15 : q[j - 16] >> 4) - 8) * w.s[b];
  case QFmt::q4_1: {
    int h = j >= 16;
    return float(h ? (q[j - 16] >> 4) * 16 : q[j] & 15) * w.s[2 * b + h] + w.m[b];
  }
  case QFmt::q8_0: return float(int8_t(q[j])) * w.s[b];
  }
  return 0.f;
}

// A block in f32: for a block of A that is not codes times a scale.
__attribute__((noinline, cold)) float block_f32(const Weights &w, int64_t b, const float *v) {
  float acc = 0.f;
  for (int j = 0; j < kBlock; ++j) acc += weight_value(w, b, j) * v[j];
  return acc;
}

// Portable path: integer sums per block (per half block for q4_1), scaled in f32.
float dot_scalar(const Weights &w, int64_t row, int64_t nb, const QRows &x, int64_t xr,
                 const float *a) {
  float acc = 0.f;
  for (int64_t kb = 0; kb < nb; ++kb) {
    int64_t b = row * nb + kb;
    size_t xi = size_t(xr * nb + kb);
    if (!x.exact[xi]) {
      acc += block_f32(w, b, a + kb * kBlock);
      continue;
    }
    const int8_t *c = &x.codes[xi * kBlock];
    const uint8_t *q = w.q + b * w.q_stride;
    float sx = x.scale[xi];
    if (w.fmt == QFmt::q8_0) {
      int32_t s = 0;
      for (int j = 0; j < kBlock; ++j) s += int32_t(int8_t(q[j])) * c[j];
      acc += float(s) * (w.s[b] * sx);
      continue;
    }
    int32_t lo = 0, hi = 0;
    for (int j = 0; j < 16; ++j) {
      lo += int32_t(q[j] & 15) * c[j];
      hi += int32_t(q[j] >> 4) * c[j + 16];
    }
    if (w.fmt == QFmt::q4_0)
      acc += float(lo + hi) * (w.s[b] * sx) - 8.f * w.s[b] * x.scaled_sum[xi];
    else
      acc += (float(lo) * w.s[2 * b] + float(hi) * 16.f * w.s[2 * b + 1]) * sx +
             w.m[b] * x.scaled_sum[xi];
  }
  return acc;
}

void run_scalar(const Weights &w, int64_t lo, int64_t hi, int64_t nb, const QRows &x, int64_t m,
                const float *a, int64_t lda, float *c, int64_t ldc) {
  for (int64_t row = lo; row < hi; ++row)
    for (int64_t r = 0; r < m; ++r) c[r * ldc + row] = dot_scalar(w, row, nb, x, r, a + r * lda);
}

// The weight repacked for the AVX-512 VNNI path (qdot_packed.inc): weight rows in groups of
// 16; per group and block, `stride` bytes: first the codes, the 4 codes of one k-group of all
// 16 rows in one 64-byte vector (q4: two k-groups per vector, one in each nibble; q8_0: as u8,
// code + 128), then the scales. Compact: each row's block scale as f16 (Q4_1: then M as f16),
// the size of the GGUF block, where every scale is an f16 value and Q4_1's halves share one
// scale (GGUF weights); else f32 scales of each row's first and last 16 values and a constant
// times the activation block's scaled code sum (Q4_1: M; Q4_0: -8 D; q8_0: -128 D, undoing the
// + 128). Rows past n have zero scales.
struct Packed {
  QFmt fmt = QFmt::q4_0;
  // the weight it was packed from: its buffers and a hash of their bytes
  const void *src[3] = {};
  uint64_t hash = 0;
  int64_t n = 0, nb = 0, code_bytes = 0, stride = 0;
  bool compact = false;
  PackedBytes data;
};

// x as an IEEE half when it is one exactly.
bool half_exact(float x, uint16_t &h) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
  if (mag == 0) return h = uint16_t(sign), true;
  const int e = int(mag >> 23) - 127;
  const uint32_t frac = (mag & 0x7fffffu) | 0x800000u; // with the implicit bit
  if (mag >= 0x7f800000u || e > 15) return false;
  if (e >= -14) { // normal: 10 fraction bits
    if (mag & 0x1fffu) return false;
    h = uint16_t(sign | uint32_t(e + 15) << 10 | (mag & 0x7fffffu) >> 13);
    return true;
  }
  const int shift = -e - 14 + 13; // subnormal: multiples of 2^-24
  if (shift > 24 || (frac & ((1u << shift) - 1))) return false;
  h = uint16_t(sign | frac >> shift);
  return true;
}

// Block blk's scales: of its first and last 16 values, and its M (Q4_1) or D.
void block_scales(const Weights &w, int64_t blk, float &lo, float &hi, float &m) {
  if (w.fmt == QFmt::q4_1)
    lo = w.s[2 * blk], hi = 16.f * w.s[2 * blk + 1], m = w.m[blk];
  else
    lo = hi = m = w.s[blk];
}

bool can_be_compact(const Weights &w, int64_t blocks) {
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float lo, hi, m;
    uint16_t h;
    block_scales(w, blk, lo, hi, m);
    if (lo != hi || !half_exact(lo, h) || !half_exact(m, h)) return false;
  }
  return true;
}

// Sizes and layout of the packed copy of w (n rows of nb blocks); its bytes zeroed.
void pack_layout(const Weights &w, int64_t n, int64_t nb, Packed &p) {
  const int64_t groups = (n + 15) / 16;
  p.fmt = w.fmt;
  p.n = n;
  p.nb = nb;
  p.compact = can_be_compact(w, n * nb);
  p.code_bytes = w.fmt == QFmt::q8_0 ? 512 : 256;
  p.stride = p.code_bytes + (p.compact ? (w.fmt == QFmt::q4_1 ? 64 : 32) : 192);
  p.data.assign_zero(size_t(groups * nb * p.stride));
}

// Weight rows [row0, row1) into p (laid out by pack_layout).
void pack_rows(const Weights &w, int64_t row0, int64_t row1, Packed &p) {
  const bool q8 = w.fmt == QFmt::q8_0;
  const int64_t nb = p.nb;
  for (int64_t row = row0; row < row1; ++row) {
    const int64_t g = row / 16, j = row % 16;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t blk = row * nb + b;
      const uint8_t *src = w.q + blk * w.q_stride;
      uint8_t code[kBlock];
      for (int e = 0; e < kBlock; ++e)
        code[e] = q8 ? uint8_t(int(int8_t(src[e])) + 128)
                     : uint8_t(e < 16 ? src[e] & 15 : src[e - 16] >> 4);
      uint8_t *dst = &p.data[size_t((g * nb + b) * p.stride)];
      for (int i = 0; i < 4; ++i) {
        if (q8) {
          for (int t = 0; t < 8; ++t) dst[64 * t + 4 * j + i] = code[4 * t + i];
        } else {
          for (int jj = 0; jj < 4; ++jj)
            dst[64 * jj + 4 * j + i] = uint8_t(code[8 * jj + i] | code[8 * jj + 4 + i] << 4);
        }
      }
      float lo, hi, m;
      block_scales(w, blk, lo, hi, m);
      uint8_t *sc = dst + p.code_bytes;
      if (p.compact) {
        uint16_t h[2] = {};
        half_exact(lo, h[0]);
        half_exact(m, h[1]);
        std::memcpy(sc + 2 * j, &h[0], 2);
        if (w.fmt == QFmt::q4_1) std::memcpy(sc + 32 + 2 * j, &h[1], 2);
      } else {
        if (w.fmt == QFmt::q4_0) m *= -8.f;
        if (w.fmt == QFmt::q8_0) m *= -128.f;
        float f[3] = {lo, hi, m};
        for (int i = 0; i < 3; ++i) std::memcpy(sc + 64 * i + 4 * j, &f[i], 4);
      }
    }
  }
}

uint64_t weight_fingerprint(const Weights &w, int64_t n, int64_t nb) {
  using cpu::sample_hash;
  const int64_t blocks = n * nb;
  const size_t qbytes = w.fmt == QFmt::q8_0 ? 32 : 16;
  uint64_t h = sample_hash(w.q, size_t((blocks - 1) * w.q_stride) + qbytes, uint64_t(w.fmt));
  h = sample_hash(w.s, sizeof(float) * size_t(blocks * (w.fmt == QFmt::q4_1 ? 2 : 1)), h);
  if (w.m) h = sample_hash(w.m, sizeof(float) * size_t(blocks), h);
  return h;
}

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#define LM_ISUM(u, v) _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1))
#include "qdot_x86.inc"
#undef LM_ISUM
} // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512vl,avx512vnni")
namespace vnni {
#define LM_ISUM(u, v) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, v)
#include "qdot_x86.inc"
#undef LM_ISUM
} // namespace vnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")
namespace vnni512 {
#include "qdot_packed.inc"
} // namespace vnni512
#pragma GCC pop_options

using RunFn = void (*)(const Weights &, int64_t, int64_t, int64_t, const QRows &, int64_t,
                       const float *, int64_t, float *, int64_t);

// By the CPU's features; LUMINAL_QDOT_ISA=scalar|avx2|vnni256 caps it (tests compare the
// paths). nullptr: the packed AVX-512 path.
RunFn pick_run() {
  const char *force = std::getenv("LUMINAL_QDOT_ISA");
  std::string cap = force ? force : "";
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool vnni = avx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  bool wide = vnni && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  if (cap == "scalar" || !avx2) return run_scalar;
  if (cap == "avx2" || !vnni) return avx2::run_rows;
  if (cap == "vnni256" || !wide) return vnni::run_rows;
  return nullptr;
}

class QDot final : public LibCallOp {
public:
  QDot(const Plan &plan, size_t step, cpu::ThreadPool &pool)
      : at_("step " + std::to_string(step) + " (qdot)"), pool_(pool), run_(pick_run()) {
    const Step &s = plan.steps[step];
    static const std::map<std::string, int> kNames = {
        {"m", 0},        {"n", 1},        {"k", 2},        {"lda", 3},
        {"a_offset", 4}, {"q_offset", 5}, {"q_stride", 6}, {"tile", 7}};
    std::string fmt;
    for (const Field &f : s.fields) {
      if (f.name == "format") {
        if (!f.is_real)
          throw PlanError(at_ + ": 'format' must be a number (0 q4_0, 1 q4_1, 2 q8_0)");
        fmt = std::to_string(int(f.real));
        continue;
      }
      auto it = kNames.find(f.name);
      if (it == kNames.end()) throw PlanError(at_ + ": unknown descriptor field '" + f.name + "'");
      if (f.is_real)
        throw PlanError(at_ + ": field '" + f.name + "' must be an integer expression");
      exprs_[it->second] = f.expr;
      set_[it->second] = true;
    }
    if (fmt == "0")
      fmt_ = QFmt::q4_0;
    else if (fmt == "1")
      fmt_ = QFmt::q4_1;
    else if (fmt == "2")
      fmt_ = QFmt::q8_0;
    else
      throw PlanError(at_ + ": 'format' must be 0 (q4_0), 1 (q4_1) or 2 (q8_0)");
    for (int i : {0, 1, 2, 3, 6})
      if (!set_[i]) throw PlanError(at_ + ": descriptor lacks a required field");
    size_t want = fmt_ == QFmt::q4_1 ? 5 : 4;
    if (s.args.size() != want)
      throw PlanError(at_ + ": needs " + std::to_string(want) + " buffers (A, Q, scales, C)");
    args_ = s.args;
    const DType q = fmt_ == QFmt::q8_0 ? DType::i8 : DType::u8;
    if (plan.buffers[args_[0]].dtype != DType::f32 || plan.buffers[args_[1]].dtype != q ||
        plan.buffers[args_.back()].dtype != DType::f32)
      throw PlanError(at_ + ": A and C must be f32 and Q " + (q == DType::i8 ? "i8" : "u8"));
    for (size_t i = 2; i + 1 < args_.size(); ++i)
      if (plan.buffers[args_[i]].dtype != DType::f32)
        throw PlanError(at_ + ": block scales must be f32");
  }

  void bind(const int64_t *vals, const int64_t *buf_bytes) override {
    for (int i = 0; i < 8; ++i) v_[i] = set_[i] ? vals[exprs_[i]] : 0;
    int64_t m = v_[0], n = v_[1], k = v_[2], lda = v_[3], aoff = v_[4];
    int64_t qoff = v_[5], qs = v_[6];
    if (m < 0 || n < 0 || k < 0 || k % kBlock)
      throw Error(at_ + ": sizes must be >= 0 and k a multiple of 32");
    if (set_[7] && v_[7] != 1 && v_[7] != 2) throw Error(at_ + ": 'tile' must be 1 or 2");
    if (m == 0 || n == 0) return;
    int64_t nb = n * (k / kBlock);
    auto need = [&](size_t arg, int64_t bytes, const char *what) {
      if (bytes > buf_bytes[args_[arg]])
        throw Error(at_ + ": " + what + " reaches outside its buffer");
    };
    if (lda < k || aoff < 0) throw Error(at_ + ": lda must be >= k and a_offset >= 0");
    need(0, 4 * (aoff + (m - 1) * lda + k), "A");
    int64_t qbytes = fmt_ == QFmt::q8_0 ? 32 : 16;
    if (qoff < 0 || qs < qbytes) throw Error(at_ + ": q_offset < 0 or q_stride too small");
    need(1, qoff + (nb - 1) * qs + qbytes, "Q");
    need(2, 4 * nb * (fmt_ == QFmt::q4_1 ? 2 : 1), "the scales");
    if (fmt_ == QFmt::q4_1) need(3, 4 * nb, "the minimums");
    need(args_.size() - 1, 4 * m * n, "C");
  }

  void run(void *const *args) override {
    int64_t m = v_[0], n = v_[1], k = v_[2];
    if (m == 0 || n == 0) return;
    a_ = static_cast<const float *>(args[0]) + v_[4];
    if (run_)
      quantize_rows(a_, v_[3], m, k, x_);
    else
      vnni512::quantize_rows_avx512(a_, v_[3], m, k, x_);
    w_ = Weights{fmt_, static_cast<const uint8_t *>(args[1]) + v_[5], v_[6],
                 static_cast<const float *>(args[2]),
                 fmt_ == QFmt::q4_1 ? static_cast<const float *>(args[3]) : nullptr};
    c_ = static_cast<float *>(args[args_.size() - 1]);
    if (!run_) repack_if_new(n, k / kBlock);
    int64_t tasks = (n + kRows - 1) / kRows;
    void *targs[1] = {this};
    if (tasks == 1 || m * n * k < (int64_t(1) << 15))
      task(targs, nullptr, 0, tasks);
    else
      pool_.run(&QDot::task, targs, nullptr, tasks, 1);
  }

private:
  static constexpr int64_t kRows = 16; // weight rows per task: one group of the packed path

  // A plan's weights are constant: packed on its first run, one copy. The weight operand moves
  // only in the search's measuring plans, which take it as an input and time runs on a ring of
  // byte-identical copies, so that each run reads its weight from memory as in a model: each
  // source buffer gets a packed copy of its own (copied from one of the same bytes, told
  // apart by the fingerprint's samples), so the packed weight a timed run reads is as cold as
  // its source. Copies beyond kMaxCopyBytes (the search's rings hold at most 96 MB of inputs,
  // RING_MAX_BYTES in targets/cpu.py) are dropped oldest first, so a weight that is a plan
  // input at a new address each run does not pile up copies.
  static constexpr size_t kMaxCopyBytes = size_t(128) << 20;

  void repack_if_new(int64_t n, int64_t nb) {
    const void *src[3] = {w_.q, w_.s, w_.m};
    auto same_src = [&](const Packed &p) {
      return p.n == n && p.nb == nb && std::equal(src, src + 3, p.src);
    };
    if (cur_ && same_src(*cur_)) return;
    for (auto &p : copies_)
      if (same_src(*p)) {
        cur_ = p.get();
        return;
      }
    const uint64_t h = weight_fingerprint(w_, n, nb);
    auto fresh = std::make_unique<Packed>();
    const Packed *twin = nullptr;
    for (auto &p : copies_)
      if (p->n == n && p->nb == nb && p->hash == h) twin = p.get();
    if (twin) {
      *fresh = *twin;
    } else {
      pack_layout(w_, n, nb, *fresh);
      cur_ = fresh.get();
      void *targs[1] = {this};
      const int64_t groups = (n + 15) / 16;
      pool_.run(&QDot::pack_task, targs, nullptr, groups, 1); // the vocabulary: 60 ms on one
      fresh->hash = h;
    }
    std::copy(src, src + 3, fresh->src);
    copies_.push_back(std::move(fresh));
    cur_ = copies_.back().get();
    size_t bytes = 0;
    for (auto &p : copies_) bytes += p->data.size();
    while (copies_.size() > 1 && bytes > kMaxCopyBytes) {
      bytes -= copies_.front()->data.size();
      copies_.erase(copies_.begin());
    }
  }

  static void pack_task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    QDot &d = *static_cast<QDot *>(targs[0]);
    pack_rows(d.w_, begin * 16, std::min(d.cur_->n, end * 16), *d.cur_);
  }

  static void task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    const QDot &d = *static_cast<const QDot *>(targs[0]);
    int64_t m = d.v_[0], n = d.v_[1], k = d.v_[2], lda = d.v_[3], nb = k / kBlock;
    int64_t lo = begin * kRows, hi = std::min(n, end * kRows);
    if (d.run_) {
      d.run_(d.w_, lo, hi, nb, d.x_, m, d.a_, lda, d.c_, n);
      return;
    }
    vnni512::run_packed(*d.cur_, begin, end, d.x_, m, d.c_, n, d.set_[7] ? int(d.v_[7]) : 1);
    for (int64_t i : d.x_.inexact) { // blocks that are not codes: their f32 sums
      int64_t r = i / nb, b = i % nb;
      for (int64_t row = lo; row < hi; ++row)
        d.c_[r * n + row] += block_f32(d.w_, row * nb + b, d.a_ + r * lda + b * kBlock);
    }
  }

  std::string at_;
  cpu::ThreadPool &pool_;
  RunFn run_;
  QFmt fmt_ = QFmt::q4_0;
  std::vector<uint32_t> args_;
  uint32_t exprs_[8] = {};
  bool set_[8] = {};
  int64_t v_[8] = {};
  // the current run's operands (set by run before the tasks start)
  QRows x_;
  Weights w_{};
  std::vector<std::unique_ptr<Packed>> copies_; // oldest first
  Packed *cur_ = nullptr;                       // the current run's
  const float *a_ = nullptr;
  float *c_ = nullptr;
};

} // namespace

std::unique_ptr<LibCallOp> make_qdot(const Plan &plan, size_t step, cpu::ThreadPool &pool) {
  return std::make_unique<QDot>(plan, step, pool);
}

} // namespace luminal
