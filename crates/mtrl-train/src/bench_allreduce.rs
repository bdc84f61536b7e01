//! `mtrl bench allreduce` (under `mpirun -np N`): what data parallelism moves per optimizer
//! update, computed and measured, for full fine-tuning and for LoRA on one model shape — the
//! trainable parameters, the bytes each rank hands the gradient all-reduce (in the accumulation
//! dtype), the bucket count, and the wall time of the whole bucketed all-reduce
//! ([`mtrl_learner::dist::all_reduce_grads`], the training step's own code), best and median
//! over the repeats. A check sums rank-numbered gradients and compares with the arithmetic.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use mtrl_learner::dist::{all_reduce_grads, ReduceOptions};
use mtrl_learner::Collective;
use mtrl_model::{LoraSpec, Policy};
use serde_json::{json, Value};

use crate::bail;
use crate::error::Result;

/// What to run.
#[derive(Clone)]
pub struct AllreduceBench {
    pub model: mtrl_model::Config,
    pub lora: LoraSpec,
    pub device: Device,
    pub bucket_mb: f64,
    pub repeats: usize,
    pub comm: Arc<dyn Collective>,
    /// The accumulation (and all-reduce) dtype, `train.grad_accumulation`.
    pub accumulation: candle_core::DType,
}

fn one(b: &AllreduceBench, policy: &Policy, what: &str) -> Result<Value> {
    let params = policy.named_parameters();
    let dtype = b.accumulation;
    let rank = b.comm.rank() as f64;
    let world = b.comm.world() as f64;
    let fresh = || -> Result<BTreeMap<String, Tensor>> {
        params
            .iter()
            .map(|(n, v)| {
                let t = Tensor::full(rank + 1.0, v.dims(), &b.device)?.to_dtype(dtype)?;
                Ok((n.clone(), t))
            })
            .collect()
    };
    let opts = ReduceOptions {
        bucket_bytes: (b.bucket_mb * 1048576.0) as usize,
    };
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..=b.repeats.max(1) {
        let mut g = fresh()?;
        let s = all_reduce_grads(b.comm.as_ref(), params, &mut g, opts, dtype)?;
        times.push(s.seconds);
        last = Some((s, g));
    }
    let (s, g) = last.expect("one repeat at least");
    // Σ_r (r + 1) over the ranks, in every element.
    let want = world * (world + 1.0) / 2.0;
    for (n, t) in &g {
        let got = t.flatten_all()?.to_dtype(candle_core::DType::F64)?.max(0)?;
        let got = got.to_scalar::<f64>()?;
        if (got - want).abs() > 1e-9 * want.max(1.0) && b.comm.world() > 1 {
            bail!("{what}: the all-reduce of `{n}` gave {got}, expected {want}");
        }
    }
    times.remove(0); // the warm-up
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let trainable: usize = params.values().map(|v| v.elem_count()).sum();
    let bytes = trainable * dtype.size_in_bytes();
    let best = sorted.first().copied().unwrap_or(0.0);
    Ok(json!({
        "trainable_params": trainable,
        "tensors": params.len(),
        "accumulation_dtype": format!("{dtype:?}").to_lowercase(),
        "bytes_per_rank_per_update_computed": bytes,
        "bytes_per_rank_per_update_measured": s.bytes,
        "buckets": s.calls - 1,
        "allreduce_s_best": best,
        "allreduce_s_median": sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        "payload_gb_per_s_best": if best > 0.0 { s.bytes as f64 / best / 1e9 } else { 0.0 },
    }))
}

/// One device all-reduce of a 1-D tensor of ones when the collective has a device communicator
/// (NCCL; also at one rank, where the training step itself skips the reduction): `null` without.
fn device_smoke(b: &AllreduceBench) -> Result<Value> {
    let n = 1 << 20;
    let ones = Tensor::ones(n, candle_core::DType::F32, &b.device)?;
    let t0 = std::time::Instant::now();
    let Some(out) = b.comm.device_all_reduce(&ones, "device smoke") else {
        return Ok(Value::Null);
    };
    let out = out?;
    let secs = t0.elapsed().as_secs_f64();
    let sum = out
        .sum_all()?
        .to_dtype(candle_core::DType::F64)?
        .to_scalar::<f64>()?;
    let want = (n * b.comm.world()) as f64;
    if sum != want {
        bail!(
            "the device all-reduce of {n} ones over {} ranks summed to {sum}",
            b.comm.world()
        );
    }
    Ok(json!({"elements": n, "sum": sum, "seconds": secs, "ok": true}))
}

/// Runs the bench on every rank; rank 0's result is the one to print.
pub fn bench_allreduce(b: &AllreduceBench) -> Result<Value> {
    let smoke = device_smoke(b)?;
    let dtype = candle_core::DType::F32;
    let full = crate::setup::seeded_random(b.model.clone(), dtype, &b.device, 0)?;
    let full_out = one(b, &full, "full fine-tuning")?;
    let lora = full.with_lora(b.lora.clone(), None, 0)?;
    let lora_out = one(b, &lora, "LoRA")?;
    let ratio = full_out["bytes_per_rank_per_update_computed"]
        .as_f64()
        .unwrap_or(0.0)
        / lora_out["bytes_per_rank_per_update_computed"]
            .as_f64()
            .unwrap_or(1.0)
            .max(1.0);
    Ok(json!({
        "world_size": b.comm.world(),
        "device": format!("{:?}", b.device),
        "bucket_mb": b.bucket_mb,
        "repeats": b.repeats,
        "lora": {"rank": b.lora.rank, "alpha": b.lora.alpha, "targets": b.lora.targets},
        "full": full_out,
        "lora_adapter": lora_out,
        "full_over_lora_bytes": ratio,
        "device_allreduce_smoke": smoke,
    }))
}
