//! Fused causal attention over packed rows, with a backward: on CUDA FlashAttention-2's varlen
//! kernels (`mtrl-kernels` with the `flash-attn` feature: bf16, head dims 64 and 128); its CPU
//! twin below runs the same arithmetic one query at a time. Both replace, for a packed training
//! forward ([`crate::transformer::VarLen`]), the spelling that spreads the rows into a padded
//! `[rows, t_max, ·]` layout and materialises every `[t_max, t_max]` score matrix per head (22.5 GB
//! of a 66 GB peak for one 2,048-token row of Qwen3-0.6B on the GPU, docs/gpu.md).
//!
//! Contract (FlashAttention-2's `mha_varlen_fwd`/`bwd`): `q` `[T, heads, d]`, `k`, `v`
//! `[T, kv, d]` (`heads % kv == 0`: query head `h` reads KV head `h / (heads / kv)`), rows
//! `offsets[i]..offsets[i + 1]`, query `i` of a row sees keys `0..=i` of that row, scores scaled
//! by `1/√d`. The forward returns `out` `[T, heads, d]` and keeps `lse` `[heads, T]` (the natural
//! log of each query's softmax denominator) for the backward, which forms, with
//! `p = exp(s − lse)` and `D = Σ dout·out`: `dv = Σ p·dout`, `ds = p·(dout·v − D)`,
//! `dq = scale·Σ ds·k`, `dk = scale·Σ ds·q` (each KV head summing its query heads).

use candle_core::backend::BackendStorage;

use crate::cpu::slice_of;
use candle_core::{
    CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Storage, Tensor, D,
};

/// Which attention core a packed forward (the learner's, the scoring of log-probs) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// Fused where the compiled kernel serves (CUDA, bf16, head dim 64 or 128, a binary built
    /// with the `flash-attn` feature), else the spelled attention.
    #[default]
    Auto,
    /// Always fused: FlashAttention-2 on CUDA (an error where it cannot serve the model), the
    /// CPU twin elsewhere (exact and slow: a reference, not a speed-up).
    Fused,
    /// Never fused: the padded spelling (on the CPU in f32, its packed kernels).
    Spelled,
}

impl AttentionKernel {
    /// Every name [`Self::parse`] takes.
    pub const NAMES: [&'static str; 3] = ["auto", "fused", "spelled"];

    /// `"auto"`, `"fused"` or `"spelled"`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "fused" => Some(Self::Fused),
            "spelled" => Some(Self::Spelled),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Fused => "fused",
            Self::Spelled => "spelled",
        }
    }

    /// Whether a model on `dev` in `dtype` with `head_dim` attends fused under this choice.
    pub fn fused_for(self, dev: &Device, dtype: DType, head_dim: usize) -> bool {
        match self {
            Self::Auto => kernel_serves(dev, dtype, head_dim),
            Self::Fused => true,
            Self::Spelled => false,
        }
    }
}

/// Whether this binary carries the FlashAttention-2 kernels (built with `flash-attn`).
pub const KERNEL_BUILT: bool = cfg!(feature = "flash-attn");

/// Whether the compiled kernel serves a model on `dev` in `dtype` with `head_dim`.
pub(crate) fn kernel_serves(dev: &Device, dtype: DType, head_dim: usize) -> bool {
    KERNEL_BUILT && dev.is_cuda() && dtype == DType::BF16 && matches!(head_dim, 64 | 128)
}

/// The op: `q.apply_op3(k, v, FlashVarlen { .. })` → `out` `[T, heads, d]`.
pub(crate) struct FlashVarlen {
    /// Row boundaries, `[rows + 1]`.
    pub offsets: Vec<usize>,
    /// `offsets` as u32 on the operands' device (the kernel reads them as int32).
    #[cfg_attr(not(feature = "flash-attn"), allow(dead_code))]
    pub cu_seqlens: Tensor,
    pub scale: f64,
    /// The forward's `lse` `[heads, T]` f32, taken by the backward.
    lse: crate::stash::Stash,
}

/// The backward's op: `q.apply_op3_no_bwd(k, v, ..)` → `[dq | dk per query head | dv per query
/// head]`, `3 · T · heads · d` elements in the operands' dtype.
struct FlashVarlenBwd<'a> {
    fwd: &'a FlashVarlen,
    out: Tensor,
    dout: Tensor,
    lse: Tensor,
}

/// `softmax(q·kᵀ/√d)·v` of each packed row under a causal mask (see the module docs), with a
/// backward. `q` `[T, heads, d]`, `k`, `v` `[T, kv, d]`; `offsets`: the rows; `cu_seqlens` the
/// same on the device (u32).
pub(crate) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offsets: &[usize],
    cu_seqlens: &Tensor,
) -> Result<Tensor> {
    // Shapes and rows are checked where the op runs (`FlashVarlen::dims`).
    let d = q.dim(D::Minus1)?;
    let op = FlashVarlen {
        offsets: offsets.to_vec(),
        cu_seqlens: cu_seqlens.clone(),
        scale: 1.0 / (d as f64).sqrt(),
        lse: crate::stash::Stash::new("fused attention", "lse"),
    };
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

impl FlashVarlen {
    /// `(T, heads, kv, d)`, checking shapes and layouts.
    fn dims(&self, q: &Layout, k: &Layout, v: &Layout) -> Result<(usize, usize, usize, usize)> {
        let (t, heads, d) = q.shape().dims3()?;
        let (tk, kv, dk) = k.shape().dims3()?;
        if tk != t || dk != d || v.shape() != k.shape() || kv == 0 || heads % kv != 0 {
            candle_core::bail!("fused attention: q {:?}, k {:?}", q.dims(), k.dims())
        }
        if !(q.is_contiguous() && k.is_contiguous() && v.is_contiguous()) {
            candle_core::bail!("fused attention: operands must be contiguous")
        }
        if self.offsets.first() != Some(&0) || self.offsets.last() != Some(&t) {
            candle_core::bail!(
                "fused attention: rows {:?} do not cover {t} tokens",
                self.offsets
            )
        }
        Ok((t, heads, kv, d))
    }
}

impl CustomOp3 for FlashVarlen {
    fn name(&self) -> &'static str {
        "flash-varlen"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, heads, kv, d) = self.dims(l1, l2, l3)?;
        let dims = (t, heads, kv, d);
        let out = crate::cpu::by_dtype!(s1.dtype(), "fused attention", |T| {
            let (out, lse) = twin::forward::<T>(
                slice_of(s1, l1)?,
                slice_of(s2, l2)?,
                slice_of(s3, l3)?,
                &self.offsets,
                dims,
                self.scale,
            );
            self.lse
                .keep(Tensor::from_vec(lse, (heads, t), &Device::Cpu)?)?;
            <T as candle_core::WithDType>::to_cpu_storage_owned(out)
        });
        Ok((out, Shape::from((t, heads, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (t, heads, kv, d) = self.dims(l1, l2, l3)?;
        let (out, lse) = cuda::forward(self, (s1, l1), (s2, l2), (s3, l3), (t, heads, kv, d))?;
        let dev = s1.device().clone();
        let lse = Tensor::from_storage(
            Storage::Cuda(candle_core::CudaStorage::wrap_cuda_slice(lse, dev)),
            (heads, t),
            candle_core::op::BackpropOp::none(),
            false,
        );
        self.lse.keep(lse)?;
        Ok((out, Shape::from((t, heads, d))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let lse = self.lse.take()?;
        let (t, heads, d) = q.dims3()?;
        let kv = k.dim(1)?;
        let op = FlashVarlenBwd {
            fwd: self,
            out: res.detach(),
            dout: grad_res.detach().contiguous()?,
            lse,
        };
        let all = q.detach().apply_op3_no_bwd(&k.detach(), &v.detach(), &op)?;
        let n = t * heads * d;
        let dq = all.narrow(0, 0, n)?.reshape((t, heads, d))?;
        // Each KV head's gradient is the sum over the query heads that read it (in f32).
        let group = |i: usize| -> Result<Tensor> {
            all.narrow(0, i * n, n)?
                .reshape((t, kv, heads / kv, d))?
                .to_dtype(DType::F32)?
                .sum(2)?
                .to_dtype(q.dtype())
        };
        Ok((Some(dq), Some(group(1)?), Some(group(2)?)))
    }
}

impl CustomOp3 for FlashVarlenBwd<'_> {
    fn name(&self) -> &'static str {
        "flash-varlen-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, heads, kv, d) = self.fwd.dims(l1, l2, l3)?;
        let lse = self.lse.flatten_all()?.to_vec1::<f32>()?;
        let (os, ol) = self.out.storage_and_layout();
        let (gs, gl) = self.dout.storage_and_layout();
        let (Storage::Cpu(os), Storage::Cpu(gs)) = (&*os, &*gs) else {
            candle_core::bail!("fused attention: out and dout must be on the CPU")
        };
        let all = crate::cpu::by_dtype!(s1.dtype(), "fused attention", |T| {
            <T as candle_core::WithDType>::to_cpu_storage_owned(twin::backward::<T>(
                twin::Operands {
                    q: slice_of(s1, l1)?,
                    k: slice_of(s2, l2)?,
                    v: slice_of(s3, l3)?,
                    out: slice_of(os, ol)?,
                    dout: slice_of(gs, gl)?,
                    lse: &lse,
                },
                &self.fwd.offsets,
                (t, heads, kv, d),
                self.fwd.scale,
            ))
        });
        Ok((all, Shape::from(3 * t * heads * d)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let dims = self.fwd.dims(l1, l2, l3)?;
        let (t, heads, _, d) = dims;
        let all = cuda::backward(
            self.fwd,
            (&self.out, &self.dout, &self.lse),
            (s1, l1),
            (s2, l2),
            (s3, l3),
            dims,
        )?;
        Ok((all, Shape::from(3 * t * heads * d)))
    }
}

/// The largest differences, relative to each tensor's largest entry, between [`attend`] on
/// `dev` (the kernel on a GPU) and the CPU twin, for the output and for the gradients of q, k, v
/// (of a weighted sum of the output): packed rows of 1, 70, 300 and 129 tokens (across the
/// kernel's 128-row tiles), bf16, GQA 16/8 heads (Qwen3-0.6B), head dims 64 and 128.
/// `mtrl selftest` reports it; on the CPU it compares the twin with itself.
pub fn check_against_twin(dev: &Device) -> crate::Result<(f32, f32)> {
    let lens = [1usize, 70, 300, 129];
    let mut offsets = vec![0usize];
    for l in lens {
        offsets.push(offsets[offsets.len() - 1] + l);
    }
    let t = offsets[offsets.len() - 1];
    let (heads, kv) = (16usize, 8usize);
    let (mut worst_out, mut worst_grad) = (0f32, 0f32);
    for d in [64usize, 128] {
        let draw = |h: usize| -> Result<Tensor> {
            Tensor::randn(0f32, 1.0, (t, h, d), &Device::Cpu)?.to_dtype(DType::BF16)
        };
        let (q, k, v) = (draw(heads)?, draw(kv)?, draw(kv)?);
        let w = Tensor::randn(0f32, 1.0, (t, heads, d), &Device::Cpu)?;
        let run = |on: &Device| -> Result<Vec<Tensor>> {
            let vars = [&q, &k, &v].map(|x| {
                x.to_device(on)
                    .and_then(|x| candle_core::Var::from_tensor(&x))
            });
            let [q, k, v] = vars;
            let (q, k, v) = (q?, k?, v?);
            let offs: Vec<u32> = offsets.iter().map(|&o| o as u32).collect();
            let cu = Tensor::from_vec(offs, offsets.len(), on)?;
            let out = attend(q.as_tensor(), k.as_tensor(), v.as_tensor(), &offsets, &cu)?;
            let loss = (out.to_dtype(DType::F32)? * w.to_device(on)?)?.sum_all()?;
            let g = loss.backward()?;
            let mut all = vec![out.to_device(&Device::Cpu)?];
            for x in [&q, &k, &v] {
                match g.get(x) {
                    Some(g) => all.push(g.to_device(&Device::Cpu)?),
                    None => candle_core::bail!("fused attention check: no gradient"),
                }
            }
            Ok(all)
        };
        let (got, want) = (run(dev)?, run(&Device::Cpu)?);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let gap = crate::cpu::max_rel_gap(a, b)?;
            if i == 0 {
                worst_out = worst_out.max(gap);
            } else {
                worst_grad = worst_grad.max(gap);
            }
        }
    }
    Ok((worst_out, worst_grad))
}

pub(crate) mod twin;

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(test)]
mod tests;
