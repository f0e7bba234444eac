#include "thread_pool.hpp"

#include <chrono>
#include <cstdlib>
#include <string>

#include "../common.hpp"

namespace luminal::cpu {

namespace {
constexpr auto kSpinTime = std::chrono::microseconds(200); // then a worker sleeps
constexpr int64_t kChunksPerThread = 4;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
inline uint64_t chunks_of(uint64_t s) {
  return (s >> 16) & 0xFFFF;
}
inline uint64_t next_of(uint64_t s) {
  return s & 0xFFFF;
}
} // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  state_.fetch_add(uint64_t(1) << 32);
  state_.notify_all();
  for (auto &t : workers_) t.join();
}

ThreadPool &ThreadPool::global() {
  static ThreadPool pool([] {
    const char *env = std::getenv("LUMINAL_NUM_THREADS");
    int n = env ? std::atoi(env) : 0;
    if (n <= 0) n = int(std::thread::hardware_concurrency());
    return n < 1 ? 1 : (n > 256 ? 256 : n);
  }());
  return pool;
}

bool ThreadPool::claim_and_run(uint64_t s) {
  if (next_of(s) >= chunks_of(s)) return false;
  if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) return true;
  int64_t c = int64_t(next_of(s));
  int64_t begin = c * chunk_, end = std::min(tasks_, begin + chunk_);
  fn_(args_, dims_, begin, end);
  done_.fetch_add(1, std::memory_order_release);
  return true;
}

void ThreadPool::worker() {
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_relaxed)) return;
    if (claim_and_run(s)) continue;
    auto until = std::chrono::steady_clock::now() + kSpinTime;
    for (int i = 1; state_.load(std::memory_order_relaxed) == s; ++i) {
      if (park_.load(std::memory_order_relaxed)) break;
      if (i % 256 == 0 && std::chrono::steady_clock::now() > until) break;
      cpu_relax();
    }
    if (state_.load(std::memory_order_acquire) != s) continue;
    sleepers_.fetch_add(1);
    state_.wait(s);
    sleepers_.fetch_sub(1);
  }
}

void ThreadPool::run(KernelFn fn, void *const *args, const int64_t *dims, int64_t tasks,
                     int64_t min_chunk) {
  if (tasks <= 0) return;
  int64_t threads = size();
  int64_t chunk = std::max<int64_t>(min_chunk, 1);
  if (threads > 1 && tasks > chunk) // enough work to share: aim for a few chunks per thread
    chunk =
        std::max(chunk, (tasks + threads * kChunksPerThread - 1) / (threads * kChunksPerThread));
  int64_t chunks = (tasks + chunk - 1) / chunk;
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (chunks <= 1 || threads == 1 || !lock.owns_lock()) {
    fn(args, dims, 0, tasks); // tiny launch, or another thread owns the pool: run inline
    return;
  }
  fn_ = fn;
  args_ = args;
  dims_ = dims;
  tasks_ = tasks;
  chunk_ = chunk;
  done_.store(0, std::memory_order_relaxed);
  park_.store(false, std::memory_order_relaxed);
  uint64_t gen = (state_.load(std::memory_order_relaxed) >> 32) + 1;
  state_.store(gen << 32 | uint64_t(chunks) << 16, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) state_.notify_all();
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    if (next_of(s) >= chunks_of(s)) break;
    claim_and_run(s);
  }
  while (done_.load(std::memory_order_acquire) < chunks) cpu_relax();
}

} // namespace luminal::cpu
