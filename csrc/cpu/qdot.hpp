// The CPU backend's `qdot` library call: a product by a block-quantized weight with integer
// dot products over int8 activation blocks (qdot.cpp).
#pragma once

#include <memory>

#include "../backend.hpp"
#include "thread_pool.hpp"

namespace luminal {

std::unique_ptr<LibCallOp> make_qdot(const Plan &plan, size_t step, cpu::ThreadPool &pool);

} // namespace luminal
