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
#include <string>
#include <vector>

#include <immintrin.h>

#include "../backend.hpp"
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
};

void quantize_rows(const float *a, int64_t lda, int64_t m, int64_t k, QRows &q) {
  int64_t nb = k / kBlock;
  q.codes.resize(size_t(m * k));
  q.scale.resize(size_t(m * nb));
  q.scaled_sum.resize(size_t(m * nb));
  q.exact.resize(size_t(m * nb));
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
      q.scale[i] = s;
      q.scaled_sum[i] = exact ? s * float(sum) : 0.f;
      q.exact[i] = exact;
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

using RunFn = void (*)(const Weights &, int64_t, int64_t, int64_t, const QRows &, int64_t,
                       const float *, int64_t, float *, int64_t);

// By the CPU's features; LUMINAL_QDOT_ISA=scalar|avx2 caps it (tests compare the paths).
RunFn pick_run() {
  const char *force = std::getenv("LUMINAL_QDOT_ISA");
  std::string cap = force ? force : "";
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool vnni = avx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  if (cap == "scalar" || !avx2) return run_scalar;
  if (cap == "avx2" || !vnni) return avx2::run_rows;
  return vnni::run_rows;
}

class QDot final : public LibCallOp {
public:
  QDot(const Plan &plan, size_t step, cpu::ThreadPool &pool)
      : at_("step " + std::to_string(step) + " (qdot)"), pool_(pool), run_(pick_run()) {
    const Step &s = plan.steps[step];
    static const std::map<std::string, int> kNames = {
        {"m", 0},        {"n", 1},        {"k", 2},       {"lda", 3},
        {"a_offset", 4}, {"q_offset", 5}, {"q_stride", 6}};
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
    for (int i = 0; i < 7; ++i) v_[i] = set_[i] ? vals[exprs_[i]] : 0;
    int64_t m = v_[0], n = v_[1], k = v_[2], lda = v_[3], aoff = v_[4];
    int64_t qoff = v_[5], qs = v_[6];
    if (m < 0 || n < 0 || k < 0 || k % kBlock)
      throw Error(at_ + ": sizes must be >= 0 and k a multiple of 32");
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
    quantize_rows(a_, v_[3], m, k, x_);
    w_ = Weights{fmt_, static_cast<const uint8_t *>(args[1]) + v_[5], v_[6],
                 static_cast<const float *>(args[2]),
                 fmt_ == QFmt::q4_1 ? static_cast<const float *>(args[3]) : nullptr};
    c_ = static_cast<float *>(args[args_.size() - 1]);
    int64_t tasks = (n + kRows - 1) / kRows;
    void *targs[1] = {this};
    if (tasks == 1 || m * n * k < (int64_t(1) << 15))
      task(targs, nullptr, 0, tasks);
    else
      pool_.run(&QDot::task, targs, nullptr, tasks, 1);
  }

private:
  static constexpr int64_t kRows = 16; // weight rows per task

  static void task(void *const *targs, const int64_t *, int64_t begin, int64_t end) {
    const QDot &d = *static_cast<const QDot *>(targs[0]);
    int64_t m = d.v_[0], n = d.v_[1], k = d.v_[2], lda = d.v_[3], nb = k / kBlock;
    d.run_(d.w_, begin * kRows, std::min(n, end * kRows), nb, d.x_, m, d.a_, lda, d.c_, n);
  }

  std::string at_;
  cpu::ThreadPool &pool_;
  RunFn run_;
  QFmt fmt_ = QFmt::q4_0;
  std::vector<uint32_t> args_;
  uint32_t exprs_[7] = {};
  bool set_[7] = {};
  int64_t v_[7] = {};
  // the current run's operands (set by run before the tasks start)
  QRows x_;
  Weights w_{};
  const float *a_ = nullptr;
  float *c_ = nullptr;
};

} // namespace

std::unique_ptr<LibCallOp> make_qdot(const Plan &plan, size_t step, cpu::ThreadPool &pool) {
  return std::make_unique<QDot>(plan, step, pool);
}

} // namespace luminal
