// Turns c_source kernels into a loaded shared library, through an on-disk cache.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace luminal::cpu {

// A dlopen'd library; closed when the last owner goes.
class SharedLib {
public:
  explicit SharedLib(const std::string &path);
  ~SharedLib();
  SharedLib(const SharedLib &) = delete;
  SharedLib &operator=(const SharedLib &) = delete;
  void *symbol(const std::string &name) const; // throws Error naming the symbol
private:
  void *handle_;
  std::string path_;
};

// Compiles each C translation unit with $CC (default "cc") and the fixed flags, caching the
// result in $LUMINAL_CACHE_DIR (default ~/.cache/luminal) under a hash of source, compiler
// version, flags and CPU model; the ones not cached yet compile in parallel on all cores.
// Throws Error with the compiler's log on failure.
std::vector<std::shared_ptr<SharedLib>> compile_each(const std::vector<std::string> &sources);

// Precompiles the prelude of `source` (its leading include-guarded block) for later compiles,
// if that is not done yet; returns the header's path, "" when there is no usable prelude.
// compile_each does this itself; calling it early lets the work overlap other work.
std::string precompile_prelude(const std::string &source);

// The cores this process may run on: how many compiles compile_each runs at once.
unsigned default_jobs();

// Writes a prebuilt shared object to the cache (keyed by its hash) and loads it.
std::shared_ptr<SharedLib> load_shared_object(const std::string &image);

} // namespace luminal::cpu
