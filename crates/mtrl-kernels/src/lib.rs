//! `mtrl-kernels`: mtrl's own CUDA kernels as PTX text, loaded by `mtrl-model` with candle's
//! `CudaDevice::get_or_load_custom_func`. Each kernel has a CPU twin beside its caller (the
//! reference its selftest compares against on a GPU):
//!
//! - `kv_write.cu`: the paged key/value store's write, one thread block per token over its heads ×
//!   head dim, addressed by a `[t]` slot mapping (`mtrl_model::kv_pool`; twin: the CPU copy of
//!   `KvWrite` and candle's `scatter_set`, which on CUDA walks the written rows serially).
//! - `paged_attention.cu`: the engine's attention for decode rows and prefill chunks in one call
//!   per layer, reading the paged store in place through the step's slot tables, one thread
//!   block per (query, head), online softmax in f32 (`mtrl_model::paged_attention`; twins: its
//!   CPU loop and the candle spelling that gathers every row's keys and values into a padded copy
//!   first).
//! - `logprob_head.cu`: the log-prob head's passes over a chunk of logits — log-sum-exp, picked
//!   log-prob and entropy in one kernel, the logits' gradient in another (`mtrl_model::
//!   logprob_head`; twin: its CPU loop, held to candle's log-softmax spelling).
//! - `rms_norm.cu`: RMSNorm's forward (keeping each row's 1/rms) and its backward's dx and dw
//!   passes (`mtrl_model::rms_norm`; twin: its CPU loop, held to candle's spelling and its
//!   autograd).
//! - `swiglu.cu`: `silu(g) · u` and its backward in one pass each (`mtrl_model::swiglu`; twin:
//!   its CPU loop, held to candle's spelling and its autograd).
//! - With `flash-attn`: FlashAttention-2's varlen causal forward and backward (bf16, head dims 64
//!   and 128) as a static library behind the C functions of [`flash`] (`flash/api.cu`; used by
//!   `mtrl_model::flash_varlen`, whose CPU twin runs the same arithmetic one query at a time).
//!
//! With the `emu` feature, [`emu`] runs the same kernel source on host threads, so tests compare
//! each kernel with its twin on a machine without a GPU.
//!
//! Without the `cuda` or `emu` feature the crate holds only the kernels' names and launch
//! geometries, and its build script does nothing.

#[cfg(feature = "emu")]
pub mod emu;

/// The PTX of `src/kv_write.cu` (functions `kv_write_u16`, `kv_write_u32`, `kv_write_u64`: the
/// element size picks the function; the copy is bit for bit).
#[cfg(feature = "cuda")]
pub const KV_WRITE: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_write.ptx"));

/// The module name `KV_WRITE` is loaded under.
pub const KV_WRITE_MODULE: &str = "mtrl_kv_write";

/// The PTX of `src/paged_attention.cu` (functions `paged_attention_bf16`,
/// `paged_attention_f16`, `paged_attention_f32`).
#[cfg(feature = "cuda")]
pub const PAGED_ATTENTION: &str = include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx"));

/// The module name `PAGED_ATTENTION` is loaded under.
pub const PAGED_ATTENTION_MODULE: &str = "mtrl_paged_attention";

/// The PTX of `src/logprob_head.cu` (functions `lse_pick_entropy_{bf16,f16,f32}`,
/// `dlogits_{bf16,f16,f32}`).
#[cfg(feature = "cuda")]
pub const LOGPROB_HEAD: &str = include_str!(concat!(env!("OUT_DIR"), "/logprob_head.ptx"));

/// The module name `LOGPROB_HEAD` is loaded under.
pub const LOGPROB_HEAD_MODULE: &str = "mtrl_logprob_head";

/// The PTX of `src/rms_norm.cu` (functions `rms_norm_fwd_*`, `rms_norm_bwd_dx_*`,
/// `rms_norm_bwd_dw_*` for `bf16`, `f16`, `f32`).
#[cfg(feature = "cuda")]
pub const RMS_NORM: &str = include_str!(concat!(env!("OUT_DIR"), "/rms_norm.ptx"));

/// The module name `RMS_NORM` is loaded under.
pub const RMS_NORM_MODULE: &str = "mtrl_rms_norm";

/// The PTX of `src/swiglu.cu` (functions `swiglu_fwd_*`, `swiglu_bwd_*` for `bf16`, `f16`,
/// `f32`).
#[cfg(feature = "cuda")]
pub const SWIGLU: &str = include_str!(concat!(env!("OUT_DIR"), "/swiglu.ptx"));

/// The module name `SWIGLU` is loaded under.
pub const SWIGLU_MODULE: &str = "mtrl_swiglu";

/// A launch's geometry, `(grid, block)` as cudarc's `LaunchConfig` takes them. Each kernel's is
/// computed here, once, for its CUDA launch and its emulated one ([`emu`] with feature `emu`).
pub type Geometry = ((u32, u32, u32), (u32, u32, u32));

/// Grid x may hold 2³¹ − 1 blocks, y and z 65,535.
const GRID_X: usize = (1 << 31) - 1;
const GRID_YZ: usize = 65_535;

/// `Err` naming the kernel when `(x, y)` blocks exceed the grid.
fn grid(kernel: &str, x: usize, y: usize) -> Result<(u32, u32, u32), String> {
    if x > GRID_X || y > GRID_YZ {
        return Err(format!(
            "{kernel}: a grid of {x} × {y} blocks is over CUDA's limits"
        ));
    }
    Ok((x.max(1) as u32, y.max(1) as u32, 1))
}

/// `kv_write`: one block per token, threads over its `row` = kv · d elements.
pub fn kv_write_geometry(tokens: usize, row: usize) -> Result<Geometry, String> {
    Ok((
        grid("kv_write", tokens, 1)?,
        (row.clamp(32, 1024) as u32, 1, 1),
    ))
}

/// `paged_attention`: one block of 4 warps (its `WARPS`) per (query, head).
pub fn paged_attention_geometry(queries: usize, heads: usize) -> Result<Geometry, String> {
    Ok((grid("paged_attention", queries, heads)?, (128, 1, 1)))
}

/// `rms_norm_fwd` and `rms_norm_bwd_dx`: one block per row of `d`, a multiple of 32 threads up
/// to 256 (its `MAX_WARPS` · 32).
pub fn rms_norm_rows_geometry(rows: usize, d: usize) -> Result<Geometry, String> {
    let threads = d.div_ceil(32).clamp(1, 8) * 32;
    Ok((grid("rms_norm", rows, 1)?, (threads as u32, 1, 1)))
}

/// `rms_norm_bwd_dw`: (column blocks of 256, row groups); returns the geometry and the number of
/// row groups (the rows of its partial sums).
pub fn rms_norm_dw_geometry(rows: usize, d: usize) -> Result<(Geometry, usize), String> {
    let groups = rows.clamp(1, 512);
    let g = grid("rms_norm_bwd_dw", d.div_ceil(256), groups)?;
    Ok(((g, (256, 1, 1)), groups))
}

/// `swiglu_fwd` and `swiglu_bwd`: blocks of 256 threads striding over `n` elements.
pub fn swiglu_geometry(n: usize) -> Result<Geometry, String> {
    let blocks = n.div_ceil(256).clamp(1, 1 << 16);
    Ok((grid("swiglu", blocks, 1)?, (256, 1, 1)))
}

/// `logprob_head`'s block (its `THREADS`).
const LOGPROB_HEAD_THREADS: usize = 256;

/// `lse_pick_entropy`: one block per row.
pub fn lse_pick_entropy_geometry(rows: usize) -> Result<Geometry, String> {
    let g = grid("lse_pick_entropy", rows, 1)?;
    Ok((g, (LOGPROB_HEAD_THREADS as u32, 1, 1)))
}

/// `dlogits`: (column blocks, rows), enough column blocks to fill the card at any row count,
/// each thread a strided run of 8 columns on average.
pub fn dlogits_geometry(rows: usize, vocab: usize) -> Result<Geometry, String> {
    let cols = vocab.div_ceil(LOGPROB_HEAD_THREADS * 8);
    Ok((
        grid("dlogits", cols, rows)?,
        (LOGPROB_HEAD_THREADS as u32, 1, 1),
    ))
}

/// FlashAttention-2's training attention (see `flash/api.cu` for layouts, scratch and return
/// codes). Every pointer is a device pointer on the stream's device; `stream` is a `CUstream`.
#[cfg(feature = "flash-attn")]
pub mod flash {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        /// The last error of this thread's last call that did not return 0.
        pub fn mtrl_flash_last_error() -> *const c_char;

        /// The splits of the deterministic backward's dq accumulator.
        pub fn mtrl_flash_dq_splits(batch: c_int, heads: c_int) -> c_int;

        /// Forward: `out`, `lse` of packed causal rows.
        pub fn mtrl_flash_varlen_fwd(
            q: *const c_void,
            k: *const c_void,
            v: *const c_void,
            out: *mut c_void,
            lse: *mut f32,
            cu_seqlens: *const c_int,
            batch: c_int,
            max_seqlen: c_int,
            total: c_int,
            heads: c_int,
            heads_k: c_int,
            head_dim: c_int,
            scale: f32,
            is_bf16: c_int,
            rng_state: *mut u64,
            stream: *mut c_void,
        ) -> c_int;

        /// The engine's prefill: `out`, `lse` of query rows that are the last positions of their
        /// key rows (causal from the bottom right).
        pub fn mtrl_flash_prefix_fwd(
            q: *const c_void,
            k: *const c_void,
            v: *const c_void,
            out: *mut c_void,
            lse: *mut f32,
            cu_seqlens_q: *const c_int,
            cu_seqlens_k: *const c_int,
            batch: c_int,
            max_seqlen_q: c_int,
            max_seqlen_k: c_int,
            total_q: c_int,
            heads: c_int,
            heads_k: c_int,
            head_dim: c_int,
            scale: f32,
            is_bf16: c_int,
            rng_state: *mut u64,
            stream: *mut c_void,
        ) -> c_int;

        /// Backward: `dq`, and `dk`, `dv` per query head.
        pub fn mtrl_flash_varlen_bwd(
            dout: *const c_void,
            q: *const c_void,
            k: *const c_void,
            v: *const c_void,
            out: *const c_void,
            lse: *const f32,
            dq: *mut c_void,
            dk_expanded: *mut c_void,
            dv_expanded: *mut c_void,
            dq_accum: *mut f32,
            dq_splits: c_int,
            softmax_d: *mut f32,
            cu_seqlens: *const c_int,
            batch: c_int,
            max_seqlen: c_int,
            total: c_int,
            heads: c_int,
            heads_k: c_int,
            head_dim: c_int,
            scale: f32,
            is_bf16: c_int,
            rng_state: *mut u64,
            stream: *mut c_void,
        ) -> c_int;
    }

    /// [`mtrl_flash_last_error`] as a string.
    pub fn last_error() -> String {
        // SAFETY: the library returns a NUL-terminated thread-local buffer.
        unsafe { std::ffi::CStr::from_ptr(mtrl_flash_last_error()) }
            .to_string_lossy()
            .into_owned()
    }
}
