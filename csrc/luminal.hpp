// luminal's C++ API: load a plan and run it, no Python needed.
//
//   auto plan = luminal::Plan::load("model.lmp");         // throws luminal::PlanError
//   luminal::Executor ex(plan, "cpu");                     // compiles/loads kernels once
//   std::vector<int64_t> dims = {7};                       // plan dims, in plan order
//   std::vector<void *> io(plan->buffers.size());          // by buffer id
//   io[x_id] = x_data; io[y_id] = y_data;                  // inputs and outputs only
//   ex.run(dims, io.data());                               // throws luminal::Error
//
// Executor::evaluate(dims) gives every expression's value (for buffer shapes and sizes) so a
// caller can allocate its outputs; see csrc/luminal_run.cpp for a complete program.
#pragma once

#include "backend.hpp"
#include "common.hpp"
#include "executor.hpp"
#include "expr.hpp"
#include "plan.hpp"
