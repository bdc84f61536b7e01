// The paged key/value store's write (mtrl_model::kv_pool). The store of one layer is a buffer of
// rows [blocks · kv · block, d]; position `slot` of head h lives at row
// ((slot / block) · kv + h) · block + slot % block. `src` holds the step's new keys (or values),
// [t, kv, d] contiguous; `slots` [t] the slot of each token. One thread block per token, threads
// over kv · d (consecutive threads write consecutive elements of a row: coalesced). A bit copy:
// the element size, not the type, picks the function.
#include <stdint.h>

template <typename T>
__device__ __forceinline__ void kv_write(const T* __restrict__ src, T* __restrict__ dst,
                                         const uint32_t* __restrict__ slots, uint32_t kv,
                                         uint32_t d, uint32_t block) {
  const uint32_t t = blockIdx.x;
  const uint32_t s = slots[t];
  const size_t base = (size_t)(s / block) * kv * block + s % block;
  const uint32_t n = kv * d;
  const T* row = src + (size_t)t * n;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint32_t h = i / d;
    const uint32_t j = i - h * d;
    dst[(base + (size_t)h * block) * d + j] = row[i];
  }
}

extern "C" __global__ void kv_write_u16(const uint16_t* src, uint16_t* dst, const uint32_t* slots,
                                        uint32_t kv, uint32_t d, uint32_t block) {
  kv_write(src, dst, slots, kv, d, block);
}

extern "C" __global__ void kv_write_u32(const uint32_t* src, uint32_t* dst, const uint32_t* slots,
                                        uint32_t kv, uint32_t d, uint32_t block) {
  kv_write(src, dst, slots, kv, d, block);
}

extern "C" __global__ void kv_write_u64(const uint64_t* src, uint64_t* dst, const uint32_t* slots,
                                        uint32_t kv, uint32_t d, uint32_t block) {
  kv_write(src, dst, slots, kv, d, block);
}
