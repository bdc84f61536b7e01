//! The CPU f32 wing of the model: every hand-written kernel, and the only `unsafe` code of the
//! crate.
//!
//! Why it exists: on a few CPU cores candle's generic ops spend their time on graph bookkeeping
//! (a zeroed gradient buffer and an add per node), zero fills, `gemm` packing for skinny products
//! and scalar `expf`. The kernels here fuse those into single graph nodes with their own
//! backward passes, and are checked against the pure-candle spellings and the PyTorch goldens.
//!
//! How it is reached: [`CpuF32`] implements the decoder's `Backend` interface; the decoder's
//! backend is chosen once, in `Transformer::new` (`transformer::backend::select`), by
//! [`handles`]. The log-prob head (`crate::logprobs`) asks the same [`handles`] before it uses
//! [`logits`]. Nothing else in the crate looks at the device.
//!
//! Map: [`backend`] (which kernel serves which decoder op) · [`linear`], [`skinny`], [`gemm`]
//! (products) · [`attn`], [`attn_blocks`], [`packed`], [`decode`], [`paged`] (attention) · [`swiglu`],
//! [`norm_rope`] (elementwise and row ops) · [`logits`] (the log-prob head) · [`vexp`],
//! [`vector`] (the shared `exp`, `dot`, `max`) · [`pool`] (threads, the shared pointer) ·
//! [`storage`] (tensor data as slices) · [`alloc`] (glibc malloc tuning).
//!
//! Threads: everything parallel runs through [`pool`] on candle's worker pool, the pool candle's
//! own CPU ops use. There is deliberately no second pool: two pools' spinning workers would fight
//! over the same cores between every pair of ops.
//!
//! Safety argument, in one place. The `unsafe` code does three things:
//! 1. Work units on the pool write disjoint parts of one output through a [`pool::SharedPtr`]
//!    (rows, column blocks, (sequence, KV group) units). Each unit's range is computed from its
//!    index alone, the ranges of different units do not overlap, and the output buffer is
//!    borrowed by the caller across the whole pool call, which returns only when every unit has.
//! 2. Strided products through [`gemm::gemm`] on raw pointers: each call's comment states the
//!    extents of the views, which lie inside buffers whose lengths were checked (or built) from
//!    the same shapes.
//! 3. Target-feature functions (`#[target_feature(enable = "avx2,fma")]`), called only after
//!    [`avx2`] has confirmed the CPU has those features; and one `mallopt` call ([`alloc`]).
//!
//! Plus [`gemm::uninit`] buffers: f32 has no invalid bit patterns, and every kernel writes each
//! element of such a buffer before it is read.
//!
//! Determinism: a kernel's result for one row (one sequence, one unit) is the same sequence of
//! f32 operations whatever the thread count, the chunking, or the other rows of the batch.

use candle_core::{DType, Device};

pub(crate) mod alloc;
mod attn;
mod attn_blocks;
#[cfg(test)]
mod attn_tests;
mod backend;
mod decode;
mod gemm;
mod linear;
pub(crate) mod logits;
mod norm_rope;
mod packed;
mod paged;
mod pool;
mod skinny;
mod storage;
mod swiglu;
mod vector;
mod vexp;

pub(crate) use backend::CpuF32;
pub(crate) use gemm::uninit;
pub(crate) use pool::{for_rows, par_rows};
pub(crate) use storage::{by_dtype, max_rel_gap, slice_of, twin_vec};

/// Whether the kernels of this module serve tensors on `dev` in `dtype`: the CPU, in f32.
pub(crate) fn handles(dev: &Device, dtype: DType) -> bool {
    dev.is_cpu() && dtype == DType::F32
}

/// Whether the AVX2 + FMA kernels can run (checked once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}
