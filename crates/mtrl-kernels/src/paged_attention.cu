// Attention over the paged key/value store for every row of an engine step, decode rows and
// prefill chunks alike (mtrl_model::paged_attention), reading the pool in place: no per-step copy
// of the rows' keys and values into a padded [n, kv, s, d] tensor, no padded queries, no mask.
//
// Operands: q [t, heads, d], the step's queries; the layer's pool buffers k, v [rows, d] (row of
// KV head g at slot s: ((s / block) · kv + g) · block + s % block); table [r, S] u32, the slots of
// each segment's positions (a segment: one sequence's rows in the step); qrow [t] u32, the
// segment of each query; qlen [t] u32, the positions each query sees (causal: its own position
// + 1). Output [t, heads, d].
//
// One thread block of 4 warps per (query, head): grid (t, heads), queries on x (a step may have
// more than the 65,535 rows grid y allows). Each warp walks every 4th position: a lane holds
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
__device__ __forceinline__ void paged_attention(const T* __restrict__ q, const T* __restrict__ kp,
                                                const T* __restrict__ vp,
                                                const uint32_t* __restrict__ table,
                                                const uint32_t* __restrict__ qrow,
                                                const uint32_t* __restrict__ qlen,
                                                T* __restrict__ out, uint32_t heads, uint32_t kv,
                                                uint32_t s_max, uint32_t d, uint32_t block,
                                                float scale) {
  __shared__ float sm[WARPS];
  __shared__ float sl[WARPS];
  __shared__ float sacc[WARPS * 256];
  const uint32_t i = blockIdx.x, h = blockIdx.y;
  const uint32_t g = h / (heads / kv);
  const uint32_t len = qlen[i];
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t per = d / 32;
  const T* qv = q + ((size_t)i * heads + h) * d;
  float qr[MAX_PER_LANE], acc[MAX_PER_LANE];
#pragma unroll
  for (uint32_t k = 0; k < MAX_PER_LANE; k++) {
    qr[k] = k < per ? to_f(qv[lane + 32 * k]) * scale : 0.f;
    acc[k] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const uint32_t* slots = table + (size_t)qrow[i] * s_max;
  for (uint32_t p = warp; p < len; p += WARPS) {
    const uint32_t slot = slots[p];
    const size_t r = ((size_t)(slot / block) * kv + g) * block + slot % block;
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

#define PAGED_ATTENTION(NAME, T)                                                                  \
  extern "C" __global__ void NAME(const T* q, const T* kp, const T* vp, const uint32_t* table,    \
                                  const uint32_t* qrow, const uint32_t* qlen, T* out,             \
                                  uint32_t heads, uint32_t kv, uint32_t s_max, uint32_t d,        \
                                  uint32_t block, float scale) {                                  \
    paged_attention(q, kp, vp, table, qrow, qlen, out, heads, kv, s_max, d, block, scale);        \
  }

PAGED_ATTENTION(paged_attention_bf16, __nv_bfloat16)
PAGED_ATTENTION(paged_attention_f16, __half)
PAGED_ATTENTION(paged_attention_f32, float)
