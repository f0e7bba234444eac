// A persistent pool that splits a launch's [0, tasks) range across threads. The calling
// thread takes part; workers spin briefly between launches, then sleep.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace luminal::cpu {

// The fixed CPU kernel ABI (docs/plan-format.md, "CPU kernels").
using KernelFn = void (*)(void *const *args, const int64_t *dims, int64_t begin, int64_t end);

class ThreadPool {
public:
  explicit ThreadPool(int threads); // total, including the caller
  ~ThreadPool();
  int size() const { return int(workers_.size()) + 1; }

  // Runs fn over [0, tasks) in chunks of at least `min_chunk` tasks; returns when all ran.
  void run(KernelFn fn, void *const *args, const int64_t *dims, int64_t tasks, int64_t min_chunk);
  // Tells spinning workers to sleep now (e.g. before a BLAS call with its own threads).
  void park() { park_.store(true, std::memory_order_relaxed); }

  static ThreadPool &global(); // sized by LUMINAL_NUM_THREADS, default hardware concurrency

private:
  void worker();
  bool claim_and_run(uint64_t s);

  std::vector<std::thread> workers_;
  std::mutex busy_; // one launch at a time; other callers run inline
  // Job fields are written before `state_` is published and read only after a claim on it.
  KernelFn fn_ = nullptr;
  void *const *args_ = nullptr;
  const int64_t *dims_ = nullptr;
  int64_t tasks_ = 0, chunk_ = 0;
  // state_ = generation << 32 | chunk count << 16 | next chunk; claims are CAS increments.
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> park_{false}, stop_{false};
};

} // namespace luminal::cpu
