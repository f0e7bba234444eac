#include "expr.hpp"

#include "common.hpp"

namespace luminal {

namespace {
const char *kOpNames[kNumOps] = {"CONST", "DIM", "ADD", "SUB", "MUL", "FLOORDIV",
                                 "MOD",   "MIN", "MAX", "LT",  "EQ"};
const char *kInfix[kNumOps] = {"", "", " + ", " - ", " * ", " // ", " % ", "", "", " < ", " == "};

[[noreturn]] void fail(const std::string &what, Op op, int64_t a, int64_t b, const char *why) {
  throw Error(what + ": " + why + " in " + kOpNames[int(op)] + "(" + std::to_string(a) + ", " +
              std::to_string(b) + ")");
}

int64_t apply(Op op, int64_t a, int64_t b, const std::string &what) {
  int64_t r = 0;
  switch (op) {
  case Op::Add:
    if (__builtin_add_overflow(a, b, &r)) fail(what, op, a, b, "int64 overflow");
    return r;
  case Op::Sub:
    if (__builtin_sub_overflow(a, b, &r)) fail(what, op, a, b, "int64 overflow");
    return r;
  case Op::Mul:
    if (__builtin_mul_overflow(a, b, &r)) fail(what, op, a, b, "int64 overflow");
    return r;
  case Op::FloorDiv:
  case Op::Mod: {
    if (b == 0) fail(what, op, a, b, "division by zero");
    if (a == INT64_MIN && b == -1) {
      if (op == Op::Mod) return 0;
      fail(what, op, a, b, "int64 overflow");
    }
    int64_t q = a / b, m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) { // C truncates toward zero; we floor
      q -= 1;
      m += b;
    }
    return op == Op::FloorDiv ? q : m;
  }
  case Op::Min: return a < b ? a : b;
  case Op::Max: return a > b ? a : b;
  case Op::Lt: return a < b ? 1 : 0;
  case Op::Eq: return a == b ? 1 : 0;
  default: break;
  }
  throw Error(what + ": bad opcode"); // unreachable for validated programs
}
} // namespace

void validate_program(const Program &p, size_t n_dims, const std::string &what) {
  int depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const Instr &in = p[i];
    std::string at = what + ", instruction " + std::to_string(i);
    if (uint8_t(in.op) >= kNumOps)
      throw PlanError(at + ": unknown opcode " + std::to_string(int(in.op)));
    if (in.op == Op::Const || in.op == Op::Dim) {
      if (in.op == Op::Dim && (in.arg < 0 || uint64_t(in.arg) >= n_dims))
        throw PlanError(at + ": DIM index " + std::to_string(in.arg) + " out of range (plan has " +
                        std::to_string(n_dims) + " dims)");
      if (++depth > kMaxStack) throw PlanError(at + ": stack deeper than 256");
    } else {
      if (in.arg != 0) throw PlanError(at + ": operand of a binary op must be 0");
      if (depth < 2) throw PlanError(at + ": stack underflow");
      --depth;
    }
  }
  if (depth != 1)
    throw PlanError(what + ": program leaves " + std::to_string(depth) + " values (expected 1)");
}

int64_t eval_program(const Program &p, const int64_t *dims, const std::string &what) {
  int64_t stack[kMaxStack];
  int sp = 0;
  for (const Instr &in : p) {
    if (in.op == Op::Const)
      stack[sp++] = in.arg;
    else if (in.op == Op::Dim)
      stack[sp++] = dims[in.arg];
    else {
      int64_t b = stack[--sp];
      stack[sp - 1] = apply(in.op, stack[sp - 1], b, what);
    }
  }
  return stack[0];
}

bool is_constant(const Program &p) {
  for (const Instr &in : p)
    if (in.op == Op::Dim) return false;
  return true;
}

std::string render_program(const Program &p, const std::vector<std::string> &dim_names) {
  std::vector<std::string> st;
  for (const Instr &in : p) {
    if (in.op == Op::Const)
      st.push_back(std::to_string(in.arg));
    else if (in.op == Op::Dim)
      st.push_back(size_t(in.arg) < dim_names.size() ? dim_names[in.arg] : "?");
    else if (st.size() >= 2) {
      std::string b = st.back();
      st.pop_back();
      std::string &a = st.back();
      if (in.op == Op::Min || in.op == Op::Max)
        a = std::string(in.op == Op::Min ? "min(" : "max(") + a + ", " + b + ")";
      else
        a = "(" + a + kInfix[int(in.op)] + b + ")";
    }
  }
  return st.size() == 1 ? st[0] : "<invalid>";
}

} // namespace luminal
