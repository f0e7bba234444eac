// Runs a plan: bind dims -> evaluate expressions -> one arena -> kernels (loaded once) -> steps.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.hpp"
#include "plan.hpp"

namespace luminal {

class Executor {
public:
  // Loads kernels (compiling C sources once, cached on disk) and maps weights.
  explicit Executor(std::shared_ptr<const Plan> plan, const std::string &backend = "cpu");
  ~Executor();
  Executor(const Executor &) = delete;
  Executor &operator=(const Executor &) = delete;

  const Plan &plan() const { return *plan_; }
  const Backend &backend() const { return *backend_; }

  // Checks each dim (plan order) against its range and evaluates every expression; checks
  // that input/output sizes match their shapes. Throws Error naming the dim or expression.
  std::vector<int64_t> evaluate(const std::vector<int64_t> &dims) const;
  // Shape of buffer `b` under expression values `vals` (from evaluate).
  std::vector<int64_t> shape(const std::vector<int64_t> &vals, uint32_t b) const;

  // Runs every step. io[b] is the host pointer of input/output buffer b (entries of other
  // buffers are ignored) and must hold that buffer's bytes for these dims; an output with an
  // alias is written in place through its input's pointer (its own entry is ignored). Thread-safe:
  // concurrent calls on one executor run one after the other. When `io_bytes` is given,
  // io_bytes[b] is checked against buffer b's size first (InputError if too small).
  void run(const std::vector<int64_t> &dims, void *const *io, const size_t *io_bytes = nullptr);

  // Bytes of the arena allocated so far (grows to the largest dims bound).
  size_t arena_bytes() const { return arena_size_; }

  // Per-step wall time (LUMINAL_DEBUG=2): when on, each step is timed (the backend syncs
  // after it, so device steps are timed too). profile() gives (total ns, calls) per step.
  void set_profiling(bool on);
  std::vector<std::pair<int64_t, int64_t>> profile() const;

private:
  struct Prepared;
  void bind(const std::vector<int64_t> &dims);
  void map_weights();

  std::shared_ptr<const Plan> plan_;
  std::unique_ptr<Backend> backend_;
  std::vector<KernelHandle> kernels_;
  std::vector<std::unique_ptr<LibCallOp>> libcalls_; // per step; null unless a LibCall
  std::vector<std::shared_ptr<void>> mappings_;      // external weight files, kept mapped
  std::vector<void *> device_weights_;               // staged backends: uploaded weights

  std::mutex mu_;
  bool bound_ = false;
  uint64_t binding_ = 0; // counts bind() calls (Backend::run_steps)
  std::vector<int64_t> dims_, vals_, buf_bytes_;
  std::vector<Prepared> steps_;
  std::vector<void *> ptrs_;                           // per buffer, current pointer
  std::vector<void *> argv_;                           // all launch/libcall args, flattened
  std::vector<std::pair<uint32_t, uint32_t>> io_args_; // (argv slot, buffer) to refresh per run
  std::vector<int64_t> io_offset_;                     // staged backends: I/O place in arena
  bool profiling_ = false;
  std::vector<std::pair<int64_t, int64_t>> prof_; // per step: (total ns, calls)
  void *arena_ = nullptr;
  size_t arena_size_ = 0;
};

// Loads the kernels of many plans at once, up to `jobs` plans at a time (0: one per core),
// and drops the executors: a backend that caches compiled kernels on disk (cpu) then makes
// each Executor(plan) without compiling. Throws the first plan's error.
void prepare(const std::vector<std::shared_ptr<const Plan>> &plans, const std::string &backend,
             unsigned jobs = 0);

} // namespace luminal
