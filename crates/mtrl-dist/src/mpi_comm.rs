//! [`Collective`] over MPI (`mpirun`, `srun`): host-memory sums and gathers, the per-step arrival
//! that names missing ranks, and a watchdog on every call.
//!
//! Threading: MPI is initialised `Serialized` and every call goes through one lock, so the
//! learner thread and anyone else never call MPI at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;
use mtrl_learner::{Collective, LearnerError};

use crate::error::{DistError, Result};
use crate::launch::Launch;
use crate::watchdog::Watchdog;

const TAG_ARRIVE: i32 = 7301;
const TAG_GO: i32 = 7302;
/// Elements per MPI call (counts are C ints).
const MAX_COUNT: usize = 1 << 30;

/// The MPI world of this job.
pub struct MpiCollective {
    lock: Mutex<Comm>,
    rank: usize,
    world: usize,
    local_rank: usize,
    timeout: Duration,
    dog: Watchdog,
    arrivals: AtomicU64,
}

struct Comm {
    world: SimpleCommunicator,
    // Finalises MPI when the collective is dropped (after a successful run).
    _universe: Universe,
}

// SAFETY: MPI is initialised with at least `Serialized` (checked in `init`), and every use of the
// communicator goes through `lock`, so no two threads call MPI at once.
unsafe impl Send for Comm {}

fn lerr(e: impl std::fmt::Display) -> LearnerError {
    LearnerError::Collective(e.to_string())
}

impl MpiCollective {
    /// Initialises MPI for a launched process.
    pub fn init(l: &Launch, timeout: Duration) -> Result<MpiCollective> {
        let (universe, got) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| DistError::Mpi("MPI was already initialised".into()))?;
        if got < Threading::Serialized {
            return Err(DistError::Mpi(format!(
                "the MPI library offers thread level {got:?}; mtrl needs Serialized"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        if (rank, size) != (l.rank, l.world) {
            return Err(DistError::Mpi(format!(
                "MPI says rank {rank} of {size}, the launcher's {} said {} of {}",
                l.source, l.rank, l.world
            )));
        }
        Ok(MpiCollective {
            lock: Mutex::new(Comm {
                world,
                _universe: universe,
            }),
            rank,
            world: size,
            local_rank: l.local_rank,
            timeout,
            dog: Watchdog::start(rank, timeout),
            arrivals: AtomicU64::new(0),
        })
    }

    fn comm(&self) -> std::sync::MutexGuard<'_, Comm> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the communicator with the watchdog armed for `what`.
    fn call<T>(&self, what: &str, f: impl FnOnce(&SimpleCommunicator) -> T) -> T {
        let c = self.comm();
        let _armed = self.dog.arm(&format!("the {what} collective"));
        f(&c.world)
    }

    /// Polls `req` until it completes or `deadline`; `Err` (and the request is forgotten, its
    /// buffer leaked, so MPI may still write it) after the deadline.
    fn finish(
        mut req: Request<'static, [u64], StaticScope>,
        deadline: Instant,
    ) -> std::result::Result<&'static [u64], ()> {
        loop {
            match req.test_with_data() {
                Ok((_, data)) => return Ok(data),
                Err(r) if Instant::now() >= deadline => {
                    std::mem::forget(r);
                    return Err(());
                }
                Err(r) => {
                    req = r;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
    }

    fn leak(v: Vec<u64>) -> &'static mut [u64] {
        Box::leak(v.into_boxed_slice())
    }

    /// Frees a buffer [`leak`](Self::leak)ed for a request that has completed.
    ///
    /// SAFETY: `b` came from `leak` and its request has completed (MPI no longer holds it).
    unsafe fn reclaim(b: &'static [u64]) {
        drop(Box::from_raw(b as *const [u64] as *mut [u64]));
    }

    fn stop(&self, message: String) -> ! {
        eprintln!("error: rank {}: {message}; stopping the job", self.rank);
        self.comm().world.abort(3)
    }
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn local_rank(&self) -> usize {
        self.local_rank
    }

    fn all_reduce_f64(&self, buf: &mut [f64], what: &str) -> mtrl_learner::Result<()> {
        self.call(what, |w| {
            for chunk in buf.chunks_mut(MAX_COUNT) {
                let send = chunk.to_vec();
                w.all_reduce_into(&send[..], chunk, SystemOperation::sum());
            }
        });
        Ok(())
    }

    fn all_reduce_f32(&self, buf: &mut [f32], what: &str) -> mtrl_learner::Result<()> {
        self.call(what, |w| {
            for chunk in buf.chunks_mut(MAX_COUNT) {
                let send = chunk.to_vec();
                w.all_reduce_into(&send[..], chunk, SystemOperation::sum());
            }
        });
        Ok(())
    }

    fn all_gather_bytes(&self, mine: &[u8], what: &str) -> mtrl_learner::Result<Vec<Vec<u8>>> {
        if mine.len() > MAX_COUNT {
            return Err(lerr(format!(
                "{what}: {} bytes from rank {} is over the {MAX_COUNT} one gather carries",
                mine.len(),
                self.rank
            )));
        }
        self.call(what, |w| {
            let mut lens = vec![0u64; self.world];
            w.all_gather_into(&(mine.len() as u64), &mut lens[..]);
            let total: u64 = lens.iter().sum();
            if total as usize > i32::MAX as usize {
                return Err(lerr(format!("{what}: {total} bytes in all is over 2 GiB")));
            }
            let counts: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
            let displs: Vec<i32> = counts
                .iter()
                .scan(0i32, |at, &n| {
                    let d = *at;
                    *at += n;
                    Some(d)
                })
                .collect();
            let mut all = vec![0u8; total as usize];
            {
                let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
                w.all_gather_varcount_into(mine, &mut part);
            }
            let mut out = Vec::with_capacity(self.world);
            for (&d, &n) in displs.iter().zip(&counts) {
                out.push(all[d as usize..(d + n) as usize].to_vec());
            }
            Ok(out)
        })
    }

    /// Rank 0 collects an arrival message `[sequence, flag]` from every rank and answers each
    /// with the OR of the flags; both sides poll with a deadline, so a rank that never comes is
    /// named (by rank 0; the others name rank 0 when it does not answer) and the job is
    /// stopped with `MPI_Abort`.
    fn arrive(&self, what: &str, flag: bool) -> mtrl_learner::Result<bool> {
        self.arrive_within(what, flag, Some(self.timeout))
    }

    fn arrive_within(
        &self,
        what: &str,
        flag: bool,
        wait: Option<Duration>,
    ) -> mtrl_learner::Result<bool> {
        let seq = self.arrivals.fetch_add(1, Ordering::Relaxed);
        if self.world == 1 {
            return Ok(flag);
        }
        // No bound: ten years stand for "as long as it takes".
        let wait = wait.unwrap_or(Duration::from_secs(315_360_000));
        let deadline = Instant::now() + wait;
        let secs = wait.as_secs_f64();
        let c = self.comm();
        if self.rank == 0 {
            let mut any = flag;
            let mut missing = Vec::new();
            let mut wrong = Vec::new();
            let reqs: Vec<_> = (1..self.world)
                .map(|r| {
                    let buf = Self::leak(vec![0; 2]);
                    let p = c.world.process_at_rank(r as i32);
                    p.immediate_receive_into_with_tag(StaticScope, buf, TAG_ARRIVE)
                })
                .collect();
            for (i, req) in reqs.into_iter().enumerate() {
                match Self::finish(req, deadline) {
                    Ok(d) => {
                        if d[0] != seq {
                            wrong.push(format!("rank {} is at collective #{}", i + 1, d[0]));
                        }
                        any |= d[1] != 0;
                        // SAFETY: the receive has completed.
                        unsafe { Self::reclaim(d) };
                    }
                    Err(()) => missing.push((i + 1).to_string()),
                }
            }
            drop(c);
            if !missing.is_empty() {
                self.stop(format!(
                    "rank(s) {} did not reach {what} within {secs:.0} s: dead or hung \
                     ([distributed] timeout_s bounds collectives, step_timeout_s the step \
                     arrivals)",
                    missing.join(", ")
                ));
            }
            if !wrong.is_empty() {
                self.stop(format!(
                    "ranks disagree on where they are: rank 0 is at collective #{seq} ({what}), {}",
                    wrong.join(", ")
                ));
            }
            let c = self.comm();
            let sends: Vec<_> = (1..self.world)
                .map(|r| {
                    let buf: &'static [u64] = Self::leak(vec![seq, u64::from(any)]);
                    let p = c.world.process_at_rank(r as i32);
                    p.immediate_send_with_tag(StaticScope, buf, TAG_GO)
                })
                .collect();
            let mut late = Vec::new();
            for (i, req) in sends.into_iter().enumerate() {
                match Self::finish(req, deadline) {
                    // SAFETY: the send has completed.
                    Ok(d) => unsafe { Self::reclaim(d) },
                    Err(()) => late.push((i + 1).to_string()),
                }
            }
            drop(c);
            if !late.is_empty() {
                self.stop(format!(
                    "rank(s) {} did not take rank 0's answer at {what} within {secs:.0} s",
                    late.join(", ")
                ));
            }
            return Ok(any);
        }
        let root = c.world.process_at_rank(0);
        let buf: &'static [u64] = Self::leak(vec![seq, u64::from(flag)]);
        let sent = Self::finish(
            root.immediate_send_with_tag(StaticScope, buf, TAG_ARRIVE),
            deadline,
        );
        let answer = match sent {
            Ok(d) => {
                // SAFETY: the send has completed.
                unsafe { Self::reclaim(d) };
                let buf = Self::leak(vec![0; 2]);
                Self::finish(
                    root.immediate_receive_into_with_tag(StaticScope, buf, TAG_GO),
                    deadline,
                )
            }
            Err(()) => Err(()),
        };
        drop(c);
        match answer {
            Ok(d) => {
                let any = d[1] != 0;
                // SAFETY: the receive has completed.
                unsafe { Self::reclaim(d) };
                Ok(any)
            }
            Err(()) => self.stop(format!(
                "rank 0 did not answer at {what} within {secs:.0} s: dead or hung ([distributed] \
                 timeout_s bounds collectives, step_timeout_s the step arrivals)"
            )),
        }
    }

    fn abort(&self, code: i32) -> ! {
        self.comm().world.abort(code)
    }
}

impl MpiCollective {
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.dog
    }

    /// Broadcasts rank 0's `buf` to every rank (NCCL's unique id).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn broadcast_bytes(&self, buf: &mut [u8], what: &str) {
        self.call(what, |w| w.process_at_rank(0).broadcast_into(buf));
    }
}
