// Turns c_source kernels into a loaded shared library, through an on-disk cache.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace luminal::cpu {

// A dlopen'd library; closed when the last owner goes. A kernel compiled in a group with
// others (see compile_each) is exported under its own name there: `alias` maps the name
// the caller asks for to that one.
class SharedLib {
public:
  explicit SharedLib(const std::string &path, std::pair<std::string, std::string> alias = {});
  ~SharedLib();
  SharedLib(const SharedLib &) = delete;
  SharedLib &operator=(const SharedLib &) = delete;
  void *symbol(const std::string &name) const; // throws Error naming the symbol
private:
  void *handle_;
  std::string path_;
  std::pair<std::string, std::string> alias_; // (asked for, exported)
};

// The entry name of a kernel compiled under a fixed name (see kernel_unit).
inline constexpr const char *kFixedEntry = "lm_kernel_entry";

// A c_source kernel as its own translation unit, and the symbol to look up in its library.
struct KernelUnit {
  std::string source, symbol;
};

// The unit of the kernel `code` whose entry point is `entry`. When the source names the entry
// point only where it defines it, as the code generator writes it, the unit defines
// kFixedEntry instead: kernels that differ only in their names (a model's layers in its decode
// and prefill plans, a variant renamed in the plan they merge into) share one library.
KernelUnit kernel_unit(const std::string &entry, const std::string &code);

// Compiles each C translation unit with $CC (default "cc") and the fixed flags, caching the
// result in $LUMINAL_CACHE_DIR (default ~/.cache/luminal) under a hash of source, compiler
// version, flags and CPU model; the ones not cached yet compile in parallel on all cores.
// Units in kernel_unit's fixed-name form that share their text before the entry point are
// compiled together, one group per core (one compiler run for many kernels: the process
// start, the precompiled prelude's load and the link are paid once per group); each kernel
// is still found in the cache by its own text afterwards. Throws Error with the compiler's
// log on failure.
std::vector<std::shared_ptr<SharedLib>> compile_each(const std::vector<std::string> &sources);

// compile_each without loading: the units not cached yet are compiled into the cache, `jobs`
// compilers at a time (0: one per core).
void compile_all(const std::vector<std::string> &sources, unsigned jobs = 0);

// Precompiles the prelude of `source` (its leading include-guarded block) for later compiles,
// if that is not done yet; returns the header's path, "" when there is no usable prelude.
// compile_each does this itself; calling it early lets the work overlap other work.
std::string precompile_prelude(const std::string &source);

// The cores this process may run on: how many compiles compile_each runs at once.
unsigned default_jobs();

// Writes a prebuilt shared object to the cache (keyed by its hash) and loads it.
std::shared_ptr<SharedLib> load_shared_object(const std::string &image);

} // namespace luminal::cpu
