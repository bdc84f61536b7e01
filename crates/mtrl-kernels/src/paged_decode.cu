// Decode attention over the paged key/value store (mtrl_model::paged_decode), reading the pool in
// place: no per-step copy of the rows' keys and values into a padded [n, kv, s, d] tensor.
//
// Operands: q [n, heads, d]; the layer's pool buffers k, v [rows, d] (row of KV head g at slot s:
// ((s / block) · kv + g) · block + s % block); idx [n, kv, S] u32, the pool row of each row's
// positions per KV head (the step's gather index, already on the device); lens [n] u32, the valid
// positions of each row (its own included). Output [n, heads, d].
//
// One thread block of 4 warps per (head, row). Each warp walks every 4th position: a lane holds
// d / 32 elements of q (scaled), dots them with the key row (coalesced: consecutive lanes read
// consecutive elements), reduces across the warp, and keeps an online softmax (running max m, sum
// l, weighted value sum acc) in f32. The warps' partial states are merged in shared memory. Head
// dims: multiples of 32 up to 256 (Qwen: 64, 128). GQA: head h reads KV head h / (heads / kv).
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define WARPS 4
#define MAX_PER_LANE 8

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ void from_f(float x, float* y) { *y = x; }
__device__ __forceinline__ void from_f(float x, __nv_bfloat16* y) { *y = __float2bfloat16(x); }
__device__ __forceinline__ void from_f(float x, __half* y) { *y = __float2half(x); }

template <typename T>
__device__ __forceinline__ void paged_decode(const T* __restrict__ q, const T* __restrict__ kp,
                                             const T* __restrict__ vp,
                                             const uint32_t* __restrict__ idx,
                                             const uint32_t* __restrict__ lens,
                                             T* __restrict__ out, uint32_t heads, uint32_t kv,
                                             uint32_t s_max, uint32_t d, float scale) {
  __shared__ float sm[WARPS];
  __shared__ float sl[WARPS];
  __shared__ float sacc[WARPS * 256];
  const uint32_t h = blockIdx.x, i = blockIdx.y;
  const uint32_t g = h / (heads / kv);
  const uint32_t len = lens[i];
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t per = d / 32;
  const T* qrow = q + ((size_t)i * heads + h) * d;
  float qr[MAX_PER_LANE], acc[MAX_PER_LANE];
#pragma unroll
  for (uint32_t k = 0; k < MAX_PER_LANE; k++) {
    qr[k] = k < per ? to_f(qrow[lane + 32 * k]) * scale : 0.f;
    acc[k] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const uint32_t* rows = idx + ((size_t)i * kv + g) * s_max;
  for (uint32_t p = warp; p < len; p += WARPS) {
    const size_t r = rows[p];
    const T* krow = kp + r * d;
    float s = 0.f;
#pragma unroll
    for (uint32_t k = 0; k < MAX_PER_LANE; k++) {
      if (k < per) s += qr[k] * to_f(krow[lane + 32 * k]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float m2 = fmaxf(m, s);
    const float a = __expf(m - m2);
    const float e = __expf(s - m2);
    const T* vrow = vp + r * d;
#pragma unroll
    for (uint32_t k = 0; k < MAX_PER_LANE; k++) {
      if (k < per) acc[k] = acc[k] * a + e * to_f(vrow[lane + 32 * k]);
    }
    l = l * a + e;
    m = m2;
  }
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (uint32_t k = 0; k < MAX_PER_LANE; k++) {
    if (k < per) sacc[warp * d + lane + 32 * k] = acc[k];
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < WARPS; w++) mx = fmaxf(mx, sm[w]);
  float total = 0.f;
  for (int w = 0; w < WARPS; w++) total += sm[w] == -INFINITY ? 0.f : sl[w] * __expf(sm[w] - mx);
  T* orow = out + ((size_t)i * heads + h) * d;
  for (uint32_t j = threadIdx.x; j < d; j += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < WARPS; w++) {
      if (sm[w] != -INFINITY) o += sacc[w * d + j] * __expf(sm[w] - mx);
    }
    from_f(total > 0.f ? o / total : 0.f, orow + j);
  }
}

#define PAGED_DECODE(NAME, T)                                                                     \
  extern "C" __global__ void NAME(const T* q, const T* kp, const T* vp, const uint32_t* idx,      \
                                  const uint32_t* lens, T* out, uint32_t heads, uint32_t kv,      \
                                  uint32_t s_max, uint32_t d, float scale) {                      \
    paged_decode(q, kp, vp, idx, lens, out, heads, kv, s_max, d, scale);                          \
  }

PAGED_DECODE(paged_decode_bf16, __nv_bfloat16)
PAGED_DECODE(paged_decode_f16, __half)
PAGED_DECODE(paged_decode_f32, float)
