// Postfix integer expressions: the plan's symbolic shapes, offsets and launch sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace luminal {

// Opcodes are fixed by the plan format; binary ops pop b, then a, and push a OP b.
enum class Op : uint8_t { Const = 0, Dim, Add, Sub, Mul, FloorDiv, Mod, Min, Max, Lt, Eq };
constexpr int kNumOps = 11;
constexpr int kMaxStack = 256;

struct Instr {
  Op op;
  int64_t arg; // CONST value or DIM index; 0 for other ops
};
using Program = std::vector<Instr>;

// Throws PlanError unless `p` is well formed: known opcodes, DIM indices < n_dims, no stack
// underflow, depth <= kMaxStack, exactly one value left. `what` names it in messages.
void validate_program(const Program &p, size_t n_dims, const std::string &what);

// Evaluates a validated program in checked int64. Throws Error on overflow or division by
// zero, naming `what`.
int64_t eval_program(const Program &p, const int64_t *dims, const std::string &what);

// True when the program reads no dim, so its value is known at load time.
bool is_constant(const Program &p);

// A readable infix rendering, e.g. "((seq * 64) + 1)"; dims are named from `dim_names`.
std::string render_program(const Program &p, const std::vector<std::string> &dim_names);

} // namespace luminal
