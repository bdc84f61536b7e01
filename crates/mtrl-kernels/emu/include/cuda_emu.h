// The subset of CUDA's execution model mtrl's own kernels use (src/*.cu), on host threads, so the
// kernels' source runs unchanged on a CPU: `cargo test` checks each kernel against its CPU twin
// without a GPU (mtrl-kernels feature `emu`, used by mtrl-model's tests).
//
// A launch runs its blocks one after another; a block's threads are fibers (ucontext) on the
// calling thread, switched cooperatively at `__syncthreads` and `__shfl_xor_sync`, so a launch
// is deterministic and costs a context switch per barrier, not an OS thread per CUDA thread.
// `__shared__` variables are per-thread statics (one block at a time per OS thread, so one copy
// serves; tests on other threads have their own). `__syncthreads` is a barrier over the block's
// live threads (a thread that returns no longer counts) and `__shfl_xor_sync` an exchange over a
// full warp. A barrier some live thread never reaches — divergence the kernel must not have —
// aborts with a message instead of hanging, as does a shuffle with a partial mask, in a warp
// with lanes that returned, or from an out-of-range lane.
//
// What this checks: indexing, reductions, synchronisation and the arithmetic (f32 with the same
// bf16/f16 conversions). What it cannot: PTX code generation, launch limits, memory coalescing or
// speed, and the candle glue that launches a kernel on a GPU (`mtrl selftest` covers those there).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cstdio>
#include <cstdlib>

struct dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

namespace mtrl_emu {

// A barrier over the live threads of a block or a warp.
struct Bar {
  uint32_t live = 0, arrived = 0;
  uint64_t gen = 0;
};

// The running thread's place: its block's barrier, its warp's barrier and exchange buffer, its lane.
struct Ctx {
  Bar* block;
  Bar* warp;
  uint64_t* buf;
  uint32_t lane, warp_size;
};

extern thread_local Ctx ctx;

// Arrives at `b` and switches to other threads until every live thread has arrived.
void wait(Bar& b, const char* what);

}  // namespace mtrl_emu

extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static thread_local

inline void __syncthreads() { mtrl_emu::wait(*mtrl_emu::ctx.block, "__syncthreads"); }

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
  mtrl_emu::Ctx& c = mtrl_emu::ctx;
  const uint32_t src = c.lane ^ (uint32_t)lane_mask;
  if (mask != 0xffffffffu || c.warp_size != 32 || c.warp->live != 32 || src >= 32) {
    fprintf(stderr,
            "cuda emulation: __shfl_xor_sync mask %x in a warp of %u with %u live lanes, "
            "lane %u ^ %d\n",
            mask, c.warp_size, c.warp->live, c.lane, lane_mask);
    abort();
  }
  memcpy(&c.buf[c.lane], &v, sizeof(T));
  mtrl_emu::wait(*c.warp, "__shfl_xor_sync");
  T r;
  memcpy(&r, &c.buf[src], sizeof(T));
  mtrl_emu::wait(*c.warp, "__shfl_xor_sync");
  return r;
}

inline float __expf(float x) { return expf(x); }
