// SwiGLU with its backward (mtrl_model::swiglu): y = T(silu(g) · u), and from dy: dg = dy · u ·
// σ(g) · (1 + g · (1 − σ(g))), du = dy · silu(g) — each pass one kernel over the elements (f32
// inside) instead of candle's silu, product and their backward chains. g, u, dy, y [n]; the
// backward writes dg then du into one [2n] buffer. Grid-stride over the elements.
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ void from_f(float x, float* y) { *y = x; }
__device__ __forceinline__ void from_f(float x, __nv_bfloat16* y) { *y = __float2bfloat16(x); }
__device__ __forceinline__ void from_f(float x, __half* y) { *y = __float2half(x); }

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

template <typename T>
__device__ __forceinline__ void swiglu_fwd(const T* __restrict__ g, const T* __restrict__ u,
                                           T* __restrict__ y, uint32_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float a = to_f(g[i]);
    from_f(a * sigmoid(a) * to_f(u[i]), y + i);
  }
}

template <typename T>
__device__ __forceinline__ void swiglu_bwd(const T* __restrict__ g, const T* __restrict__ u,
                                           const T* __restrict__ dy, T* __restrict__ out,
                                           uint32_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float a = to_f(g[i]), b = to_f(u[i]), dz = to_f(dy[i]);
    const float s = sigmoid(a);
    from_f(dz * b * s * (1.f + a * (1.f - s)), out + i);
    from_f(dz * a * s, out + n + i);
  }
}

#define SWIGLU(SUFFIX, T)                                                                       \
  extern "C" __global__ void swiglu_fwd_##SUFFIX(const T* g, const T* u, T* y, uint32_t n) {    \
    swiglu_fwd<T>(g, u, y, n);                                                                  \
  }                                                                                             \
  extern "C" __global__ void swiglu_bwd_##SUFFIX(const T* g, const T* u, const T* dy, T* out,   \
                                                 uint32_t n) {                                  \
    swiglu_bwd<T>(g, u, dy, out, n);                                                            \
  }

SWIGLU(bf16, __nv_bfloat16)
SWIGLU(f16, __half)
SWIGLU(f32, float)
