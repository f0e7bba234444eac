#include "cublaslt_api.hpp"

#include <cstdlib>
#include <dlfcn.h>
#include <mutex>

#include "../common.hpp"

namespace luminal::cuda {

namespace {

std::mutex g_mu;
std::string g_path;
bool g_tried = false;
CublasLt g_api{};
std::string g_why; // empty when loaded

template <typename F> void bind(void *lib, F &slot, const char *symbol, std::string &why) {
  slot = reinterpret_cast<F>(dlsym(lib, symbol));
  if (!slot && why.empty()) why = std::string("the library lacks ") + symbol;
}

void load_locked() {
  g_tried = true;
  std::string path = g_path;
  if (path.empty()) {
    const char *env = std::getenv("LUMINAL_CUBLASLT");
    path = env && *env ? env : "libcublasLt.so.13";
  }
  // It stays loaded for the life of the process: plans may hold handles until exit.
  void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    g_why = "cannot load " + path + " (" + (e ? e : "not found") +
            "; pip install nvidia-cublas, or set LUMINAL_CUBLASLT)";
    return;
  }
  CublasLt &a = g_api;
  std::string &w = g_why;
  bind(lib, a.cublasLtGetStatusName, "cublasLtGetStatusName", w);
  bind(lib, a.cublasLtGetStatusString, "cublasLtGetStatusString", w);
  bind(lib, a.cublasLtGetVersion, "cublasLtGetVersion", w);
  bind(lib, a.cublasLtCreate, "cublasLtCreate", w);
  bind(lib, a.cublasLtDestroy, "cublasLtDestroy", w);
  bind(lib, a.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate", w);
  bind(lib, a.cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy", w);
  bind(lib, a.cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute", w);
  bind(lib, a.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate", w);
  bind(lib, a.cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy", w);
  bind(lib, a.cublasLtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute", w);
  bind(lib, a.cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate", w);
  bind(lib, a.cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy", w);
  bind(lib, a.cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute", w);
  bind(lib, a.cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic", w);
  bind(lib, a.cublasLtMatmul, "cublasLtMatmul", w);
  if (!w.empty()) w = path + ": " + w;
}

} // namespace

void set_cublaslt_path(const std::string &path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_tried) g_path = path;
}

const CublasLt &cublaslt() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_tried) load_locked();
  if (!g_why.empty()) throw Error("cuBLASLt unavailable: " + g_why);
  return g_api;
}

void check_cublas(cublasStatus_t s, const char *call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const char *name = nullptr, *text = nullptr;
  if (g_api.cublasLtGetStatusName) name = g_api.cublasLtGetStatusName(s);
  if (g_api.cublasLtGetStatusString) text = g_api.cublasLtGetStatusString(s);
  throw Error(std::string(call) + " failed: " + (name ? name : "cuBLAS error") + " (" +
              std::to_string(s) + ")" + (text ? std::string(": ") + text : ""));
}

} // namespace luminal::cuda
