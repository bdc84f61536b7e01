// The log-prob head's two passes over a chunk of logits (mtrl_model::logprob_head), each one
// kernel instead of candle's chain (cast to f32, log-softmax, gather, exp, product, sum; in the
// backward softmax again, product, scatter-add, cast).
//
// z [n, V] the chunk's logits h · Wᵀ (bf16, f16 or f32), read in its own dtype and computed in
// f32; targets [n] u32 the picked token of each row; inv_t = 1 / temperature.
//
// lse_pick_entropy: one block per row, an online (max, Σ e, Σ e·y) over y = z · inv_t in one
// pass, merged across the block; writes out [n, 3] f32 = (lse, y[target] − lse, entropy
// lse − Σ p·y clamped at 0).
//
// dlogits: dz[r, c] = g[r] · inv_t · ([c == target] − exp(y − lse[r])), written in dz's dtype;
// grid (column blocks, n), each thread a strided run of columns.
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define THREADS 256

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ void from_f(float x, float* y) { *y = x; }
__device__ __forceinline__ void from_f(float x, __nv_bfloat16* y) { *y = __float2bfloat16(x); }
__device__ __forceinline__ void from_f(float x, __half* y) { *y = __float2half(x); }

// (m, s, e) ← merge with (m2, s2, e2): the running max, Σ exp(y − m) and Σ exp(y − m)·y.
__device__ __forceinline__ void merge(float& m, float& s, float& e, float m2, float s2, float e2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    e = e2;
    return;
  }
  const float mm = fmaxf(m, m2);
  const float a = __expf(m - mm), b = __expf(m2 - mm);
  s = s * a + s2 * b;
  e = e * a + e2 * b;
  m = mm;
}

template <typename T>
__device__ __forceinline__ void lse_pick_entropy(const T* __restrict__ z,
                                                 const uint32_t* __restrict__ targets,
                                                 float* __restrict__ out, uint32_t vocab,
                                                 float inv_t) {
  __shared__ float sm[THREADS / 32], ss[THREADS / 32], se[THREADS / 32];
  const uint32_t r = blockIdx.x;
  const T* row = z + (size_t)r * vocab;
  float m = -INFINITY, s = 0.f, e = 0.f;
  for (uint32_t c = threadIdx.x; c < vocab; c += THREADS) {
    const float y = to_f(row[c]) * inv_t;
    if (y > m) {
      const float a = (m == -INFINITY) ? 0.f : __expf(m - y);
      s = s * a + 1.f;
      e = e * a + y;
      m = y;
    } else {
      const float p = __expf(y - m);
      s += p;
      e += p * y;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffff, m, off);
    const float s2 = __shfl_xor_sync(0xffffffff, s, off);
    const float e2 = __shfl_xor_sync(0xffffffff, e, off);
    merge(m, s, e, m2, s2, e2);
  }
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
    se[warp] = e;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (uint32_t w = 1; w < THREADS / 32; w++) merge(m, s, e, sm[w], ss[w], se[w]);
    const float lse = m + logf(s);
    out[3 * r] = lse;
    out[3 * r + 1] = to_f(row[targets[r]]) * inv_t - lse;
    out[3 * r + 2] = fmaxf(lse - e / s, 0.f);
  }
}

template <typename T, typename O>
__device__ __forceinline__ void dlogits(const T* __restrict__ z, const float* __restrict__ lse,
                                        const uint32_t* __restrict__ targets,
                                        const float* __restrict__ g, O* __restrict__ dz,
                                        uint32_t vocab, float inv_t) {
  const uint32_t r = blockIdx.y;
  const float c = g[r] * inv_t, l = lse[r];
  const uint32_t t = targets[r];
  const size_t base = (size_t)r * vocab;
  for (uint32_t col = blockIdx.x * THREADS + threadIdx.x; col < vocab;
       col += gridDim.x * THREADS) {
    const float p = __expf(to_f(z[base + col]) * inv_t - l);
    from_f(c * ((col == t ? 1.f : 0.f) - p), dz + base + col);
  }
}

#define LPE(NAME, T)                                                                      \
  extern "C" __global__ void NAME(const T* z, const uint32_t* targets, float* out,        \
                                  uint32_t vocab, float inv_t) {                          \
    lse_pick_entropy<T>(z, targets, out, vocab, inv_t);                                   \
  }
LPE(lse_pick_entropy_bf16, __nv_bfloat16)
LPE(lse_pick_entropy_f16, __half)
LPE(lse_pick_entropy_f32, float)

// dz in the logits' dtype (the weights' dtype: the backward products run in it).
#define DZ(NAME, T)                                                                       \
  extern "C" __global__ void NAME(const T* z, const float* lse, const uint32_t* targets,  \
                                  const float* g, T* dz, uint32_t vocab, float inv_t) {   \
    dlogits<T, T>(z, lse, targets, g, dz, vocab, inv_t);                                  \
  }
DZ(dlogits_bf16, __nv_bfloat16)
DZ(dlogits_f16, __half)
DZ(dlogits_f32, float)
