//! Ctrl-C and SIGTERM for every command: the first signal asks whatever registered a stop hook
//! (a training run, a server) to finish gracefully — a run checkpoints and returns, a server
//! stops accepting and drains; a signal with no hook registered, or a second signal, ends the
//! process at once with status 130. So a user's Ctrl-C ends any command within seconds, and
//! checkpoints are whole: they are written atomically (a kill mid-save leaves only a temp folder).
//!
//! Why process-wide: tokio's signal handling replaces the default disposition for the rest of the
//! process once any runtime listened for a signal; a handler tied to a run's runtime therefore
//! left later stages (the default job's evaluation after an interrupted RL stage) deaf to every
//! signal but SIGKILL. One listener thread, started by the first [`on_signal`], owns both signals
//! from then on; a command that never registers keeps the default disposition (the signal ends
//! it at once).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

type Hook = Box<dyn Fn() + Send + Sync>;

static HOOKS: Mutex<Vec<(u64, Hook)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);
/// A signal already asked for a graceful stop: the next one exits at once.
static ASKED: AtomicBool = AtomicBool::new(false);
static START: Once = Once::new();

/// Exit status of a process ended by a signal (128 + SIGINT, as shells report Ctrl-C).
pub const INTERRUPTED_EXIT: i32 = 130;

/// Keeps a stop hook registered; dropping it removes the hook.
#[must_use = "the hook is removed when the guard is dropped"]
pub struct SignalGuard(u64);

impl Drop for SignalGuard {
    fn drop(&mut self) {
        if let Ok(mut h) = HOOKS.lock() {
            h.retain(|(id, _)| *id != self.0);
        }
    }
}

/// Runs `then` on the first Ctrl-C or SIGTERM while the guard lives (see the module header).
pub fn on_signal(then: impl Fn() + Send + Sync + 'static) -> SignalGuard {
    start();
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut h) = HOOKS.lock() {
        h.push((id, Box::new(then)));
    }
    SignalGuard(id)
}

/// What one signal does: the hooks' graceful stop the first time one is registered, else exit.
fn handle() {
    let fired = match HOOKS.lock() {
        Ok(h) if !h.is_empty() && !ASKED.swap(true, Ordering::SeqCst) => {
            for (_, f) in h.iter() {
                f();
            }
            true
        }
        _ => false,
    };
    if fired {
        eprintln!(
            "stopping gracefully (a checkpoint is written); press Ctrl-C again to exit at once"
        );
    } else {
        eprintln!("interrupted");
        std::process::exit(INTERRUPTED_EXIT);
    }
}

fn start() {
    START.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("mtrl-signals".into())
            .spawn(listen);
        if let Err(e) = spawned {
            eprintln!("warning: no signal handling ({e}): Ctrl-C ends the process at once");
        }
    });
}

fn listen() {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    rt.block_on(async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut term) = signal(SignalKind::terminate()) else {
                return;
            };
            let Ok(mut int) = signal(SignalKind::interrupt()) else {
                return;
            };
            loop {
                tokio::select! {
                    _ = int.recv() => handle(),
                    _ = term.recv() => handle(),
                }
            }
        }
        #[cfg(not(unix))]
        loop {
            if tokio::signal::ctrl_c().await.is_err() {
                return;
            }
            handle();
        }
    });
}
