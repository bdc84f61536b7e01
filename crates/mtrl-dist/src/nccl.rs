//! Gradients summed on the GPUs with NCCL (cudarc's bindings), bootstrapped over MPI: rank 0
//! makes the unique id, MPI broadcasts it, every rank joins with its device's stream. Everything
//! but the device all-reduce goes through the MPI collective it wraps.

use std::sync::{Mutex, OnceLock};

use candle_core::{Device, Storage, Tensor};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use mtrl_learner::{Collective, LearnerError};

use crate::mpi_comm::MpiCollective;

/// MPI for the host, NCCL for the device.
pub struct NcclCollective {
    host: MpiCollective,
    comm: OnceLock<Mutex<NcclComm>>,
}

struct NcclComm(Comm);

// SAFETY: the communicator is only used under its mutex, by one thread at a time; NCCL
// communicators may be used from any thread that sets the right device (cudarc's stream does).
unsafe impl Send for NcclComm {}

fn lerr(e: impl std::fmt::Display) -> LearnerError {
    LearnerError::Collective(format!("NCCL: {e}"))
}

impl NcclCollective {
    pub fn new(host: MpiCollective) -> NcclCollective {
        NcclCollective {
            host,
            comm: OnceLock::new(),
        }
    }

    /// The NCCL communicator on `dev`, made at the first device all-reduce (every rank reaches it
    /// together: it is the first gradient bucket of the first step).
    fn comm(&self, dev: &Device) -> mtrl_learner::Result<&Mutex<NcclComm>> {
        if let Some(c) = self.comm.get() {
            return Ok(c);
        }
        let Device::Cuda(cd) = dev else {
            return Err(lerr("gradients are not on a CUDA device"));
        };
        let mut raw = [0u8; 128];
        if self.host.rank() == 0 {
            let id = Id::new().map_err(|e| lerr(format!("{e:?}")))?;
            for (b, c) in raw.iter_mut().zip(id.internal()) {
                *b = *c as u8;
            }
        }
        self.host
            .broadcast_bytes(&mut raw, "NCCL unique id broadcast");
        let mut internal = [0 as core::ffi::c_char; 128];
        for (c, b) in internal.iter_mut().zip(raw) {
            *c = b as core::ffi::c_char;
        }
        let comm = Comm::from_rank(
            cd.cuda_stream(),
            self.host.rank(),
            self.host.world(),
            Id::uninit(internal),
        )
        .map_err(|e| lerr(format!("joining as rank {}: {e:?}", self.host.rank())))?;
        let _ = self.comm.set(Mutex::new(NcclComm(comm)));
        Ok(self.comm.get().expect("set above"))
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.host.rank()
    }
    fn world(&self) -> usize {
        self.host.world()
    }
    fn local_rank(&self) -> usize {
        self.host.local_rank()
    }
    fn all_reduce_f64(&self, buf: &mut [f64], what: &str) -> mtrl_learner::Result<()> {
        self.host.all_reduce_f64(buf, what)
    }
    fn all_reduce_f32(&self, buf: &mut [f32], what: &str) -> mtrl_learner::Result<()> {
        self.host.all_reduce_f32(buf, what)
    }
    fn all_gather_bytes(&self, mine: &[u8], what: &str) -> mtrl_learner::Result<Vec<Vec<u8>>> {
        self.host.all_gather_bytes(mine, what)
    }
    fn arrive(&self, what: &str, flag: bool) -> mtrl_learner::Result<bool> {
        self.host.arrive(what, flag)
    }
    fn arrive_within(
        &self,
        what: &str,
        flag: bool,
        wait: Option<std::time::Duration>,
    ) -> mtrl_learner::Result<bool> {
        self.host.arrive_within(what, flag, wait)
    }
    fn abort(&self, code: i32) -> ! {
        self.host.abort(code)
    }

    fn device_all_reduce(&self, t: &Tensor, what: &str) -> Option<mtrl_learner::Result<Tensor>> {
        Some(self.reduce(t, what))
    }
}

impl NcclCollective {
    fn reduce(&self, t: &Tensor, what: &str) -> mtrl_learner::Result<Tensor> {
        let dev = t.device().clone();
        let comm = self.comm(&dev)?;
        let Device::Cuda(cd) = &dev else {
            return Err(lerr(format!("{what}: not on a CUDA device")));
        };
        let t = t.to_dtype(candle_core::DType::F32)?.contiguous()?;
        let n = t.elem_count();
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*storage else {
            return Err(lerr(format!("{what}: not CUDA storage")));
        };
        let src = cs.as_cuda_slice::<f32>()?;
        let src = src.slice(layout.start_offset()..layout.start_offset() + n);
        let stream = cd.cuda_stream();
        let mut out = stream
            .alloc_zeros::<f32>(n)
            .map_err(|e| lerr(format!("{what}: {e:?}")))?;
        {
            let c = comm.lock().unwrap_or_else(|e| e.into_inner());
            let _armed = self.host_watchdog(what);
            c.0.all_reduce(&src, &mut out, &ReduceOp::Sum)
                .map_err(|e| lerr(format!("{what}: {e:?}")))?;
            stream
                .synchronize()
                .map_err(|e| lerr(format!("{what}: {e:?}")))?;
        }
        drop(storage);
        let s = candle_core::cuda_backend::CudaStorage::wrap_cuda_slice(out, cd.clone());
        Ok(Tensor::from_storage(
            Storage::Cuda(s),
            n,
            candle_core::op::BackpropOp::none(),
            false,
        ))
    }

    fn host_watchdog(&self, what: &str) -> impl Drop + '_ {
        self.host
            .watchdog()
            .arm(&format!("the NCCL {what} all-reduce"))
    }
}
