//! `mtrl-kernels`: mtrl's own CUDA kernels as PTX text, loaded by `mtrl-model` with candle's
//! `CudaDevice::get_or_load_custom_func`. Each kernel has a CPU twin beside its caller (the
//! reference its selftest compares against on a GPU):
//!
//! - `kv_write.cu`: the paged key/value store's write, one thread block per token over its heads ×
//!   head dim, addressed by a `[t]` slot mapping (`mtrl_model::kv_pool`; twin: the CPU copy of
//!   `KvWrite` and candle's `scatter_set`, which on CUDA walks the written rows serially).
//! - `paged_decode.cu`: decode attention reading the paged store in place through the step's
//!   gather index, one thread block per (head, row), online softmax in f32
//!   (`mtrl_model::paged_decode`; twins: its CPU loop and the candle spelling that gathers every
//!   row's keys and values into a padded copy first).
//!
//! Without the `cuda` feature the crate is empty and its build script does nothing.

/// The PTX of `src/kv_write.cu` (functions `kv_write_u16`, `kv_write_u32`, `kv_write_u64`: the
/// element size picks the function; the copy is bit for bit).
#[cfg(feature = "cuda")]
pub const KV_WRITE: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_write.ptx"));

/// The module name `KV_WRITE` is loaded under.
pub const KV_WRITE_MODULE: &str = "mtrl_kv_write";

/// The PTX of `src/paged_decode.cu` (functions `paged_decode_bf16`, `paged_decode_f16`,
/// `paged_decode_f32`).
#[cfg(feature = "cuda")]
pub const PAGED_DECODE: &str = include_str!(concat!(env!("OUT_DIR"), "/paged_decode.ptx"));

/// The module name `PAGED_DECODE` is loaded under.
pub const PAGED_DECODE_MODULE: &str = "mtrl_paged_decode";

/// Threads per block of `paged_decode` (its `WARPS` × 32).
pub const PAGED_DECODE_THREADS: u32 = 128;
