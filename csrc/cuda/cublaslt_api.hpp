// Our own declarations of the cuBLASLt entry points luminal uses, loaded from libcublasLt.so.13
// on first use (no CUDA toolkit at build time). Types and constants follow cublasLt.h and
// library_types.h of CUDA 13; only what the CUDA backend's gemm calls is declared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_api.hpp"

namespace luminal::cuda {

using cublasStatus_t = int;
using cublasLtHandle_t = struct cublasLtContext *;
using cublasLtMatmulDesc_t = struct cublasLtMatmulDescOpaque *;
using cublasLtMatrixLayout_t = struct cublasLtMatrixLayoutOpaque *;
using cublasLtMatmulPreference_t = struct cublasLtMatmulPreferenceOpaque *;

struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
// cudaDataType_t
enum : int { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
// cublasComputeType_t
enum : int { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_64F = 70 };
// cublasOperation_t
enum : int32_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
// cublasLtMatmulDescAttributes_t
enum : int { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 };
// cublasLtMatrixLayoutAttribute_t
enum : int {
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6
};
// cublasLtMatmulPreferenceAttributes_t
enum : int {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

struct CublasLt {
  const char *(*cublasLtGetStatusName)(cublasStatus_t);
  const char *(*cublasLtGetStatusString)(cublasStatus_t);
  size_t (*cublasLtGetVersion)();
  cublasStatus_t (*cublasLtCreate)(cublasLtHandle_t *);
  cublasStatus_t (*cublasLtDestroy)(cublasLtHandle_t);
  cublasStatus_t (*cublasLtMatmulDescCreate)(cublasLtMatmulDesc_t *, int compute, int scale);
  cublasStatus_t (*cublasLtMatmulDescDestroy)(cublasLtMatmulDesc_t);
  cublasStatus_t (*cublasLtMatmulDescSetAttribute)(cublasLtMatmulDesc_t, int, const void *, size_t);
  cublasStatus_t (*cublasLtMatrixLayoutCreate)(cublasLtMatrixLayout_t *, int type, uint64_t rows,
                                               uint64_t cols, int64_t ld);
  cublasStatus_t (*cublasLtMatrixLayoutDestroy)(cublasLtMatrixLayout_t);
  cublasStatus_t (*cublasLtMatrixLayoutSetAttribute)(cublasLtMatrixLayout_t, int, const void *,
                                                     size_t);
  cublasStatus_t (*cublasLtMatmulPreferenceCreate)(cublasLtMatmulPreference_t *);
  cublasStatus_t (*cublasLtMatmulPreferenceDestroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*cublasLtMatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t, int,
                                                         const void *, size_t);
  cublasStatus_t (*cublasLtMatmulAlgoGetHeuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                                   cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                                   cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                                   cublasLtMatmulPreference_t, int,
                                                   cublasLtMatmulHeuristicResult_t *, int *);
  cublasStatus_t (*cublasLtMatmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *alpha,
                                   const void *A, cublasLtMatrixLayout_t, const void *B,
                                   cublasLtMatrixLayout_t, const void *beta, const void *C,
                                   cublasLtMatrixLayout_t, void *D, cublasLtMatrixLayout_t,
                                   const cublasLtMatmulAlgo_t *, void *workspace,
                                   size_t workspace_bytes, CUstream);
};

// Where to load libcublasLt from (Python passes what cuda-pathfinder found); takes effect
// only before the first cublaslt() call. Default: $LUMINAL_CUBLASLT, else "libcublasLt.so.13".
void set_cublaslt_path(const std::string &path);

// The library, loaded once; throws Error("cuBLASLt unavailable: ...") when it cannot be.
const CublasLt &cublaslt();

// Throws Error("<call> failed: CUBLAS_STATUS_X (code): description") unless s is success.
void check_cublas(cublasStatus_t s, const char *call);

#define LM_CUBLAS(fn, ...)                                                                         \
  ::luminal::cuda::check_cublas(::luminal::cuda::cublaslt().fn(__VA_ARGS__), #fn)

} // namespace luminal::cuda
