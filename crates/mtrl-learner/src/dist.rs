//! Data parallelism as the learner sees it: N ranks hold the same weights and the same step
//! batch; each computes the gradients of its share of the step's micro-batches (every N-th, in
//! order), and the ranks sum them ([`all_reduce_grads`]) before one identical optimizer update.
//!
//! The transport is behind [`Collective`] (MPI in host memory, NCCL on the device: `mtrl-dist`);
//! [`Local`] is the single process. Gradients are summed in buckets of about `bucket_bytes`, in
//! the parameters' name order, so every rank packs the same buckets. A parameter that got no
//! gradient on any rank stays absent (the optimizer then skips it, as a single process would).
//!
//! Exactness: with `train.grad_accumulation = "f64"` gradients are summed in f64, where the sum of
//! a handful of f32 micro-batch gradients is exact whatever their order or grouping, so N ranks
//! give the single process's sum and, after the same f32 cast, its update bit for bit (the
//! micro-batch composition is the single process's: the split is made before the share is taken).
//! With `"f32"` (the default; half the memory on a GPU) N ranks match one to rounding.

use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::{DType, Tensor, Var};

use crate::error::{LearnerError, Result};

/// What the ranks share.
pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// Element-wise sum over ranks, in place; `what` names the collective in errors.
    fn all_reduce_f64(&self, buf: &mut [f64], what: &str) -> Result<()>;
    /// Element-wise sum over ranks, in place.
    fn all_reduce_f32(&self, buf: &mut [f32], what: &str) -> Result<()>;
    /// Every rank's bytes, in rank order.
    fn all_gather_bytes(&self, mine: &[u8], what: &str) -> Result<Vec<Vec<u8>>>;
    /// A device-side sum of `t` (1-D, on this rank's device) when this collective has a device
    /// communicator (NCCL); `None` sends gradients through host memory.
    fn device_all_reduce(&self, _t: &Tensor, _what: &str) -> Option<Result<Tensor>> {
        None
    }
    /// This rank's index among the ranks of its node (its GPU: `cuda:<local rank>`).
    fn local_rank(&self) -> usize {
        0
    }
    /// Waits until every rank has reached `what`, naming the ranks that did not within the
    /// collective timeout; returns whether any rank raised `flag` (a stop, a failure).
    fn arrive(&self, _what: &str, flag: bool) -> Result<bool> {
        Ok(flag)
    }
    /// [`Collective::arrive`] with its own bound instead of the collective timeout (`None`: no
    /// bound; a rank that dies still ends the job through the launcher). The step arrivals use
    /// it: a rank may be late there for as long as its rollouts and rank 0's validation may
    /// healthily take.
    fn arrive_within(
        &self,
        what: &str,
        flag: bool,
        _wait: Option<std::time::Duration>,
    ) -> Result<bool> {
        self.arrive(what, flag)
    }
    /// Ends every rank of the job after a failure on this one (one process just exits).
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// One process: nothing to combine.
#[derive(Debug, Clone, Copy, Default)]
pub struct Local;

impl Collective for Local {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn all_reduce_f64(&self, _: &mut [f64], _: &str) -> Result<()> {
        Ok(())
    }
    fn all_reduce_f32(&self, _: &mut [f32], _: &str) -> Result<()> {
        Ok(())
    }
    fn all_gather_bytes(&self, mine: &[u8], _: &str) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
}

/// Whether micro-batch `i` of a step is this rank's ([`dealt_to`]).
pub fn owns(c: &dyn Collective, i: usize) -> bool {
    dealt_to(i, c.world()) == c.rank()
}

/// The rank micro-batch `i` goes to among `world`. Micro-batches come longest first
/// (`batch::micro_batches`), so they are dealt back and forth — ranks 0 … w−1, then w−1 … 0 —
/// rather than round-robin, under which rank 0 would take the longest of every round.
pub fn dealt_to(i: usize, world: usize) -> usize {
    let w = world.max(1);
    let (round, j) = (i / w, i % w);
    if round % 2 == 0 {
        j
    } else {
        w - 1 - j
    }
}

/// What the gradient all-reduce moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CommStats {
    /// Bytes each rank contributed (payload, not the transport's traffic).
    pub bytes: u64,
    /// All-reduce calls (buckets).
    pub calls: u64,
    pub seconds: f64,
}

impl CommStats {
    pub fn add(&mut self, o: &CommStats) {
        self.bytes += o.bytes;
        self.calls += o.calls;
        self.seconds += o.seconds;
    }
}

/// How gradients travel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReduceOptions {
    pub bucket_bytes: usize,
}

impl Default for ReduceOptions {
    fn default() -> ReduceOptions {
        ReduceOptions {
            bucket_bytes: 25 << 20,
        }
    }
}

/// Sums `grads` over the ranks in place (see the module docs). `params` gives every rank the
/// same names and shapes; `dtype` is the accumulation dtype. A no-op for one rank.
pub fn all_reduce_grads(
    c: &dyn Collective,
    params: &BTreeMap<String, Var>,
    grads: &mut BTreeMap<String, Tensor>,
    opts: ReduceOptions,
    dtype: DType,
) -> Result<CommStats> {
    let mut stats = CommStats::default();
    if c.world() <= 1 {
        return Ok(stats);
    }
    let t0 = Instant::now();
    let names: Vec<&String> = params.keys().collect();
    let mut present: Vec<f64> = names
        .iter()
        .map(|n| f64::from(u8::from(grads.contains_key(*n))))
        .collect();
    c.all_reduce_f64(&mut present, "gradient presence")?;
    stats.calls += 1;
    let live: Vec<(&String, &Var)> = names
        .iter()
        .zip(&present)
        .filter(|(_, p)| **p > 0.0)
        .map(|(n, _)| (*n, &params[*n]))
        .collect();
    let elem = dtype.size_in_bytes();
    let mut bucket: Vec<(&String, &Var)> = Vec::new();
    let mut bytes = 0usize;
    let mut out = BTreeMap::new();
    for (i, &(name, var)) in live.iter().enumerate() {
        bucket.push((name, var));
        bytes += var.elem_count() * elem;
        if bytes >= opts.bucket_bytes || i + 1 == live.len() {
            let n = stats.calls;
            reduce_bucket(c, &bucket, grads, dtype, &mut out, n)?;
            stats.calls += 1;
            stats.bytes += bytes as u64;
            bucket.clear();
            bytes = 0;
        }
    }
    *grads = out;
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

/// One bucket: flattened, summed (on the device or through host memory), cut back.
fn reduce_bucket(
    c: &dyn Collective,
    bucket: &[(&String, &Var)],
    grads: &BTreeMap<String, Tensor>,
    dtype: DType,
    out: &mut BTreeMap<String, Tensor>,
    index: u64,
) -> Result<()> {
    let dev = bucket[0].1.device().clone();
    let flat = bucket
        .iter()
        .map(|(name, var)| match grads.get(*name) {
            Some(g) => Ok(g.to_dtype(dtype)?.flatten_all()?),
            None => Ok(Tensor::zeros(var.elem_count(), dtype, &dev)?),
        })
        .collect::<Result<Vec<_>>>()?;
    let joined = Tensor::cat(&flat, 0)?;
    let what = format!("gradient bucket {index}");
    let summed = match c.device_all_reduce(&joined, &what) {
        Some(r) => r?,
        None if dtype == DType::F64 => {
            let mut v = joined.to_vec1::<f64>()?;
            c.all_reduce_f64(&mut v, &what)?;
            Tensor::from_vec(v, joined.elem_count(), &dev)?
        }
        None => {
            let mut v = joined.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            c.all_reduce_f32(&mut v, &what)?;
            Tensor::from_vec(v, joined.elem_count(), &dev)?.to_dtype(dtype)?
        }
    };
    let mut at = 0usize;
    for (name, var) in bucket {
        let n = var.elem_count();
        let g = summed.narrow(0, at, n)?.reshape(var.dims())?;
        out.insert((*name).clone(), g);
        at += n;
    }
    if at != summed.elem_count() {
        return Err(LearnerError::Collective(format!(
            "{what}: {} elements came back, {at} were sent",
            summed.elem_count()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use std::sync::{Arc, Barrier, Mutex};

    /// N threads as ranks: sums through shared slots (exercises the packing, not a transport).
    struct Threads {
        rank: usize,
        world: usize,
        barrier: Arc<Barrier>,
        slots: Arc<Mutex<Vec<Vec<f64>>>>,
    }

    impl Threads {
        fn sum(&self, buf: &mut [f64]) {
            self.slots.lock().unwrap()[self.rank] = buf.to_vec();
            self.barrier.wait();
            let all = self.slots.lock().unwrap().clone();
            for (i, b) in buf.iter_mut().enumerate() {
                *b = all.iter().map(|s| s[i]).sum();
            }
            self.barrier.wait();
        }
    }

    impl Collective for Threads {
        fn rank(&self) -> usize {
            self.rank
        }
        fn world(&self) -> usize {
            self.world
        }
        fn all_reduce_f64(&self, buf: &mut [f64], _: &str) -> Result<()> {
            self.sum(buf);
            Ok(())
        }
        fn all_reduce_f32(&self, buf: &mut [f32], _: &str) -> Result<()> {
            let mut v: Vec<f64> = buf.iter().map(|&x| x as f64).collect();
            self.sum(&mut v);
            for (b, x) in buf.iter_mut().zip(v) {
                *b = x as f32;
            }
            Ok(())
        }
        fn all_gather_bytes(&self, mine: &[u8], _: &str) -> Result<Vec<Vec<u8>>> {
            Ok(vec![mine.to_vec()])
        }
    }

    #[test]
    fn buckets_sum_and_absent_gradients_stay_absent() {
        let dev = Device::Cpu;
        let mut params = BTreeMap::new();
        for (n, len) in [("a", 3usize), ("b", 5), ("c", 2), ("unused", 4)] {
            params.insert(n.to_string(), Var::zeros(len, DType::F32, &dev).unwrap());
        }
        let world = 2;
        let barrier = Arc::new(Barrier::new(world));
        let slots = Arc::new(Mutex::new(vec![Vec::new(); world]));
        let run = |rank: usize, bucket_bytes: usize| {
            let c = Threads {
                rank,
                world,
                barrier: barrier.clone(),
                slots: slots.clone(),
            };
            let params = params.clone();
            std::thread::spawn(move || {
                let mut g = BTreeMap::new();
                let v = |len: usize, k: f64| {
                    Tensor::from_vec(
                        (0..len).map(|i| k + i as f64).collect::<Vec<_>>(),
                        len,
                        &Device::Cpu,
                    )
                    .unwrap()
                };
                g.insert("a".to_string(), v(3, rank as f64));
                // `b` only on rank 1, `c` only on rank 0, `unused` nowhere.
                if rank == 1 {
                    g.insert("b".to_string(), v(5, 10.0));
                } else {
                    g.insert("c".to_string(), v(2, 100.0));
                }
                let o = ReduceOptions { bucket_bytes };
                let s = all_reduce_grads(&c, &params, &mut g, o, DType::F64).unwrap();
                (g, s)
            })
        };
        for (bucket_bytes, calls) in [(1usize, 4u64), (1 << 20, 2)] {
            let hs: Vec<_> = (0..world).map(|r| run(r, bucket_bytes)).collect();
            let outs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            for (g, s) in &outs {
                assert_eq!(s.calls, calls, "bucket_bytes {bucket_bytes}");
                assert_eq!(s.bytes, (3 + 5 + 2) * 8);
                let a: Vec<f64> = g["a"].to_vec1().unwrap();
                assert_eq!(a, vec![1.0, 3.0, 5.0]);
                assert_eq!(g["b"].to_vec1::<f64>().unwrap()[4], 14.0);
                assert_eq!(g["c"].to_vec1::<f64>().unwrap(), vec![100.0, 101.0]);
                assert!(!g.contains_key("unused"));
            }
        }
    }

    #[test]
    fn one_rank_is_a_no_op() {
        let dev = Device::Cpu;
        let params = BTreeMap::from([("w".to_string(), Var::zeros(2, DType::F32, &dev).unwrap())]);
        let mut g = BTreeMap::from([("w".to_string(), Tensor::ones(2, DType::F32, &dev).unwrap())]);
        let s = all_reduce_grads(
            &Local,
            &params,
            &mut g,
            ReduceOptions::default(),
            DType::F64,
        );
        assert_eq!(s.unwrap(), CommStats::default());
        assert_eq!(g["w"].to_vec1::<f32>().unwrap(), vec![1.0, 1.0]);
        assert!((0..4).all(|i| owns(&Local, i)));
    }

    #[test]
    fn micro_batches_are_dealt_back_and_forth() {
        let deal: Vec<usize> = (0..7).map(|i| dealt_to(i, 3)).collect();
        assert_eq!(deal, vec![0, 1, 2, 2, 1, 0, 0]);
        assert!((0..5).all(|i| dealt_to(i, 1) == 0));
    }
}
