// The descriptor of a plan's `gemm` library call, parsed and validated once for every backend
// (docs/plan-format.md, "Library calls"): C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for
// each of `batch` row-major matrices; strides and offsets in elements. Args: A, B, C.
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
    kAlpha,
    kBeta,
    kNum
  };

  // The descriptor at bound dims: every field evaluated, row-major defaults filled in.
  struct Bound {
    int64_t v[kNum] = {};
    double alpha = 1.0, beta = 0.0;
    int64_t operator[](int i) const { return v[i]; }
    bool empty() const { return v[kM] == 0 || v[kN] == 0 || v[kBatch] == 0; }
    // One B shared by a batch whose A and C rows continue from matrix to matrix (a linear
    // layer over batch x seq rows) is one product of batch*m rows: B is packed once, not once
    // per matrix. A CPU backend's choice; the bound descriptor stays valid either way.
    void merge_shared_b() {
      if (v[kBatch] > 1 && v[kStrideB] == 0 && !v[kTransA] && v[kStrideA] == v[kM] * v[kLda] &&
          v[kStrideC] == v[kM] * v[kLdc] && v[kBatch] * v[kM] <= INT32_MAX) {
        v[kM] *= v[kBatch];
        v[kBatch] = 1;
      }
    }
  };

  // Checks the step's shape: three buffers (A, B, C, then `extra_args` more of a backend's own),
  // known field names, integer fields given as integer expressions, and m, n, k present. `at`
  // names the step in errors; fields named in `extra` are a backend's own (its schedule),
  // parsed by the caller.
  GemmDesc(const Step &s, const std::string &at, const std::vector<std::string> &extra = {},
           size_t extra_args = 0)
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
      fields_.push_back({it->second, &f});
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
    check(b, v[kTransB] ? n : k, v[kTransB] ? k : n, v[kLdb], v[kStrideB], v[kOffB], elems[1], "B");
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

  std::string at_;
  std::vector<std::pair<int, const Field *>> fields_;
};

} // namespace luminal
