//! Per-sequence key/value cache.
//!
//! Each sequence owns one cache (one `[1, kv_heads, capacity, head_dim]` buffer per layer for keys
//! and for values) and its own length, so sequences of different lengths decode side by side
//! without padding. The buffer grows by doubling; appends write in place (`slice_set`), so a decode
//! step copies only the new token's keys and values. Views handed to attention are `narrow`s of the
//! buffer, which candle's batched matmul reads without a copy.
//!
//! Invariant: all layers hold the same number of positions; `len()` is that number.

use candle_core::{Result, Tensor, D};

#[derive(Debug, Clone)]
struct LayerCache {
    k: Tensor,
    v: Tensor,
}

/// Keys and values of every layer for one sequence.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<Option<LayerCache>>,
    len: usize,
}

impl KvCache {
    /// An empty cache for a model with `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
            len: 0,
        }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `k`, `v` (`[1, kv, t, d]`) to `layer` and returns views of all cached keys/values.
    /// The length advances when the last layer is appended.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let needed = self.write(layer, k, v)?;
        let Some(c) = self.layers[layer].as_ref() else {
            candle_core::bail!("kv cache slot {layer} not initialised")
        };
        Ok((c.k.narrow(2, 0, needed)?, c.v.narrow(2, 0, needed)?))
    }

    /// Writes `k`, `v` (`[1, kv, t, d]`) after the cached positions of `layer` (growing the buffers
    /// when needed) and returns the number of valid positions of `layer` afterwards. The length
    /// advances when the last layer is written.
    pub(crate) fn write(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<usize> {
        let t = k.dim(2)?;
        let needed = self.len + t;
        let slot = &mut self.layers[layer];
        let grow = match slot {
            None => true,
            Some(c) => c.k.dim(2)? < needed,
        };
        if grow {
            let cap = needed.next_power_of_two().max(64);
            let (b, h, _, d) = k.dims4()?;
            let new = match slot.take() {
                None => LayerCache {
                    k: Tensor::zeros((b, h, cap, d), k.dtype(), k.device())?,
                    v: Tensor::zeros((b, h, cap, d), k.dtype(), k.device())?,
                },
                Some(old) => {
                    let kz = Tensor::zeros((b, h, cap - self.len, d), k.dtype(), k.device())?;
                    LayerCache {
                        k: Tensor::cat(&[&old.k.narrow(2, 0, self.len)?, &kz], 2)?,
                        v: Tensor::cat(&[&old.v.narrow(2, 0, self.len)?, &kz], 2)?,
                    }
                }
            };
            *slot = Some(new);
        }
        let Some(c) = slot.as_ref() else {
            candle_core::bail!("kv cache slot {layer} not initialised")
        };
        c.k.slice_set(&k.contiguous()?, 2, self.len)?;
        c.v.slice_set(&v.contiguous()?, 2, self.len)?;
        if layer + 1 == self.layers.len() {
            self.len = needed;
        }
        Ok(needed)
    }

    /// The whole key and value buffers of `layer` (`[1, kv, capacity, head_dim]`, contiguous),
    /// including unwritten capacity.
    pub(crate) fn buffers(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        self.layers
            .get(layer)
            .and_then(Option::as_ref)
            .map(|c| (&c.k, &c.v))
    }

    /// Bytes held by the buffers (capacity, not length).
    pub fn capacity_bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|c| 2 * c.k.elem_count() * c.k.dtype().size_in_bytes())
            .sum()
    }

    /// Head dimension of the cached keys, if any layer is filled (used by tests).
    pub fn head_dim(&self) -> Option<usize> {
        self.layers
            .iter()
            .flatten()
            .next()
            .and_then(|c| c.k.dim(D::Minus1).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn append_grows_and_keeps_values() {
        let dev = Device::Cpu;
        let mut c = KvCache::new(1);
        let mut all = Vec::new();
        for step in 0..70 {
            let k = Tensor::full(step as f32, (1, 2, 1, 4), &dev).unwrap();
            let (kk, _) = c.append(0, &k, &k).unwrap();
            all.push(step as f32);
            assert_eq!(kk.dims4().unwrap(), (1, 2, step + 1, 4));
        }
        assert_eq!(c.len(), 70);
        let (kk, _) = c
            .append(
                0,
                &Tensor::zeros((1, 2, 1, 4), DType::F32, &dev).unwrap(),
                &Tensor::zeros((1, 2, 1, 4), DType::F32, &dev).unwrap(),
            )
            .unwrap();
        let col: Vec<f32> = kk
            .narrow(1, 0, 1)
            .unwrap()
            .narrow(3, 0, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(&col[..70], &all[..]);
        assert_eq!(c.head_dim(), Some(4));
    }
}
