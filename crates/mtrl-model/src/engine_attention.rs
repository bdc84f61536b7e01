//! Which attention the engine's forward runs (`[rollout] engine_attention`, `mtrl bench engine
//! --attention`): the paged kernel reading the store in place ([`crate::paged_attention`]),
//! FlashAttention-2 for prompt chunks ([`crate::flash_prefill`]), or the gather spelling
//! ([`crate::transformer::paged`]). `Auto` picks the fastest the build and model allow; the
//! others exist to compare them on one card and as escape hatches.

use candle_core::{DType, Device};

use crate::transformer::backend::Backend;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineAttention {
    /// Prompt chunks through FlashAttention-2 where it serves (a binary built with `flash-attn`,
    /// CUDA, bf16, head dim 64 or 128), the other rows through the paged kernel where it serves
    /// (CUDA), else the gather spelling (on the CPU f32 backend, its own kernels).
    #[default]
    Auto,
    /// Every row through the paged kernel (its CPU twin off CUDA: exact and slow, a reference).
    Paged,
    /// Decode rows through the paged kernel, prompt chunks through FlashAttention-2 (CPU twins
    /// off CUDA); on CUDA an error where FlashAttention-2 cannot serve the model.
    FlashPrefill,
    /// The gather spelling: keys and values copied to padded tensors, masked attention (on the
    /// CPU f32 backend, its own kernels).
    Gathered,
}

impl EngineAttention {
    /// Every name [`Self::parse`] takes.
    pub const NAMES: [&'static str; 4] = ["auto", "paged", "flash-prefill", "gathered"];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "paged" => Some(Self::Paged),
            "flash-prefill" => Some(Self::FlashPrefill),
            "gathered" => Some(Self::Gathered),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Paged => "paged",
            Self::FlashPrefill => "flash-prefill",
            Self::Gathered => "gathered",
        }
    }

    /// `(in place, prompt chunks through FlashAttention-2)` for a model on `dev` in `dtype` with
    /// heads of `head_dim` under backend `be`; an error where a forced choice cannot run there.
    pub(crate) fn resolve(
        self,
        be: &dyn Backend,
        dev: &Device,
        dtype: DType,
        head_dim: usize,
    ) -> candle_core::Result<(bool, bool)> {
        let flash = crate::flash_varlen::kernel_serves(dev, dtype, head_dim);
        let paged = crate::paged_attention::serves(dev, dtype, head_dim);
        match self {
            Self::Auto => {
                let in_place = be.paged_in_place(dev, dtype, head_dim);
                Ok((in_place, in_place && flash))
            }
            Self::Gathered => Ok((false, false)),
            Self::Paged if dev.is_cuda() && !paged => candle_core::bail!(
                "engine_attention = \"paged\": the kernel takes bf16, f16 or f32 with a head dim \
                 that is a multiple of 32 up to 256, not {dtype:?} with {head_dim}"
            ),
            Self::Paged => Ok((true, false)),
            Self::FlashPrefill if dev.is_cuda() && !(flash && paged) => candle_core::bail!(
                "engine_attention = \"flash-prefill\": FlashAttention-2 serves bf16 with head dim \
                 64 or 128 in a binary built with --features cuda,flash-attn (this one: {}), not \
                 {dtype:?} with {head_dim}",
                if crate::flash_varlen::KERNEL_BUILT {
                    "with flash-attn"
                } else {
                    "without flash-attn"
                }
            ),
            Self::FlashPrefill => Ok((true, true)),
        }
    }
}
