//! Who launches on which CUDA stream, and the device settings applied when one is opened.
//!
//! candle's `Device::new_cuda` launches on CUDA's per-thread default stream and shares one cuBLAS
//! handle (and its workspace) between every clone of the device, whatever thread uses it; cudarc
//! then tracks no events between streams, so work of two threads is ordered only by hand-placed
//! `synchronize` calls. mtrl opens devices with their own stream instead
//! (`Device::new_cuda_with_stream`: a stream, a cuBLAS handle and a curand generator per
//! device object), which also puts cudarc's context in multi-stream mode before the first
//! allocation, so every buffer records the events of its reads and writes and a copy or a free
//! on another stream waits for them.
//!
//! The ordering rules (ARCHITECTURE.md, "Streams"):
//! - the learner's device ([`crate::parse_device`]) owns stream L: loading, training, the
//!   reference and validation run there;
//! - a full-fine-tuning engine gets its own device ([`engine_device`]), stream E, created before
//!   its copy of the weights; published weights reach it as device-side copies enqueued on E,
//!   ordered after the learner's writes by the buffers' events (the manual `synchronize` calls of
//!   `Learner::weights` and `Engine::update_weights` are kept as a second guard);
//! - a LoRA engine shares the learner's device (the frozen base is not copied): engine and
//!   learner then enqueue on the one stream L from two threads, so their kernels are serialised
//!   on the GPU in the order they are enqueued, never concurrent on one cuBLAS workspace.
//!
//! A setting on every device opened here: the stream-ordered memory pool keeps freed memory
//! (release threshold `u64::MAX`; CUDA's default 0 hands it back to the driver at every
//! synchronisation, and the next step maps it again). TF32 is not switched on: candle's switch is
//! process-wide and would move f32 runs off the goldens; the head's gradient product runs in the
//! weights' dtype instead (`logprobs`).

use candle_core::Device;

use crate::error::{ModelError, Result};

/// The device a generation engine on `learner`'s GPU runs on: a new device object with its own
/// stream and cuBLAS handle (the CPU is the CPU).
pub fn engine_device(learner: &Device) -> Result<Device> {
    match learner.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => open_cuda(gpu_id),
        _ => Ok(learner.clone()),
    }
}

/// The first `n` elements (from its layout's start) of a contiguous tensor's storage on the GPU,
/// for a kernel launch beside the op's operands (an index, row offsets, a kept log-sum-exp);
/// `what` names it in the error.
#[cfg(feature = "cuda")]
pub(crate) fn cuda_view<'a, T: candle_core::cuda_backend::CudaDType>(
    st: &'a candle_core::Storage,
    l: &candle_core::Layout,
    n: usize,
    what: &str,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    let candle_core::Storage::Cuda(s) = st else {
        candle_core::bail!("{what} must be on the GPU")
    };
    if !l.is_contiguous() {
        candle_core::bail!("{what} must be contiguous")
    }
    let o = l.start_offset();
    Ok(s.as_cuda_slice::<T>()?.slice(o..o + n))
}

/// The bf16 view of a custom op's operand under its (contiguous) layout, for FlashAttention-2's
/// calls; any other dtype is an error naming the op `what`.
#[cfg(feature = "flash-attn")]
pub(crate) fn bf16_operand<'a>(
    (s, l): (&'a candle_core::CudaStorage, &candle_core::Layout),
    n: usize,
    what: &str,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, half::bf16>> {
    use candle_core::backend::BackendStorage;
    if s.dtype() != candle_core::DType::BF16 {
        candle_core::bail!("{what}: the kernel takes bf16, got {:?}", s.dtype())
    }
    let o = l.start_offset();
    Ok(s.as_cuda_slice::<half::bf16>()?.slice(o..o + n))
}

/// Opens CUDA device `ordinal` with its own stream and applies the settings of the module header.
#[cfg(feature = "cuda")]
pub(crate) fn open_cuda(ordinal: usize) -> Result<Device> {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    let dev = Device::new_cuda_with_stream(ordinal)
        .map_err(|e| ModelError::InvalidArgument(format!("cuda:{ordinal}: {e}")))?;
    let cuda = dev.as_cuda_device()?;
    let cu_device = cuda.cuda_stream().context().cu_device();
    // SAFETY: `cu_device` comes from a live context; the attribute takes a u64 (cuuint64_t).
    let pool = unsafe { result::device::get_default_mem_pool(cu_device) };
    if let Ok(pool) = pool {
        let mut keep = u64::MAX;
        let set = unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        };
        if let Err(e) = set {
            mtrl_core::trace!("cuda:{ordinal}: memory pool release threshold not set: {e:?}");
        }
    }
    Ok(dev)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn open_cuda(ordinal: usize) -> Result<Device> {
    Err(ModelError::InvalidArgument(format!(
        "cuda:{ordinal} needs a binary built with the `cuda` feature"
    )))
}

/// The memory of `dev` in bytes: the GPU's total as the driver reports it, the host's
/// (`MemTotal` of `/proc/meminfo`) for the CPU.
pub fn memory_bytes(dev: &Device) -> Result<u64> {
    match dev {
        Device::Cpu => host_memory(),
        #[cfg(feature = "cuda")]
        Device::Cuda(c) => {
            use candle_core::cuda_backend::cudarc::driver::result;
            c.cuda_stream()
                .context()
                .bind_to_thread()
                .and_then(|_| result::mem_get_info())
                .map(|(_, total)| total as u64)
                .map_err(|e| ModelError::InvalidArgument(format!("GPU memory unknown: {e:?}")))
        }
        #[allow(unreachable_patterns)]
        _ => Err(ModelError::InvalidArgument(format!(
            "the memory of {:?} is unknown",
            dev.location()
        ))),
    }
}

fn host_memory() -> Result<u64> {
    let path = std::path::Path::new("/proc/meminfo");
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| ModelError::InvalidArgument("/proc/meminfo has no MemTotal line".into()))
}
