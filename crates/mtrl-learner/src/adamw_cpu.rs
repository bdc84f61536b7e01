//! The AdamW update of an f32 parameter on the CPU as one fused pass over the parameter, its
//! gradient and its moments (the tensor spelling in `adamw` makes about a dozen passes, each
//! allocating a full-size temporary). It evaluates the same f32 expressions in the same order as
//! that spelling (candle's `affine` is `x · mul + add` in f32), so both give identical bits.

use candle_core::{DType, Device, Tensor};

/// The f32 coefficients of one step, as candle's scalar ops would round them.
#[derive(Clone, Copy)]
pub(crate) struct Coeffs {
    pub b1: f32,
    pub omb1: f32,
    pub b2: f32,
    pub omb2: f32,
    pub decay: f32,
    pub inv_bc2: f32,
    pub eps: f32,
    pub step: f32,
}

/// Contiguous f32 data of a CPU tensor.
fn data(t: &Tensor) -> Option<Vec<f32>> {
    if !t.device().is_cpu() || t.dtype() != DType::F32 {
        return None;
    }
    t.flatten_all().ok()?.to_vec1::<f32>().ok()
}

/// `(p, m, v)` after one step, or `None` when a tensor is not f32 on the CPU (the caller then
/// takes the tensor path).
pub(crate) fn update(
    p: &Tensor,
    g: &Tensor,
    m: Option<&Tensor>,
    v: Option<&Tensor>,
    k: Coeffs,
) -> Option<(Tensor, Tensor, Tensor)> {
    let (mut pd, gd) = (data(p)?, data(g)?);
    let mut md = match m {
        Some(m) => data(m)?,
        None => Vec::new(),
    };
    let mut vd = match v {
        Some(v) => data(v)?,
        None => Vec::new(),
    };
    let (fresh_m, fresh_v) = (md.is_empty(), vd.is_empty());
    if fresh_m {
        md = vec![0f32; gd.len()];
    }
    if fresh_v {
        vd = vec![0f32; gd.len()];
    }
    if pd.len() != gd.len() || md.len() != gd.len() || vd.len() != gd.len() {
        return None;
    }
    let threads = candle_core::utils::get_num_threads().max(1);
    let chunk = gd.len().div_ceil(threads).max(1 << 15);
    std::thread::scope(|s| {
        let mut parts = pd
            .chunks_mut(chunk)
            .zip(md.chunks_mut(chunk))
            .zip(vd.chunks_mut(chunk))
            .zip(gd.chunks(chunk))
            .peekable();
        while let Some((((pc, mc), vc), gc)) = parts.next() {
            // The last chunk runs on this thread.
            if parts.peek().is_some() {
                s.spawn(move || kernel(pc, mc, vc, gc, fresh_m, fresh_v, k));
            } else {
                kernel(pc, mc, vc, gc, fresh_m, fresh_v, k);
            }
        }
    });
    let dev = Device::Cpu;
    let shape = p.shape();
    Some((
        Tensor::from_vec(pd, shape, &dev).ok()?,
        Tensor::from_vec(md, shape, &dev).ok()?,
        Tensor::from_vec(vd, shape, &dev).ok()?,
    ))
}

fn kernel(
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    fresh_m: bool,
    fresh_v: bool,
    k: Coeffs,
) {
    for i in 0..g.len() {
        let gi = g[i];
        let mi = if fresh_m {
            gi * k.omb1 + 0.0
        } else {
            (m[i] * k.b1 + 0.0) + (gi * k.omb1 + 0.0)
        };
        let g2 = gi * gi;
        let vi = if fresh_v {
            g2 * k.omb2 + 0.0
        } else {
            (v[i] * k.b2 + 0.0) + (g2 * k.omb2 + 0.0)
        };
        let pi = p[i] * k.decay + 0.0;
        let denom = (vi.sqrt() * k.inv_bc2 + 0.0) * 1.0 + k.eps;
        p[i] = pi - ((mi / denom) * k.step + 0.0);
        m[i] = mi;
        v[i] = vi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensor spelling of `adamw::AdamW::step` for an f32 parameter.
    fn spelled(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, lr: f64, t: i32) -> [Tensor; 3] {
        let (b1, b2, eps, wd) = (0.9, 0.999, 1e-8, 0.01);
        let (bc1, bc2_sqrt) = (1.0 - f64::powi(b1, t), (1.0 - f64::powi(b2, t)).sqrt());
        let m = ((m * b1).unwrap() + (g * (1.0 - b1)).unwrap()).unwrap();
        let v = ((v * b2).unwrap() + (g.sqr().unwrap() * (1.0 - b2)).unwrap()).unwrap();
        let p = (p * (1.0 - lr * wd)).unwrap();
        let denom = ((v.sqrt().unwrap() / bc2_sqrt).unwrap() + eps).unwrap();
        let upd = (m.div(&denom).unwrap() * (lr / bc1)).unwrap();
        [(p - upd).unwrap(), m, v]
    }

    #[test]
    fn fused_pass_matches_the_tensor_spelling_bit_for_bit() {
        let dev = Device::Cpu;
        let n = 100_003; // several chunks, uneven
        let mut p = Tensor::randn(0f32, 1.0, n, &dev).unwrap();
        let (mut m, mut v) = (p.zeros_like().unwrap(), p.zeros_like().unwrap());
        let (mut pf, mut mf, mut vf) = (p.clone(), None::<Tensor>, None::<Tensor>);
        for t in 1..=4 {
            let g = Tensor::randn(0f32, 1e-2, n, &dev).unwrap();
            let lr = 1e-3 * t as f64;
            let (b1, b2): (f64, f64) = (0.9, 0.999);
            let k = Coeffs {
                b1: b1 as f32,
                omb1: (1.0 - b1) as f32,
                b2: b2 as f32,
                omb2: (1.0 - b2) as f32,
                decay: (1.0 - lr * 0.01) as f32,
                inv_bc2: (1.0 / (1.0 - b2.powi(t)).sqrt()) as f32,
                eps: 1e-8f64 as f32,
                step: (lr / (1.0 - b1.powi(t))) as f32,
            };
            let (a, b, c) = update(&pf, &g, mf.as_ref(), vf.as_ref(), k).unwrap();
            (pf, mf, vf) = (a, Some(b), Some(c));
            [p, m, v] = spelled(&p, &g, &m, &v, lr, t);
            for (x, y) in [
                (&pf, &p),
                (mf.as_ref().unwrap(), &m),
                (vf.as_ref().unwrap(), &v),
            ] {
                let (x, y) = (x.to_vec1::<f32>().unwrap(), y.to_vec1::<f32>().unwrap());
                assert!(
                    x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "step {t}"
                );
            }
        }
    }
}
