#include "executor.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <map>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "cpu/compiler.hpp"

namespace luminal {

struct Executor::Prepared {
  uint32_t index; // in the plan's steps
  StepKind kind;
  KernelHandle kernel;
  LaunchGeom geom;
  uint32_t argv0; // first slot in argv_
  LibCallOp *op;
  uint32_t dst, src;
  int64_t nbytes, dst_offset, src_offset;
};

namespace {

std::string base_backend(const std::string &name) {
  return name == "cpu-staged" ? "cpu" : name;
}

size_t round_up(int64_t n) {
  return size_t((n + int64_t(kAlign) - 1) / int64_t(kAlign) * kAlign);
}

struct Mapping {
  std::shared_ptr<void> data;
  uint64_t size = 0;
};

// Maps a whole weight file read-only; the page cache holds it, nothing is copied.
Mapping map_file(const std::string &path, const std::string &what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(what + ": cannot open '" + path + "': " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(what + ": '" + path + "' is not a regular file");
  }
  auto size = size_t(st.st_size);
  void *p = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  if (p == MAP_FAILED) throw Error(what + ": cannot map '" + path + "': " + std::strerror(errno));
#ifdef MADV_HUGEPAGE
  // read-only file huge pages where the kernel supports them (see host_alloc)
  if (p && size >= (size_t(4) << 20)) ::madvise(p, size, MADV_HUGEPAGE);
#endif
  return {std::shared_ptr<void>(p,
                                [size](void *q) {
                                  if (q) ::munmap(q, size);
                                }),
          size};
}

} // namespace

Executor::Executor(std::shared_ptr<const Plan> plan, const std::string &backend)
    : plan_(std::move(plan)), backend_(make_backend(backend)) {
  const Plan &pl = *plan_;
  if (pl.backend != base_backend(backend))
    throw Error("plan was compiled for backend '" + pl.backend + "', not '" + backend + "'");
  kernels_ = backend_->load_kernels(pl);
  libcalls_.resize(pl.steps.size());
  for (size_t i = 0; i < pl.steps.size(); ++i)
    if (pl.steps[i].kind == StepKind::libcall) libcalls_[i] = backend_->make_libcall(pl, i);
  ptrs_.assign(pl.buffers.size(), nullptr);
  map_weights();
}

Executor::~Executor() {
  for (void *p : device_weights_) backend_->free(p);
  if (arena_) backend_->free(arena_);
}

namespace {
int debug_level() {
  static const int level = [] {
    const char *d = std::getenv("LUMINAL_DEBUG");
    return d && *d ? std::atoi(d) : 0;
  }();
  return level;
}
} // namespace

void Executor::map_weights() {
  const Plan &pl = *plan_;
  std::map<std::string, Mapping> files;
  std::map<std::string, bool> wrapped; // a mapped file the backend took without a copy
  const bool say = debug_level() >= 2;
  for (const WeightSource &w : pl.weights) {
    const std::string &name = pl.buffers[w.buffer].name;
    const uint8_t *host = pl.blob + w.offset;
    bool in_wrapped = false;
    if (w.external) {
      std::string path = w.path[0] == '/' ? w.path : pl.base_dir + "/" + w.path;
      Mapping &m = files[path];
      if (!m.data) {
        m = map_file(path, "weight '" + name + "'");
        if (!backend_->host_visible()) {
          // a file mapping starts on a page: a unified-memory backend may wrap it whole
          std::string why;
          void *dev = backend_->map_host(m.data.get(), m.size, &why);
          if (dev)
            device_weights_.push_back(dev);
          else if (say)
            std::fprintf(stderr, "luminal: weights of '%s' copied: %s\n", path.c_str(),
                         why.c_str());
          wrapped[path] = dev != nullptr;
        }
      }
      if (w.offset > m.size || w.nbytes > m.size - w.offset)
        throw Error("weight '" + name + "': bytes [" + std::to_string(w.offset) + ", +" +
                    std::to_string(w.nbytes) + ") lie outside '" + path + "' (" +
                    std::to_string(m.size) + " bytes)");
      host = static_cast<const uint8_t *>(m.data.get()) + w.offset;
      in_wrapped = wrapped[path];
    }
    if (backend_->host_visible() || in_wrapped) {
      ptrs_[w.buffer] = const_cast<uint8_t *>(host); // kernels only read weights
      continue;
    }
    std::string why;
    void *dev = backend_->map_host(host, w.nbytes, &why);
    if (!dev) {
      if (say) std::fprintf(stderr, "luminal: weight '%s' copied: %s\n", name.c_str(), why.c_str());
      dev = backend_->alloc(w.nbytes);
      backend_->copy_in(dev, host, w.nbytes);
    }
    device_weights_.push_back(dev);
    ptrs_[w.buffer] = dev;
  }
  for (auto &kv : files) mappings_.push_back(kv.second.data);
}

std::vector<int64_t> Executor::evaluate(const std::vector<int64_t> &dims) const {
  const Plan &pl = *plan_;
  if (dims.size() != pl.dims.size())
    throw InputError("expected " + std::to_string(pl.dims.size()) + " dim values, got " +
                     std::to_string(dims.size()));
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] < pl.dims[i].min || dims[i] > pl.dims[i].max)
      throw InputError("dim '" + pl.dims[i].name + "' = " + std::to_string(dims[i]) +
                       " is outside its range [" + std::to_string(pl.dims[i].min) + ", " +
                       std::to_string(pl.dims[i].max) + "]");
  std::vector<int64_t> vals(pl.exprs.size());
  for (size_t i = 0; i < vals.size(); ++i) {
    try {
      vals[i] = eval_program(pl.exprs[i], dims.data(), "");
    } catch (const Error &e) {
      throw InputError(pl.expr_users(uint32_t(i)) + e.what());
    }
  }
  for (const Buffer &b : pl.buffers) {
    int64_t count = 1;
    for (uint32_t e : b.shape) {
      if (vals[e] < 0) throw InputError("buffer '" + b.name + "' has a negative dimension");
      if (__builtin_mul_overflow(count, vals[e], &count))
        throw InputError("buffer '" + b.name + "' has more than 2^63 elements");
    }
    int64_t n = vals[b.nbytes];
    bool io = b.role == Role::input || b.role == Role::output;
    if (n < 0 || (io && n != dtype_nbytes(b.dtype, count)))
      throw PlanError("buffer '" + b.name + "' size " + std::to_string(n) +
                      " bytes does not match its shape");
    if (b.role == Role::scratch && (vals[b.offset] < 0 || vals[b.offset] > INT64_MAX / 2 - n))
      throw PlanError("scratch buffer '" + b.name + "' has a bad arena offset");
  }
  return vals;
}

std::vector<int64_t> Executor::shape(const std::vector<int64_t> &vals, uint32_t b) const {
  std::vector<int64_t> s;
  for (uint32_t e : plan_->buffers.at(b).shape) s.push_back(vals.at(e));
  return s;
}

void Executor::bind(const std::vector<int64_t> &dims) {
  const Plan &pl = *plan_;
  bound_ = false;
  vals_ = evaluate(dims);
  buf_bytes_.assign(pl.buffers.size(), 0);
  int64_t arena = 0;
  for (size_t b = 0; b < pl.buffers.size(); ++b) {
    const Buffer &buf = pl.buffers[b];
    buf_bytes_[b] = vals_[buf.nbytes];
    if (buf.role == Role::scratch) arena = std::max(arena, vals_[buf.offset] + buf_bytes_[b]);
  }
  // Staged backends keep inputs and outputs in the arena too, after the scratch buffers.
  io_offset_.assign(pl.buffers.size(), -1);
  if (!backend_->host_visible()) {
    for (size_t b = 0; b < pl.buffers.size(); ++b)
      if ((pl.buffers[b].role == Role::input || pl.buffers[b].role == Role::output) &&
          pl.buffers[b].alias == kNone) {
        io_offset_[b] = int64_t(round_up(arena));
        arena = io_offset_[b] + buf_bytes_[b];
      }
    for (size_t b = 0; b < pl.buffers.size(); ++b)
      if (pl.buffers[b].alias != kNone) io_offset_[b] = io_offset_[pl.buffers[b].alias];
  }

  steps_.clear();
  argv_.clear();
  io_args_.clear();
  for (size_t i = 0; i < pl.steps.size(); ++i) {
    const Step &s = pl.steps[i];
    if (s.when != kNone && vals_[s.when] == 0) continue; // another variant's step
    Prepared p{};
    p.index = uint32_t(i);
    p.kind = s.kind;
    p.argv0 = uint32_t(argv_.size());
    std::string what = "step " + std::to_string(i);
    if (s.kind == StepKind::launch) {
      p.kernel = kernels_[s.kernel];
      for (int k = 0; k < 3; ++k) {
        p.geom.grid[k] = vals_[s.grid[k]];
        p.geom.block[k] = vals_[s.block[k]];
      }
      p.geom.shared_mem = vals_[s.shared_mem];
      backend_->check_launch(p.geom, what + " (kernel '" + pl.kernels[s.kernel].name + "')");
    } else if (s.kind == StepKind::libcall) {
      p.op = libcalls_[i].get();
      try {
        p.op->bind(vals_.data(), buf_bytes_.data());
      } catch (const Error &e) {
        std::string at = what + " (" + s.func + ")", msg = e.what();
        throw PlanError(msg.rfind(at, 0) == 0 ? msg : at + ": " + msg);
      }
    } else {
      p.dst = s.dst;
      p.src = s.src;
      p.nbytes = vals_[s.nbytes];
      p.dst_offset = vals_[s.dst_offset];
      p.src_offset = vals_[s.src_offset];
      auto fits = [&](int64_t off, uint32_t b) {
        return p.nbytes >= 0 && off >= 0 && off <= buf_bytes_[b] && p.nbytes <= buf_bytes_[b] - off;
      };
      if (!fits(p.dst_offset, s.dst) || !fits(p.src_offset, s.src))
        throw PlanError(what + ": copy of " + std::to_string(p.nbytes) + " bytes from '" +
                        pl.buffers[s.src].name + "'+" + std::to_string(p.src_offset) + " to '" +
                        pl.buffers[s.dst].name + "'+" + std::to_string(p.dst_offset) +
                        " is out of bounds");
    }
    for (uint32_t a : s.args) {
      Role r = pl.buffers[a].role;
      if (r == Role::input || r == Role::output) io_args_.emplace_back(uint32_t(argv_.size()), a);
      argv_.push_back(nullptr);
    }
    steps_.push_back(p);
  }

  size_t need = round_up(arena);
  if (need > arena_size_) {
    if (arena_) backend_->free(arena_);
    arena_ = nullptr;
    arena_size_ = 0;
    arena_ = backend_->alloc(need);
    arena_size_ = need;
  }
  auto *base = static_cast<uint8_t *>(arena_);
  for (size_t b = 0; b < pl.buffers.size(); ++b) {
    if (pl.buffers[b].role == Role::scratch)
      ptrs_[b] = base + vals_[pl.buffers[b].offset];
    else if (io_offset_[b] >= 0)
      ptrs_[b] = base + io_offset_[b];
  }
  size_t slot = 0;
  for (const Prepared &p : steps_)
    for (uint32_t a : pl.steps[p.index].args) argv_[slot++] = ptrs_[a];
  dims_ = dims;
  ++binding_; // pointers and dims may have changed: recorded steps are stale
  bound_ = true;
}

void Executor::run(const std::vector<int64_t> &dims, void *const *io, const size_t *io_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!bound_ || dims != dims_) bind(dims);
  const Plan &pl = *plan_;
  // An output that updates an input in place is written through the input's pointer.
  std::vector<void *> aliased;
  for (size_t b = 0; b < pl.buffers.size(); ++b)
    if (pl.buffers[b].alias != kNone) {
      if (aliased.empty()) aliased.assign(io, io + pl.buffers.size());
      aliased[b] = io[pl.buffers[b].alias];
    }
  if (!aliased.empty()) io = aliased.data();
  if (io_bytes)
    for (size_t b = 0; b < pl.buffers.size(); ++b) {
      Role r = pl.buffers[b].role;
      if ((r == Role::input || (r == Role::output && pl.buffers[b].alias == kNone)) &&
          io_bytes[b] < size_t(buf_bytes_[b]))
        throw InputError("array for '" + pl.buffers[b].name + "' holds " +
                         std::to_string(io_bytes[b]) + " bytes, the plan needs " +
                         std::to_string(buf_bytes_[b]));
    }
  Backend &be = *backend_;
  bool staged = !be.host_visible();
  for (const auto &[slot, b] : io_args_) argv_[slot] = staged ? ptrs_[b] : io[b];
  if (staged) {
    for (size_t b = 0; b < pl.buffers.size(); ++b)
      if (pl.buffers[b].role == Role::input) be.copy_in(ptrs_[b], io[b], size_t(buf_bytes_[b]));
  }
  auto ptr = [&](uint32_t b) -> uint8_t * {
    Role r = pl.buffers[b].role;
    return static_cast<uint8_t *>(!staged && (r == Role::input || r == Role::output) ? io[b]
                                                                                     : ptrs_[b]);
  };
  auto exec = [&](const Prepared &p) {
    switch (p.kind) {
    case StepKind::launch: be.launch(p.kernel, p.geom, &argv_[p.argv0], dims_.data()); break;
    case StepKind::libcall: p.op->run(&argv_[p.argv0]); break;
    case StepKind::copy:
      if (p.nbytes > 0)
        be.copy(ptr(p.dst) + p.dst_offset, ptr(p.src) + p.src_offset, size_t(p.nbytes));
      break;
    }
  };
  if (!profiling_) {
    be.run_steps(binding_, [&] {
      for (const Prepared &p : steps_) exec(p);
    });
  } else {
    prof_.resize(pl.steps.size());
    for (const Prepared &p : steps_) {
      auto t0 = std::chrono::steady_clock::now();
      exec(p);
      be.sync();
      auto t1 = std::chrono::steady_clock::now();
      prof_[p.index].first += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
      prof_[p.index].second += 1;
    }
  }
  be.sync();
  if (staged) {
    for (size_t b = 0; b < pl.buffers.size(); ++b)
      if (pl.buffers[b].role == Role::output) be.copy_out(io[b], ptrs_[b], size_t(buf_bytes_[b]));
  }
}

void Executor::set_profiling(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  profiling_ = on;
  prof_.assign(plan_->steps.size(), {0, 0});
}

std::vector<std::pair<int64_t, int64_t>> Executor::profile() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex &>(mu_));
  return prof_;
}

void prepare(const std::vector<std::shared_ptr<const Plan>> &plans, const std::string &backend,
             unsigned jobs) {
  if (jobs == 0) jobs = std::max(1u, std::thread::hardware_concurrency());
  if (base_backend(backend) == "cpu") {
    // every plan's C kernels in one batch, so that the compiler groups them (far fewer
    // compiler runs); a unit that fails is reported below, by the Executor of its plan
    std::vector<std::string> sources;
    for (const auto &p : plans)
      if (p && p->backend == "cpu")
        for (const Kernel &k : p->kernels)
          if (k.format == KernelFormat::c_source)
            sources.push_back(cpu::kernel_unit(k.entry, k.code).source);
    try {
      cpu::compile_all(sources, jobs);
    } catch (const Error &) {
    }
  }
  std::vector<std::exception_ptr> errors(plans.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < plans.size();) try {
        Executor ex(plans[i], backend);
      } catch (...) {
        errors[i] = std::current_exception();
      }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < std::min<size_t>(jobs, plans.size()); ++t) threads.emplace_back(work);
  work();
  for (auto &t : threads) t.join();
  for (auto &e : errors)
    if (e) std::rethrow_exception(e);
}

} // namespace luminal
