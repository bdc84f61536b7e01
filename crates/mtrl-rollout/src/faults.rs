//! Fault injection for tests of fault tolerance: `MTRL_FAULTS=tool_error:0.05,slow_tool:0.02,
//! engine_error:0.01` makes that fraction of environment steps fail (`tool_error`), stall for
//! `slow_tool`'s delay (default 1 s; `slow_tool:0.02:1.5` for 1.5 s) before running, or of
//! generation requests fail (`engine_error`).
//!
//! Decisions are a hash of (run seed, group, sample, attempt, turn, kind) — not of time or
//! thread order — so a run and its resumed twin meet the same faults, and a retried attempt
//! draws afresh (it is likely to get through). Every injected fault is counted by kind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::episode::EpisodeId;
use crate::error::{Result, RolloutError};

/// The variable read by [`Faults::from_env`].
pub const FAULTS_VAR: &str = "MTRL_FAULTS";

/// One kind of injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    ToolError,
    SlowTool,
    EngineError,
}

impl FaultKind {
    pub const ALL: [FaultKind; 3] = [
        FaultKind::ToolError,
        FaultKind::SlowTool,
        FaultKind::EngineError,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            FaultKind::ToolError => "tool_error",
            FaultKind::SlowTool => "slow_tool",
            FaultKind::EngineError => "engine_error",
        }
    }

    fn index(&self) -> usize {
        *self as usize
    }
}

/// Which faults to inject, and how many were.
#[derive(Debug, Default)]
pub struct Faults {
    rates: [f64; 3],
    slow: Duration,
    seed: u64,
    injected: [AtomicU64; 3],
}

fn bad(spec: &str, msg: impl std::fmt::Display) -> RolloutError {
    RolloutError::Internal(format!("{FAULTS_VAR}=`{spec}`: {msg}"))
}

impl Faults {
    /// No faults.
    pub fn none() -> Faults {
        Faults {
            slow: Duration::from_secs(1),
            ..Faults::default()
        }
    }

    /// Parses `kind:rate[:seconds],…`; an unknown kind, a rate outside [0, 1] or a malformed item
    /// is an error naming it.
    pub fn parse(spec: &str, seed: u64) -> Result<Faults> {
        let mut f = Faults {
            seed,
            ..Faults::none()
        };
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let parts: Vec<&str> = item.split(':').collect();
            let kind = FaultKind::ALL
                .into_iter()
                .find(|k| k.as_str() == parts[0])
                .ok_or_else(|| {
                    bad(
                        spec,
                        format!(
                            "unknown fault `{}` (tool_error, slow_tool, engine_error)",
                            parts[0]
                        ),
                    )
                })?;
            let rate: f64 = match parts.get(1) {
                Some(r) => r
                    .parse()
                    .map_err(|_| bad(spec, format!("`{item}`: rate is not a number")))?,
                None => {
                    return Err(bad(
                        spec,
                        format!("`{item}` needs a rate, e.g. {}:0.05", parts[0]),
                    ))
                }
            };
            if !(0.0..=1.0).contains(&rate) {
                return Err(bad(
                    spec,
                    format!("`{item}`: rate {rate} is outside [0, 1]"),
                ));
            }
            if let Some(s) = parts.get(2) {
                let secs: f64 = s
                    .parse()
                    .ok()
                    .filter(|x: &f64| x.is_finite() && *x >= 0.0 && kind == FaultKind::SlowTool)
                    .ok_or_else(|| {
                        bad(spec, format!("`{item}`: only slow_tool takes seconds >= 0"))
                    })?;
                f.slow = Duration::from_secs_f64(secs);
            }
            if parts.len() > 3 {
                return Err(bad(spec, format!("`{item}` has too many fields")));
            }
            f.rates[kind.index()] = rate;
        }
        Ok(f)
    }

    /// From `MTRL_FAULTS` (no faults when unset or empty).
    pub fn from_env(seed: u64) -> Result<Faults> {
        match std::env::var(FAULTS_VAR) {
            Ok(s) => Faults::parse(&s, seed),
            Err(_) => Ok(Faults::none()),
        }
    }

    /// Whether any fault can be injected.
    pub fn active(&self) -> bool {
        self.rates.iter().any(|r| *r > 0.0)
    }

    /// Whether `kind` strikes at this point of an episode; counts it when it does.
    pub fn strikes(&self, kind: FaultKind, id: EpisodeId, turn: u64) -> bool {
        let rate = self.rates[kind.index()];
        if rate <= 0.0 {
            return false;
        }
        let h = mtrl_core::rng::sample_seed(
            self.seed ^ 0xFA17_0000 ^ ((kind.index() as u64) << 56),
            id.group,
            id.sample ^ (u64::from(id.attempt) << 40) ^ (u64::from(id.replacement) << 52),
            turn,
        );
        let hit = ((h >> 11) as f64 / (1u64 << 53) as f64) < rate;
        if hit {
            self.injected[kind.index()].fetch_add(1, Ordering::Relaxed);
            metrics::counter!("mtrl_rollout_faults_injected_total", "kind" => kind.as_str())
                .increment(1);
        }
        hit
    }

    /// The delay of `slow_tool`.
    pub fn slow(&self) -> Duration {
        self.slow
    }

    /// Faults injected so far, by kind.
    pub fn injected(&self) -> [(FaultKind, u64); 3] {
        FaultKind::ALL.map(|k| (k, self.injected[k.index()].load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates_and_delays_and_names_bad_items() {
        let f = Faults::parse("tool_error:0.05, slow_tool:0.02:1.5,engine_error:0.01", 1).unwrap();
        assert_eq!(f.rates, [0.05, 0.02, 0.01]);
        assert_eq!(f.slow, Duration::from_millis(1500));
        assert!(f.active() && !Faults::parse("", 1).unwrap().active());
        for (spec, what) in [
            ("disk_full:0.1", "unknown fault `disk_full`"),
            ("tool_error", "needs a rate"),
            ("tool_error:x", "not a number"),
            ("tool_error:1.5", "outside [0, 1]"),
            ("tool_error:0.1:3", "only slow_tool"),
        ] {
            let e = Faults::parse(spec, 0).unwrap_err().to_string();
            assert!(e.contains(what) && e.contains(FAULTS_VAR), "{spec}: {e}");
        }
    }

    #[test]
    fn decisions_are_reproducible_and_near_the_rate() {
        let f = Faults::parse("tool_error:0.05", 7).unwrap();
        let g = Faults::parse("tool_error:0.05", 7).unwrap();
        let id = |group, attempt| EpisodeId {
            group,
            sample: 3,
            attempt,
            replacement: 0,
        };
        let hits: Vec<bool> = (0..4000)
            .map(|i| f.strikes(FaultKind::ToolError, id(i, 0), 2))
            .collect();
        let again: Vec<bool> = (0..4000)
            .map(|i| g.strikes(FaultKind::ToolError, id(i, 0), 2))
            .collect();
        assert_eq!(hits, again);
        let n = hits.iter().filter(|h| **h).count();
        assert!((150..=250).contains(&n), "{n} of 4000 at 5 %");
        assert_eq!(f.injected()[0].1, n as u64);
        // A retry draws afresh.
        let retry: Vec<bool> = (0..4000)
            .map(|i| f.strikes(FaultKind::ToolError, id(i, 1), 2))
            .collect();
        assert_ne!(hits, retry);
        assert!(!f.strikes(FaultKind::EngineError, id(1, 0), 0));
    }
}
