// Stand-in for PyTorch's c10/cuda/CUDAException.h, which FlashAttention-2's launch templates
// include for two macros. A failed CUDA call is recorded (first error wins) and reported by
// mtrl_flash_last_error() instead of throwing a torch exception (see ../../api.cu).
#pragma once
#include <cstdio>
#include <cuda_runtime.h>
namespace mtrl_flash {
void record_error(cudaError_t e, const char* file, int line);
}
#define C10_CUDA_CHECK(EXPR)                                                  \
  do {                                                                        \
    cudaError_t mtrl_e_ = (EXPR);                                             \
    if (mtrl_e_ != cudaSuccess) ::mtrl_flash::record_error(mtrl_e_, __FILE__, __LINE__); \
  } while (0)
#define C10_CUDA_KERNEL_LAUNCH_CHECK() C10_CUDA_CHECK(cudaGetLastError())
