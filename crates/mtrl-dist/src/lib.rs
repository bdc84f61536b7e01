//! Data-parallel ranks on existing engines: MPI (Open MPI through the `mpi` crate) launches the
//! processes (`mpirun`, Slurm `srun`), tells each its rank and carries the host-memory
//! collectives; NCCL (cudarc) sums gradients on the GPUs, bootstrapped over MPI as nccl-tests and
//! Horovod do. Everything here implements [`mtrl_learner::Collective`]; the training loop sees
//! nothing else.
//!
//! No collective runs without a bound: every one is armed on a [`watchdog`] that ends the rank
//! when it overruns `[distributed] timeout_s`, and the per-step [`Collective::arrive`] names the
//! ranks that did not come (dead or hung) before the job is stopped.
//!
//! Invariant: only this crate (and the binary that calls [`init`]) knows MPI or NCCL.

pub mod error;
pub mod faults;
pub mod launch;
#[cfg(feature = "mpi")]
mod mpi_comm;
#[cfg(feature = "nccl")]
mod nccl;
pub mod watchdog;

use std::sync::Arc;
use std::time::Duration;

pub use error::{DistError, Result};
pub use faults::{RankFault, RANK_FAULT_VAR};
pub use launch::Launch;
use mtrl_learner::{Collective, Local};

/// How [`init`] sets the ranks up.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// `[distributed] grad_reduce`: `host`, `nccl` or `auto`.
    pub grad_reduce: String,
    /// The model trains on a CUDA device.
    pub on_cuda: bool,
    /// With a LoRA adapter (small gradients: `auto` keeps them on the host path).
    pub lora: bool,
    pub timeout: Duration,
}

/// The ranks of this process: MPI's when a launcher started it (`mpirun`, `srun`), else
/// [`Local`]. A launched process in a build without the `mpi` feature is an error (it would
/// otherwise train alone, N times over).
pub fn init(opts: &InitOptions) -> Result<Arc<dyn Collective>> {
    let launch = Launch::from_env();
    let want_nccl = match opts.grad_reduce.as_str() {
        "nccl" => true,
        "host" => false,
        _ => opts.on_cuda && !opts.lora,
    };
    if want_nccl && !opts.on_cuda {
        return Err(DistError::Config(
            "distributed.grad_reduce = \"nccl\" sums gradients on CUDA devices, and \
             model.device is not one; use \"host\" or \"auto\""
                .into(),
        ));
    }
    let Some(l) = launch else {
        if opts.grad_reduce == "nccl" && !cfg!(feature = "nccl") {
            return Err(DistError::Config(
                "distributed.grad_reduce = \"nccl\": this mtrl was built without the `nccl` \
                 feature"
                    .into(),
            ));
        }
        return Ok(Arc::new(Local));
    };
    #[cfg(feature = "mpi")]
    {
        let host = mpi_comm::MpiCollective::init(&l, opts.timeout)?;
        if want_nccl {
            #[cfg(feature = "nccl")]
            return Ok(Arc::new(nccl::NcclCollective::new(host)));
            #[cfg(not(feature = "nccl"))]
            return Err(DistError::Config(format!(
                "distributed.grad_reduce = \"{}\" wants NCCL, and this mtrl was built without \
                 the `nccl` feature (cargo build --release --features nccl); set \
                 grad_reduce = \"host\" to sum gradients over MPI",
                opts.grad_reduce
            )));
        }
        Ok(Arc::new(host))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = want_nccl;
        Err(DistError::Config(format!(
            "started by a launcher as rank {} of {} ({}), but this mtrl was built without the \
             `mpi` feature: rebuild with `cargo build --release --features mpi` (Open MPI and its \
             headers installed)",
            l.rank, l.world, l.source
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(grad_reduce: &str, on_cuda: bool) -> InitOptions {
        InitOptions {
            grad_reduce: grad_reduce.into(),
            on_cuda,
            lora: false,
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_process_no_launcher_started_is_one_rank() {
        if Launch::from_env().is_some() {
            return; // this test binary itself runs under mpirun
        }
        for g in ["auto", "host"] {
            let c = init(&opts(g, false)).unwrap();
            assert_eq!((c.rank(), c.world()), (0, 1));
        }
        let Err(e) = init(&opts("nccl", false)) else {
            panic!("grad_reduce = nccl on the CPU was accepted");
        };
        let e = e.to_string();
        assert!(
            e.contains("distributed.grad_reduce") && e.contains("CUDA"),
            "{e}"
        );
    }
}
