#include "backend.hpp"

namespace luminal {

std::unique_ptr<Backend> make_cpu_backend(bool staged); // cpu/cpu_backend.cpp

std::unique_ptr<Backend> make_backend(const std::string &name) {
  if (name == "cpu") return make_cpu_backend(false);
  if (name == "cpu-staged") return make_cpu_backend(true);
  if (name == "cuda") throw Error("luminal was built without CUDA support (backend 'cuda')");
  if (name == "metal") throw Error("luminal was built without Metal support (backend 'metal')");
  throw Error("unknown backend '" + name + "' (available: cpu)");
}

std::vector<std::string> available_backends() {
  return {"cpu"};
}

} // namespace luminal
