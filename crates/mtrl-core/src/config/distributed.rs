//! `[distributed]`: how data-parallel ranks (`mpirun -np N mtrl train …`, or `srun`) combine.
//!
//! ```toml
//! [distributed]
//! grad_reduce = "auto"   # "host": MPI all-reduce in host memory; "nccl": on the device (CUDA
//!                        # builds); "auto": nccl for full fine-tuning on CUDA, host otherwise
//! bucket_mb = 25         # gradients are all-reduced in buckets of about this many MiB
//! timeout_s = 300        # a rank that does not reach a collective within this is named and the
//!                        # job is stopped
//! step_timeout_s = 3600  # how late a rank may reach a step's start (its rollouts, rank 0's
//!                        # validation and checkpoint): absent = derived from the rollout bounds,
//!                        # timeout_s + rollout.timeout_s × (max_retries + 1) × the episode waves
//!                        # of a step and of a validation pass (no bound with rollout.timeout_s = 0)
//! checksum_every = 10    # compare a parameter checksum across ranks every N steps (0 = never)
//! ```
//!
//! A single-process run reads the section too but has nothing to combine.

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

/// The gradient all-reduce backends.
pub const GRAD_REDUCES: &[&str] = &["auto", "host", "nccl"];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistributedSpec {
    pub grad_reduce: Option<String>,
    pub bucket_mb: Option<f64>,
    pub timeout_s: Option<f64>,
    pub step_timeout_s: Option<f64>,
    pub checksum_every: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DistributedConfig {
    pub grad_reduce: String,
    pub bucket_mb: f64,
    pub timeout_s: f64,
    /// The bound of the step arrivals; `None`: derived from the rollout bounds (see the module
    /// header and `mtrl_train::data_parallel::step_wait`).
    pub step_timeout_s: Option<f64>,
    pub checksum_every: u64,
}

impl Default for DistributedConfig {
    fn default() -> DistributedConfig {
        DistributedConfig {
            grad_reduce: "auto".into(),
            bucket_mb: 25.0,
            timeout_s: 300.0,
            step_timeout_s: None,
            checksum_every: 10,
        }
    }
}

impl DistributedSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<DistributedConfig> {
        let d = DistributedConfig::default();
        let grad_reduce = self.grad_reduce.unwrap_or(d.grad_reduce);
        if !GRAD_REDUCES.contains(&grad_reduce.as_str()) {
            return Err(ctx.invalid(
                "distributed.grad_reduce",
                format!(
                    "`{grad_reduce}`: expected one of {}",
                    GRAD_REDUCES.join(", ")
                ),
            ));
        }
        let bucket_mb = self.bucket_mb.unwrap_or(d.bucket_mb);
        if !(bucket_mb.is_finite() && bucket_mb > 0.0 && bucket_mb <= 65536.0) {
            return Err(ctx.invalid(
                "distributed.bucket_mb",
                format!("{bucket_mb}: expected a size in (0, 65536] MiB"),
            ));
        }
        let timeout_s = self.timeout_s.unwrap_or(d.timeout_s);
        if !(timeout_s.is_finite() && timeout_s > 0.0) {
            return Err(ctx.invalid(
                "distributed.timeout_s",
                format!("{timeout_s}: expected a positive number of seconds"),
            ));
        }
        if let Some(t) = self.step_timeout_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(ctx.invalid(
                    "distributed.step_timeout_s",
                    format!(
                        "{t}: expected a positive number of seconds (leave it out to derive it)"
                    ),
                ));
            }
        }
        Ok(DistributedConfig {
            grad_reduce,
            bucket_mb,
            timeout_s,
            step_timeout_s: self.step_timeout_s,
            checksum_every: self.checksum_every.unwrap_or(d.checksum_every),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;
    use std::path::Path;

    fn load(section: &str) -> crate::Result<crate::Config> {
        Config::from_toml_str(&format!("[distributed]\n{section}\n"), Path::new("d.toml"))
    }

    #[test]
    fn defaults_and_range_errors_name_the_key() {
        let c = Config::from_toml_str("", Path::new("d.toml")).unwrap();
        assert_eq!(c.distributed.grad_reduce, "auto");
        assert_eq!(c.distributed.checksum_every, 10);
        let c = load("grad_reduce = \"host\"\nbucket_mb = 0.5\nchecksum_every = 0").unwrap();
        assert_eq!(
            (c.distributed.bucket_mb, c.distributed.checksum_every),
            (0.5, 0)
        );
        for (s, key) in [
            ("grad_reduce = \"gloo\"", "distributed.grad_reduce"),
            ("bucket_mb = 0", "distributed.bucket_mb"),
            ("timeout_s = -1", "distributed.timeout_s"),
            ("step_timeout_s = 0", "distributed.step_timeout_s"),
        ] {
            let e = load(s).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("d.toml"), "{s}: {e}");
        }
        let t = Config::from_toml_str("[train]\ngrad_accumulation = \"bf16\"", Path::new("d.toml"));
        let e = t.unwrap_err().to_string();
        assert!(e.contains("train.grad_accumulation"), "{e}");
        let e = load("world = 2").unwrap_err().to_string();
        assert!(e.contains("world"), "{e}");
    }
}
