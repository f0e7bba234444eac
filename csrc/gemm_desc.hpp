// The descriptor of a plan's `gemm` library call, parsed and validated once for every backend
// (docs/plan-format.md, "Library calls"): C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for
// each of `batch` row-major matrices; strides and offsets in elements. Args: A, B, C.
//
// An implicit convolution (the conv_* fields, taken only by a call that asks for them): B is
// not stored but read through a convolution's geometry from an image of conv_c channels of
// conv_ih x conv_iw values (channel stride conv_cs, row stride conv_rs, unit column stride;
// image i at b_offset + i * stride_b): B[(c * kh + dy) * kw + dx, oy * conv_ow + ox] is the
// image's value at channel c, row oy * sh + dy - ph, column ox * sw + dx - pw, 0 outside it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common.hpp"
#include "plan.hpp"

namespace luminal {

class GemmDesc {
public:
  enum Index {
    kM,
    kN,
    kK,
    kLda,
    kLdb,
    kLdc,
    kTransA,
    kTransB,
    kBatch,
    kStrideA,
    kStrideB,
    kStrideC,
    kOffA,
    kOffB,
    kOffC,
    kConvC, // the implicit convolution's geometry (the header's comment)
    kConvKh,
    kConvKw,
    kConvOw,
    kConvSh,
    kConvSw,
    kConvPh,
    kConvPw,
    kConvIh,
    kConvIw,
    kConvCs,
    kConvRs,
    kAlpha,
    kBeta,
    kNum
  };

  // The descriptor at bound dims: every field evaluated, row-major defaults filled in.
  struct Bound {
    int64_t v[kNum] = {};
    double alpha = 1.0, beta = 0.0;
    bool conv = false; // B read through the conv_* geometry
    int64_t operator[](int i) const { return v[i]; }
    bool empty() const { return v[kM] == 0 || v[kN] == 0 || v[kBatch] == 0; }
    // One B shared by a batch whose A and C rows continue from matrix to matrix (a linear
    // layer over batch x seq rows) is one product of batch*m rows: B is packed once, not once
    // per matrix. A CPU backend's choice; the bound descriptor stays valid either way.
    void merge_shared_b() {
      if (!conv && v[kBatch] > 1 && v[kStrideB] == 0 && !v[kTransA] &&
          v[kStrideA] == v[kM] * v[kLda] && v[kStrideC] == v[kM] * v[kLdc] &&
          v[kBatch] * v[kM] <= INT32_MAX) {
        v[kM] *= v[kBatch];
        v[kBatch] = 1;
      }
    }
  };

  // Checks the step's shape: three buffers (A, B, C, then `extra_args` more of a backend's own),
  // known field names, integer fields given as integer expressions, and m, n, k present. `at`
  // names the step in errors; fields named in `extra` are a backend's own (its schedule),
  // parsed by the caller. `conv_ok`: the caller reads B through the conv_* fields; elsewhere
  // they are refused.
  GemmDesc(const Step &s, const std::string &at, const std::vector<std::string> &extra = {},
           size_t extra_args = 0, bool conv_ok = false)
      : at_(at) {
    if (s.args.size() != 3 + extra_args)
      throw PlanError(at + ": needs " + std::to_string(3 + extra_args) + " buffers (A, B, C" +
                      (extra_args ? ", ...)" : ")"));
    for (const Field &f : s.fields) {
      if (std::find(extra.begin(), extra.end(), f.name) != extra.end()) continue;
      auto it = index().find(f.name);
      if (it == index().end()) throw PlanError(at + ": unknown descriptor field '" + f.name + "'");
      if (f.is_real && it->second < kAlpha)
        throw PlanError(at + ": field '" + f.name + "' must be an integer expression");
      if (it->second >= kConvC && it->second < kAlpha && !conv_ok)
        throw PlanError(at + ": field '" + f.name +
                        "' (an implicit convolution) is taken by pgemm only");
      conv_ |= it->second >= kConvC && it->second < kAlpha;
      fields_.push_back({it->second, &f});
    }
    if (conv_)
      for (const char *req : {"conv_c", "conv_kh", "conv_kw", "conv_ow", "conv_ih", "conv_iw"}) {
        bool found = false;
        for (const auto &f : fields_) found |= f.second->name == req;
        if (!found) throw PlanError(at + ": implicit convolution lacks field '" + req + "'");
      }
    for (const char *req : {"m", "n", "k"}) {
      bool found = false;
      for (const auto &f : fields_) found |= f.second->name == req;
      if (!found) throw PlanError(at + ": descriptor lacks required field '" + req + "'");
    }
  }

  // Evaluates the fields at `vals` (the plan's expression values) and refuses a descriptor
  // whose sizes are out of range or whose operands reach outside their buffers (`elems`: each
  // operand buffer's size in elements). Batch strides may be negative (batches stepping back).
  Bound bind(const int64_t *vals, const int64_t elems[3]) const {
    Bound b;
    int64_t *v = b.v;
    v[kBatch] = 1;
    bool set[kNum] = {};
    for (const auto &[i, f] : fields_) {
      set[i] = true;
      if (i == kAlpha || i == kBeta)
        (i == kAlpha ? b.alpha : b.beta) = f->is_real ? f->real : double(vals[f->expr]);
      else
        v[i] = vals[f->expr];
    }
    int64_t m = v[kM], n = v[kN], k = v[kK];
    if (!set[kLda]) v[kLda] = v[kTransA] ? m : k;
    if (!set[kLdb]) v[kLdb] = v[kTransB] ? k : n;
    if (!set[kLdc]) v[kLdc] = n;
    for (int i : {kM, kN, kK, kLda, kLdb, kLdc, kBatch})
      if (v[i] < 0 || v[i] > INT32_MAX)
        throw Error(at_ + ": gemm size " + std::to_string(v[i]) + " out of range");
    for (int i : {kTransA, kTransB})
      if (v[i] != 0 && v[i] != 1) throw Error(at_ + ": gemm trans_a and trans_b must be 0 or 1");
    check(b, v[kTransA] ? k : m, v[kTransA] ? m : k, v[kLda], v[kStrideA], v[kOffA], elems[0], "A");
    if (conv_)
      check_conv(b, set, elems[1]);
    else
      check(b, v[kTransB] ? n : k, v[kTransB] ? k : n, v[kLdb], v[kStrideB], v[kOffB], elems[1],
            "B");
    check(b, m, n, v[kLdc], v[kStrideC], v[kOffC], elems[2], "C");
    return b;
  }

private:
  static const std::map<std::string, int> &index() {
    static const std::map<std::string, int> kIndex = {{"m", kM},
                                                      {"n", kN},
                                                      {"k", kK},
                                                      {"lda", kLda},
                                                      {"ldb", kLdb},
                                                      {"ldc", kLdc},
                                                      {"trans_a", kTransA},
                                                      {"trans_b", kTransB},
                                                      {"batch", kBatch},
                                                      {"stride_a", kStrideA},
                                                      {"stride_b", kStrideB},
                                                      {"stride_c", kStrideC},
                                                      {"a_offset", kOffA},
                                                      {"b_offset", kOffB},
                                                      {"c_offset", kOffC},
                                                      {"conv_c", kConvC},
                                                      {"conv_kh", kConvKh},
                                                      {"conv_kw", kConvKw},
                                                      {"conv_ow", kConvOw},
                                                      {"conv_sh", kConvSh},
                                                      {"conv_sw", kConvSw},
                                                      {"conv_ph", kConvPh},
                                                      {"conv_pw", kConvPw},
                                                      {"conv_ih", kConvIh},
                                                      {"conv_iw", kConvIw},
                                                      {"conv_cs", kConvCs},
                                                      {"conv_rs", kConvRs},
                                                      {"alpha", kAlpha},
                                                      {"beta", kBeta}};
    return kIndex;
  }

  // An operand of rows x cols stored with leading dimension ld, `batch` of them `stride` apart
  // from `off`: every element it touches lies in [0, elems).
  void check(const Bound &b, int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t off,
             int64_t elems, const char *name) const {
    std::string what = at_ + ": operand " + name;
    if (b[kM] == 0 || b[kN] == 0 || b[kBatch] == 0) return; // an empty product runs nothing
    int64_t need = std::max<int64_t>(cols, 1);
    if (ld < need)
      throw Error(what + ": leading dimension " + std::to_string(ld) + " < " +
                  std::to_string(need));
    if (rows == 0 || cols == 0) return;
    __int128 span = __int128(b[kBatch] - 1) * stride;
    __int128 first = off + (span < 0 ? span : 0);
    __int128 last = off + (span > 0 ? span : 0) + __int128(rows - 1) * ld + cols;
    if (first < 0 || last > elems)
      throw Error(what + " reaches outside its buffer (" + std::to_string(elems) + " elements)");
  }

  // The implicit convolution's geometry: defaults filled in (stride 1, no padding, a dense
  // image), k and n of its patches, and every image read inside B's buffer.
  void check_conv(Bound &b, const bool *set, int64_t elems) const {
    int64_t *v = b.v;
    b.conv = true;
    if (!set[kConvSh]) v[kConvSh] = 1;
    if (!set[kConvSw]) v[kConvSw] = 1;
    if (!set[kConvRs]) v[kConvRs] = v[kConvIw];
    if (!set[kConvCs]) v[kConvCs] = v[kConvIh] * v[kConvRs];
    const std::string what = at_ + ": implicit convolution";
    for (int i : {kConvC, kConvKh, kConvKw, kConvOw, kConvSh, kConvSw, kConvIh, kConvIw})
      if (v[i] < 1 || v[i] > INT32_MAX)
        throw Error(what + ": conv_c, kh, kw, ow, sh, sw, ih, iw must be 1.." +
                    std::to_string(INT32_MAX) + ", not " + std::to_string(v[i]));
    for (int i : {kConvPh, kConvPw, kConvCs, kConvRs})
      if (v[i] < 0 || v[i] > INT32_MAX)
        throw Error(what + ": conv_ph, pw, cs, rs must be 0.." + std::to_string(INT32_MAX));
    if (v[kTransB] != 0) throw Error(what + ": needs trans_b 0");
    if (__int128(v[kConvC]) * v[kConvKh] * v[kConvKw] != v[kK])
      throw Error(what + ": k " + std::to_string(v[kK]) + " is not conv_c * conv_kh * conv_kw");
    if (v[kN] % v[kConvOw] != 0)
      throw Error(what + ": n " + std::to_string(v[kN]) + " is not a multiple of conv_ow");
    if (b.empty()) return;
    __int128 span = __int128(v[kBatch] - 1) * v[kStrideB];
    __int128 first = v[kOffB] + (span < 0 ? span : 0);
    __int128 last = v[kOffB] + (span > 0 ? span : 0) + __int128(v[kConvC] - 1) * v[kConvCs] +
                    __int128(v[kConvIh] - 1) * v[kConvRs] + v[kConvIw];
    if (first < 0 || last > elems)
      throw Error(what + ": the image reaches outside its buffer (" + std::to_string(elems) +
                  " elements)");
  }

  std::string at_;
  bool conv_ = false;
  std::vector<std::pair<int, const Field *>> fields_;
};

} // namespace luminal
