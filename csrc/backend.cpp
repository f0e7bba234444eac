#include "backend.hpp"

#ifdef LUMINAL_WITH_CUDA
#include "cuda/cuda_api.hpp"
#include "cuda/cuda_backend.hpp"
#endif
#ifdef LUMINAL_WITH_METAL
#include "metal/metal_backend.hpp"
#endif

namespace luminal {

std::unique_ptr<Backend> make_cpu_backend(bool staged); // cpu/cpu_backend.cpp

std::unique_ptr<Backend> make_backend(const std::string &name) {
  if (name == "cpu") return make_cpu_backend(false);
  if (name == "cpu-staged") return make_cpu_backend(true);
#ifdef LUMINAL_WITH_CUDA
  if (name == "cuda") return make_cuda_backend(); // throws "CUDA unavailable: <why>"
#else
  if (name == "cuda") throw Error("luminal was built without CUDA support (backend 'cuda')");
#endif
#ifdef LUMINAL_WITH_METAL
  if (name == "metal") return make_metal_backend(); // throws "Metal unavailable: <why>"
#else
  if (name == "metal") throw Error("luminal was built without Metal support (backend 'metal')");
#endif
  throw Error("unknown backend '" + name + "' (available: cpu)");
}

std::vector<std::string> available_backends() {
  std::vector<std::string> out = {"cpu"};
#ifdef LUMINAL_WITH_CUDA
  if (cuda::unavailable_reason().empty()) out.push_back("cuda");
#endif
#ifdef LUMINAL_WITH_METAL
  if (metal::unavailable_reason().empty()) out.push_back("metal");
#endif
  return out;
}

} // namespace luminal
