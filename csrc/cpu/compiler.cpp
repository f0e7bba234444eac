#include "compiler.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <fstream>
#include <mutex>
#include <random>
#include <spawn.h>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "../common.hpp"

extern char **environ;

namespace luminal::cpu {

namespace {

// -ffast-math is avoided on purpose: it breaks inf/nan handling that softmax relies on.
// -fopenmp-simd lets generated reductions ask for vectorization with `omp simd reduction`
// without allowing reassociation anywhere else. -fno-tree-loop-if-convert: GCC 12 at -O3
// miscompiles inner loops holding guarded (padding) loads when it if-converts them
// (tests/test_ops_reduce.py::test_scans caught it). -fno-trapping-math changes no result (we
// never read FP exception flags) but lets GCC vectorize trunc/floor. Wide vectors: the inner
// loops of split reductions are 16-64 floats, one or a few AVX-512 registers.
const std::vector<std::string> kFlags = {"-O3",
                                         "-march=native",
                                         "-fno-math-errno",
                                         "-ffp-contract=fast",
                                         "-fno-trapping-math",
                                         "-mprefer-vector-width=512",
                                         "-fopenmp-simd",
                                         "-shared",
                                         "-fno-tree-loop-if-convert",
                                         "-fPIC"};

uint64_t fnv1a(const std::string &s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::vector<std::string> compiler_argv() {
  const char *cc = std::getenv("CC");
  std::istringstream in(cc && *cc ? cc : "cc");
  std::vector<std::string> argv;
  for (std::string w; in >> w;) argv.push_back(w); // "$CC" may be e.g. "ccache gcc"
  return argv;
}

// Runs argv with stdout+stderr sent to `log`; returns the exit status (-1: could not start).
int run(const std::vector<std::string> &argv, const std::string &log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char *> args;
  for (const auto &a : argv) args.push_back(const_cast<char *>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_file(const std::string &path, const std::string &data) {
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), std::streamsize(data.size()));
  if (!f) throw Error("cannot write '" + path + "'");
}

void mkdirs(const std::string &path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') {
      std::string p = path.substr(0, i);
      if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST)
        throw Error("cannot create cache folder '" + p + "': " + std::strerror(errno));
    }
}

std::string cache_dir() {
  if (const char *d = std::getenv("LUMINAL_CACHE_DIR"); d && *d) return d;
  if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/luminal";
  const char *home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/luminal";
}

std::string unique_suffix() {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  return std::to_string(::getpid()) + "-" + hex(rng());
}

// What makes a cached object reusable: the compiler's identity and the CPU it targets.
const std::string &toolchain_id() {
  static std::once_flag once;
  static std::string id;
  std::call_once(once, [] {
    std::string dir = cache_dir();
    mkdirs(dir);
    std::string log = dir + "/version-" + unique_suffix() + ".txt";
    auto argv = compiler_argv();
    argv.push_back("--version");
    if (run(argv, log) == 0) id = read_file(log);
    std::remove(log.c_str());
    std::ifstream cpu("/proc/cpuinfo");
    for (std::string line; std::getline(cpu, line);)
      if (line.rfind("model name", 0) == 0 || line.rfind("flags", 0) == 0) {
        id += line;
        if (line.rfind("flags", 0) == 0) break;
      }
    for (const auto &f : kFlags) id += " " + f;
  });
  return id;
}

std::mutex g_compile_mu; // one compile at a time per process; the cache is shared
} // namespace

SharedLib::SharedLib(const std::string &path) : path_(path) {
  handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) throw Error("cannot load kernel library '" + path + "': " + ::dlerror());
}

SharedLib::~SharedLib() {
  ::dlclose(handle_);
}

void *SharedLib::symbol(const std::string &name) const {
  void *p = ::dlsym(handle_, name.c_str());
  if (!p) throw Error("kernel entry point '" + name + "' not found in '" + path_ + "'");
  return p;
}

std::shared_ptr<SharedLib> compile_c(const std::string &source) {
  std::lock_guard<std::mutex> lock(g_compile_mu);
  std::string dir = cache_dir();
  mkdirs(dir);
  std::string key = hex(fnv1a(source, fnv1a(toolchain_id())));
  std::string so = dir + "/cpu-" + key + ".so";
  if (::access(so.c_str(), R_OK) != 0) {
    std::string tmp = dir + "/tmp-" + key + "-" + unique_suffix();
    std::string src = tmp + ".c", out = tmp + ".so", log = tmp + ".log";
    write_file(src, source);
    auto argv = compiler_argv();
    argv.insert(argv.end(), kFlags.begin(), kFlags.end());
    argv.insert(argv.end(), {"-o", out, src});
    int rc = run(argv, log);
    std::string text = read_file(log);
    std::remove(log.c_str());
    if (rc != 0) {
      std::remove(out.c_str());
      std::string cmd;
      for (const auto &a : argv) cmd += (cmd.empty() ? "" : " ") + a;
      throw Error(rc < 0 ? "cannot run the C compiler '" + argv[0] +
                               "' (set $CC to a C compiler): " + cmd
                         : "C compiler failed (exit " + std::to_string(rc) + "): " + cmd +
                               " (source kept at " + src + ")\n" + text);
    }
    std::remove(src.c_str());
    // rename is atomic, so concurrent processes never load a half-written library.
    if (std::rename(out.c_str(), so.c_str()) != 0)
      throw Error("cannot move compiled kernels into the cache: " + so);
  }
  return std::make_shared<SharedLib>(so);
}

std::shared_ptr<SharedLib> load_shared_object(const std::string &image) {
  std::lock_guard<std::mutex> lock(g_compile_mu);
  std::string dir = cache_dir();
  mkdirs(dir);
  std::string so = dir + "/so-" + hex(fnv1a(image)) + "-" + std::to_string(image.size()) + ".so";
  if (::access(so.c_str(), R_OK) != 0) {
    std::string tmp = so + "." + unique_suffix();
    write_file(tmp, image);
    if (std::rename(tmp.c_str(), so.c_str()) != 0) throw Error("cannot write " + so);
  }
  return std::make_shared<SharedLib>(so);
}

} // namespace luminal::cpu
