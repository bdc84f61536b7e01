//! A bound on every collective: [`Watchdog::arm`] before it, [`Armed`] dropped after; a
//! collective still running at its deadline ends the process with a message naming the rank and
//! the collective (the launcher then stops the other ranks: `mpirun` ends the whole job when one
//! rank exits without finalising MPI).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The exit status of a rank the watchdog stopped.
pub const WATCHDOG_EXIT: i32 = 75;

#[derive(Default)]
struct Slot {
    armed: Option<(Instant, String)>,
}

/// One thread watching the collective in progress.
pub struct Watchdog {
    shared: Arc<(Mutex<Slot>, Condvar)>,
    rank: usize,
    timeout: Duration,
}

/// A collective in progress; dropping it disarms the watchdog.
pub struct Armed<'a> {
    dog: &'a Watchdog,
}

impl Watchdog {
    /// Starts the watching thread for `rank`.
    pub fn start(rank: usize, timeout: Duration) -> Watchdog {
        let shared: Arc<(Mutex<Slot>, Condvar)> = Arc::default();
        let s = shared.clone();
        std::thread::Builder::new()
            .name("mtrl-watchdog".into())
            .spawn(move || watch(&s, rank, timeout))
            .expect("spawning the collective watchdog thread");
        Watchdog {
            shared,
            rank,
            timeout,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Arms the watchdog for `what` (one collective at a time).
    pub fn arm(&self, what: &str) -> Armed<'_> {
        let (m, cv) = &*self.shared;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        s.armed = Some((Instant::now() + self.timeout, what.to_string()));
        cv.notify_all();
        Armed { dog: self }
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        let (m, cv) = &*self.dog.shared;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        s.armed = None;
        cv.notify_all();
    }
}

fn watch(shared: &(Mutex<Slot>, Condvar), rank: usize, timeout: Duration) {
    let (m, cv) = shared;
    let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        match s.armed.clone() {
            None => s = cv.wait(s).unwrap_or_else(|e| e.into_inner()),
            Some((deadline, what)) => {
                let now = Instant::now();
                if now >= deadline {
                    eprintln!(
                        "error: rank {rank}: {what} has not completed within {:.0} s \
                         ([distributed] timeout_s): a peer rank is dead or hung; stopping this \
                         rank (the launcher stops the others)",
                        timeout.as_secs_f64()
                    );
                    std::process::exit(WATCHDOG_EXIT);
                }
                let (next, _) = cv
                    .wait_timeout(s, deadline - now)
                    .unwrap_or_else(|e| e.into_inner());
                s = next;
            }
        }
    }
}
