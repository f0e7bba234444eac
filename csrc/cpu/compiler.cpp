#include "compiler.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <dlfcn.h>
#include <exception>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sched.h>
#include <spawn.h>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <utime.h>
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

// Precompiled preludes kept in the cache folder (the most recently used ones).
constexpr size_t kKeepPreludes = 4;

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

// The compiler's `--version` text (empty when it does not run).
const std::string &compiler_version() {
  static std::once_flag once;
  static std::string text;
  std::call_once(once, [] {
    std::string dir = cache_dir();
    mkdirs(dir);
    std::string log = dir + "/version-" + unique_suffix() + ".txt";
    auto argv = compiler_argv();
    argv.push_back("--version");
    if (run(argv, log) == 0) text = read_file(log);
    std::remove(log.c_str());
  });
  return text;
}

// kFlags for the compiler in use: Clang rejects GCC's -ftree-* options (an error, not a
// warning), and has no if-conversion bug to work around.
const std::vector<std::string> &cc_flags() {
  static const std::vector<std::string> flags = [] {
    if (compiler_version().find("clang") == std::string::npos) return kFlags;
    std::vector<std::string> out;
    for (const auto &f : kFlags)
      if (f.rfind("-fno-tree-", 0) != 0) out.push_back(f);
    return out;
  }();
  return flags;
}

// What makes a cached object reusable: the compiler's identity and the CPU it targets.
const std::string &toolchain_id() {
  static std::once_flag once;
  static std::string id;
  std::call_once(once, [] {
    id = compiler_version();
    std::ifstream cpu("/proc/cpuinfo");
    for (std::string line; std::getline(cpu, line);)
      if (line.rfind("model name", 0) == 0 || line.rfind("flags", 0) == 0) {
        id += line;
        if (line.rfind("flags", 0) == 0) break;
      }
    for (const auto &f : cc_flags()) id += " " + f;
  });
  return id;
}

// The leading include-guarded block of a source (after blank and #line lines) through its
// matching #endif: the prelude every generated kernel starts with. Empty when there is none.
std::string guarded_prelude(const std::string &src) {
  auto line_end = [&](size_t p) {
    size_t e = src.find('\n', p);
    return e == std::string::npos ? src.size() : e + 1;
  };
  // "#  word rest" -> (word, rest); empty word when the line is no directive
  auto directive = [&](size_t p, size_t e) -> std::pair<std::string, std::string> {
    while (p < e && (src[p] == ' ' || src[p] == '\t')) ++p;
    if (p == e || src[p] != '#') return {};
    ++p;
    while (p < e && (src[p] == ' ' || src[p] == '\t')) ++p;
    size_t w = p;
    while (p < e && std::isalpha(static_cast<unsigned char>(src[p]))) ++p;
    std::string word = src.substr(w, p - w);
    while (p < e && std::isspace(static_cast<unsigned char>(src[p]))) ++p;
    size_t r = p;
    while (p < e && !std::isspace(static_cast<unsigned char>(src[p]))) ++p;
    return {word, src.substr(r, p - r)};
  };
  size_t pos = 0;
  for (size_t e; pos < src.size(); pos = e) {
    e = line_end(pos);
    if (src.find_first_not_of(" \t\r\n", pos) >= e) continue;
    if (directive(pos, e).first != "line") break;
  }
  size_t start = pos, e = line_end(start);
  auto [w0, guard] = directive(start, e);
  auto [w1, defined] = directive(e, line_end(e));
  if (w0 != "ifndef" || w1 != "define" || guard.empty() || guard != defined) return {};
  int depth = 0;
  for (size_t p = start; p < src.size(); p = line_end(p)) {
    std::string w = directive(p, line_end(p)).first;
    if (w == "if" || w == "ifdef" || w == "ifndef")
      ++depth;
    else if (w == "endif" && --depth == 0)
      return src.substr(start, line_end(p) - start);
  }
  return {};
}

void write_atomic(const std::string &path, const std::string &data) {
  std::string tmp = path + "." + unique_suffix();
  write_file(tmp, data);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("cannot write " + path);
  }
}

// Precompiled preludes. Parsing the prelude (immintrin.h above all) is most of a small
// kernel's compile: with the prelude precompiled once, `-include` makes the compiler load it
// and skip the source's own guarded copy. The object code is the same. Keyed by the prelude
// text and the toolchain; a precompiled header that fails is not used again in this process.
std::mutex g_pch_mu;
std::map<std::string, std::string> g_pch; // header path -> itself, "" when unusable

// Removes all but the kKeepPreludes most recently used precompiled preludes of `dir` (each is
// tens of MB, and every change of the prelude or the toolchain makes a new one). A process
// still using a removed one sees its compile fail and compiles without it.
void prune_preludes(const std::string &dir) {
  std::vector<std::pair<long long, std::string>> found; // (last use, .gch path)
  if (DIR *d = ::opendir(dir.c_str())) {
    while (const dirent *e = ::readdir(d)) {
      std::string name = e->d_name;
      struct stat st;
      if (name.rfind("pch-", 0) == 0 && name.size() > 6 &&
          name.compare(name.size() - 6, 6, ".h.gch") == 0 &&
          ::stat((dir + "/" + name).c_str(), &st) == 0)
        found.emplace_back(st.st_mtime, dir + "/" + name);
    }
    ::closedir(d);
  }
  std::sort(found.rbegin(), found.rend());
  for (size_t i = kKeepPreludes; i < found.size(); ++i) {
    std::remove(found[i].second.c_str());
    std::remove(found[i].second.substr(0, found[i].second.size() - 4).c_str()); // the .h
  }
}

std::string precompiled_prelude(const std::string &prelude) {
  if (prelude.empty()) return {};
  std::string key = hex(fnv1a(prelude, fnv1a(toolchain_id())));
  std::string dir = cache_dir(), header = dir + "/pch-" + key + ".h", gch = header + ".gch";
  std::lock_guard<std::mutex> lock(g_pch_mu); // one build; other compiles wait for it
  if (auto it = g_pch.find(header); it != g_pch.end()) return it->second;
  std::string &slot = g_pch[header];
  if (::access(gch.c_str(), R_OK) == 0 && ::access(header.c_str(), R_OK) == 0) {
    ::utime(gch.c_str(), nullptr); // its last use, for prune_preludes
    return slot = header;
  }
  try {
    write_atomic(header, prelude);
    std::string tmp = dir + "/tmp-pch-" + key + "-" + unique_suffix() + ".gch";
    auto argv = compiler_argv();
    for (const auto &f : cc_flags())
      if (f != "-shared") argv.push_back(f);
    argv.insert(argv.end(), {"-x", "c-header", header, "-o", tmp});
    int rc = run(argv, tmp + ".log");
    std::remove((tmp + ".log").c_str());
    if (rc == 0 && std::rename(tmp.c_str(), gch.c_str()) == 0) {
      prune_preludes(dir);
      return slot = header;
    }
    std::remove(tmp.c_str());
  } catch (const Error &) {
  }
  return slot = "";
}

void pch_failed(const std::string &header) {
  std::lock_guard<std::mutex> lock(g_pch_mu);
  g_pch[header].clear();
}

std::string join(const std::vector<std::string> &argv) {
  std::string cmd;
  for (const auto &a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  return cmd;
}

// Runs the compiler on `src` into the shared library `out`, through the precompiled prelude
// when there is one. On failure, returns the log of a run without it.
struct Outcome {
  int rc;
  std::vector<std::string> argv;
  std::string log;
};

Outcome run_compiler(const std::string &source, const std::string &src, const std::string &out) {
  std::string log = out + ".log";
  auto argv_for = [&](const std::string &pch) {
    auto argv = compiler_argv();
    argv.insert(argv.end(), cc_flags().begin(), cc_flags().end());
    if (!pch.empty()) argv.insert(argv.end(), {"-include", pch});
    argv.insert(argv.end(), {"-o", out, src});
    return argv;
  };
  std::string pch = precompiled_prelude(guarded_prelude(source));
  auto argv = argv_for(pch);
  int rc = run(argv, log);
  if (rc != 0 && !pch.empty()) { // the source's own error, or a stale header: try without it
    argv = argv_for("");
    rc = run(argv, log);
    if (rc == 0) pch_failed(pch);
  }
  Outcome o{rc, argv, read_file(log)};
  std::remove(log.c_str());
  return o;
}

[[noreturn]] void compile_error(const Outcome &o, const std::string &src) {
  throw Error(o.rc < 0 ? "cannot run the C compiler '" + o.argv[0] +
                             "' (set $CC to a C compiler): " + join(o.argv)
                       : "C compiler failed (exit " + std::to_string(o.rc) + "): " + join(o.argv) +
                             " (source kept at " + src + ")\n" + o.log);
}

std::string kernel_key(const std::string &source) {
  return hex(fnv1a(source, fnv1a(toolchain_id())));
}

// The symbol a kernel of key `key` is exported under in a group's library.
std::string group_symbol(const std::string &key) {
  return std::string(kFixedEntry) + "_" + key;
}

// Where the cache holds a kernel: its own library (`symbol` empty), or a group's, named by
// the kernel's `.ref` file ("cpu-group-<hash>.so").
struct Cached {
  std::string path, symbol;
};

bool find_cached(const std::string &dir, const std::string &key, Cached &out) {
  std::string so = dir + "/cpu-" + key + ".so";
  if (::access(so.c_str(), R_OK) == 0) {
    out = {so, ""};
    return true;
  }
  std::istringstream ref(read_file(dir + "/cpu-" + key + ".ref"));
  std::string lib, extra;
  if (!(ref >> lib) || (ref >> extra) || lib.rfind("cpu-group-", 0) != 0 ||
      lib.find('/') != std::string::npos || ::access((dir + "/" + lib).c_str(), R_OK) != 0)
    return false;
  out = {dir + "/" + lib, group_symbol(key)};
  return true;
}

// The cached library of `source` (key `key`), compiled first when missing.
std::string compiled_library(const std::string &dir, const std::string &source,
                             const std::string &key) {
  std::string so = dir + "/cpu-" + key + ".so";
  if (::access(so.c_str(), R_OK) == 0) return so;
  std::string tmp = dir + "/tmp-" + key + "-" + unique_suffix();
  std::string src = tmp + ".c", out = tmp + ".so";
  write_file(src, source);
  Outcome o = run_compiler(source, src, out);
  if (o.rc != 0) {
    std::remove(out.c_str());
    compile_error(o, src);
  }
  std::remove(src.c_str());
  // rename is atomic, so concurrent processes never load a half-written library.
  if (std::rename(out.c_str(), so.c_str()) != 0)
    throw Error("cannot move compiled kernels into the cache: " + so);
  return so;
}

// Where the entry point's definition starts in a unit in kernel_unit's fixed-name form, or
// npos when it is not in that form or when the code from there on has preprocessor
// directives other than #pragma and #line: in a group, a macro it defined would reach the
// kernels after it. Whatever precedes the entry is the same text for a group's kernels.
size_t groupable_at(const std::string &src) {
  const std::string def = std::string("void ") + kFixedEntry + "(void *const *args,";
  size_t at = src.find(def);
  if (at == std::string::npos || src.find(kFixedEntry) != at + 5 ||
      src.find(kFixedEntry, at + 6) != std::string::npos)
    return std::string::npos;
  for (size_t p = at; p < src.size();) {
    size_t e = std::min(src.find('\n', p), src.size());
    size_t q = src.find_first_not_of(" \t", p);
    if (q < e && src[q] == '#') {
      size_t w = std::min(src.find_first_not_of(" \t", q + 1), e);
      if (src.compare(w, 6, "pragma") != 0 && src.compare(w, 4, "line") != 0)
        return std::string::npos;
    }
    p = e + 1;
  }
  return at;
}

// One compiler run: a single unit, or a group (units sharing their text before the entry
// point, each entry renamed to group_symbol(key)).
struct Task {
  std::vector<size_t> units;
  size_t bytes = 0;
};

// Compiles a group into one library and writes each member's `.ref`. False when the
// compiler fails (the members are then compiled one by one, whose errors are the ones shown).
bool compile_group(const std::string &dir, const std::vector<std::string> &sources,
                   const std::vector<std::string> &keys, const std::vector<size_t> &units) {
  size_t first = groupable_at(sources[units[0]]);
  std::string text = sources[units[0]].substr(0, first);
  for (size_t i : units) {
    const std::string &s = sources[i];
    size_t at = groupable_at(s);
    text += "void " + group_symbol(keys[i]) + s.substr(at + 5 + std::strlen(kFixedEntry)) + "\n";
  }
  std::string name = "cpu-group-" + hex(fnv1a(text, fnv1a(toolchain_id()))) + ".so";
  std::string so = dir + "/" + name;
  if (::access(so.c_str(), R_OK) != 0) {
    std::string tmp = dir + "/tmp-" + name + "-" + unique_suffix();
    std::string src = tmp + ".c", out = tmp + ".so";
    write_file(src, text);
    Outcome o = run_compiler(text, src, out);
    std::remove(src.c_str());
    if (o.rc != 0 || std::rename(out.c_str(), so.c_str()) != 0) {
      std::remove(out.c_str());
      return false;
    }
  }
  // written after the library is in place: a reader that finds a .ref finds its library
  for (size_t i : units) write_atomic(dir + "/cpu-" + keys[i] + ".ref", name + "\n");
  return true;
}

// The misses among `units` as compiler runs: one group per core of the units that may share
// one (largest first onto the least loaded group), the rest alone.
std::vector<Task> plan_tasks(const std::vector<std::string> &sources,
                             const std::vector<size_t> &misses, unsigned jobs) {
  std::vector<Task> tasks;
  std::map<std::string, std::vector<size_t>> classes; // text before the entry -> units
  size_t total = 0; // the bytes compiled: a class's shared head counted once
  for (size_t i : misses) {
    size_t at = misses.size() > 1 ? groupable_at(sources[i]) : std::string::npos;
    if (at == std::string::npos) {
      tasks.push_back({{i}, sources[i].size()});
      total += sources[i].size();
    } else {
      classes[sources[i].substr(0, at)].push_back(i);
      total += sources[i].size() - at;
    }
  }
  // each class gets groups in proportion to its share of the bytes (a class that is all of
  // them, a search's candidates, one per core)
  for (auto &[head, units] : classes) {
    size_t bytes = 0;
    for (size_t i : units) bytes += sources[i].size() - head.size();
    size_t n = std::clamp<size_t>((jobs * bytes + total / 2) / std::max<size_t>(total, 1), 1,
                                  units.size());
    std::sort(units.begin(), units.end(),
              [&](size_t a, size_t b) { return sources[a].size() > sources[b].size(); });
    std::vector<Task> groups(n);
    for (size_t i : units) {
      auto g = std::min_element(groups.begin(), groups.end(),
                                [](const Task &a, const Task &b) { return a.bytes < b.bytes; });
      g->units.push_back(i);
      g->bytes += sources[i].size() - head.size();
    }
    for (auto &g : groups) tasks.push_back(std::move(g));
  }
  std::sort(tasks.begin(), tasks.end(),
            [](const Task &a, const Task &b) { return a.bytes > b.bytes; });
  return tasks;
}

// Every unit's place in the cache, compiling the missing ones first, `jobs` compilers at a
// time. A unit that failed to compile has its error instead.
std::vector<Cached> ensure_compiled(const std::vector<std::string> &sources, unsigned jobs,
                                    std::vector<std::exception_ptr> &errors) {
  std::string dir = cache_dir();
  mkdirs(dir);
  std::vector<std::string> keys(sources.size());
  std::vector<Cached> found(sources.size());
  std::vector<size_t> misses;
  std::map<std::string, size_t> first; // key -> the unit that compiles it
  for (size_t i = 0; i < sources.size(); ++i) {
    keys[i] = kernel_key(sources[i]);
    if (!find_cached(dir, keys[i], found[i]) && first.emplace(keys[i], i).second)
      misses.push_back(i);
  }
  errors.assign(sources.size(), nullptr);
  std::vector<Task> queue = plan_tasks(sources, misses, jobs ? jobs : default_jobs());
  std::mutex mu;
  size_t next = 0;
  auto work = [&] {
    for (;;) {
      Task t;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next == queue.size()) return;
        t = queue[next++];
      }
      if (t.units.size() > 1) {
        bool ok = false;
        try { // a cache it cannot write to included: alone, each shows its own error
          ok = compile_group(dir, sources, keys, t.units);
        } catch (...) {
        }
        if (!ok) {
          std::lock_guard<std::mutex> lock(mu);
          for (size_t i : t.units) queue.push_back({{i}, sources[i].size()});
        }
        continue;
      }
      size_t i = t.units[0];
      try {
        found[i] = {compiled_library(dir, sources[i], keys[i]), ""};
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min<size_t>(jobs ? jobs : default_jobs(), queue.size()); ++t)
    threads.emplace_back(work);
  work();
  for (auto &t : threads) t.join();
  for (size_t i = 0; i < sources.size(); ++i) {
    size_t j = first.count(keys[i]) ? first[keys[i]] : i;
    if (errors[j])
      errors[i] = errors[j];
    else if (found[i].path.empty() && !find_cached(dir, keys[i], found[i]))
      errors[i] = std::make_exception_ptr(Error("kernel library missing from the cache after "
                                                "its compile: cpu-" +
                                                keys[i]));
  }
  return found;
}
} // namespace

std::string precompile_prelude(const std::string &source) {
  std::string dir = cache_dir();
  mkdirs(dir);
  return precompiled_prelude(guarded_prelude(source));
}

unsigned default_jobs() {
#ifdef __linux__
  cpu_set_t set; // the cores this process may use, which a container may limit
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return unsigned(CPU_COUNT(&set));
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n ? n : 1;
}

KernelUnit kernel_unit(const std::string &entry, const std::string &code) {
  size_t at = code.find("void " + entry + "(void *const *args,");
  if (at != std::string::npos && code.find(entry) == at + 5 &&
      code.find(entry, at + 6) == std::string::npos)
    return {"#line 1 \"kernel\"\n" + code.substr(0, at) + "void " + kFixedEntry +
                code.substr(at + 5 + entry.size()) + "\n",
            kFixedEntry};
  return {"#line 1 \"" + entry + "\"\n" + code + "\n", entry};
}

SharedLib::SharedLib(const std::string &path, std::pair<std::string, std::string> alias)
    : path_(path), alias_(std::move(alias)) {
  handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) throw Error("cannot load kernel library '" + path + "': " + ::dlerror());
}

SharedLib::~SharedLib() {
  ::dlclose(handle_);
}

void *SharedLib::symbol(const std::string &name) const {
  const std::string &exported =
      !alias_.first.empty() && name == alias_.first ? alias_.second : name;
  void *p = ::dlsym(handle_, exported.c_str());
  if (!p) throw Error("kernel entry point '" + exported + "' not found in '" + path_ + "'");
  return p;
}

std::vector<std::shared_ptr<SharedLib>> compile_each(const std::vector<std::string> &sources) {
  std::vector<std::exception_ptr> errors;
  auto found = ensure_compiled(sources, 0, errors);
  for (auto &e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<std::shared_ptr<SharedLib>> libs;
  for (const auto &c : found)
    libs.push_back(std::make_shared<SharedLib>(
        c.path, c.symbol.empty() ? std::pair<std::string, std::string>{}
                                 : std::pair<std::string, std::string>{kFixedEntry, c.symbol}));
  return libs;
}

void compile_all(const std::vector<std::string> &sources, unsigned jobs) {
  std::vector<std::exception_ptr> errors;
  ensure_compiled(sources, jobs, errors);
  for (auto &e : errors)
    if (e) std::rethrow_exception(e);
}

std::shared_ptr<SharedLib> load_shared_object(const std::string &image) {
  std::string dir = cache_dir();
  mkdirs(dir);
  std::string so = dir + "/so-" + hex(fnv1a(image)) + "-" + std::to_string(image.size()) + ".so";
  if (::access(so.c_str(), R_OK) != 0) write_atomic(so, image);
  return std::make_shared<SharedLib>(so);
}

} // namespace luminal::cpu
