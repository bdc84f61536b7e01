//! Phase trace lines for placing a stall. With `MTRL_TRACE=1` (any value but empty or `0`) the
//! trainer, the engine thread and the engine's first forwards print one line per phase to stderr:
//! seconds since the first trace, the thread's name, what just happened. Repeated events (requests,
//! engine steps) are traced for the first 8 and then every 256th; `MTRL_TRACE=all` traces every
//! one. The last line printed before a hang names the phase that hangs (`mtrl train` is otherwise
//! silent until its first step record). Off, a trace point costs one load of a cached flag.
//!
//! ```text
//! [trace     0.001s mtrl-engine] engine step 1: start, 15 unfinished
//! ```

use std::sync::OnceLock;
use std::time::Instant;

/// The environment variable that turns tracing on.
pub const TRACE_VAR: &str = "MTRL_TRACE";

/// When tracing started, and whether every repeated event is traced (`MTRL_TRACE=all`) or only
/// the first few and then a sparse sample.
static START: OnceLock<Option<(Instant, bool)>> = OnceLock::new();

fn state() -> Option<(Instant, bool)> {
    *START.get_or_init(|| {
        let v = std::env::var(TRACE_VAR).ok()?;
        (!v.is_empty() && v != "0").then(|| (Instant::now(), v == "all"))
    })
}

/// Whether `MTRL_TRACE` is on (read once per process).
pub fn enabled() -> bool {
    state().is_some()
}

/// Whether every repeated event (engine step, request) is traced: `MTRL_TRACE=all`.
pub fn all() -> bool {
    state().is_some_and(|(_, all)| all)
}

/// Prints one trace line when tracing is on (use [`trace!`](crate::trace!)).
pub fn line(args: std::fmt::Arguments<'_>) {
    if let Some((t0, _)) = state() {
        let thread = std::thread::current();
        eprintln!(
            "[trace {:>9.3}s {}] {args}",
            t0.elapsed().as_secs_f64(),
            thread.name().unwrap_or("-")
        );
    }
}

/// `trace!("engine step {n}: start")`: a trace line when `MTRL_TRACE` is on; the arguments are not
/// evaluated when it is off.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::trace::enabled() {
            $crate::trace::line(format_args!($($arg)*));
        }
    };
}
