// RMSNorm with its backward (mtrl_model::rms_norm), each pass one kernel instead of candle's chain
// (cast to f32, square, mean, add, sqrt, divide, cast, multiply; and every op's backward).
//
// x [n, d] (bf16, f16 or f32; computed in f32), w [d]. Forward, one block per row: rstd =
// 1 / sqrt(mean(x²) + eps), y = T(T(x · rstd) · w) — the normed row rounded to the dtype before
// the weight, as Hugging Face's Qwen norm and candle's spelling round it; rstd [n] f32 is kept
// for the backward. Backward: dx (one block per row) = rstd · (dn − x · rstd · c), dn = dy · w,
// c = Σ dn · x · rstd / d; dw partial sums (grid (column blocks, row groups), each thread one
// column over a strided run of rows) [row groups, d] f32 = Σ dy · T(x · rstd), summed over the
// groups by the caller. Block sizes: multiples of 32 up to 256 (the geometry in mtrl-kernels).
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define MAX_WARPS 8

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ void from_f(float x, float* y) { *y = x; }
__device__ __forceinline__ void from_f(float x, __nv_bfloat16* y) { *y = __float2bfloat16(x); }
__device__ __forceinline__ void from_f(float x, __half* y) { *y = __float2half(x); }

// x rounded to T and back.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  T t;
  from_f(x, &t);
  return to_f(t);
}

// The sum of every thread's `v` over the block, returned to every thread.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (uint32_t w = 0; w < blockDim.x / 32; w++) total += smem[w];
  __syncthreads();
  return total;
}

template <typename T>
__device__ __forceinline__ void rms_norm_fwd(const T* __restrict__ x, const T* __restrict__ w,
                                             T* __restrict__ y, float* __restrict__ rstd,
                                             uint32_t d, float eps) {
  __shared__ float smem[MAX_WARPS];
  const size_t r = blockIdx.x;
  const T* row = x + r * d;
  float ss = 0.f;
  for (uint32_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = to_f(row[j]);
    ss += v * v;
  }
  const float rs = 1.f / sqrtf(block_sum(ss, smem) / (float)d + eps);
  T* out = y + r * d;
  for (uint32_t j = threadIdx.x; j < d; j += blockDim.x) {
    from_f(round_to<T>(to_f(row[j]) * rs) * to_f(w[j]), out + j);
  }
  if (threadIdx.x == 0) rstd[r] = rs;
}

template <typename T>
__device__ __forceinline__ void rms_norm_bwd_dx(const T* __restrict__ x, const T* __restrict__ w,
                                                const T* __restrict__ dy,
                                                const float* __restrict__ rstd,
                                                T* __restrict__ dx, uint32_t d) {
  __shared__ float smem[MAX_WARPS];
  const size_t r = blockIdx.x;
  const T* xr = x + r * d;
  const T* gr = dy + r * d;
  const float rs = rstd[r];
  float c = 0.f;
  for (uint32_t j = threadIdx.x; j < d; j += blockDim.x) {
    c += to_f(gr[j]) * to_f(w[j]) * to_f(xr[j]);
  }
  c = block_sum(c, smem) * rs / (float)d;
  T* out = dx + r * d;
  for (uint32_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float dn = to_f(gr[j]) * to_f(w[j]);
    from_f(rs * (dn - to_f(xr[j]) * rs * c), out + j);
  }
}

template <typename T>
__device__ __forceinline__ void rms_norm_bwd_dw(const T* __restrict__ x, const T* __restrict__ dy,
                                                const float* __restrict__ rstd,
                                                float* __restrict__ partial, uint32_t n,
                                                uint32_t d) {
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = 0.f;
  for (uint32_t r = blockIdx.y; r < n; r += gridDim.y) {
    const size_t at = (size_t)r * d + j;
    acc += to_f(dy[at]) * round_to<T>(to_f(x[at]) * rstd[r]);
  }
  partial[(size_t)blockIdx.y * d + j] = acc;
}

#define RMS_NORM(SUFFIX, T)                                                                   \
  extern "C" __global__ void rms_norm_fwd_##SUFFIX(const T* x, const T* w, T* y, float* rstd, \
                                                   uint32_t d, float eps) {                   \
    rms_norm_fwd<T>(x, w, y, rstd, d, eps);                                                   \
  }                                                                                           \
  extern "C" __global__ void rms_norm_bwd_dx_##SUFFIX(const T* x, const T* w, const T* dy,    \
                                                      const float* rstd, T* dx, uint32_t d) { \
    rms_norm_bwd_dx<T>(x, w, dy, rstd, dx, d);                                                \
  }                                                                                           \
  extern "C" __global__ void rms_norm_bwd_dw_##SUFFIX(const T* x, const T* dy,                \
                                                      const float* rstd, float* partial,      \
                                                      uint32_t n, uint32_t d) {               \
    rms_norm_bwd_dw<T>(x, dy, rstd, partial, n, d);                                           \
  }

RMS_NORM(bf16, __nv_bfloat16)
RMS_NORM(f16, __half)
RMS_NORM(f32, float)
