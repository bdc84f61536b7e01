//! glibc `malloc` settings for the CPU backend, applied once when a CPU model is built.
//!
//! Why: candle allocates a fresh buffer for every op's output. With glibc's defaults, buffers above
//! the (adaptive) mmap threshold come from `mmap` and go back with `munmap`, and freed heap top
//! above 2× that threshold is trimmed, so the next step faults in and zeroes the same pages again:
//! a quarter of a training step on 2 cores was page faults and TLB shootdowns. Here buffers up to
//! 32 MiB (glibc's largest allowed threshold) come from the heap, and freed heap is kept for reuse.
//! The CPU paths keep their large temporaries under that size (the log-prob path splits its
//! vocabulary projection into chunks of at most [`MAX_HEAP_BLOCK`] bytes).
//!
//! Trade-off: the process keeps its peak heap resident instead of returning it between steps.
//! Process-wide and one-way; only a CPU model turns it on, and only on glibc targets.

/// glibc's largest `M_MMAP_THRESHOLD` on 64-bit targets (`HEAP_MAX_SIZE / 2`).
pub(crate) const MAX_HEAP_BLOCK: usize = 32 << 20;

/// Applies the settings (once per process; later calls do nothing).
pub(crate) fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            extern "C" {
                fn mallopt(
                    param: std::os::raw::c_int,
                    value: std::os::raw::c_int,
                ) -> std::os::raw::c_int;
            }
            const M_TRIM_THRESHOLD: std::os::raw::c_int = -1;
            const M_TOP_PAD: std::os::raw::c_int = -2;
            const M_MMAP_THRESHOLD: std::os::raw::c_int = -3;
            // SAFETY: `mallopt` is thread-safe (it takes the arena locks) and only changes tuning
            // parameters; a rejected value leaves the default in place.
            unsafe {
                mallopt(M_MMAP_THRESHOLD, MAX_HEAP_BLOCK as std::os::raw::c_int);
                mallopt(M_TRIM_THRESHOLD, i32::MAX);
                mallopt(M_TOP_PAD, 64 << 20);
            }
        });
    }
}
