//! `mtrl-kernels`: mtrl's own CUDA kernels as PTX text, loaded by `mtrl-model` with candle's
//! `CudaDevice::get_or_load_custom_func`. Each kernel has a CPU twin beside its caller (the
//! reference its selftest compares against on a GPU):
//!
//! - `kv_write.cu`: the paged key/value store's write, one thread block per token over its heads ×
//!   head dim, addressed by a `[t]` slot mapping (`mtrl_model::kv_pool`; twin: the CPU copy of
//!   `KvWrite` and candle's `scatter_set`, which on CUDA walks the written rows serially).
//!
//! Without the `cuda` feature the crate is empty and its build script does nothing.

/// The PTX of `src/kv_write.cu` (functions `kv_write_u16`, `kv_write_u32`, `kv_write_u64`: the
/// element size picks the function; the copy is bit for bit).
#[cfg(feature = "cuda")]
pub const KV_WRITE: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_write.ptx"));

/// The module name `KV_WRITE` is loaded under.
pub const KV_WRITE_MODULE: &str = "mtrl_kv_write";
