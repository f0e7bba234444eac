// In-memory form of a plan file (.lmp) and its loader/validator. The byte layout is
// documented in docs/plan-format.md; python/luminal/plan.py writes it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "expr.hpp"

namespace luminal {

constexpr char kMagic[4] = {'L', 'M', 'P', 'L'};
constexpr uint32_t kFormatVersion = 3;
constexpr uint32_t kOldestVersion = 1;  // version 1 has no buffer alias field
constexpr uint32_t kNone = 0xFFFFFFFFu; // "no expression" (e.g. arena offset of a non-scratch)
constexpr uint64_t kAlign = 64;         // blob, inline weights and the arena

enum class Role : uint8_t { input = 0, output, weight, scratch };
enum class KernelFormat : uint8_t {
  c_source = 0,
  shared_object,
  cuda_source,
  ptx,
  cubin,
  msl,
  metallib,
};
enum class StepKind : uint8_t { launch = 0, libcall, copy };

const char *role_name(Role r);
const char *kernel_format_name(KernelFormat f);

struct Dim {
  std::string name;
  int64_t min = 0, max = 0;
};

struct Buffer {
  std::string name;
  DType dtype = DType::f32;
  Role role = Role::scratch;
  std::vector<uint32_t> shape; // expression ids, outermost first
  uint32_t nbytes = 0;         // expression id
  uint32_t offset = kNone;     // expression id (arena offset, bytes); scratch only
  // Outputs only: the input buffer this output updates in place (it is that input's memory).
  uint32_t alias = kNone;
};

struct Kernel {
  std::string name;
  KernelFormat format = KernelFormat::c_source;
  std::string entry;
  std::string code; // source text or binary image
};

// One named descriptor field of a LibCall: an integer expression or a real constant.
struct Field {
  std::string name;
  bool is_real = false;
  uint32_t expr = kNone;
  double real = 0.0;
};

struct Step {
  StepKind kind = StepKind::launch;
  // Launch
  uint32_t kernel = kNone;
  uint32_t grid[3] = {kNone, kNone, kNone}, block[3] = {kNone, kNone, kNone};
  uint32_t shared_mem = kNone;
  // LibCall
  std::string func;
  std::vector<Field> fields;
  // Launch and LibCall: buffer ids
  std::vector<uint32_t> args;
  // Copy (bytes)
  uint32_t dst = kNone, src = kNone, nbytes = kNone, dst_offset = kNone, src_offset = kNone;
  // Version 3: the step runs only where this expression is nonzero (kNone: always), so one
  // plan holds variants chosen by bound dims (a prefill and a decode program).
  uint32_t when = kNone;
};

struct WeightSource {
  uint32_t buffer = 0;
  bool external = false;
  std::string path;    // external: relative to the plan's folder (or absolute)
  uint64_t offset = 0; // inline: from the blob start; external: from the file start
  uint64_t nbytes = 0;
};

struct Plan {
  uint32_t version = kFormatVersion;
  std::string backend, arch;
  std::vector<Dim> dims;
  std::vector<Program> exprs;
  std::vector<Buffer> buffers;
  std::vector<Kernel> kernels;
  std::vector<Step> steps;
  std::vector<WeightSource> weights;
  std::vector<std::pair<std::string, std::string>> metadata;

  std::string base_dir;             // external weight paths resolve against it
  std::shared_ptr<const void> keep; // owns the bytes `blob` points into (mapping or copy)
  const uint8_t *blob = nullptr;
  uint64_t blob_size = 0;

  // Parses and validates; throws PlanError saying what is wrong.
  static std::shared_ptr<const Plan> load(const std::string &path);
  static std::shared_ptr<const Plan> from_bytes(const void *data, size_t n,
                                                const std::string &base_dir);
  // The same for plan bytes given in pieces (header, body, each weight): copied once, straight
  // into the plan's own aligned memory.
  static std::shared_ptr<const Plan>
  from_parts(const std::vector<std::pair<const void *, size_t>> &parts,
             const std::string &base_dir);

  // Names the places that use expression `id`, for error messages.
  std::string expr_users(uint32_t id) const;
  std::vector<std::string> dim_names() const;
};

} // namespace luminal
