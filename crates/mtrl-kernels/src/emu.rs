//! The kernels of `src/*.cu` on host threads (feature `emu`; see `emu/include/cuda_emu.h`): a
//! launch the way cudarc's builder makes one, so a test drives a kernel with the arguments its
//! candle op passes on a GPU and compares the result with the op's CPU twin.
//!
//! What a pass shows: the kernel's indexing, reductions, synchronisation and arithmetic are
//! right (and it has no divergent barrier or shuffle: the emulation aborts on one). What it does
//! not: PTX code generation, launch limits, memory coalescing or speed, and the candle glue that
//! launches the kernel on a GPU — `mtrl selftest` checks those there.

use std::ffi::{c_char, c_int, c_void, CString};

extern "C" {
    fn mtrl_emu_launch(
        name: *const c_char,
        gx: u32,
        gy: u32,
        gz: u32,
        bx: u32,
        by: u32,
        bz: u32,
        args: *mut *mut c_void,
    ) -> c_int;
}

/// One launch: arguments in the kernel's order, each at most 8 bytes (pointers, `u32`, `f32`).
pub struct Launch<'a> {
    name: &'a str,
    cells: Vec<u64>,
}

impl<'a> Launch<'a> {
    /// A launch of kernel `name` (its `extern "C"` name in the `.cu` file).
    pub fn new(name: &'a str) -> Self {
        Launch {
            name,
            cells: Vec::new(),
        }
    }

    /// A pointer argument: the start of `s`.
    pub fn slice<T>(mut self, s: &[T]) -> Self {
        self.cells.push(s.as_ptr() as u64);
        self
    }

    /// A pointer argument the kernel writes through: the start of `s`.
    pub fn slice_mut<T>(mut self, s: &mut [T]) -> Self {
        self.cells.push(s.as_mut_ptr() as u64);
        self
    }

    /// A `u32` argument.
    pub fn u32(mut self, v: u32) -> Self {
        self.cells.push(v as u64);
        self
    }

    /// An `f32` argument.
    pub fn f32(mut self, v: f32) -> Self {
        self.cells.push(v.to_bits() as u64);
        self
    }

    /// Runs the kernel over `geometry` (grid, block), as computed for its CUDA launch; returns
    /// when every block is done.
    ///
    /// # Safety
    ///
    /// The arguments must match the kernel's parameters in number, order and type, and every
    /// pointer must cover what the kernel reads or writes at this grid (as on a GPU). A pointer
    /// written through must come from [`Self::slice_mut`] on a slice that outlives the call.
    pub unsafe fn run(mut self, (grid, block): crate::Geometry) -> Result<(), String> {
        let name = CString::new(self.name).map_err(|e| e.to_string())?;
        let mut args: Vec<*mut c_void> = self
            .cells
            .iter_mut()
            .map(|c| c as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: `args` points at the cells, alive for the call; the caller vouches for them.
        let rc = unsafe {
            mtrl_emu_launch(
                name.as_ptr(),
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                args.as_mut_ptr(),
            )
        };
        match rc {
            0 => Ok(()),
            _ => Err(format!("cuda emulation: no kernel named {}", self.name)),
        }
    }
}
