// The CPU backend's `pgemm` library call: the gemm descriptor run by luminal's own packed,
// register-blocked kernel (f32, or bf16/f16 operands summed in f32), its schedule in
// descriptor fields (pgemm.cpp).
#pragma once

#include <memory>

#include "../backend.hpp"
#include "thread_pool.hpp"

namespace luminal {

// n values of t (f16 or bf16) at src as f32 at dst (the gemm call widens half operands).
void widen_to_f32(DType t, const void *src, float *dst, int64_t n);

std::unique_ptr<LibCallOp> make_pgemm(const Plan &plan, size_t step, cpu::ThreadPool &pool);

} // namespace luminal
