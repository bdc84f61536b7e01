//! `mtrl selftest`'s checks of mtrl's own kernels against their twins, on the selftest's device:
//! on a GPU the CUDA kernel against the candle spelling it replaced (the KV write bit for bit, the
//! paged attention of decode rows and prefill chunks and FlashAttention-2's prefill within
//! rounding; FlashAttention-2's training forward and backward against their CPU twin), on the CPU
//! the CPU twin against the same spelling. Also: no op ran on zero elements during the selftest.

use candle_core::{DType, Device, Tensor};
use mtrl_model::kv_pool::{write_index, KvPool, SeqBlocks, BLOCK};
use serde_json::{json, Value};

use crate::error::Result;

/// `(check, dtype, ok, fields)` of every kernel check on `dev`.
pub(crate) fn checks(dev: &Device) -> Result<Vec<(String, String, bool, Value)>> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F32] {
        let d = kv_write_against_scatter(dev, dtype)?;
        out.push((
            "kv-write kernel = scatter_set".to_string(),
            format!("{dtype:?}").to_lowercase(),
            d == 0.0,
            json!({"max_abs_diff": d, "tol": 0.0}),
        ));
    }
    for (dtype, tol) in [(DType::BF16, 5e-2f32), (DType::F32, 1e-4)] {
        let d = mtrl_model::paged_attention::check_against_gathered(dev, dtype)?;
        out.push((
            "paged attention kernel (decode + prefill) ≈ gathered attention".to_string(),
            format!("{dtype:?}").to_lowercase(),
            d < tol,
            json!({"max_abs_diff": d, "tol": tol}),
        ));
    }
    for (dtype, tol) in [(DType::BF16, 1e-2f32), (DType::F32, 1e-4)] {
        let (o, d) = mtrl_model::logprob_head::check_against_twin(dev, dtype)?;
        out.push((
            "log-prob head kernels ≈ twin (lse/pick/entropy, dz)".to_string(),
            format!("{dtype:?}").to_lowercase(),
            o < tol && d < tol,
            json!({"max_rel_diff_stats": o, "max_rel_diff_dz": d, "tol": tol}),
        ));
    }
    for (dtype, tol) in [(DType::BF16, 1e-2f32), (DType::F32, 1e-4)] {
        let dt = format!("{dtype:?}").to_lowercase();
        let (y, g) = mtrl_model::rms_norm::check_against_twin(dev, dtype)?;
        out.push((
            "rms-norm kernels ≈ twin (y; dx, dw)".to_string(),
            dt.clone(),
            y < tol && g < tol,
            json!({"max_rel_diff_y": y, "max_rel_diff_grad": g, "tol": tol}),
        ));
        let (y, g) = mtrl_model::swiglu::check_against_twin(dev, dtype)?;
        out.push((
            "swiglu kernels ≈ twin (y; dg, du)".to_string(),
            dt,
            y < tol && g < tol,
            json!({"max_rel_diff_y": y, "max_rel_diff_grad": g, "tol": tol}),
        ));
    }
    // FlashAttention-2: on a GPU only where the binary carries the kernel.
    let flash = dev.is_cpu() || mtrl_model::AttentionKernel::Auto.fused_for(dev, DType::BF16, 128);
    if flash {
        let d = mtrl_model::flash_prefill::check_against_gathered(dev, DType::BF16)?;
        let tol = 5e-2f32;
        out.push((
            "prefill attention kernel (prompt chunks after stored positions) ≈ gathered attention"
                .to_string(),
            "bf16".to_string(),
            d < tol,
            json!({"max_abs_diff": d, "tol": tol}),
        ));
    }
    if flash {
        let (o, g) = mtrl_model::flash_varlen::check_against_twin(dev)?;
        let (to, tg) = (2e-2f32, 5e-2f32);
        out.push((
            "fused attention kernel ≈ twin (fwd, bwd)".to_string(),
            "bf16".to_string(),
            o < to && g < tg,
            json!({"max_rel_diff_out": o, "max_rel_diff_grad": g, "tol_out": to, "tol_grad": tg}),
        ));
    }
    Ok(out)
}

/// The store after a write of interleaved, out-of-order slots across block boundaries, once with
/// the kernel and once with `scatter_set`: their largest difference.
fn kv_write_against_scatter(dev: &Device, dtype: DType) -> Result<f32> {
    let (layers, kv, d) = (2usize, 8usize, 128usize);
    let new = || KvPool::new(layers, kv, d, 16 * BLOCK, dtype, dev);
    let (mut a, mut b) = (new()?, new()?);
    let mut slots = Vec::new();
    for p in [&mut a, &mut b] {
        let (mut x, mut y) = (SeqBlocks::default(), SeqBlocks::default());
        p.reserve(&mut x, 3 * BLOCK + 5)?;
        p.reserve(&mut y, 2 * BLOCK)?;
        // Interleaved owners, across block boundaries, out of order (the same in both stores).
        slots = x.slots(3 * BLOCK + 5).collect();
        slots.reverse();
        slots.extend(y.slots(2 * BLOCK).step_by(7));
    }
    let t = slots.len();
    let k = Tensor::randn(0f32, 1.0, (t * kv, d), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(dev)?;
    let v = (&k * 0.5)?;
    a.write(1, &a.slot_mapping(&slots)?, &k, &v)?;
    b.write_scatter(1, &write_index(&slots, kv, d, dev)?, &k, &v)?;
    let mut worst = 0f32;
    for (x, y) in [(a.layer(1).0, b.layer(1).0), (a.layer(1).1, b.layer(1).1)] {
        let diff = (x.to_dtype(DType::F32)? - y.to_dtype(DType::F32)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        worst = worst.max(diff);
    }
    Ok(worst)
}
