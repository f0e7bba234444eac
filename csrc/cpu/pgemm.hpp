// The CPU backend's `pgemm` library call: the gemm descriptor run by luminal's own packed,
// register-blocked f32 kernel, its schedule in descriptor fields (pgemm.cpp).
#pragma once

#include <memory>

#include "../backend.hpp"
#include "thread_pool.hpp"

namespace luminal {

std::unique_ptr<LibCallOp> make_pgemm(const Plan &plan, size_t step, cpu::ThreadPool &pool);

} // namespace luminal
